"""Parameters by name: the per-layer names checkpoints use, and `ParamFiller`, which
assembles a model's parameters from them one array at a time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array


def flat_name(path) -> str:
    return ".".join(str(p) for p in path)


def is_stacked(name: str) -> bool:
    """`layers.X` (every layer along a leading axis), not `layers.3.X` (one layer)."""
    parts = name.split(".")
    return parts[0] == "layers" and len(parts) > 1 and not parts[1].isdigit()


def per_layer_params(flat: dict) -> dict:
    """Parameters by per-layer name: a stacked `layers.X` of shape [L, ...] becomes
    `layers.0.X` ... `layers.{L-1}.X` (how checkpoints of other libraries name them);
    per-layer names pass through."""
    out = {}
    for name, value in flat.items():
        if is_stacked(name):
            rest = name[len("layers."):]
            for i in range(value.shape[0]):
                out[f"layers.{i}.{rest}"] = value[i]
        else:
            out[name] = value
    return out


def on_device(array, dtype, sharding=None) -> Array:
    """`array` as a JAX array of `dtype`, placed by `sharding` (each device receives only
    its shard) or on the default device. A host array that already has the dtype is
    copied over as it is: `jnp.asarray` would compile a conversion program per shape (a
    third of the time SmolLM2 took to load from the model cache)."""
    if sharding is not None:
        return jax.device_put(np.asarray(array).astype(np.dtype(dtype), copy=False), sharding)
    if isinstance(array, np.ndarray) and array.dtype == np.dtype(dtype):
        return jax.device_put(array)
    return jnp.asarray(array, dtype)


class TensorShapeError(ValueError):
    """A checkpoint tensor whose shape, in the file's own layout, differs from what
    config.json implies; `tensor` is its name (the caller adds the file it is in)."""

    def __init__(self, tensor: str, found: tuple, expected: tuple):
        self.tensor = tensor
        super().__init__(f"tensor {tensor} has shape {tuple(found)}, expected "
                         f"{tuple(expected)} by config.json; the checkpoint does not match "
                         "its config.json")


class ParamFiller:
    """Assembles a model's parameters from per-layer arrays (`layers.{i}.X`, as
    checkpoints store them), into the stacked layout (`layers.X` [L, ...]) of a model with
    `scan_layers` or one array per layer otherwise, one array at a time, so a loader holds
    about one copy of the weights.

    `targets()` lists every per-layer name with the shape it must have; `set(name, array)`
    stores one (cast to the storage dtype); `state()` returns the params once all are set.
    """

    def __init__(self, abstract_params, dtype, placement=None):
        self._dtype = dtype
        # placement(key path, shape) -> where the array goes (a jax Sharding), or None
        self._placement = placement
        self._leaves = {flat_name(key): (key, leaf)
                        for key, leaf in nnx.to_flat_state(abstract_params)}
        self._buffers: dict[str, object] = {}
        self._missing: dict[str, int] = {}
        self._done: dict[str, Array] = {}

    def targets(self) -> list[tuple[str, tuple]]:
        out = []
        for name, (key, leaf) in self._leaves.items():
            shape = tuple(leaf.get_value().shape)
            if is_stacked(name):
                rest = flat_name(key[1:])
                out += [(f"layers.{i}.{rest}", shape[1:]) for i in range(shape[0])]
            else:
                out.append((name, shape))
        return out

    def _located(self, name: str) -> tuple[str, int | None, tuple]:
        """(the leaf's name, the layer or None, the leaf's whole shape) of a target."""
        parts = name.split(".")
        stacked, layer = name, None
        if parts[0] == "layers" and parts[1].isdigit() and name not in self._leaves:
            stacked, layer = "layers." + ".".join(parts[2:]), int(parts[1])
        if stacked not in self._leaves:
            raise KeyError(f"the model has no parameter {name}")
        return stacked, layer, tuple(self._leaves[stacked][1].get_value().shape)

    def shape_of(self, name: str) -> tuple:
        """The shape `set(name, ...)` takes."""
        _, layer, shape = self._located(name)
        return shape if layer is None else shape[1:]

    def set(self, name: str, array) -> None:
        import numpy as np

        stacked, layer, shape = self._located(name)
        want = shape if layer is None else shape[1:]
        if tuple(array.shape) != want:
            raise ValueError(f"{name} has shape {tuple(array.shape)}, expected {want}")
        if not jnp.issubdtype(array.dtype, jnp.floating):
            raise ValueError(f"{name} holds {array.dtype}, expected floats")
        if layer is None:
            self._done[stacked] = on_device(array, self._dtype, self._where(stacked, shape))
            return
        if stacked not in self._buffers:
            self._buffers[stacked] = np.empty(shape, np.dtype(self._dtype))
            self._missing[stacked] = shape[0]
        self._buffers[stacked][layer] = np.asarray(array).astype(np.dtype(self._dtype))
        self._missing[stacked] -= 1
        if not self._missing[stacked]:  # complete: hand it to JAX, drop the host copy
            self._done[stacked] = on_device(self._buffers.pop(stacked), self._dtype,
                                             self._where(stacked, shape))

    def _where(self, name: str, shape: tuple):
        return None if self._placement is None else self._placement(self._leaves[name][0],
                                                                    shape)

    def state(self):
        missing = sorted(set(self._leaves) - set(self._done))
        if missing:
            raise ValueError(f"parameters never set: {missing[:5]}")
        return nnx.from_flat_state([(key, leaf.replace(self._done[name]))
                                    for name, (key, leaf) in self._leaves.items()])
