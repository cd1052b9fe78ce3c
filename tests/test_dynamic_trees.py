"""EAGLE-2 dynamic trees: growing and reranking against a plain-Python reference."""

import heapq

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.trees.dynamic_trees import (
    ExpandedNodes,
    frontier,
    grow_dynamic_tree,
    grow_from_depth_scores,
    select_best_nodes,
)
from specjax.trees.shapes import DynamicTree, tree_depths

VOCAB = 12


def child_log_probs(table: np.ndarray, tokens, depths):
    """The synthetic draft: children's log-probabilities depend on (depth, token)."""
    return table[depths, tokens]


def reference_tree(root_lp: np.ndarray, table: np.ndarray, tree: DynamicTree):
    """EAGLE-2 for one row, written the obvious way: a pool of (score, drafting order)."""
    k = tree.top_k
    order = np.argsort(-root_lp, kind="stable")[:k]
    pool = [(float(root_lp[t]), int(t), -1, 1) for t in order]  # score, token, parent, depth
    frontier = list(range(k))
    for depth in range(1, tree.max_depth):
        candidates = []
        for parent in frontier:
            lp = table[depth, pool[parent][1]]
            for t in np.argsort(-lp, kind="stable")[:k]:
                candidates.append((np.float32(pool[parent][0]) + np.float32(lp[t]), int(t),
                                   parent, depth + 1))
        start = len(pool)
        pool.extend(candidates)
        best = heapq.nsmallest(k, range(len(candidates)), key=lambda i: -candidates[i][0])
        frontier = [start + i for i in best]
    kept = sorted(sorted(range(len(pool)), key=lambda i: (-pool[i][0], i))[:tree.num_nodes])
    where = {node: i for i, node in enumerate(kept)}
    return ([pool[i][1] for i in kept],
            [-1 if pool[i][2] < 0 else where[pool[i][2]] for i in kept])


@pytest.mark.parametrize("tree", [DynamicTree(num_nodes=10, max_depth=4, top_k=3),
                                  DynamicTree(num_nodes=5, max_depth=2, top_k=2),
                                  DynamicTree(num_nodes=4, max_depth=4, top_k=1),
                                  DynamicTree(num_nodes=20, max_depth=3, top_k=4)])
def test_grow_matches_the_reference(tree):
    rng = np.random.default_rng(0)
    batch = 3
    logits = rng.normal(size=(batch, VOCAB)).astype(np.float32) * 2
    root_lp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    table = np.asarray(jax.nn.log_softmax(
        rng.normal(size=(tree.max_depth, VOCAB, VOCAB)).astype(np.float32) * 2, axis=-1))
    seen = []

    def expand(count, nodes: ExpandedNodes, depth):
        # Inside the scan the nodes are traced: the callback sees each expansion's values.
        jax.debug.callback(lambda *values: seen.append([np.asarray(v) for v in values]),
                           nodes.tokens, nodes.parents, nodes.depths, depth, ordered=True)
        lp = jnp.asarray(table)[frontier(nodes.depths, depth, tree.top_k),
                                frontier(nodes.tokens, depth, tree.top_k)]
        return count + 1, lp

    count, tokens, parents = jax.jit(
        lambda root: grow_dynamic_tree(tree, root, expand, jnp.int32(0)))(jnp.asarray(root_lp))
    assert int(count) == tree.max_depth - 1
    width = tree.top_k * (tree.max_depth - 1)
    assert [int(depth) for *_, depth in seen] == list(range(1, tree.max_depth))
    for node_tokens, node_parents, node_depths, depth in seen:
        # The nodes handed over: a consistent tree of the top_k * depth expanded so far
        # (parents earlier, depths following them), then padding nothing attends to.
        assert node_parents.shape == (batch, width)
        real = tree.top_k * int(depth)
        assert np.all(node_parents[:, :real] < np.arange(real)[None])
        np.testing.assert_array_equal(node_depths[:, :real],
                                      tree_depths(jnp.asarray(node_parents[:, :real])))
        assert np.all(node_parents[:, real:] == -1) and np.all(node_depths[:, real:] == 0)
        assert np.all(node_tokens[:, real:] == 0)

    for row in range(batch):
        want_tokens, want_parents = reference_tree(root_lp[row], table, tree)
        np.testing.assert_array_equal(tokens[row], want_tokens)
        np.testing.assert_array_equal(parents[row], want_parents)


