"""A Llama-family decoder in Flax NNX with an explicit multi-token KV cache.

The module honours the CausalLM contract of DESIGN.md section 3: one call takes T new
tokens per row, writes their keys/values at per-row offsets `cache_lengths[b] + t`, and
attends to the cached slots below each row's length plus the new tokens allowed by
`new_mask[B, T, T]` (causal by default). Positions are passed by the caller, independent
of cache slots, so token trees need no change here.

Rotary embeddings use the "rotate half" layout of Hugging Face checkpoints, so their
q/k projection weights load without a permutation.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from specjax import attention
from specjax.rope import apply_rotary, check_rope_scaling, inverse_frequencies

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_name(dtype) -> str:
    """The canonical name ("float32", "bfloat16", "float16") of a dtype given as a string,
    a numpy dtype or a jnp scalar type (`jnp.bfloat16`, `np.float32`)."""
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = jnp.dtype(dtype).name
        except TypeError:
            raise TypeError(f"dtype must be a string or a dtype, got {dtype!r}") from None
    if name not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(_DTYPES)} "
                         "(as a string or jnp.float32 / jnp.bfloat16 / jnp.float16)")
    return name


def _dtype(name: str):
    return _DTYPES[dtype_name(name)]


ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Static architecture of a decoder of the Llama family (frozen and hashable).

    The defaults are Llama: RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases.
    The other fields switch on what Mistral, Qwen2/3, Gemma 1/2 and GPT-2 differ by:

    head_dim: defaults to d_model // num_heads. qkv_bias / attn_out_bias / mlp_bias: biases.
    norm_type: "rms" or "layer" (LayerNorm with bias); norm_weight_offset: Gemma's
      (1 + w) RMSNorm scale (computed in float32). qk_norm: Qwen3's per-head RMSNorm of q, k.
    gated_mlp + activation: SwiGLU ("silu"), GeGLU ("gelu_tanh"), or a plain fc-act-proj
      MLP (gated_mlp=False, GPT-2). embed_scale: multiply embeddings by sqrt(d_model).
    position_embedding: "rope" or "learned" (GPT-2); rope_scaling: None,
      ("linear", factor) or ("llama3", factor, low_freq_factor, high_freq_factor,
      original_max_position_embeddings).
    query_scale: attention scale (default head_dim ** -0.5); attn_logit_softcap /
      final_logit_softcap: cap * tanh(x / cap) (Gemma 2).
    sliding_window: attend to the last `sliding_window` positions only, in the layers
      listed by sliding_layers ("all", "even": layers 0, 2, 4, ... as Gemma 2, or "none").
    sandwich_norm: Gemma 2's extra norms after attention and around the MLP.
    attention_block_size / attention_query_block: execution, not architecture: a decode
      or verify step (up to READ_BEFORE_WRITE_MAX_TOKENS new tokens) reads the KV cache in
      blocks of `attention_block_size` slots, only as many blocks as the longest row
      fills (`specjax.attention`); a longer input (a prefill) attends in square tiles of
      `attention_query_block` queries and keys, each block of queries reading only the
      key blocks its mask reaches. Any values give the same outputs up to float
      rounding; `with_attention_blocks` changes them on a loaded model.
    input_vocab_size: rows of the token embedding when they differ from the LM head's
      `vocab_size` (None: the same). A draft whose head scores a reduced vocabulary (a
      subset of its target's ids, `specjax.DraftModel(..., draft_vocab=ids)`) still reads
      every target id; the head is then untied.
    dtype / param_dtype: compute and storage dtypes ("float32", "bfloat16", "float16").
    Logits are always returned in float32.
    scan_layers: run the layers as one `lax.scan` over parameters (and a cache) stacked
      along a leading [L] axis, so tracing and compiling cost one layer whatever the depth;
      False (default) keeps one parameter array per layer and unrolls the layers. On CPU
      the scan costs a copy of each layer's weights per forward (XLA CPU cannot feed a
      matmul from a slice of the stacked array): plain decoding measured 0.66-0.69x the
      unrolled tokens/s, for a 3.8x shorter compile of SmolLM2's 30 layers
      (`benchmarks/results/compile_time_cpu.md`).
    """

    vocab_size: int
    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    max_seq_len: int
    head_dim: int | None = None
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    tie_embeddings: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    attn_out_bias: bool = False
    mlp_bias: bool = False
    norm_type: str = "rms"
    norm_weight_offset: bool = False
    qk_norm: bool = False
    gated_mlp: bool = True
    activation: str = "silu"
    embed_scale: bool = False
    position_embedding: str = "rope"
    rope_scaling: tuple | None = None
    query_scale: float | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    sliding_window: int | None = None
    sliding_layers: str = "all"
    sandwich_norm: bool = False
    scan_layers: bool = False
    input_vocab_size: int | None = None
    attention_block_size: int = attention.DEFAULT_BLOCK_SIZE
    attention_query_block: int = attention.DEFAULT_QUERY_BLOCK

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "num_kv_heads",
                     "d_ff", "max_seq_len", "attention_block_size", "attention_query_block"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TransformerConfig.{name} must be a positive int, got {value!r}")
        if self.input_vocab_size is not None:
            if not isinstance(self.input_vocab_size, int) or self.input_vocab_size < 1:
                raise ValueError(f"TransformerConfig.input_vocab_size must be a positive int "
                                 f"or None, got {self.input_vocab_size!r}")
            if self.tie_embeddings and self.input_vocab_size != self.vocab_size:
                raise ValueError(f"tie_embeddings needs input_vocab_size "
                                 f"({self.input_vocab_size}) == vocab_size ({self.vocab_size}): "
                                 "a tied head scores every embedded id; untie it")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model ({self.d_model}) is not divisible by num_heads ({self.num_heads}); "
                "pass head_dim explicitly")
        if self.position_embedding not in ("rope", "learned"):
            raise ValueError(f"position_embedding must be 'rope' or 'learned', got "
                             f"{self.position_embedding!r}")
        if self.position_embedding == "rope" and self.resolved_head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got "
                             f"{self.resolved_head_dim}")
        if self.norm_type not in ("rms", "layer"):
            raise ValueError(f"norm_type must be 'rms' or 'layer', got {self.norm_type!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got "
                             f"{self.activation!r}")
        if self.sliding_layers not in ("all", "even", "none"):
            raise ValueError(f"sliding_layers must be 'all', 'even' or 'none', got "
                             f"{self.sliding_layers!r}")
        check_rope_scaling(self.rope_scaling)
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"scan_layers must be a bool, got {self.scan_layers!r}")
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        object.__setattr__(self, "param_dtype", dtype_name(self.param_dtype))

    @property
    def embedding_rows(self) -> int:
        return self.vocab_size if self.input_vocab_size is None else self.input_vocab_size

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def compute_dtype(self):
        return _dtype(self.dtype)

    @property
    def storage_dtype(self):
        return _dtype(self.param_dtype)

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of layer `layer` (None: full attention)."""
        if self.sliding_window is None or self.sliding_layers == "none":
            return None
        if self.sliding_layers == "even" and layer % 2:
            return None
        return self.sliding_window


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Fixed-size key/value cache: keys and values `[B, num_kv_heads, S, head_dim]` per
    layer (a tuple of L arrays), or, for a model with
    `scan_layers`, every layer in one array (`[L, B, ...]`, scanned over with the
    layers); and the position of the token in every slot (`positions` int32 [B, S], for
    sliding-window masks: with token trees, positions and slots differ).

    The cache holds no lengths: the caller keeps `cache_lengths[B]`, and rolling back is
    keeping an older length. Slots at or beyond a row's length are masked and later
    overwritten, never erased.
    """

    keys: Array | tuple[Array, ...]
    values: Array | tuple[Array, ...]
    positions: Array

    @property
    def max_len(self) -> int:
        return self.positions.shape[1]

    @property
    def num_layers(self) -> int:
        return len(self.keys) if isinstance(self.keys, tuple) else self.keys.shape[0]

    def compact(self, start_B: Array, sources_BD: Array) -> KVCache:
        """Copy slot `sources[b, d]` to slot `start[b] + d`, in every layer and in the
        positions: after a token-tree verify, the accepted path's entries move to the
        contiguous slots that follow the committed ones. Sources are never below their
        destinations (a path's nodes come in topological order), so gathering everything
        first and writing after is safe. Entries past a row's accepted path are copied too
        and stay masked (they lie beyond its length)."""
        slots = self.max_len
        sources_BD = jnp.clip(sources_BD, 0, slots - 1).astype(jnp.int32)

        def move(cache_BXS: Array, slot_axis: int) -> Array:
            shape = list(cache_BXS.shape)
            shape[slot_axis] = sources_BD.shape[1]
            gather = jnp.broadcast_to(
                jnp.moveaxis(sources_BD.reshape(sources_BD.shape + (1,) * (cache_BXS.ndim - 2)),
                             1, slot_axis), shape)
            moved = jnp.take_along_axis(cache_BXS, gather, axis=slot_axis)

            def write(row, new, start):
                offsets = [0] * row.ndim
                offsets[slot_axis - 1] = start
                return jax.lax.dynamic_update_slice(row, new, offsets)

            return jax.vmap(write)(cache_BXS, moved, start_B.astype(jnp.int32))

        def every_layer(cache, slot_axis):
            if isinstance(cache, tuple):
                return tuple(move(c, slot_axis) for c in cache)
            return jax.vmap(lambda c: move(c, slot_axis))(cache)

        return KVCache(keys=every_layer(self.keys, 2), values=every_layer(self.values, 2),
                       positions=move(self.positions, 1))

    @classmethod
    def create(cls, config: TransformerConfig, batch: int, max_len: int) -> KVCache:
        # Slots outside head_dim: attention reads the cache one block of slots at a time
        # (`specjax.attention`), and a block is then one contiguous run of memory per row
        # and head (with slots innermost, a block of a long cache is head_dim short runs
        # far apart: measured 0.75-0.85x the decode speed at batch 8 of SmolLM2 in 4096-
        # and 8192-slot caches against 256).
        layers, kv, head_dim = config.num_layers, config.num_kv_heads, config.resolved_head_dim
        keys_shape = values_shape = (batch, kv, max_len, head_dim)
        positions = jnp.zeros((batch, max_len), jnp.int32)
        if config.scan_layers:
            return cls(keys=jnp.zeros((layers,) + keys_shape, config.compute_dtype),
                       values=jnp.zeros((layers,) + values_shape, config.compute_dtype),
                       positions=positions)
        return cls(keys=tuple(jnp.zeros(keys_shape, config.compute_dtype)
                              for _ in range(layers)),
                   values=tuple(jnp.zeros(values_shape, config.compute_dtype)
                                for _ in range(layers)),
                   positions=positions)


