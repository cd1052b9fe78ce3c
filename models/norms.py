"""Normalisation layers: RMSNorm (Llama; Gemma's (1 + w) scale) and LayerNorm (GPT-2)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array

from specjax_models.config import TransformerConfig


class RMSNorm(nnx.Module):
    """RMSNorm; `offset` scales by (1 + w) in float32 (Gemma), else w * x in the compute
    dtype (Llama)."""

    def __init__(self, dim: int, *, eps: float, dtype, param_dtype, offset: bool = False):
        self.eps = eps
        self.dtype = dtype
        self.offset = offset
        self.weight = nnx.Param(jnp.zeros((dim,), param_dtype) if offset
                                else jnp.ones((dim,), param_dtype))

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        shape = (1,) * (x.ndim - 1) + (-1,)
        if self.offset:
            scale = 1.0 + self.weight[...].astype(jnp.float32).reshape(shape)
            return (normed * scale).astype(self.dtype)
        weight = self.weight[...].astype(self.dtype).reshape(shape)
        return weight * normed.astype(self.dtype)


class LayerNorm(nnx.Module):
    """LayerNorm with weight and bias, statistics in float32 (GPT-2)."""

    def __init__(self, dim: int, *, eps: float, dtype, param_dtype):
        self.eps = eps
        self.dtype = dtype
        self.weight = nnx.Param(jnp.ones((dim,), param_dtype))
        self.bias = nnx.Param(jnp.zeros((dim,), param_dtype))

    def __call__(self, x: Array) -> Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        shape = (1,) * (x.ndim - 1) + (-1,)
        normed = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        out = normed * self.weight[...].astype(jnp.float32).reshape(shape) \
            + self.bias[...].astype(jnp.float32).reshape(shape)
        return out.astype(self.dtype)


def make_norm(config: TransformerConfig, dim: int | None = None):
    dim = dim or config.d_model
    if config.norm_type == "layer":
        return LayerNorm(dim, eps=config.rms_norm_eps, dtype=config.compute_dtype,
                         param_dtype=config.storage_dtype)
    return RMSNorm(dim, eps=config.rms_norm_eps, dtype=config.compute_dtype,
                   param_dtype=config.storage_dtype, offset=config.norm_weight_offset)
