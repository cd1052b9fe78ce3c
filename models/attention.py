"""Attention of a `specjax_models.Transformer` over its KV cache: grouped-query attention
with rotary or learned positions, sliding windows and logit soft-capping, read in blocks
(`specjax.lm.attention`).

Rotary embeddings use the "rotate half" layout of Hugging Face checkpoints, so their
q/k projection weights load without a permutation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array

from specjax.lm import attention
from specjax.lm.rope import apply_rotary, inverse_frequencies, rotary_scale
from specjax_models.cache import write_layer_rows
from specjax_models.config import TransformerConfig
from specjax_models.norms import RMSNorm

# Inputs up to this many tokens (decoding, verifying drafts or a token tree) read the cache
# before writing to it, in two segments; longer ones (prefills) write first and read once.
READ_BEFORE_WRITE_MAX_TOKENS = 64


def rotary_inverse_frequencies(config: TransformerConfig) -> Array:
    """`[head_dim // 2]` float32 inverse frequencies of this model (`specjax.lm.rope`)."""
    return inverse_frequencies(config.resolved_head_dim, config.rope_theta,
                               config.rope_scaling)


def softcap(x: Array, cap: float | None) -> Array:
    return x if cap is None else cap * jnp.tanh(x / cap)


class Attention(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        head_dim = config.resolved_head_dim
        dense = lambda n_in, n_out, bias: nnx.Linear(
            n_in, n_out, use_bias=bias, dtype=config.compute_dtype,
            param_dtype=config.storage_dtype, rngs=rngs)
        self.q_proj = dense(config.d_model, config.num_heads * head_dim, config.qkv_bias)
        self.k_proj = dense(config.d_model, config.num_kv_heads * head_dim, config.qkv_bias)
        self.v_proj = dense(config.d_model, config.num_kv_heads * head_dim, config.qkv_bias)
        self.o_proj = dense(config.num_heads * head_dim, config.d_model, config.attn_out_bias)
        if config.qk_norm:
            # Per head (Qwen3) or over the whole projection (OLMoE).
            whole = config.qk_norm_scope == "projection"
            norm = lambda heads: RMSNorm(head_dim * heads if whole else head_dim,
                                         eps=config.rms_norm_eps, dtype=config.compute_dtype,
                                         param_dtype=config.storage_dtype)
            self.q_norm = norm(config.num_heads)
            self.k_norm = norm(config.num_kv_heads)

    def __call__(self, x_BTD: Array, positions_BT: Array, cache_kv: tuple | None,
                 layer: Array | None, cache_lengths_B: Array | None,
                 new_mask_BTT: Array | None, key_positions_BS: Array | None,
                 window: Array | None):
        """`(out [B, T, D], cache_kv)`. `cache_kv` is the every-layer `(keys, values)` of a
        `KVCache` (or None for a plain forward); this layer's slice is `layer` (traced, the
        scan's index), and only its T new entries per row are written. `window`: this
        layer's sliding window (traced; None when the model has none)."""
        cfg = self.config
        batch, num_new, _ = x_BTD.shape
        head_dim, num_kv = cfg.resolved_head_dim, cfg.num_kv_heads
        group = cfg.num_heads // num_kv
        q_BTX, k_BTX, v_BTX = self.q_proj(x_BTD), self.k_proj(x_BTD), self.v_proj(x_BTD)
        if cfg.qk_norm and cfg.qk_norm_scope == "projection":
            q_BTX, k_BTX = self.q_norm(q_BTX), self.k_norm(k_BTX)
        if cfg.clip_qkv is not None:
            q_BTX, k_BTX, v_BTX = (jnp.clip(x, -cfg.clip_qkv, cfg.clip_qkv)
                                   for x in (q_BTX, k_BTX, v_BTX))
        q_BTNH = q_BTX.reshape(batch, num_new, cfg.num_heads, head_dim)
        k_BTKH = k_BTX.reshape(batch, num_new, num_kv, head_dim)
        v_BTKH = v_BTX.reshape(batch, num_new, num_kv, head_dim)
        if cfg.qk_norm and cfg.qk_norm_scope == "head":
            q_BTNH, k_BTKH = self.q_norm(q_BTNH), self.k_norm(k_BTKH)
        if cfg.position_embedding == "rope":
            inv_freq, rotate = rotary_inverse_frequencies(cfg), rotary_scale(cfg.rope_scaling)
            q_BTNH = apply_rotary(q_BTNH, positions_BT, inv_freq, rotate)
            k_BTKH = apply_rotary(k_BTKH, positions_BT, inv_freq, rotate)

        k_BKTH = k_BTKH.transpose(0, 2, 1, 3)
        v_BKTH = v_BTKH.transpose(0, 2, 1, 3)
        scale = cfg.query_scale if cfg.query_scale is not None else head_dim ** -0.5
        q_BKGTH = q_BTNH.reshape(batch, num_new, num_kv, group, head_dim).transpose(0, 2, 3, 1, 4)
        out_BKGTH, cache_kv = attend(cfg, q_BKGTH, k_BKTH, v_BKTH, cache_kv, layer,
                                     cache_lengths_B, positions_BT, new_mask_BTT,
                                     key_positions_BS, window, scale)
        out_BTKGH = out_BKGTH.transpose(0, 3, 1, 2, 4)
        out_BTD = self.o_proj(out_BTKGH.reshape(batch, num_new, cfg.num_heads * head_dim))
        return out_BTD, cache_kv