def rotary_inverse_frequencies(config: TransformerConfig) -> Array:
    """`[head_dim // 2]` float32 inverse frequencies of this model (`specjax.rope`)."""
    return inverse_frequencies(config.resolved_head_dim, config.rope_theta,
                               config.rope_scaling)


def _softcap(x: Array, cap: float | None) -> Array:
    return x if cap is None else cap * jnp.tanh(x / cap)


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


# Inputs up to this many tokens (decoding, verifying drafts or a token tree) read the cache
# before writing to it, in two segments; longer ones (prefills) write first and read once.
READ_BEFORE_WRITE_MAX_TOKENS = 64


def _write_rows(cache_B, new_B, starts_B: Array, slot_axis: int = 1) -> Array:
    """Write each row's T new entries at its own offset along `slot_axis` (in place under jit).

    `cache_B` and `new_B` have the batch on axis 0 and agree on every axis but `slot_axis`.
    """
    if cache_B.shape[0] == 1:
        # One row: a plain dynamic_update_slice. The batched form lowers to a scatter
        # that XLA CPU runs as ~4 kernels per write (index checks, a select, the write).
        index = tuple(starts_B[0] if axis == slot_axis else 0 for axis in range(cache_B.ndim))
        return jax.lax.dynamic_update_slice(cache_B, new_B.astype(cache_B.dtype), index)

    def write_one(row, new, start):
        index = tuple(start if axis == slot_axis - 1 else 0 for axis in range(row.ndim))
        return jax.lax.dynamic_update_slice(row, new.astype(row.dtype), index)
    return jax.vmap(write_one)(cache_B, new_B, starts_B)


