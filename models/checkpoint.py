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


def load_checkpoint(path: str | Path, dtype=None) -> specjax.CausalLM:
    """A CausalLM from a directory written by `save_checkpoint`.

    `dtype` ("float32", "bfloat16", "float16", or jnp.float32 / jnp.bfloat16 / ...) casts
    the parameters and sets the compute dtype; default: as saved.
    """
    path = Path(path).absolute()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    if not (path / "config.json").exists() or not (path / "params").exists():
        raise FileNotFoundError(f"{path} is not a specjax checkpoint (it needs config.json "
                                "and params/); train one with `specjax train --out DIR`")
    config = config_from_dict(json.loads((path / "config.json").read_text()))
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    _, abstract_params = nnx.split(abstract, nnx.Param)
    # Restore onto this machine's default device, whatever device wrote the checkpoint.
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                          nnx.to_pure_dict(abstract_params))
    restored = ocp.StandardCheckpointer().restore(path / "params", target)
    if dtype is not None:
        name = dtype_name(dtype)
        config = dataclasses.replace(config, dtype=name, param_dtype=name)
        restored = jax.tree.map(lambda x: x.astype(config.storage_dtype), restored)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))),
                                 nnx.Param)
    nnx.replace_by_pure_dict(params, restored)
    return specjax.CausalLM.from_nnx(nnx.merge(graphdef, params))


def load_config(path: str | Path) -> TransformerConfig:
    return config_from_dict(json.loads((Path(path) / "config.json").read_text()))