@pytest.mark.parametrize("depth", [2, 5, 9])
def test_the_drafter_is_traced_once_whatever_the_depth(depth):
    """The depths are one `lax.scan`: a tree of depth 9 traces (and compiles) the drafter's
    expansion once, as a tree of depth 2 does."""
    traced = []

    def expand(carry, nodes, d):
        traced.append(d)
        return carry, jnp.zeros((nodes.tokens.shape[0], 2, VOCAB))

    tree = DynamicTree(num_nodes=6, max_depth=depth, top_k=2)
    jax.jit(lambda root: grow_dynamic_tree(tree, root, expand, None)).lower(
        jnp.zeros((1, VOCAB)))
    assert len(traced) == 1


def test_depth_scores_grow_the_tree_a_parent_independent_draft_would():
    """Offset drafters (Medusa, parallel drafts): every depth-d + 1 node scored by row d of
    the scores, whatever its parent; the reference with a table that ignores the token."""
    tree = DynamicTree(num_nodes=9, max_depth=4, top_k=3)
    rng = np.random.default_rng(1)
    scores_BDV = np.asarray(jax.nn.log_softmax(
        rng.normal(size=(2, tree.max_depth, VOCAB)).astype(np.float32) * 2, axis=-1))
    tokens, parents = grow_from_depth_scores(tree, jnp.asarray(scores_BDV))
    for row in range(2):
        table = np.broadcast_to(scores_BDV[row][:, None], (tree.max_depth, VOCAB, VOCAB))
        want_tokens, want_parents = reference_tree(scores_BDV[row, 0], table, tree)
        np.testing.assert_array_equal(tokens[row], want_tokens)
        np.testing.assert_array_equal(parents[row], want_parents)


def test_ties_keep_the_parent_first():
    """A child as probable as its parent (log-probability 0) ties with it: the kept set
    must still contain every kept node's parent, with parents before children."""
    # Pool: a chain 0 -> 1 -> 2 of equal scores, and two siblings of node 0 scoring higher.
    tokens = jnp.asarray([[5, 6, 7, 8, 9]])
    parents = jnp.asarray([[-1, 0, 1, -1, -1]])
    scores = jnp.asarray([[-1.0, -1.0, -1.0, -0.5, -0.5]])
    for keep in range(1, 6):
        kept_tokens, kept_parents = select_best_nodes(tokens, parents, scores, keep)
        kept_parents = np.asarray(kept_parents[0])
        assert np.all(kept_parents < np.arange(keep))
        by_token = dict(zip(np.asarray(kept_tokens[0]).tolist(), kept_parents.tolist(),
                            strict=True))
        if 7 in by_token:
            assert 6 in by_token and 5 in by_token
        if 6 in by_token:
            assert 5 in by_token
    np.testing.assert_array_equal(select_best_nodes(tokens, parents, scores, 3)[0],
                                  [[5, 8, 9]])


def test_impossible_tokens_rank_last():
    """-inf scores (tokens the draft cannot produce) are kept only when nothing else is."""
    tokens = jnp.asarray([[1, 2, 3, 4]])
    parents = jnp.asarray([[-1, -1, 0, 0]])
    scores = jnp.asarray([[-0.1, -jnp.inf, -0.2, -jnp.inf]])
    kept, kept_parents = select_best_nodes(tokens, parents, scores, 2)
    np.testing.assert_array_equal(kept, [[1, 3]])
    np.testing.assert_array_equal(kept_parents, [[-1, 0]])


def test_budget_is_validated():
    assert DynamicTree(num_nodes=10, max_depth=4, top_k=3).pool_size == 3 + 3 * 9
    with pytest.raises(ValueError, match="exceeds the 6 nodes"):
        DynamicTree(num_nodes=7, max_depth=2, top_k=2)
    with pytest.raises(ValueError, match="top_k must be an int >= 1"):
        DynamicTree(num_nodes=4, max_depth=2, top_k=0)
    with pytest.raises(ValueError, match="num_nodes must be an int >= 1"):
        DynamicTree(num_nodes=True, max_depth=2, top_k=2)