def _identity_keys_values(stored_keys, stored_values):
    return stored_keys, stored_values


def attend(cfg: TransformerConfig, q_BKGTH: Array, new_keys_BKTX: Array, new_values_BKTY: Array,
           cache_kv: tuple | None, layer, cache_lengths_B: Array | None, positions_BT: Array,
           new_mask_BTT: Array | None, key_positions_BS: Array | None, window, scale: float,
           keys_values=_identity_keys_values, value_dim: int | None = None):
    """`(out [B, K, G, T, value_dim], cache_kv)`: the queries' attention over this layer's
    committed cache slots and the T new entries, whose stored forms `new_keys` /
    `new_values` are written into `cache_kv` (the every-layer `(keys, values)` of a
    `KVCache`, or None for a plain forward). `keys_values(stored keys, stored values) ->
    (keys, values)` turns stored entries (of the cache or new) into what the scores and the
    weighted sum read: the identity for plain attention; multi-head latent attention stores
    a latent and a rotary key, and attends to their concatenation with the latent as the
    value (`specjax_models.latent_attention`). `value_dim`: the values' width (default the
    queries')."""
    batch, num_new = positions_BT.shape
    softcap = cfg.attn_logit_softcap
    value_dim = value_dim or q_BKGTH.shape[-1]
    blocks = dict(block_size=cfg.attention_block_size, scale=scale, softcap=softcap,
                  compute_dtype=cfg.compute_dtype)
    new_keys_BKTH, new_values_BKTH = keys_values(new_keys_BKTX, new_values_BKTY)
    new_visible_BTT = _new_token_visibility(positions_BT, new_mask_BTT, window)
    read_before_write = cache_kv is not None and num_new <= READ_BEFORE_WRITE_MAX_TOKENS
    if cache_kv is None:
        state = attention.accumulate(
            attention.empty_state(q_BKGTH, value_dim),
            attention.masked_scores(q_BKGTH, new_keys_BKTH, new_visible_BTT, scale, softcap),
            new_values_BKTH, cfg.compute_dtype)
        out_BKGTH = attention.finish(state, cfg.compute_dtype)
    elif read_before_write:
        # Decoding and verification: the committed slots as the cache held them before
        # this call (so the write can happen in place afterwards), then the new tokens.
        keys_LBKSX, values_LBKSY = cache_kv
        read_block = _block_reader(keys_LBKSX, values_LBKSY, layer, keys_values)

        def committed_block(slots_S):
            visible_BS = slots_S[None, :] < cache_lengths_B[:, None]
            visible_BTS = jnp.broadcast_to(visible_BS[:, None, :],
                                           (batch, num_new, slots_S.shape[0]))
            return _within_window(visible_BTS, positions_BT, key_positions_BS, slots_S,
                                  window)

        state = attention.attend_cache(
            attention.empty_state(q_BKGTH, value_dim), q_BKGTH, read_block, committed_block,
            jnp.max(cache_lengths_B), capacity=keys_LBKSX.shape[3], **blocks)
        new_scores = attention.masked_scores(q_BKGTH, new_keys_BKTH, new_visible_BTT, scale,
                                             softcap)
        state = attention.accumulate(state, new_scores, new_values_BKTH, cfg.compute_dtype)
        out_BKGTH = attention.finish(state, cfg.compute_dtype)
    else:
        # Long inputs (a prefill): write first, then each block of queries reads the
        # blocks of the written cache its mask reaches (committed slots and the new
        # tokens up to its last visible one).
        keys_LBKSX, values_LBKSY = cache_kv
        cache_kv = (write_layer_rows(keys_LBKSX, layer, new_keys_BKTX, cache_lengths_B, 2),
                    write_layer_rows(values_LBKSY, layer, new_values_BKTY, cache_lengths_B, 2))
        reach_BT = cache_lengths_B[:, None] + attention.last_visible_new(
            new_mask_BTT, batch, num_new) + 1

        def written_block(query_t, slots_S):
            visible_BtS = attention.written_cache_visibility(
                cache_lengths_B, query_t, slots_S, num_new, new_mask_BTT)
            rows_Bt = jnp.take(positions_BT, jnp.clip(query_t, 0, num_new - 1), axis=1)
            return _within_window(visible_BtS, rows_Bt, key_positions_BS, slots_S, window)

        out_BKGTH = attention.attend_written_cache(
            q_BKGTH, _block_reader(*cache_kv, layer, keys_values), written_block, reach_BT,
            capacity=keys_LBKSX.shape[3], query_block=cfg.attention_query_block,
            value_dim=value_dim, **(blocks | {"block_size": cfg.attention_query_block}))

    if read_before_write:
        # The write offsets are made to depend on this layer's attention output (the
        # added term is always 0), which orders the in-place write after the reads of
        # the old cache. XLA cannot order a read and an in-place write that are
        # independent, and copies the whole cache every step instead (measured: plain
        # decoding of the bundled target 1.45 -> 0.77 ms/token on 2 CPU cores).
        never_B = (out_BKGTH[:, 0, 0, 0, 0] > jnp.inf).astype(cache_lengths_B.dtype)
        write_at_B = cache_lengths_B + never_B
        keys_LBKSX, values_LBKSY = cache_kv
        cache_kv = (write_layer_rows(keys_LBKSX, layer, new_keys_BKTX, write_at_B, 2),
                    write_layer_rows(values_LBKSY, layer, new_values_BKTY, write_at_B, 2))
    return out_BKGTH, cache_kv


