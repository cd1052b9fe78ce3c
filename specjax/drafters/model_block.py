"""`ModelBlock`: a feature head's decoder block whose code is the model's, as params + pure
functions.

specjax's own feature heads (EAGLE, MiMo's MTP) run a Llama-style block written here
(`specjax.drafters.feature_head`). DeepSeek-V3's multi-token-prediction module runs one
more block of its own model instead: multi-head latent attention with its latent cache,
and a mixture of experts. specjax imports no model code, so such a block comes in from
the model package (`specjax_models.mtp.MtpBlock`) the way a model comes in as a
`CausalLM`: a pytree whose only leaves are the parameters, with the pure apply function
and the cache factory as static data, so an `Eagle` carrying it passes straight into
`jax.jit` and two equal graph definitions share one compilation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax import Array


@dataclasses.dataclass(frozen=True)
class _NnxBlockApply:
    graphdef: Any

    def __call__(self, params, x_BTD, positions_BT, cache, cache_lengths_B, new_mask_BTT):
        return nnx.merge(self.graphdef, params)(x_BTD, positions_BT, cache, cache_lengths_B,
                                                new_mask_BTT)


@dataclasses.dataclass(frozen=True)
class _NnxBlockCache:
    graphdef: Any

    def __call__(self, params, batch: int, slots: int):
        return nnx.merge(self.graphdef, params).init_cache(batch, slots)


def _static(**kwargs):
    return dataclasses.field(metadata={"static": True}, **kwargs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class ModelBlock:
    """One decoder block with its own KV cache, supplied by model code.

    params: pytree of arrays (the only leaves).
    apply_fn: `apply_fn(params, x[B, T, D], positions[B, T], cache, cache_lengths[B],
      new_mask[B, T, T] | None) -> (out[B, T, D], cache)`: the block over T new positions
      of the residual stream. With a cache it writes their entries at slots
      `cache_lengths[b] + t` and each position attends to the slots below
      `cache_lengths[b]` plus the new positions `new_mask` allows (causal when None), the
      `CausalLM` contract for one block; with `cache=None` (and `cache_lengths=None`) it is
      a causal forward over the T positions alone.
    init_cache_fn: `init_cache_fn(params, batch, slots) -> cache` (any pytree).
    d_model: the residual stream's width.
    """

    params: Any
    apply_fn: Callable = _static()
    init_cache_fn: Callable = _static()
    _: dataclasses.KW_ONLY
    d_model: int = _static()

    def __post_init__(self):
        if isinstance(self.d_model, bool) or not isinstance(self.d_model, int) or \
                self.d_model < 1:
            raise ValueError(f"d_model must be a positive int, got {self.d_model!r}")

    @classmethod
    def from_nnx(cls, module: nnx.Module) -> ModelBlock:
        """Functional view of an NNX block called as `module(x, positions, cache,
        cache_lengths, new_mask) -> (out, cache)`, with `module.init_cache(batch, slots)`
        and `module.d_model` (as `specjax_models.mtp.MtpBlock` has)."""
        if not isinstance(module, nnx.Module):
            raise TypeError(f"ModelBlock.from_nnx expects a flax.nnx.Module, got "
                            f"{type(module).__name__}")
        for needed in ("init_cache", "d_model"):
            if not hasattr(module, needed):
                raise TypeError(f"ModelBlock.from_nnx needs module.{needed} (as "
                                "specjax_models.mtp.MtpBlock has)")
        graphdef, params, other = nnx.split(module, nnx.Param, ...)
        if jax.tree.leaves(other):
            raise ValueError("ModelBlock.from_nnx supports blocks whose state is only "
                             "nnx.Param")
        return cls(params, _NnxBlockApply(graphdef), _NnxBlockCache(graphdef),
                   d_model=int(module.d_model))

    def apply(self, x_BTD: Array, positions_BT: Array, cache, cache_lengths_B: Array | None,
              new_mask_BTT: Array | None = None):
        """`(out [B, T, D], cache)` (see `apply_fn`)."""
        if (cache is None) != (cache_lengths_B is None):
            raise ValueError("pass cache and cache_lengths together (or neither, for a "
                             "forward over the new positions alone)")
        return self.apply_fn(self.params, x_BTD, positions_BT, cache, cache_lengths_B,
                             new_mask_BTT)

    def init_cache(self, batch: int, slots: int):
        """A fresh cache for `batch` rows of `slots` positions."""
        return self.init_cache_fn(self.params, batch, slots)

    def __repr__(self):
        count = sum(getattr(x, "size", 0) for x in jax.tree.leaves(self.params))
        return f"ModelBlock(d_model={self.d_model}, params={count:,})"
