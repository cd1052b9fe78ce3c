"""Multi-head latent attention (MLA, DeepSeek-V2/V3) over a cache of compressed latents.

Keys and values come from one low-rank latent per token: `kv_a_proj` maps the residual
stream to a latent c (width `kv_lora_rank`, then RMS-normed) and a rotary key k_r
(width `qk_rope_head_dim`, shared by every head); `kv_b_proj` expands c into each head's
key without position (`qk_nope_head_dim`) and value (`v_head_dim`). Queries come from
`q_proj`, or low-rank through `q_a_proj`, a norm and `q_b_proj`, each head's split into a
part without position and a rotary part.

The cache holds what the latent attention needs and nothing more: per token c and k_r
(`KVCache.keys` [B, 1, S, kv_lora_rank], `.values` [B, 1, S, qk_rope_head_dim]), against
2 x heads x head_dim for full keys and values. The up-projections are absorbed: a head's
score is q_nope . (W_uk c) + q_r . k_r = (W_uk^T q_nope) . c + q_r . k_r, so the query's
nope part is mapped into latent space once per token and every head attends to the
cached [c, k_r] directly (one shared "KV head", `specjax.lm.attention`'s blocks, windows,
trees, compaction and chunked prefill unchanged); the weighted sum of latents is mapped
to each head's value by W_uv afterwards. The scores equal the expanded form's up to
float rounding (tests/test_latent_attention.py).

DeepSeek's checkpoints store the rotary dimensions interleaved (pairs (x0, x1), ...);
the loader permutes those projection columns to the rotate-half layout
(`specjax_models.hf_deepseek`), so the rotation here is the one every model uses.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from jax import Array

from specjax.lm.rope import apply_rotary, inverse_frequencies, rotary_scale
from specjax_models.attention import attend
from specjax_models.config import TransformerConfig
from specjax_models.norms import RMSNorm


def _latent_keys_values(latents_BKSC: Array, rotary_BKSR: Array) -> tuple[Array, Array]:
    """What the scores and the weighted sum read from stored entries: keys [c, k_r],
    values c."""
    return jnp.concatenate([latents_BKSC, rotary_BKSR.astype(latents_BKSC.dtype)], -1), \
        latents_BKSC


class LatentAttention(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        heads, nope, rope = config.num_heads, config.qk_nope_head_dim, config.qk_rope_head_dim
        dense = lambda n_in, n_out, bias: nnx.Linear(
            n_in, n_out, use_bias=bias, dtype=config.compute_dtype,
            param_dtype=config.storage_dtype, rngs=rngs)
        norm = lambda dim: RMSNorm(dim, eps=config.rms_norm_eps, dtype=config.compute_dtype,
                                   param_dtype=config.storage_dtype)
        if config.q_lora_rank:
            self.q_a_proj = dense(config.d_model, config.q_lora_rank, config.qkv_bias)
            self.q_a_norm = norm(config.q_lora_rank)
            self.q_b_proj = dense(config.q_lora_rank, heads * (nope + rope), False)
        else:
            self.q_proj = dense(config.d_model, heads * (nope + rope), False)
        self.kv_a_proj = dense(config.d_model, config.kv_lora_rank + rope, config.qkv_bias)
        self.kv_a_norm = norm(config.kv_lora_rank)
        self.kv_b_proj = dense(config.kv_lora_rank, heads * (nope + config.v_head_dim), False)
        self.o_proj = dense(heads * config.v_head_dim, config.d_model, config.attn_out_bias)

    def __call__(self, x_BTD: Array, positions_BT: Array, cache_kv: tuple | None,
                 layer: Array | None, cache_lengths_B: Array | None,
                 new_mask_BTT: Array | None, key_positions_BS: Array | None,
                 window: Array | None):
        """`(out [B, T, D], cache_kv)`, as `specjax_models.attention.Attention`."""
        cfg = self.config
        batch, num_new, _ = x_BTD.shape
        heads, nope, rope = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        latent_dim, value_dim = cfg.kv_lora_rank, cfg.v_head_dim
        if cfg.q_lora_rank:
            q_BTX = self.q_b_proj(self.q_a_norm(self.q_a_proj(x_BTD)))
        else:
            q_BTX = self.q_proj(x_BTD)
        q_BTNQ = q_BTX.reshape(batch, num_new, heads, nope + rope)
        inv_freq = inverse_frequencies(rope, cfg.rope_theta, cfg.rope_scaling)
        rotate = rotary_scale(cfg.rope_scaling)
        q_rotary_BTNR = apply_rotary(q_BTNQ[..., nope:], positions_BT, inv_freq, rotate)
        compressed_BTX = self.kv_a_proj(x_BTD)
        latent_BTC = self.kv_a_norm(compressed_BTX[..., :latent_dim])
        k_rotary_BT1R = apply_rotary(compressed_BTX[..., None, latent_dim:], positions_BT,
                                     inv_freq, rotate)
        # W_uk and W_uv of each head, [C, N, nope] and [C, N, V]: absorbed into the query
        # and applied to the attended latent.
        up_CNX = self.kv_b_proj.kernel[...].astype(cfg.compute_dtype).reshape(
            latent_dim, heads, nope + value_dim)
        q_latent_BTNC = jnp.einsum("BTNX,CNX->BTNC", q_BTNQ[..., :nope], up_CNX[..., :nope])
        q_B1NTQ = jnp.concatenate([q_latent_BTNC, q_rotary_BTNR.astype(q_latent_BTNC.dtype)],
                                  -1).transpose(0, 2, 1, 3)[:, None]
        scale = cfg.query_scale if cfg.query_scale is not None else (nope + rope) ** -0.5
        out_B1NTC, cache_kv = attend(
            cfg, q_B1NTQ, latent_BTC[:, None], k_rotary_BT1R.transpose(0, 2, 1, 3), cache_kv,
            layer, cache_lengths_B, positions_BT, new_mask_BTT, key_positions_BS, window, scale,
            keys_values=_latent_keys_values, value_dim=latent_dim)
        out_BTNV = jnp.einsum("BNTC,CNV->BTNV", out_B1NTC[:, 0].astype(cfg.compute_dtype),
                              up_CNX[..., nope:])
        return self.o_proj(out_BTNV.reshape(batch, num_new, heads * value_dim)), cache_kv
