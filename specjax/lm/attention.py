"""Attention over a KV cache whose cost follows the tokens in it, not its capacity.

A cache is a fixed-size buffer (static shapes, donated, updated in place); most of its
slots are empty for most of a request. Dense attention reads every slot and masks the
empty ones, so a step pays for the capacity. Here the cache is read in blocks of a static
size inside a loop whose trip count is the number of blocks that hold a visible token
(traced: the longest row's length), and the blocks are merged with an online softmax
(the running maximum, sum and weighted values of flash attention). Queries of a long
input (a prefill) are split into blocks too, and each query block reads only the key
blocks its mask can reach: the causal triangle, not the square.

The functions take the cache through two callables, so any layout works (the
Transformer keeps `[B, K, S, H]`; feature heads keep `[B, S, K, H]`):

- `read_block(start, size) -> (keys [B, K, size, H], values [B, K, size, H])`: slots
  `start .. start + size - 1` (one `dynamic_slice` of the cache; never a copy of it);
- `visible_block(slots [size]) -> bool [B, T, size]`: may query t of row b read each slot.

Axes: B batch, K key/value heads, G query heads per key/value head, T queries, H head
dimension, S slots. Scores and the softmax are float32; the weighted sum of values runs
in the compute dtype with float32 accumulation.

An accelerator kernel (a Pallas ragged / paged attention) replaces `attend_cache` for one
platform: it receives the same arguments, and the callers need not change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import Array

# Slots per cache block when decoding or verifying. On CPU, XLA copies a dynamically
# sliced block before the dot that reads it, so a block longer than needed costs a copy
# of its empty part: measured on SmolLM2 (2 cores, 131-163 tokens in a 4096-slot cache,
# batch 8) blocks of 64 / 128 / 256 slots decode at 1.00 / 0.93 / 0.80x the speed of a
# 256-slot cache read whole (batch 1: 0.99 / 1.01 / 0.95x).
DEFAULT_BLOCK_SIZE = 64
# Queries per block of a long input (a prefill), which reads keys in blocks of the same
# size: each block of queries reads only the key blocks its mask reaches, so the causal
# square's upper half is skipped.
DEFAULT_QUERY_BLOCK = 256

ReadBlock = Callable[[Array, int], tuple[Array, Array]]
VisibleBlock = Callable[[Array], Array]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SoftmaxState:
    """The online softmax after some key blocks: per query, the largest score so far
    (`-inf` before any visible key), the sum of `exp(score - maximum)` and the sum of
    `exp(score - maximum) * value` (all float32)."""

    maximum_BKGT: Array
    total_BKGT: Array
    weighted_BKGTH: Array


def empty_state(q_BKGTH: Array, value_dim: int | None = None) -> SoftmaxState:
    """The state before any key: attends to nothing. `value_dim`: the values' width, when
    it is not the queries' (multi-head latent attention)."""
    shape = q_BKGTH.shape[:-1]
    return SoftmaxState(jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.float32),
                        jnp.zeros(shape + (value_dim or q_BKGTH.shape[-1],), jnp.float32))