def _write_layer_rows(cache_LB, layer: Array, new_B, starts_B: Array, slot_axis: int) -> Array:
    """`_write_rows` into layer `layer` (traced) of an every-layer cache `[L, B, ...]`:
    only the T new entries per row are written (in place under jit), never the layer."""
    if cache_LB.shape[1] == 1:
        index = tuple(layer if axis == 0 else starts_B[0] if axis == slot_axis + 1 else 0
                      for axis in range(cache_LB.ndim))
        return jax.lax.dynamic_update_slice(cache_LB, new_B[None].astype(cache_LB.dtype), index)

    def write_one(stack, new, start):  # stack [L, ...] of one row
        index = tuple(layer if axis == 0 else start if axis == slot_axis else 0
                      for axis in range(stack.ndim))
        return jax.lax.dynamic_update_slice(stack, new[None].astype(stack.dtype), index)
    return jax.vmap(write_one, in_axes=(1, 0, 0), out_axes=1)(cache_LB, new_B, starts_B)


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
            self.q_norm = RMSNorm(head_dim, eps=config.rms_norm_eps, dtype=config.compute_dtype,
                                  param_dtype=config.storage_dtype)
            self.k_norm = RMSNorm(head_dim, eps=config.rms_norm_eps, dtype=config.compute_dtype,
                                  param_dtype=config.storage_dtype)

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
        q_BTNH = self.q_proj(x_BTD).reshape(batch, num_new, cfg.num_heads, head_dim)
        k_BTKH = self.k_proj(x_BTD).reshape(batch, num_new, num_kv, head_dim)
        v_BTKH = self.v_proj(x_BTD).reshape(batch, num_new, num_kv, head_dim)
        if cfg.qk_norm:
            q_BTNH, k_BTKH = self.q_norm(q_BTNH), self.k_norm(k_BTKH)
        if cfg.position_embedding == "rope":
            inv_freq = rotary_inverse_frequencies(cfg)
            q_BTNH = apply_rotary(q_BTNH, positions_BT, inv_freq)
            k_BTKH = apply_rotary(k_BTKH, positions_BT, inv_freq)

        k_BKTH = k_BTKH.transpose(0, 2, 1, 3)
        v_BKTH = v_BTKH.transpose(0, 2, 1, 3)
        scale = cfg.query_scale if cfg.query_scale is not None else head_dim ** -0.5
        q_BKGTH = q_BTNH.reshape(batch, num_new, num_kv, group, head_dim).transpose(0, 2, 3, 1, 4)
        blocks = dict(block_size=cfg.attention_block_size, scale=scale,
                      softcap=cfg.attn_logit_softcap, compute_dtype=cfg.compute_dtype)
        read_before_write = cache_kv is not None and num_new <= READ_BEFORE_WRITE_MAX_TOKENS
        if cache_kv is None:
            state = attention.accumulate(
                attention.empty_state(q_BKGTH),
                attention.masked_scores(q_BKGTH, k_BKTH,
                                        self._new_token_visibility(positions_BT, new_mask_BTT,
                                                                   window),
                                        scale, cfg.attn_logit_softcap),
                v_BKTH, cfg.compute_dtype)
            out_BKGTH = attention.finish(state, cfg.compute_dtype)
        elif read_before_write:
            # Decoding and verification: the committed slots as the cache held them before
            # this call (so the write can happen in place afterwards), then the new tokens.
            keys_LBKSH, values_LBKSH = cache_kv
            read_block = _block_reader(keys_LBKSH, values_LBKSH, layer)

            def committed_block(slots_S):
                visible_BS = slots_S[None, :] < cache_lengths_B[:, None]
                visible_BTS = jnp.broadcast_to(visible_BS[:, None, :],
                                               (batch, num_new, slots_S.shape[0]))
                return _within_window(visible_BTS, positions_BT, key_positions_BS, slots_S,
                                      window)

            state = attention.attend_cache(
                attention.empty_state(q_BKGTH), q_BKGTH, read_block, committed_block,
                jnp.max(cache_lengths_B), capacity=keys_LBKSH.shape[3], **blocks)
            new_scores = attention.masked_scores(
                q_BKGTH, k_BKTH, self._new_token_visibility(positions_BT, new_mask_BTT, window),
                scale, cfg.attn_logit_softcap)
            state = attention.accumulate(state, new_scores, v_BKTH, cfg.compute_dtype)
            out_BKGTH = attention.finish(state, cfg.compute_dtype)
        else:
            # Long inputs (a prefill): write first, then each block of queries reads the
            # blocks of the written cache its mask reaches (committed slots and the new
            # tokens up to its last visible one).
            keys_LBKSH, values_LBKSH = cache_kv
            cache_kv = (_write_layer_rows(keys_LBKSH, layer, k_BKTH, cache_lengths_B, 2),
                        _write_layer_rows(values_LBKSH, layer, v_BKTH, cache_lengths_B, 2))
            reach_BT = cache_lengths_B[:, None] + attention.last_visible_new(
                new_mask_BTT, batch, num_new) + 1

            def written_block(query_t, slots_S):
                visible_BtS = attention.written_cache_visibility(
                    cache_lengths_B, query_t, slots_S, num_new, new_mask_BTT)
                rows_Bt = jnp.take(positions_BT, jnp.clip(query_t, 0, num_new - 1), axis=1)
                return _within_window(visible_BtS, rows_Bt, key_positions_BS, slots_S, window)

            out_BKGTH = attention.attend_written_cache(
                q_BKGTH, _block_reader(*cache_kv, layer), written_block, reach_BT,
                capacity=keys_LBKSH.shape[3], query_block=cfg.attention_query_block,
                **(blocks | {"block_size": cfg.attention_query_block}))

        out_BTKGH = out_BKGTH.transpose(0, 3, 1, 2, 4)
        if read_before_write:
            # The write offsets are made to depend on this layer's attention output (the
            # added term is always 0), which orders the in-place write after the reads of
            # the old cache. XLA cannot order a read and an in-place write that are
            # independent, and copies the whole cache every step instead (measured: plain
            # decoding of the bundled target 1.45 -> 0.77 ms/token on 2 CPU cores).
            never_B = (out_BTKGH[:, 0, 0, 0, 0] > jnp.inf).astype(cache_lengths_B.dtype)
            write_at_B = cache_lengths_B + never_B
            keys_LBKSH, values_LBKSH = cache_kv
            cache_kv = (_write_layer_rows(keys_LBKSH, layer, k_BKTH, write_at_B, 2),
                        _write_layer_rows(values_LBKSH, layer, v_BKTH, write_at_B, 2))
        out_BTD = self.o_proj(out_BTKGH.reshape(batch, num_new, cfg.num_heads * head_dim))
        return out_BTD, cache_kv

    def _new_token_visibility(self, positions_BT: Array, new_mask_BTT: Array | None,
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


def _block_reader(keys_LBKSH: Array, values_LBKSH: Array, layer):
    """`read_block` of `specjax.attention` for layer `layer` of an every-layer cache (a
    one-layer stack for unrolled models): one slice of each array, never the layer."""
    layer = 0 if keys_LBKSH.shape[0] == 1 else layer

    def read_block(start, size):
        _, batch, kv, _, head_dim = keys_LBKSH.shape
        keys, values = (jax.lax.dynamic_slice(cache, (layer, 0, 0, start, 0),
                                              (1, batch, kv, size, head_dim))
                        for cache in (keys_LBKSH, values_LBKSH))
        return keys[0], values[0]
    return read_block


def _within_window(visible_BTS: Array, query_positions_BT: Array, key_positions_BS: Array,
                   slots_S: Array, window: Array | None) -> Array:
    """Mask keys `window` or more positions behind the query (sliding-window layers)."""
    if window is None:
        return visible_BTS
    key_positions_BS = jnp.take(key_positions_BS, slots_S, axis=1)
    distance_BTS = query_positions_BT[:, :, None] - key_positions_BS[:, None, :]
    return visible_BTS & (distance_BTS < window)


class MLP(nnx.Module):
    """Gated (SwiGLU / GeGLU: down(act(gate(x)) * up(x))) or plain (down(act(up(x))))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        dense = lambda n_in, n_out: nnx.Linear(
            n_in, n_out, use_bias=config.mlp_bias, dtype=config.compute_dtype,
            param_dtype=config.storage_dtype, rngs=rngs)
        self.gated = config.gated_mlp
        self.activation = ACTIVATIONS[config.activation]
        if config.gated_mlp:
            self.gate_proj = dense(config.d_model, config.d_ff)
        self.up_proj = dense(config.d_model, config.d_ff)
        self.down_proj = dense(config.d_ff, config.d_model)

    def __call__(self, x: Array) -> Array:
        if self.gated:
            return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(self.activation(self.up_proj(x)))


class Block(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.input_norm = make_norm(config)
        self.attention = Attention(config, rngs=rngs)
        self.post_attention_norm = make_norm(config)  # the pre-MLP norm, as HF names it
        self.mlp = MLP(config, rngs=rngs)
        self.sandwich = config.sandwich_norm
        if config.sandwich_norm:
            self.attn_out_norm = make_norm(config)
            self.mlp_out_norm = make_norm(config)

    def __call__(self, x_BTD, positions_BT, cache_kv, layer, cache_lengths_B, new_mask_BTT,
                 key_positions_BS, window):
        attended, cache_kv = self.attention(self.input_norm(x_BTD), positions_BT, cache_kv,
                                            layer, cache_lengths_B, new_mask_BTT,
                                            key_positions_BS, window)
        if self.sandwich:
            attended = self.attn_out_norm(attended)
        x_BTD = x_BTD + attended
        mlp_out = self.mlp(self.post_attention_norm(x_BTD))
        if self.sandwich:
            mlp_out = self.mlp_out_norm(mlp_out)
        return x_BTD + mlp_out, cache_kv


@functools.partial(jax.jit, static_argnames=("block_def", "window"))
def _unrolled_block(block_def, block_params, x_BTD, positions_BT, cache_kv, cache_lengths_B,
                    new_mask_BTT, key_positions_BS, *, window):
    """One block of an unrolled model (`cache_kv` a one-layer stack), as its own jitted
    function: every layer of a model shares the block's structure and shapes, so a forward
    traces and lowers one block instead of L (a decoder step of SmolLM2's 30 layers traced
    in 1.3 s, now a fraction of it), and XLA inlines the calls, so the compiled program
    is the unrolled one."""
    block = nnx.merge(block_def, block_params)
    return block(x_BTD, positions_BT, cache_kv, 0, cache_lengths_B, new_mask_BTT,
                 key_positions_BS, window)


class Transformer(nnx.Module):
    """Decoder-only transformer: embeddings, pre-norm blocks, final norm, LM head.

    Call: `model(tokens[B,T], positions[B,T], cache=None, cache_lengths=None, new_mask=None)
    -> (logits f32[B,T,V], hidden[B,T,D], cache)`. With `cache=None` it is a plain full
    forward over the T tokens (causal, or `new_mask`); with a `KVCache` it writes the new
    keys/values (and positions) at `cache_lengths[b] + t` and returns the updated cache.
    The caller must keep `cache_lengths[b] + T <= cache.max_len` (specjax checks this
    before tracing). `hidden` is the final-layer feature after the final norm, the input
    of the LM head.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = nnx.Embed(config.embedding_rows, config.d_model, dtype=config.compute_dtype,
                               param_dtype=config.storage_dtype, rngs=rngs)
        if config.position_embedding == "learned":
            self.position_embed = nnx.Embed(config.max_seq_len, config.d_model,
                                            dtype=config.compute_dtype,
                                            param_dtype=config.storage_dtype, rngs=rngs)
        blocks = [Block(config, rngs=rngs) for _ in range(config.num_layers)]
        if config.scan_layers:
            # One Block whose parameters carry a leading [L] axis, scanned over. Built layer
            # by layer (the same random init as separate blocks), then stacked.
            graphdef, _ = nnx.split(blocks[0])
            self.layers = nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs),
                                                           *[nnx.state(b) for b in blocks]))
        else:
            self.layers = nnx.List(blocks)
        self.final_norm = make_norm(config)
        if not config.tie_embeddings:
            self.lm_head = nnx.Linear(config.d_model, config.vocab_size, use_bias=False,
                                      dtype=config.compute_dtype,
                                      param_dtype=config.storage_dtype, rngs=rngs)

    def init_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache.create(self.config, batch, max_len)

    def compact_cache(self, cache: KVCache, start_B: Array, sources_BD: Array) -> KVCache:
        """The CausalLM contract's compaction (see `KVCache.compact`)."""
        return cache.compact(start_B, sources_BD)

    def __call__(self, tokens_BT: Array, positions_BT: Array, cache: KVCache | None = None,
                 cache_lengths_B: Array | None = None, new_mask_BTT: Array | None = None,
                 feature_layers: tuple[int, ...] = (), layers: tuple[int, ...] | None = None,
                 head: bool = True):
        """`(logits f32[B,T,V], hidden[B,T,D], cache)`. With `feature_layers` (static layer
        indices), hidden is `[B, T, F + 1, D]`: the residual stream entering each listed
        layer, then the final (normed) hidden state, from this same forward (EAGLE-3 reads
        layers 2, L // 2 and L - 3).

        `layers` (static, increasing layer indices; None: all): run only these blocks, the
        others pass the residual stream through unchanged and their cache entries are not
        touched (self-speculation drafts with the target's own weights this way, reading
        the cache the full model wrote for the layers it runs).

        `head=False`: stop after the blocks: `(None, residual stream [B, T, D], cache)`, the
        stream leaving the last block run, before the final norm and the LM head (an early
        exit: Kangaroo drafts from the stream after the first n blocks)."""
        cfg = self.config
        for layer in feature_layers:
            if not 0 <= layer < cfg.num_layers:
                raise ValueError(f"feature layer {layer} is outside [0, {cfg.num_layers})")
        if layers is not None:
            layers = tuple(layers)
            if list(layers) != sorted(set(layers)) or any(
                    not 0 <= i < cfg.num_layers for i in layers):
                raise ValueError(f"layers must be increasing indices in [0, {cfg.num_layers}),"
                                 f" got {layers}")
            if feature_layers:
                raise ValueError("feature_layers with a subset of layers is not defined: the "
                                 "residual streams then differ from the full model's")
        running = range(cfg.num_layers) if layers is None else layers
        if cache is not None and cache_lengths_B is None:
            raise ValueError("cache_lengths is required when a cache is given")
        positions_BT = positions_BT.astype(jnp.int32)
        if cache is not None:
            # Opaque lengths: with constant ones (a prefill into a fresh cache) XLA would
            # constant-fold the fully masked attention to the empty cache, seconds of
            # compile time for long caches.
            cache_lengths_B = jax.lax.optimization_barrier(cache_lengths_B)
        # Ids outside the vocabulary would read NaN rows (an out-of-range gather fills NaN),
        # and a NaN value in a masked slot still poisons attention (0 * NaN). specjax
        # refuses such ids on input; a caller's own padding reads a real row instead.
        x_BTD = self.embed(jnp.clip(tokens_BT, 0, cfg.embedding_rows - 1))
        if cfg.embed_scale:
            x_BTD = x_BTD * jnp.asarray(math.sqrt(cfg.d_model), cfg.compute_dtype)
        if cfg.position_embedding == "learned":
            x_BTD = x_BTD + self.position_embed(jnp.clip(positions_BT, 0, cfg.max_seq_len - 1))
        # Every slot's position after this call's write (for sliding windows): committed
        # slots keep theirs, the new tokens' slots get theirs, the rest are masked anyway.
        key_positions_BS = None if cache is None else _write_rows(
            cache.positions, positions_BT, cache_lengths_B)
        windows = [cfg.layer_window(i) for i in range(cfg.num_layers)]
        has_windows = any(w is not None for w in windows)

        def run_layer(block, x_BTD, cache_kv, features, layer, window):
            # The residual stream entering each requested layer (static list).
            features = tuple(jnp.where(layer == wanted, x_BTD, kept)
                             for wanted, kept in zip(feature_layers, features, strict=True))
            if cfg.scan_layers:
                x_BTD, cache_kv = block(x_BTD, positions_BT, cache_kv, layer, cache_lengths_B,
                                        new_mask_BTT, key_positions_BS, window)
            else:
                block_def, block_params = nnx.split(block)
                x_BTD, cache_kv = _unrolled_block(block_def, block_params, x_BTD, positions_BT,
                                                  cache_kv, cache_lengths_B, new_mask_BTT,
                                                  key_positions_BS, window=window)
            return x_BTD, cache_kv, features

        features = tuple(jnp.zeros_like(x_BTD) for _ in feature_layers)
        if cfg.scan_layers:
            block_def, layer_params = nnx.split(self.layers)
            no_window = jnp.iinfo(jnp.int32).max
            windows_L = jnp.asarray([no_window if w is None else w for w in windows],
                                    jnp.int32) if has_windows else None

            def scan_body(carry, layer_inputs):
                params, layer, window = layer_inputs
                return run_layer(nnx.merge(block_def, params), *carry, layer, window), None

            def subset_body(carry, layer_inputs):
                # A layer subset indexes the stacked parameters inside the loop: gathering
                # them first would copy the kept layers' weights at every call.
                layer, window = layer_inputs
                params = jax.tree.map(
                    lambda stack: jax.lax.dynamic_index_in_dim(stack, layer, keepdims=False),
                    layer_params)
                return run_layer(nnx.merge(block_def, params), *carry, layer, window), None

            cache_kv = None if cache is None else (cache.keys, cache.values)
            if layers is None:
                (x_BTD, cache_kv, features), _ = jax.lax.scan(
                    scan_body, (x_BTD, cache_kv, features),
                    (layer_params, jnp.arange(cfg.num_layers, dtype=jnp.int32), windows_L))
            elif layers:
                index_R = jnp.asarray(layers, jnp.int32)
                (x_BTD, cache_kv, features), _ = jax.lax.scan(
                    subset_body, (x_BTD, cache_kv, features),
                    (index_R, None if windows_L is None else windows_L[index_R]))
            new_kv = cache_kv
        else:
            new_keys, new_values = [], []
            for index, block in enumerate(self.layers):
                layer_kv = None if cache is None else (cache.keys[index][None],
                                                       cache.values[index][None])
                if index in running:
                    # This layer's arrays as a one-layer stack (a free reshape), so both
                    # layouts share the attention code; the write stays in place.
                    x_BTD, layer_kv, features = run_layer(block, x_BTD, layer_kv, features,
                                                          index, windows[index])
                if layer_kv is not None:
                    new_keys.append(layer_kv[0][0])
                    new_values.append(layer_kv[1][0])
            new_kv = None if cache is None else (tuple(new_keys), tuple(new_values))
        new_cache = None if cache is None else KVCache(new_kv[0], new_kv[1], key_positions_BS)
        if not head:
            if feature_layers:
                raise ValueError("head=False returns the residual stream itself; "
                                 "feature_layers is for forwards that reach the head")
            return None, x_BTD, new_cache
        hidden_BTD = self.final_norm(x_BTD)
        # The head accumulates and returns float32 even for bfloat16 models: rounding the
        # logits to bfloat16 would make exact ties common (8 bits of mantissa), and which
        # of two tied tokens argmax picks then depends on the kernel's rounding, which
        # differs between a 1-token decode step and a (K+1)-token verify.
        hidden_c = hidden_BTD.astype(cfg.compute_dtype)
        if cfg.tie_embeddings:
            logits_BTV = jnp.einsum("BTD,VD->BTV", hidden_c,
                                    self.embed.embedding[...].astype(cfg.compute_dtype),
                                    preferred_element_type=jnp.float32)
        else:
            logits_BTV = jnp.einsum("BTD,DV->BTV", hidden_c,
                                    self.lm_head.kernel[...].astype(cfg.compute_dtype),
                                    preferred_element_type=jnp.float32)
        logits_BTV = _softcap(logits_BTV.astype(jnp.float32), cfg.final_logit_softcap)
        if feature_layers:
            hidden_BTD = jnp.stack([f.astype(hidden_BTD.dtype) for f in features]
                                   + [hidden_BTD], axis=2)
        return logits_BTV, hidden_BTD, new_cache


