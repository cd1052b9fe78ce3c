"""specjax.lm.attention: block-wise attention over a KV cache equals dense attention, reads
only the blocks that hold visible tokens, and the Transformer built on it equals its own
full forward for every mask it supports."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import build_lm

import specjax_models
from specjax.lm import attention

B, K, G, H, S = 3, 2, 2, 8, 40


def _dense(q_BKGTH, keys_BKSH, values_BKSH, visible_BTS, softcap=None):
    """Reference: one softmax over every slot (float64 on the host)."""
    q, keys, values = (np.asarray(x, np.float64) for x in (q_BKGTH, keys_BKSH, values_BKSH))
    scores = np.einsum("bkgth,bksh->bkgts", q, keys) / np.sqrt(H)
    if softcap is not None:
        scores = softcap * np.tanh(scores / softcap)
    scores = np.where(np.asarray(visible_BTS)[:, None, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights = weights / weights.sum(-1, keepdims=True)
    return np.einsum("bkgts,bksh->bkgth", weights, values)


def _inputs(seed, num_queries):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    return (normal(B, K, G, num_queries, H), normal(B, K, S, H), normal(B, K, S, H))


def _reader(keys_BKSH, values_BKSH):
    def read_block(start, size):
        return (jax.lax.dynamic_slice_in_dim(keys_BKSH, start, size, axis=2),
                jax.lax.dynamic_slice_in_dim(values_BKSH, start, size, axis=2))
    return read_block


@functools.partial(jax.jit, static_argnames=("block", "softcap"))
def _cached(q, keys, values, lengths_B, block, softcap=None):
    def committed(slots_S):
        visible_BS = slots_S[None, :] < lengths_B[:, None]
        return jnp.broadcast_to(visible_BS[:, None, :], (B, q.shape[3], slots_S.shape[0]))

    state = attention.attend_cache(attention.empty_state(q), q, _reader(keys, values),
                                   committed, jnp.max(lengths_B), capacity=S,
                                   block_size=block, scale=H ** -0.5, softcap=softcap,
                                   compute_dtype=jnp.float32)
    return attention.finish(state, jnp.float32)


# Lengths inside a block, on a block edge (8, 16 with blocks of 8), one slot, the whole
# capacity; blocks that divide the capacity, that do not (the last one starts early), and
# one larger than the cache.
@pytest.mark.parametrize("block", [1, 8, 12, 64])
@pytest.mark.parametrize("lengths", [(5, 8, 1), (16, 13, 40), (40, 40, 39)])
def test_cache_blocks_equal_dense_attention(block, lengths):
    q, keys, values = _inputs(0, 2)
    lengths_B = np.array(lengths, np.int32)
    visible = np.broadcast_to((np.arange(S)[None] < lengths_B[:, None])[:, None], (B, 2, S))
    out = _cached(q, keys, values, lengths_B, block, softcap=None)
    np.testing.assert_allclose(out, _dense(q, keys, values, visible), rtol=1e-5, atol=1e-5)
    capped = _cached(q, keys, values, lengths_B, block, softcap=1.5)
    np.testing.assert_allclose(capped, _dense(q, keys, values, visible, softcap=1.5),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [4, 8])
def test_blocks_past_the_longest_row_are_never_read(block):
    """Slots past the last block that holds a visible token are poisoned with NaN (a NaN
    value in a masked slot still poisons a dense softmax: 0 * NaN): block-wise attention
    never reads them, so the output is the clean one."""
    q, keys, values = _inputs(1, 1)
    lengths_B = np.array([3, 21, 6], np.int32)
    first_unread = -(-int(lengths_B.max()) // block) * block
    poisoned_keys, poisoned_values = keys.copy(), values.copy()
    poisoned_keys[..., first_unread:, :] = np.nan
    poisoned_values[..., first_unread:, :] = np.nan
    out = np.asarray(_cached(q, poisoned_keys, poisoned_values, lengths_B, block))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _cached(q, keys, values, lengths_B, block), rtol=1e-6,
                               atol=1e-6)


def test_a_query_that_sees_nothing_gets_zeros_not_nan():
    q, keys, values = _inputs(2, 1)
    out = _cached(q, keys, values, np.zeros(B, np.int32), 8)
    np.testing.assert_array_equal(out, np.zeros_like(out))


@pytest.mark.parametrize("query_block", [3, 4, 64])
@pytest.mark.parametrize("tree", [False, True], ids=["causal", "tree-mask"])
def test_written_cache_in_query_blocks_equals_dense(query_block, tree):
    """Many new tokens written after ragged committed prefixes: each query block reads only
    the key blocks its mask reaches; the result is the dense masked softmax."""
    num_new = 10
    q, keys, values = _inputs(3, num_new)
    lengths_B = np.array([0, 7, 30], np.int32)
    rng = np.random.default_rng(4)
    new_mask = None
    if tree:  # every node sees itself and a random subset of the earlier nodes
        new_mask = np.tril(rng.random((B, num_new, num_new)) < 0.5) | np.eye(num_new, dtype=bool)
    # The contract's mask, written out slot by slot: committed slots, then new token j at
    # slot length + j when the query may see it.
    visible = np.zeros((B, num_new, S), bool)
    for b in range(B):
        for t in range(num_new):
            visible[b, t, :lengths_B[b]] = True
            for j in range(num_new):
                if (j <= t) if new_mask is None else new_mask[b, t, j]:
                    visible[b, t, lengths_B[b] + j] = True
    reach = lengths_B[:, None] + np.asarray(attention.last_visible_new(
        None if new_mask is None else jnp.asarray(new_mask), B, num_new)) + 1

    @jax.jit
    def run(q, keys, values, lengths_B, reach):
        def visible_block(query_t, slots_S):
            return attention.written_cache_visibility(
                lengths_B, query_t, slots_S, num_new,
                None if new_mask is None else jnp.asarray(new_mask))
        return attention.attend_written_cache(
            q, _reader(keys, values), visible_block, reach, capacity=S, block_size=8,
            query_block=query_block, scale=H ** -0.5, softcap=None, compute_dtype=jnp.float32)

    np.testing.assert_allclose(run(q, keys, values, lengths_B, reach),
                               _dense(q, keys, values, visible), rtol=1e-5, atol=1e-5)


def test_last_visible_new_follows_the_mask():
    mask = np.array([[[1, 0, 0], [0, 0, 0], [1, 1, 1]]], bool)
    np.testing.assert_array_equal(attention.last_visible_new(jnp.asarray(mask), 1, 3),
                                  [[0, -1, 2]])
    np.testing.assert_array_equal(attention.last_visible_new(None, 2, 3), [[0, 1, 2]] * 2)


BLOCKED = dict(attention_block_size=8, attention_query_block=16, max_seq_len=256)


@pytest.mark.parametrize("overrides", [
    {}, {"sliding_window": 11, "sliding_layers": "even"}, {"scan_layers": True},
    {"attn_logit_softcap": 5.0},
], ids=["full", "sliding-window", "scan-layers", "softcap"])
def test_transformer_with_small_blocks_equals_its_full_forward(overrides):
    """A Transformer reading its cache in blocks of 8 slots and its queries in blocks of 16:
    ragged rows whose lengths end inside blocks and on block edges, short inputs (decode,
    verify: read before write) and long ones (write first), in a cache whose capacity is
    not a multiple of the block, give the no-cache full forward's logits."""
    lm = build_lm(2, **BLOCKED, **overrides)
    batch = 2
    sequences = np.random.default_rng(5).integers(0, lm.vocab_size, (batch, 150))
    reference = np.asarray(lm.logits(sequences.astype(np.int32)))
    apply = jax.jit(lambda lm, t, p, c, n: lm.apply(t, p, c, n))
    cache = lm.init_cache(batch, 150)
    lengths = np.zeros(batch, np.int32)
    # 3 tokens into each row, then row 0 rolls back to 1: ragged [1, 3]; then lengths
    # [8, 10] (an edge), [45, 47], [46, 48] (an edge), [117, 119].
    for chunk in [3, 7, 37, 1, 71]:
        rows = np.arange(batch)[:, None]
        cols = lengths[:, None] + np.arange(chunk)[None]
        logits, _, cache = apply(lm, sequences[rows, cols].astype(np.int32), cols, cache,
                                 lengths)
        np.testing.assert_allclose(logits, reference[rows, cols], rtol=3e-5, atol=3e-5)
        lengths = lengths + chunk if chunk != 3 else np.array([1, 3], np.int32)