def masked_scores(q_BKGTH: Array, keys_BKSH: Array, visible_BTS: Array, scale: float,
                  softcap: float | None) -> Array:
    """Float32 scores `[B, K, G, T, S]` of the queries against the keys (scaled, soft-capped
    as Gemma 2 does), `-inf` where not visible."""
    scores_BKGTS = jnp.einsum("BKGTH,BKSH->BKGTS", q_BKGTH, keys_BKSH.astype(q_BKGTH.dtype),
                              preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        scores_BKGTS = softcap * jnp.tanh(scores_BKGTS / softcap)
    return jnp.where(visible_BTS[:, None, None], scores_BKGTS, -jnp.inf)


def accumulate(state: SoftmaxState, scores_BKGTS: Array, values_BKSH: Array,
               compute_dtype) -> SoftmaxState:
    """Merge one block of (masked) scores and its values into the online softmax."""
    maximum_BKGT = jnp.maximum(state.maximum_BKGT, jnp.max(scores_BKGTS, axis=-1))
    # A query that has seen no visible key yet keeps -inf; shifting by 0 there keeps
    # exp(-inf - shift) = 0 instead of exp(nan).
    shift_BKGT = jnp.where(jnp.isfinite(maximum_BKGT), maximum_BKGT, 0.0)
    rescale_BKGT = jnp.exp(state.maximum_BKGT - shift_BKGT)
    exp_BKGTS = jnp.exp(scores_BKGTS - shift_BKGT[..., None])
    total_BKGT = state.total_BKGT * rescale_BKGT + jnp.sum(exp_BKGTS, axis=-1)
    block_BKGTH = jnp.einsum("BKGTS,BKSH->BKGTH", exp_BKGTS.astype(compute_dtype),
                             values_BKSH.astype(compute_dtype),
                             preferred_element_type=jnp.float32)
    weighted_BKGTH = state.weighted_BKGTH * rescale_BKGT[..., None] + block_BKGTH
    return SoftmaxState(maximum_BKGT, total_BKGT, weighted_BKGTH)


def finish(state: SoftmaxState, dtype) -> Array:
    """The attention output `[B, K, G, T, H]`; a query that saw no key gets zeros."""
    total_BKGT = jnp.where(state.total_BKGT > 0, state.total_BKGT, 1.0)
    return (state.weighted_BKGTH / total_BKGT[..., None]).astype(dtype)


def num_blocks(num_slots: Array, block: int) -> Array:
    """Blocks of `block` slots that cover slots `0 .. num_slots - 1` (int32 scalar)."""
    return (jnp.asarray(num_slots, jnp.int32) + block - 1) // block


def attend_cache(state: SoftmaxState, q_BKGTH: Array, read_block: ReadBlock,
                 visible_block: VisibleBlock, num_slots: Array, *, capacity: int,
                 block_size: int, scale: float, softcap: float | None,
                 compute_dtype) -> SoftmaxState:
    """Merge cache slots `0 .. num_slots - 1` (a traced int32 scalar: the furthest slot any
    query may read, plus one) into `state`, `block_size` slots at a time, in a loop of
    `ceil(num_slots / block_size)` trips: slots beyond are never read.

    `capacity` is the cache's slot count. When it is not a multiple of the block, the last
    block starts early (a slice may not run past the buffer) and masks the slots an
    earlier block already merged.
    """
    block = min(block_size, capacity)

    def merge_block(index, state):
        start = index * block
        first = jnp.minimum(start, capacity - block)
        keys_BKbH, values_BKbH = read_block(first, block)
        slots_b = first + jnp.arange(block, dtype=jnp.int32)
        visible_BTb = visible_block(slots_b) & (slots_b >= start)[None, None, :]
        scores = masked_scores(q_BKGTH, keys_BKbH, visible_BTb, scale, softcap)
        return accumulate(state, scores, values_BKbH, compute_dtype)

    # The first block is merged outside the loop (masked if the cache is empty): most
    # steps of a short request need no other, and then no loop runs; a cache of one
    # block has no loop at all.
    state = merge_block(0, state)
    if capacity <= block:
        return state
    return jax.lax.fori_loop(1, num_blocks(num_slots, block), merge_block, state)


def last_visible_new(new_mask_BTT: Array | None, batch: int, num_new: int) -> Array:
    """`[B, T]` int32: the last new token each query may see (-1: none); causal when
    `new_mask` is None (query t sees new tokens 0..t)."""
    if new_mask_BTT is None:
        return jnp.broadcast_to(jnp.arange(num_new, dtype=jnp.int32), (batch, num_new))
    index_T = jnp.arange(num_new, dtype=jnp.int32)
    return jnp.max(jnp.where(new_mask_BTT.astype(bool), index_T[None, None, :], -1), axis=-1)


def written_cache_visibility(cache_lengths_B: Array, query_t: Array, slots_S: Array,
                             num_new: int, new_mask_BTT: Array | None) -> Array:
    """`[B, t, S]` bool, the contract's mask after a write: may query `query_t` (indices
    into the T new tokens; indices past T see nothing) read each slot? Slots below the
    row's length hold committed tokens; slot `length + j` holds new token j, visible when
    `new_mask[b, t, j]` (causal, j <= t, when None); other slots are stale."""
    batch = cache_lengths_B.shape[0]
    relative_BS = slots_S[None, :] - cache_lengths_B[:, None]
    is_new_BS = (relative_BS >= 0) & (relative_BS < num_new)
    index_BtS = jnp.broadcast_to(jnp.clip(relative_BS, 0, num_new - 1)[:, None, :],
                                 (batch, query_t.shape[0], slots_S.shape[0]))
    if new_mask_BTT is None:
        new_BtS = index_BtS <= query_t[None, :, None]
    else:
        rows_BtT = jnp.take(new_mask_BTT.astype(bool), jnp.clip(query_t, 0, num_new - 1),
                            axis=1)
        new_BtS = jnp.take_along_axis(rows_BtT, index_BtS, axis=2)
    visible_BtS = (relative_BS < 0)[:, None, :] | (is_new_BS[:, None, :] & new_BtS)
    return visible_BtS & (query_t < num_new)[None, :, None]


def attend_written_cache(q_BKGTH: Array, read_block: ReadBlock,
                         visible_block: Callable[[Array, Array], Array],
                         reach_BT: Array, *, capacity: int, block_size: int,
                         query_block: int, scale: float, softcap: float | None,
                         compute_dtype, value_dim: int | None = None) -> Array:
    """Attention of many queries (a prefill, a wide tree) over a cache that already holds
    their keys: queries in blocks of `query_block`, each reading only the slots below the
    furthest one its queries reach (`reach[b, t]`: the slot after the last one query t of
    row b may read). Returns `[B, K, G, T, value_dim]` in the queries' dtype (value_dim:
    the values' width, default the queries').

    `visible_block(query_index [Tq], slots [size]) -> bool [B, Tq, size]` masks one block
    of queries against one block of slots.
    """
    batch, kv_heads, group, num_new, head_dim = q_BKGTH.shape
    value_dim = value_dim or head_dim
    if num_new <= query_block:
        state = attend_cache(empty_state(q_BKGTH, value_dim), q_BKGTH, read_block,
                             lambda slots: visible_block(jnp.arange(num_new), slots),
                             jnp.max(reach_BT), capacity=capacity, block_size=block_size,
                             scale=scale, softcap=softcap, compute_dtype=compute_dtype)
        return finish(state, q_BKGTH.dtype)
    num_query_blocks = -(-num_new // query_block)
    padded = num_query_blocks * query_block
    # Padding queries (past T) reach nothing and are cut off below.
    q_BKGTH = jnp.pad(q_BKGTH, ((0, 0),) * 3 + ((0, padded - num_new), (0, 0)))
    reach_BT = jnp.pad(reach_BT, ((0, 0), (0, padded - num_new)))

    def one_query_block(index):
        first = index * query_block
        queries_BKGtH = jax.lax.dynamic_slice_in_dim(q_BKGTH, first, query_block, axis=3)
        query_index_t = first + jnp.arange(query_block, dtype=jnp.int32)
        reach = jnp.max(jax.lax.dynamic_slice_in_dim(reach_BT, first, query_block, axis=1))
        state = attend_cache(empty_state(queries_BKGtH, value_dim), queries_BKGtH, read_block,
                             lambda slots: visible_block(query_index_t, slots), reach,
                             capacity=capacity, block_size=block_size, scale=scale,
                             softcap=softcap, compute_dtype=compute_dtype)
        return finish(state, q_BKGTH.dtype)

    out_QBKGtH = jax.lax.map(one_query_block, jnp.arange(num_query_blocks, dtype=jnp.int32))
    out_BKGQtH = out_QBKGtH.transpose(1, 2, 3, 0, 4, 5)
    return out_BKGQtH.reshape(batch, kv_heads, group, padded, value_dim)[:, :, :, :num_new]