class _ShapeOnlyKeys:
    """Stands in for `nnx.Rngs` while a module is built only for its shapes: the same key
    for every initialiser. Inside `nnx.eval_shape` each draw from a real `nnx.Rngs`
    updates its counter, and flax's update probes the traced counter in a way that costs
    the length of the whole trace so far: quadratic in the parameters (SmolLM2: 0.52 s,
    against 0.16 s with this)."""

    def __init__(self):
        self._key = jax.random.key(0)

    def params(self) -> Array:
        return self._key

    def __call__(self) -> Array:
        return self._key


def abstract_transformer(config: TransformerConfig) -> Transformer:
    """The model's structure with `jax.ShapeDtypeStruct` parameters (nothing allocated),
    for loaders to fill with real weights."""
    return nnx.eval_shape(lambda: Transformer(config, rngs=_ShapeOnlyKeys()))


def count_params(model_or_state) -> int:
    """Number of parameters of an NNX module (or of a params state / abstract state)."""
    state = model_or_state
    if isinstance(model_or_state, nnx.Module):
        state = nnx.state(model_or_state, nnx.Param)
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state))


def embedding_and_head(lm) -> tuple[Array, Array]:
    """The token embedding [V, D] and the LM head [V, D] (the embedding again when tied) of
    a Transformer (an NNX module or its `specjax.CausalLM`): what feature drafters (EAGLE,
    MTP, Medusa) share with their target. Arrays, not copies: they stay frozen."""
    params = lm.params if hasattr(lm, "apply_fn") else nnx.state(lm, nnx.Param)
    names = set(params.keys()) if hasattr(params, "keys") else set()
    if "embed" not in names:
        raise TypeError("embedding_and_head needs a specjax_models.Transformer (or its "
                        f"CausalLM); these parameters have no 'embed': {sorted(names)}")
    embedding = jnp.asarray(params["embed"]["embedding"][...])
    if "lm_head" in names:
        return embedding, jnp.asarray(params["lm_head"]["kernel"][...]).T
    return embedding, embedding


