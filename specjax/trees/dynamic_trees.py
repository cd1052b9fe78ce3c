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

Shapes are static: every level has `top_k` frontier nodes and the draft is re-fed all nodes
it has expanded (k, 2k, ... tokens), each attending to its ancestors only.
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
    """The nodes a drafter must evaluate at one level, per row: `tokens`, `parents` (index
    into these nodes, -1 = the root, the last committed token) and `depths` (1 = child of
    the root), all int32 [B, F] in topological order. The last `top_k` are the frontier
    whose children are wanted."""

    tokens: Int[Array, "B F"]
    parents: Int[Array, "B F"]
    depths: Int[Array, "B F"]


# expand(carry, nodes) -> (carry, log-probabilities [B, top_k, V] of the frontier's children)
Expand = Callable[[Any, ExpandedNodes], tuple[Any, Array]]


def _gather(values_BX: Array, index_BY: Array) -> Array:
    return jnp.take_along_axis(values_BX, index_BY, axis=1)


def grow_dynamic_tree(tree: DynamicTree, root_log_probs_BV: Float[Array, "B V"],
                      expand: Expand, carry: Any) -> tuple[Any, Array, Array]:
    """Grow every row's tree (see the module docstring).

    Args:
      tree: the static budget (num_nodes, max_depth, top_k).
      root_log_probs_BV: the draft's log-probabilities of the token after the last
        committed one (-inf for tokens it cannot draw).
      expand: called once per depth 1 .. max_depth - 1 with the nodes expanded so far;
        returns the draft's log-probabilities of the children of the last `top_k` nodes.
      carry: threaded through `expand` (e.g. the draft's cache).

    Returns:
      `(carry, tokens [B, N], parents [B, N])`: the kept nodes, parents indexing them.
    """
    batch, top_k = root_log_probs_BV.shape[0], tree.top_k
    score_Bk, token_Bk = jax.lax.top_k(root_log_probs_BV.astype(jnp.float32), top_k)
    # The pool: every drafted node, by drafting order; parents index the pool.
    pool_tokens, pool_parents, pool_scores = [token_Bk], [jnp.full((batch, top_k), -1)], [score_Bk]
    pool_size = top_k
    # The expanded nodes fed to the drafter; the frontier is the last top_k of them.
    nodes = ExpandedNodes(token_Bk.astype(jnp.int32), jnp.full((batch, top_k), -1, jnp.int32),
                          jnp.ones((batch, top_k), jnp.int32))
    frontier_pool_Bk = jnp.broadcast_to(jnp.arange(top_k, dtype=jnp.int32), (batch, top_k))
    frontier_score_Bk = score_Bk
    for depth in range(1, tree.max_depth):  # static
        carry, log_probs_BkV = expand(carry, nodes)
        child_score_Bkk, child_token_Bkk = jax.lax.top_k(log_probs_BkV.astype(jnp.float32),
                                                         top_k)
        score_BK = (frontier_score_Bk[:, :, None] + child_score_Bkk).reshape(batch, -1)
        token_BK = child_token_Bkk.reshape(batch, -1).astype(jnp.int32)
        parent_pool_BK = jnp.repeat(frontier_pool_Bk, top_k, axis=1)
        pool_tokens.append(token_BK)
        pool_parents.append(parent_pool_BK)
        pool_scores.append(score_BK)
        if depth + 1 < tree.max_depth:  # the next frontier: the best top_k children
            frontier_score_Bk, pick_Bk = jax.lax.top_k(score_BK, top_k)
            fed = nodes.tokens.shape[1]
            parent_fed_BK = jnp.repeat(jnp.arange(fed - top_k, fed, dtype=jnp.int32)[None],
                                       top_k, axis=1)
            nodes = ExpandedNodes(
                jnp.concatenate([nodes.tokens, _gather(token_BK, pick_Bk)], axis=1),
                jnp.concatenate([nodes.parents, _gather(
                    jnp.broadcast_to(parent_fed_BK, token_BK.shape), pick_Bk)], axis=1),
                jnp.concatenate([nodes.depths, jnp.full((batch, top_k), depth + 1,
                                                        jnp.int32)], axis=1))
            frontier_pool_Bk = pool_size + pick_Bk.astype(jnp.int32)
        pool_size += top_k * top_k
    tokens_BP = jnp.concatenate(pool_tokens, axis=1)
    parents_BP = jnp.concatenate(pool_parents, axis=1).astype(jnp.int32)
    scores_BP = jnp.concatenate(pool_scores, axis=1)
    return (carry,) + select_best_nodes(tokens_BP, parents_BP, scores_BP, tree.num_nodes)


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
