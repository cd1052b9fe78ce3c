"""Rotary position embeddings (RoPE), shared by the model package's Transformer and the
feature heads: the inverse frequencies (with Llama 3.1's band-wise rescaling, linear
scaling or YaRN's ramp between interpolated and extrapolated bands) and the rotation in
the rotate-half layout Hugging Face checkpoints use (the first half of each head's
dimensions paired with the second half)."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import Array

# The scaling rules `rope_scaling` may name, and the length of each one's tuple.
_SCALING_LENGTHS = {"linear": 2, "llama3": 5, "yarn": 7}


def check_rope_scaling(rope_scaling) -> None:
    """None, `("linear", factor)`, `("llama3", factor, low_freq_factor, high_freq_factor,
    original_max_position_embeddings)` or `("yarn", factor,
    original_max_position_embeddings, beta_fast, beta_slow, attention_factor, truncate)`;
    anything else is a ValueError."""
    if rope_scaling is None:
        return
    expected = _SCALING_LENGTHS.get(rope_scaling[0] if len(rope_scaling) else None)
    if expected is None or len(rope_scaling) != expected:
        raise ValueError(f"rope_scaling must be ('linear', factor), ('llama3', factor, "
                         "low_freq_factor, high_freq_factor, original_max_position_embeddings)"
                         " or ('yarn', factor, original_max_position_embeddings, beta_fast, "
                         f"beta_slow, attention_factor, truncate), got {rope_scaling!r}")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's 0.1 mscale ln(factor) + 1 (1 when the factor does not stretch): the default
    attention factor, and DeepSeek's score scale with its mscale_all_dim."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rotary_scale(rope_scaling) -> float:
    """The factor on cos and sin: YaRN's attention_factor, else 1."""
    return float(rope_scaling[5]) if rope_scaling is not None and rope_scaling[0] == "yarn" \
        else 1.0


def _yarn_inverse_frequencies(head_dim: int, theta: float, factor: float, original: int,
                              beta_fast: float, beta_slow: float, truncate: bool) -> Array:
    """YaRN (Peng et al. 2023): dimensions that turn fewer than beta_slow times over the
    original context are interpolated (divided by factor), those that turn more than
    beta_fast times kept, a linear ramp between."""
    def correction_dim(rotations):
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = jnp.clip((jnp.arange(head_dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
    extrapolated = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    keep = 1.0 - ramp
    return extrapolated / factor * (1.0 - keep) + extrapolated * keep


def inverse_frequencies(head_dim: int, theta: float, rope_scaling=None) -> Array:
    """`[head_dim // 2]` float32 inverse frequencies theta^(-2i/head_dim), rescaled as
    `rope_scaling` asks (see `check_rope_scaling`)."""
    exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if rope_scaling is None:
        return inv_freq
    if rope_scaling[0] == "yarn":
        _, factor, original, beta_fast, beta_slow, _, truncate = rope_scaling
        return _yarn_inverse_frequencies(head_dim, theta, factor, original, beta_fast,
                                         beta_slow, truncate)
    if rope_scaling[0] == "linear":
        return inv_freq / rope_scaling[1]
    _, factor, low_freq_factor, high_freq_factor, original = rope_scaling
    low_wavelen, high_wavelen = original / low_freq_factor, original / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(medium, smoothed, scaled)


def apply_rotary(x_BTNH: Array, positions_BT: Array, inv_freq_F: Array,
                 scale: float = 1.0) -> Array:
    """Rotate queries or keys `[B, T, N, H]` by their positions (rotate-half layout,
    float32 maths, the input's dtype back); `scale` multiplies cos and sin
    (`rotary_scale`: YaRN's attention factor)."""
    angles_BTF = positions_BT.astype(jnp.float32)[..., None] * inv_freq_F[None, None, :]
    angles_BTH = jnp.concatenate([angles_BTF, angles_BTF], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles_BTH), jnp.sin(angles_BTH)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    x = x_BTNH.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos + rotated * sin).astype(x_BTNH.dtype)