@pytest.mark.parametrize("width", [5, 70], ids=["read-before-write", "write-first"])
def test_tree_masks_and_features_with_small_blocks(width):
    """A token tree (each node sees its ancestors) verified over a filled cache, with
    features of layer 0: every node's logits and features equal the full forward of its
    root-to-node path, read in blocks of 8 (the tree wider or narrower than 64 tokens
    selects the read-before-write or the write-first path)."""
    lm = build_lm(4, **BLOCKED)
    prefix = np.random.default_rng(6).integers(0, lm.vocab_size, (1, 29)).astype(np.int32)
    nodes = np.random.default_rng(7).integers(0, lm.vocab_size, (1, width)).astype(np.int32)
    rng = np.random.default_rng(8)
    parents = [-1] + [int(rng.integers(-1, node)) for node in range(1, width)]
    ancestors = np.zeros((width, width), bool)
    depth = np.zeros(width, np.int32)
    for node in range(width):
        ancestors[node, node] = True
        if parents[node] >= 0:
            ancestors[node] |= ancestors[parents[node]]
            depth[node] = depth[parents[node]] + 1
    cache = lm.init_cache(1, 110)
    positions = np.arange(29)[None]
    _, _, cache = lm.apply(prefix, positions, cache, np.zeros(1, np.int32))
    assert (width > specjax_models.transformer.READ_BEFORE_WRITE_MAX_TOKENS) == (width == 70)
    logits, hidden, _ = lm.apply(nodes, 29 + depth[None], cache, np.full(1, 29, np.int32),
                                 ancestors[None], feature_layers=(0,))
    for node in (0, width // 2, width - 1):
        path = np.concatenate([prefix[0], nodes[0, ancestors[node]]])[None]
        full_logits, full_hidden, _ = lm.apply(path, np.arange(path.shape[1])[None],
                                               lm.init_cache(1, 110), np.zeros(1, np.int32),
                                               feature_layers=(0,))
        np.testing.assert_allclose(logits[0, node], full_logits[0, -1], rtol=3e-5, atol=3e-5)
        np.testing.assert_allclose(hidden[0, node], full_hidden[0, -1], rtol=3e-5, atol=3e-5)