def first_layers(model, num_layers: int):
    """A shallower copy of `model`: its first `num_layers` blocks with the same embeddings,
    final norm and head (a layer-truncated draft sharing the target's tokenizer).

    `model` is a `Transformer` (returns a Transformer) or a `specjax.CausalLM` made from
    one, as `from_pretrained` and `load_checkpoint` return (returns a CausalLM).
    """
    depth = _config_of(model).num_layers
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) \
            or not 1 <= num_layers <= depth:
        raise ValueError(f"num_layers must be an int in [1, {depth}], got {num_layers!r}")
    return select_layers(model, tuple(range(num_layers)))


def select_layers(model, layers, draft_vocab=None):
    """A draft built from `model`: the blocks listed in `layers` (target layer indices, run
    in that order) with the same embeddings and final norm, and its LM head; with
    `draft_vocab` (target token ids) the head keeps only those rows, so its logits cover
    the reduced vocabulary (column j is id `draft_vocab[j]`; pair it with
    `specjax.DraftModel(draft, draft_vocab=ids)`) while the embedding still reads every
    target id (`TransformerConfig.input_vocab_size`). The starting point of a distilled
    layer draft (`specjax_models.recipes.smollm2_draft`).

    `model` is a `Transformer` (returns a Transformer) or a `specjax.CausalLM` made from
    one (returns a CausalLM). The result's config is `result.config` (a Transformer) or
    `select_layers_config(config, layers, draft_vocab)`.
    """
    import specjax
    from specjax.drafters.base import draft_vocab_ids

    if isinstance(model, specjax.CausalLM):
        return specjax.CausalLM.from_nnx(select_layers(_module_of(model), layers, draft_vocab))
    if not isinstance(model, Transformer):
        raise TypeError(f"select_layers expects a Transformer or a CausalLM, got "
                        f"{type(model).__name__}")
    source_config = model.config
    ids = None if draft_vocab is None else np.asarray(
        draft_vocab_ids(draft_vocab, source_config.vocab_size))
    config = select_layers_config(source_config, layers, ids)
    chosen = np.asarray(layers, np.int64)
    shallow = abstract_transformer(config)
    flat_source = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    updated = []
    for path, _ in nnx.to_flat_state(nnx.state(shallow, nnx.Param)):
        if path[0] == "layers" and config.scan_layers:  # stacked: pick along the [L] axis
            leaf = flat_source[path]
            leaf = leaf.replace(leaf.get_value()[chosen])
        elif path[0] == "layers":
            leaf = flat_source[("layers", int(chosen[path[1]]), *path[2:])]
        elif path == ("lm_head", "kernel") and ids is not None:
            if source_config.tie_embeddings:
                rows_VD = flat_source[("embed", "embedding")].get_value()
                leaf = flat_source[("embed", "embedding")].replace(rows_VD[ids].T)
            else:
                leaf = flat_source[path]
                leaf = leaf.replace(leaf.get_value()[:, ids])
        else:
            leaf = flat_source[path]
        updated.append((path, leaf))
    nnx.update(shallow, nnx.from_flat_state(updated))
    return shallow


