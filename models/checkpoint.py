"""Model checkpoints on disk: `config.json` (the TransformerConfig) + `params/` (orbax).

`save_checkpoint(lm_or_model, config, path)` and `load_checkpoint(path) -> CausalLM` are
what the command line, the bundled pair and training exports use.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx

import specjax
from specjax.runtime.files import damaged, read_json, write_json_atomically
from specjax_models.sharded import loading_placement, shard
from specjax_models.transformer import TransformerConfig, abstract_transformer, dtype_name


def config_to_dict(config: TransformerConfig) -> dict:
    return dataclasses.asdict(config)


REMEDY = "save the checkpoint again (or copy a complete one)"


def config_from_dict(fields: dict, source: str = "config.json") -> TransformerConfig:
    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"{source} has fields this version does not know: {unknown}")
    try:
        return TransformerConfig(**fields)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{source} does not describe a model this version can build: "
                         f"{error}") from None


def save_checkpoint(lm: specjax.CausalLM, config: TransformerConfig, path: str | Path,
                    extra: dict | None = None) -> Path:
    """Write `config.json` (+ `extra` metadata) and the params under `path/params`."""
    path = Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    # The parameters first (orbax writes them under a temporary name and renames the
    # folder when complete), then config.json, atomically: a killed save leaves no
    # config.json that describes parameters which are not all there.
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path / "params", nnx.to_pure_dict(lm.params), force=True)
    checkpointer.wait_until_finished()
    if extra is not None:
        write_json_atomically(path / "metadata.json", extra)
    write_json_atomically(path / "config.json", config_to_dict(config))
    return path


def load_checkpoint(path: str | Path, dtype=None, scan_layers: bool | None = None, *,
                    mesh=None, rules=None) -> specjax.CausalLM:
    """A CausalLM from a directory written by `save_checkpoint`.

    `dtype` ("float32", "bfloat16", "float16", or jnp.float32 / jnp.bfloat16 / ...) casts
    the parameters and sets the compute dtype; default: as saved. `scan_layers` (see
    `TransformerConfig`) overrides the saved setting; either layout loads into either.
    `mesh`, `rules`: a `jax.sharding.Mesh` to place the model on by `specjax.sharding`
    rules (default: the preset its axis names ask for); orbax restores each array
    straight onto its shards (see `specjax_models.shard`).
    """
    path = Path(path).absolute()
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory {path} does not exist")
    if not (path / "config.json").exists() or not (path / "params").exists():
        raise FileNotFoundError(f"{path} is not a specjax checkpoint (it needs config.json "
                                "and params/); train one with `specjax train --out DIR`")
    config = config_from_dict(read_json(path / "config.json", REMEDY),
                              str(path / "config.json"))
    checkpointer = ocp.StandardCheckpointer()
    try:
        stored = checkpointer.metadata(path / "params").item_metadata.tree
    except Exception as error:  # orbax / tensorstore raise many types for a damaged folder
        raise damaged(path / "params", f"is not a readable orbax checkpoint "
                      f"({type(error).__name__}: {_first_line(error)})", REMEDY) from None
    # Restore onto this machine's default device, whatever device wrote the checkpoint, or
    # each array onto its shards of `mesh`.
    rules, where = loading_placement(mesh, rules)
    where = where and where.for_model(config)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree_util.tree_map_with_path(
        lambda key, m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device if where is None
                                            else where(_names(key), m.shape)), stored)
    if scan_layers is not None:
        config = dataclasses.replace(config, scan_layers=bool(scan_layers))
    try:
        restored = checkpointer.restore(path / "params", target)
    except Exception as error:  # a truncated or missing array file, a damaged index
        raise damaged(path / "params", f"cannot be read ({type(error).__name__}: "
                      f"{_first_line(error)}): the checkpoint is incomplete or damaged",
                      REMEDY) from None
    restored = _layer_layout(restored, config.scan_layers)
    if dtype is not None:
        name = dtype_name(dtype)
        config = dataclasses.replace(config, dtype=name, param_dtype=name)
        restored = jax.tree.map(lambda x: x.astype(config.storage_dtype), restored)
    graphdef, params = nnx.split(abstract_transformer(config),
                                 nnx.Param)
    _check_against_config(path, restored, nnx.to_pure_dict(params))
    nnx.replace_by_pure_dict(params, restored)
    lm = specjax.CausalLM.from_nnx(nnx.merge(graphdef, params))
    return lm if mesh is None else shard(lm, mesh, rules)


def _names(key_path) -> tuple:
    """A pytree key path (dict keys, sequence indices) as plain names."""
    return tuple(getattr(k, "key", getattr(k, "idx", k)) for k in key_path)


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else "no message"


def _check_against_config(path: Path, restored: dict, expected: dict) -> None:
    """Every parameter config.json implies is there, with its shape and a float dtype, and
    nothing else: a checkpoint whose config.json and params/ disagree is refused by name."""
    def flat(tree, prefix=""):
        for key, value in tree.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                yield from flat(value, name + "/")
            else:
                yield name, value

    saved, wanted = dict(flat(restored)), dict(flat(expected))
    missing, extra = sorted(set(wanted) - set(saved)), sorted(set(saved) - set(wanted))
    if missing or extra:
        raise damaged(path, f"its params/ do not match its config.json (missing "
                      f"{missing[:3]}, unexpected {extra[:3]})", REMEDY)
    for name, value in saved.items():
        if tuple(value.shape) != tuple(wanted[name].shape):
            raise damaged(path, f"parameter {name} has shape {tuple(value.shape)}, "
                          f"config.json implies {tuple(wanted[name].shape)}", REMEDY)
        if not jax.numpy.issubdtype(value.dtype, jax.numpy.floating):
            raise damaged(path, f"parameter {name} holds {value.dtype}, expected floats",
                          REMEDY)


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
    source = Path(path) / "config.json"
    if not source.exists():
        raise FileNotFoundError(f"{path} has no config.json (not a specjax checkpoint)")
    return config_from_dict(read_json(source, REMEDY), str(source))
