"""Model checkpoints on disk: `config.json` (the TransformerConfig) + `params/` (orbax).

`save_checkpoint(lm_or_model, config, path)` and `load_checkpoint(path) -> CausalLM` are
what the command line, the bundled pair and training exports use.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx

import specjax
from specjax_models.transformer import Transformer, TransformerConfig, dtype_name


def config_to_dict(config: TransformerConfig) -> dict:
    return dataclasses.asdict(config)


def config_from_dict(fields: dict) -> TransformerConfig:
    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"config.json has fields this version does not know: {unknown}")
    return TransformerConfig(**fields)


def save_checkpoint(lm: specjax.CausalLM, config: TransformerConfig, path: str | Path,
                    extra: dict | None = None) -> Path:
    """Write `config.json` (+ `extra` metadata) and the params under `path/params`."""
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config_to_dict(config), indent=1) + "\n")
    if extra is not None:
        (path / "metadata.json").write_text(json.dumps(extra, indent=1) + "\n")
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path / "params", nnx.to_pure_dict(lm.params), force=True)
    checkpointer.wait_until_finished()
    return path


def load_checkpoint(path: str | Path, dtype=None,
                    scan_layers: bool | None = None) -> specjax.CausalLM:
    """A CausalLM from a directory written by `save_checkpoint`.

    `dtype` ("float32", "bfloat16", "float16", or jnp.float32 / jnp.bfloat16 / ...) casts
    the parameters and sets the compute dtype; default: as saved. `scan_layers` (see
    `TransformerConfig`) overrides the saved setting; either layout loads into either.
    """
    path = Path(path).absolute()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    if not (path / "config.json").exists() or not (path / "params").exists():
        raise FileNotFoundError(f"{path} is not a specjax checkpoint (it needs config.json "
                                "and params/); train one with `specjax train --out DIR`")
    config = config_from_dict(json.loads((path / "config.json").read_text()))
    checkpointer = ocp.StandardCheckpointer()
    stored = checkpointer.metadata(path / "params").item_metadata.tree
    # Restore onto this machine's default device, whatever device wrote the checkpoint.
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          stored)
    if scan_layers is not None:
        config = dataclasses.replace(config, scan_layers=bool(scan_layers))
    restored = _layer_layout(checkpointer.restore(path / "params", target), config.scan_layers)
    if dtype is not None:
        name = dtype_name(dtype)
        config = dataclasses.replace(config, dtype=name, param_dtype=name)
        restored = jax.tree.map(lambda x: x.astype(config.storage_dtype), restored)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))),
                                 nnx.Param)
    nnx.replace_by_pure_dict(params, restored)
    return specjax.CausalLM.from_nnx(nnx.merge(graphdef, params))


def _layer_layout(tree: dict, stacked: bool) -> dict:
    """The saved layers in the model's layout: one subtree per layer (`layers/0/...`), or,
    for `scan_layers`, one subtree with a leading [L] axis (`layers/...`). Checkpoints are
    written in either and load in both."""
    layers = tree.get("layers")
    if not isinstance(layers, dict) or not layers:
        return tree
    per_layer_saved = all(str(k).isdigit() for k in layers)
    if stacked and per_layer_saved:
        per_layer = [layers[k] for k in sorted(layers, key=int)]
        return dict(tree, layers=jax.tree.map(lambda *xs: jax.numpy.stack(xs), *per_layer))
    if not stacked and not per_layer_saved:
        count = jax.tree.leaves(layers)[0].shape[0]
        return dict(tree, layers={i: jax.tree.map(lambda x, i=i: x[i], layers)
                                  for i in range(count)})
    if not stacked:  # orbax gives string keys; the module's pure dict has int keys
        return dict(tree, layers={int(k): v for k, v in layers.items()})
    return tree


def load_config(path: str | Path) -> TransformerConfig:
    return config_from_dict(json.loads((Path(path) / "config.json").read_text()))