def with_attention_blocks(model, block_size: int | None = None, query_block: int | None = None):
    """`model` (a `Transformer` or a `specjax.CausalLM` made from one) with other attention
    block sizes (`TransformerConfig.attention_block_size` / `attention_query_block`; None
    keeps the current one): the same parameters (no copy), other execution."""
    import specjax

    if isinstance(model, specjax.CausalLM):
        return specjax.CausalLM.from_nnx(with_attention_blocks(_module_of(model), block_size,
                                                               query_block))
    if not isinstance(model, Transformer):
        raise TypeError(f"with_attention_blocks expects a Transformer or a CausalLM, got "
                        f"{type(model).__name__}")
    changes = {name: value for name, value in (("attention_block_size", block_size),
                                                ("attention_query_block", query_block))
               if value is not None}
    config = dataclasses.replace(model.config, **changes)
    rebuilt = abstract_transformer(config)
    nnx.update(rebuilt, nnx.state(model, nnx.Param))
    return rebuilt


def select_layers_config(config: TransformerConfig, layers,
                         draft_vocab=None) -> TransformerConfig:
    """The config of `select_layers(model, layers, draft_vocab)` for a model of `config`."""
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__len__") or not len(layers) \
            or any(isinstance(i, bool) or not isinstance(i, (int, np.integer))
                   or not 0 <= i < config.num_layers for i in layers):
        raise ValueError(f"layers must be a non-empty sequence of layer indices in [0, "
                         f"{config.num_layers}), got {layers!r}")
    config = dataclasses.replace(config, num_layers=len(layers))
    if draft_vocab is None:
        return config
    return dataclasses.replace(config, vocab_size=len(draft_vocab),
                               input_vocab_size=config.embedding_rows, tie_embeddings=False)