def _new_token_visibility(positions_BT: Array, new_mask_BTT: Array | None,
                          window: Array | None) -> Array:
    """`[B, T, T]` bool: may new token t see new token u (causal unless `new_mask`)?"""
    batch, num_new = positions_BT.shape
    if new_mask_BTT is None:
        causal_TT = jnp.tril(jnp.ones((num_new, num_new), bool))
        visible_BTT = jnp.broadcast_to(causal_TT, (batch, num_new, num_new))
    else:
        visible_BTT = new_mask_BTT.astype(bool)
    if window is not None:
        distance_BTT = positions_BT[:, :, None] - positions_BT[:, None, :]
        visible_BTT = visible_BTT & (distance_BTT < window)
    return visible_BTT


def _block_reader(keys_LBKSX: Array, values_LBKSY: Array, layer,
                  keys_values=_identity_keys_values):
    """`read_block` of `specjax.lm.attention` for layer `layer` of an every-layer cache (a
    one-layer stack for unrolled models): one slice of each array, never the layer, turned
    into keys and values by `keys_values` (see `attend`)."""
    layer = 0 if keys_LBKSX.shape[0] == 1 else layer

    def read_block(start, size):
        keys, values = (jax.lax.dynamic_slice(cache, (layer, 0, 0, start, 0),
                                              (1, *cache.shape[1:3], size, cache.shape[4]))
                        for cache in (keys_LBKSX, values_LBKSY))
        return keys_values(keys[0], values[0])
    return read_block


def _within_window(visible_BTS: Array, query_positions_BT: Array, key_positions_BS: Array,
                   slots_S: Array, window: Array | None) -> Array:
    """Mask keys `window` or more positions behind the query (sliding-window layers)."""
    if window is None:
        return visible_BTS
    key_positions_BS = jnp.take(key_positions_BS, slots_S, axis=1)
    distance_BTS = query_positions_BT[:, :, None] - key_positions_BS[:, None, :]
    return visible_BTS & (distance_BTS < window)
