"""EAGLE-2 dynamic draft trees (Li et al. 2024), grown per row inside jit.

Any drafter that gives log-probabilities for a set of tree nodes can grow one: the draft
model today, feature heads (EAGLE, Medusa) next. Each node's score is its cumulative draft
log-probability (the sum along its path), an estimate of the chance that the target
accepts the whole path.

1. Depth 1: the root's `top_k` most probable tokens.
2. Depth d + 1: the `top_k` best-scoring nodes of depth d (the frontier; all of them at
   depth 1) each get their `top_k` most probable children; the best `top_k` of those
   `top_k**2` children are the next frontier.
3. Rerank every drafted node (`DynamicTree.pool_size` of them) by score and keep the best
   `num_nodes`: ties go to the node drafted first, and since a child's score never exceeds
   its parent's (log-probabilities are <= 0, and float addition of a non-positive number
   never increases), every kept node's parent is kept too.

The kept nodes come out in drafting order (by depth, then frontier rank, then child rank):
a topological order with each node's siblings in descending draft probability.

Shapes are static, and one program grows a tree of any depth: the depths are a
`lax.scan`, each expansion feeding the drafter a buffer of the widest feed's size,
`top_k * (max_depth - 1)` nodes, of which the first `top_k * depth` are the expanded ones
(in drafting order, each attending to its ancestors only) and the rest padding no real
node attends to (parent -1, depth 0). The frontier whose children are wanted is the
buffer's nodes `top_k * (depth - 1) .. top_k * depth` (`frontier`). Compile time no
longer grows with the depth (EAGLE's head on the bundled target: 3.6 s at depth 2 and
9.9 s at depth 8 when each depth was unrolled); a shallow expansion feeds more padding
than it did, which a memory-bound accelerator does not notice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Float, Int

from specjax.trees.shapes import DynamicTree


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ExpandedNodes:
    """The nodes a drafter evaluates at one expansion, per row, at the fixed width F =
    top_k * (max_depth - 1): `tokens`, `parents` (index into these nodes, -1 = the root,
    the last committed token) and `depths` (1 = child of the root), all int32 [B, F] in
    topological order. The first `top_k * depth` are the nodes expanded so far; the rest
    are padding (parent -1, depth 0, token 0) that no real node attends to. The frontier
    whose children are wanted: `frontier(values, depth, top_k)`."""

    tokens: Int[Array, "B F"]
    parents: Int[Array, "B F"]
    depths: Int[Array, "B F"]


# expand(carry, nodes, depth) -> (carry, log-probabilities [B, top_k, V] of the children of
# the frontier of depth `depth` (int32 scalar, traced), nodes top_k*(depth-1)..top_k*depth)
Expand = Callable[[Any, ExpandedNodes, Array], tuple[Any, Array]]


def frontier(values_BF: Array, depth: Array, top_k: int) -> Array:
    """The frontier's entries of a per-node array `[B, F, ...]`: nodes `top_k * (depth -
    1)` to `top_k * depth` (the `depth` an `Expand` is handed)."""
    return jax.lax.dynamic_slice_in_dim(values_BF, (depth - 1) * top_k, top_k, axis=1)


def _gather(values_BX: Array, index_BY: Array) -> Array:
    return jnp.take_along_axis(values_BX, index_BY, axis=1)


def grow_dynamic_tree(tree: DynamicTree, root_log_probs_BV: Float[Array, "B V"],
                      expand: Expand, carry: Any) -> tuple[Any, Array, Array]:
    """Grow every row's tree (see the module docstring).

    Args:
      tree: the static budget (num_nodes, max_depth, top_k).
      root_log_probs_BV: the draft's log-probabilities of the token after the last
        committed one (-inf for tokens it cannot draw).
      expand: called for depths 1 .. max_depth - 1 (inside one `lax.scan`: traced once)
        with the nodes expanded so far (`ExpandedNodes`, fixed width) and the depth;
        returns the draft's log-probabilities of the children of that depth's frontier.
      carry: threaded through `expand` (e.g. the draft's cache); its shapes must not change.

    Returns:
      `(carry, tokens [B, N], parents [B, N])`: the kept nodes, parents indexing them.
    """
    batch, top_k = root_log_probs_BV.shape[0], tree.top_k
    score_Bk, token_Bk = jax.lax.top_k(root_log_probs_BV.astype(jnp.float32), top_k)
    token_Bk = token_Bk.astype(jnp.int32)
    root_parents_Bk = jnp.full((batch, top_k), -1, jnp.int32)
    expansions = tree.max_depth - 1
    if expansions == 0:
        return (carry,) + select_best_nodes(token_Bk, root_parents_Bk, score_Bk,
                                            tree.num_nodes)
    width = top_k * expansions
    pad = lambda values_Bk, fill: jnp.concatenate(
        [values_Bk, jnp.full((batch, width - top_k), fill, jnp.int32)], axis=1)
    nodes = ExpandedNodes(pad(token_Bk, 0), pad(root_parents_Bk, -1),
                          pad(jnp.ones((batch, top_k), jnp.int32), 0))
    # The frontier by its place in the pool (every drafted node, in drafting order: the
    # root's top_k, then top_k * top_k children per expansion) and by its score.
    frontier_pool_Bk = jnp.broadcast_to(jnp.arange(top_k, dtype=jnp.int32), (batch, top_k))

    def one_depth(loop, depth):
        carry, nodes, frontier_pool_Bk, frontier_score_Bk = loop
        carry, log_probs_BkV = expand(carry, nodes, depth)
        child_score_Bkk, child_token_Bkk = jax.lax.top_k(log_probs_BkV.astype(jnp.float32),
                                                         top_k)
        score_BK = (frontier_score_Bk[:, :, None] + child_score_Bkk).reshape(batch, -1)
        token_BK = child_token_Bkk.reshape(batch, -1).astype(jnp.int32)
        parent_pool_BK = jnp.repeat(frontier_pool_Bk, top_k, axis=1)
        # The next frontier: the best top_k children, appended to the fed nodes (after the
        # last expansion this writes into the buffer's last slots, which nothing reads).
        next_score_Bk, pick_Bk = jax.lax.top_k(score_BK, top_k)
        first_fed = (depth - 1) * top_k  # this frontier's place among the fed nodes
        parent_fed_BK = jnp.broadcast_to(
            jnp.repeat(first_fed + jnp.arange(top_k, dtype=jnp.int32), top_k)[None],
            token_BK.shape)
        write = lambda buffer_BF, new_Bk: jax.lax.dynamic_update_slice_in_dim(
            buffer_BF, new_Bk.astype(jnp.int32), depth * top_k, axis=1)
        nodes = ExpandedNodes(write(nodes.tokens, _gather(token_BK, pick_Bk)),
                              write(nodes.parents, _gather(parent_fed_BK, pick_Bk)),
                              write(nodes.depths, jnp.full((batch, top_k), depth + 1)))
        first_pool = top_k + (depth - 1) * top_k * top_k  # these children's pool offset
        loop = (carry, nodes, first_pool + pick_Bk.astype(jnp.int32), next_score_Bk)
        return loop, (token_BK, parent_pool_BK, score_BK)

    (carry, _, _, _), (tokens_EBK, parents_EBK, scores_EBK) = jax.lax.scan(
        one_depth, (carry, nodes, frontier_pool_Bk, score_Bk),
        jnp.arange(1, tree.max_depth, dtype=jnp.int32))
    flat = lambda values_EBK: jnp.swapaxes(values_EBK, 0, 1).reshape(batch, -1)
    tokens_BP = jnp.concatenate([token_Bk, flat(tokens_EBK)], axis=1)
    parents_BP = jnp.concatenate([root_parents_Bk, flat(parents_EBK)], axis=1)
    scores_BP = jnp.concatenate([score_Bk, flat(scores_EBK)], axis=1)
    return (carry,) + select_best_nodes(tokens_BP, parents_BP, scores_BP, tree.num_nodes)


def grow_from_depth_scores(tree: DynamicTree, scores_BDV: Float[Array, "B D V"]
                           ) -> tuple[Int[Array, "B N"], Int[Array, "B N"]]:
    """`(tokens, parents)` of a tree whose every node at depth d + 1 is scored by
    `scores_BDV[:, d]`, whatever its parent (drafters that predict offsets rather than
    continuations: Medusa's heads, parallel drafts); D >= `tree.max_depth`."""
    batch, _, vocab = scores_BDV.shape

    def expand(carry, nodes: ExpandedNodes, depth):
        scores_BV = jax.lax.dynamic_index_in_dim(scores_BDV, depth, axis=1, keepdims=False)
        return carry, jnp.broadcast_to(scores_BV[:, None], (batch, tree.top_k, vocab))

    _, tokens_BN, parents_BN = grow_dynamic_tree(tree, scores_BDV[:, 0], expand, None)
    return tokens_BN, parents_BN


def select_best_nodes(tokens_BP: Int[Array, "B P"], parents_BP: Int[Array, "B P"],
                      scores_BP: Float[Array, "B P"],
                      num_nodes: int) -> tuple[Int[Array, "B N"], Int[Array, "B N"]]:
    """Keep the `num_nodes` best-scoring nodes of each row's pool (ties: the earlier node),
    in pool order, with parents re-indexed into the kept nodes (-1 stays the root).

    The pool must be topologically ordered with scores that never increase from a parent
    to its child; then the kept set is ancestor-closed and every parent is found."""
    batch, pool = tokens_BP.shape
    index_BP = jnp.broadcast_to(jnp.arange(pool, dtype=jnp.int32), (batch, pool))
    # Sort by (-score, pool index): explicit tie-breaking, so a parent always precedes a
    # child of equal score.
    _, by_rank_BP = jax.lax.sort((-scores_BP, index_BP), dimension=1, num_keys=2)
    kept_BN = jnp.sort(by_rank_BP[:, :num_nodes], axis=1)
    parent_pool_BN = _gather(parents_BP, kept_BN)
    # Position of each parent among the kept nodes (kept_BN is sorted).
    parent_BN = jax.vmap(jnp.searchsorted)(kept_BN, parent_pool_BN).astype(jnp.int32)
    parent_BN = jnp.where(parent_pool_BN < 0, -1, parent_BN)
    return _gather(tokens_BP, kept_BN), parent_BN