def _config_of(model) -> TransformerConfig:
    import specjax

    if isinstance(model, specjax.CausalLM):
        return _module_of(model).config
    if isinstance(model, Transformer):
        return model.config
    raise TypeError(f"expected a Transformer or a CausalLM, got {type(model).__name__}")


def _module_of(lm):
    graphdef = getattr(lm.apply_fn, "graphdef", None)
    if graphdef is None:
        raise TypeError("this needs a CausalLM made by CausalLM.from_nnx from a "
                        "specjax_models.Transformer (as from_pretrained, from_gguf and "
                        "load_checkpoint return)")
    return nnx.merge(graphdef, lm.params)


def _flat_name(path) -> str:
    return ".".join(str(p) for p in path)


def _is_stacked(name: str) -> bool:
    """`layers.X` (every layer along a leading axis), not `layers.3.X` (one layer)."""
    parts = name.split(".")
    return parts[0] == "layers" and len(parts) > 1 and not parts[1].isdigit()


def per_layer_params(flat: dict) -> dict:
    """Parameters by per-layer name: a stacked `layers.X` of shape [L, ...] becomes
    `layers.0.X` ... `layers.{L-1}.X` (how checkpoints of other libraries name them);
    per-layer names pass through."""
    out = {}
    for name, value in flat.items():
        if _is_stacked(name):
            rest = name[len("layers."):]
            for i in range(value.shape[0]):
                out[f"layers.{i}.{rest}"] = value[i]
        else:
            out[name] = value
    return out


def _on_device(array, dtype, sharding=None) -> Array:
    """`array` as a JAX array of `dtype`, placed by `sharding` (each device receives only
    its shard) or on the default device. A host array that already has the dtype is
    copied over as it is: `jnp.asarray` would compile a conversion program per shape (a
    third of the time SmolLM2 took to load from the model cache)."""
    if sharding is not None:
        return jax.device_put(np.asarray(array).astype(np.dtype(dtype), copy=False), sharding)
    if isinstance(array, np.ndarray) and array.dtype == np.dtype(dtype):
        return jax.device_put(array)
    return jnp.asarray(array, dtype)


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
        self._leaves = {_flat_name(key): (key, leaf)
                        for key, leaf in nnx.to_flat_state(abstract_params)}
        self._buffers: dict[str, object] = {}
        self._missing: dict[str, int] = {}
        self._done: dict[str, Array] = {}

    def targets(self) -> list[tuple[str, tuple]]:
        out = []
        for name, (key, leaf) in self._leaves.items():
            shape = tuple(leaf.get_value().shape)
            if _is_stacked(name):
                rest = _flat_name(key[1:])
                out += [(f"layers.{i}.{rest}", shape[1:]) for i in range(shape[0])]
            else:
                out.append((name, shape))
        return out

    def set(self, name: str, array) -> None:
        import numpy as np

        parts = name.split(".")
        stacked, layer = name, None
        if parts[0] == "layers" and parts[1].isdigit() and name not in self._leaves:
            stacked, layer = "layers." + ".".join(parts[2:]), int(parts[1])
        if stacked not in self._leaves:
            raise KeyError(f"the model has no parameter {name}")
        shape = tuple(self._leaves[stacked][1].get_value().shape)
        want = shape if layer is None else shape[1:]
        if tuple(array.shape) != want:
            raise ValueError(f"{name} has shape {tuple(array.shape)}, expected {want}")
        if not jnp.issubdtype(array.dtype, jnp.floating):
            raise ValueError(f"{name} holds {array.dtype}, expected floats")
        if layer is None:
            self._done[stacked] = _on_device(array, self._dtype, self._where(stacked, shape))
            return
        if stacked not in self._buffers:
            self._buffers[stacked] = np.empty(shape, np.dtype(self._dtype))
            self._missing[stacked] = shape[0]
        self._buffers[stacked][layer] = np.asarray(array).astype(np.dtype(self._dtype))
        self._missing[stacked] -= 1
        if not self._missing[stacked]:  # complete: hand it to JAX, drop the host copy
            self._done[stacked] = _on_device(self._buffers.pop(stacked), self._dtype,
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
