"""Proposals from one forward's per-offset distributions: what every parallel drafter
(`ParallelDraft`, `ParallelEagle`) builds once its single forward has given it the
logits of the next 1..D tokens, offset d from the last committed token (offset 1 is the
next token).

- A chain: draft d is drawn from offset d's warped distribution (sampled, q_d = that
  distribution) or is its argmax (one-hot q); the drafts are independent given the
  committed text, and q_d is exactly what draft d was drawn from, so verification stays
  exact whatever rule runs. A confidence threshold offers the leading confident drafts.
- A static tree (`TreeShape`): the children of every depth-d node (the root: d = 0) come
  from offset d + 1, each parent's drawn on its own (without replacement, or top-k).
- An EAGLE-2 dynamic tree (`DynamicTree`): every frontier node at depth d is expanded from
  offset d + 1, scored along each path by those same distributions (no further forward).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import Array

from specjax.decoding.sampling import SamplingParams, draw_with_q, tree_scores
from specjax.drafters.base import Proposal, confident_drafts, token_confidence
from specjax.drafters.draft_model import draw_children, empty_tree_draws, place_children
from specjax.trees.dynamic_trees import grow_from_depth_scores
from specjax.trees.shapes import DynamicTree, TreeShape

# offset_logits(d) -> float32 [B, V] over the target's vocabulary, offset d + 1 (d >= 0).
OffsetLogits = Callable[[int], Array]


def chain_from_offsets(key: Array, offset_logits: OffsetLogits, num_draft_tokens: int,
                       sampling: SamplingParams, *, deterministic: bool,
                       min_confidence: float | None) -> Proposal:
    """K drafts, draft d + 1 from offset d + 1 (module docstring)."""
    tokens, qs, confidence = [], [], []
    for offset, offset_key in enumerate(jax.random.split(key, num_draft_tokens)):
        logits_BV = offset_logits(offset)
        token_B, q_BV = draw_with_q(offset_key, logits_BV, sampling,
                                    deterministic=deterministic)
        tokens.append(token_B)
        qs.append(q_BV)
        if min_confidence is not None:
            confidence.append(token_confidence(logits_BV, token_B))
    num_real_B = None
    if min_confidence is not None:  # static
        num_real_B = confident_drafts(jnp.stack(confidence, axis=1), min_confidence)
    return Proposal(tokens=jnp.stack(tokens, axis=1), q=jnp.stack(qs, axis=1),
                    num_real=num_real_B)


def static_tree_from_offsets(key: Array, offset_logits: OffsetLogits, tree: TreeShape,
                             sampling: SamplingParams, vocab_size: int, *,
                             deterministic: bool) -> Proposal:
    """Every node of a static tree, a depth-d parent's children from offset d + 1."""
    by_depth = {0: offset_logits(0)}  # each offset's logits built once
    batch, num_nodes = by_depth[0].shape[0], tree.num_nodes
    children_of: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children_of.setdefault(parent, []).append(node)
    depth_of = {-1: 0, **{node: d for node, d in enumerate(tree.depths)}}
    node_keys = jax.random.split(key, num_nodes + 1)
    draws = empty_tree_draws(batch, num_nodes, vocab_size, deterministic or sampling.greedy)
    for parent, nodes in children_of.items():  # static
        depth = depth_of[parent]
        if depth not in by_depth:
            by_depth[depth] = offset_logits(depth)
        draws = place_children(draws, nodes, draw_children(
            node_keys[parent + 1], by_depth[depth], len(nodes), sampling,
            deterministic=deterministic))
    tokens_BN, q_BNV, never_BN = draws
    return Proposal(tokens=tokens_BN, q=q_BNV, never_accept=never_BN)


def dynamic_tree_from_offsets(offset_logits: OffsetLogits, tree: DynamicTree,
                              sampling: SamplingParams) -> Proposal:
    """An EAGLE-2 tree per row (`specjax.trees.dynamic_trees`), a depth-d frontier expanded from
    offset d + 1."""
    scores_BDV = jnp.stack([tree_scores(offset_logits(d), sampling)
                            for d in range(tree.max_depth)], axis=1)
    tokens_BN, parents_BN = grow_from_depth_scores(tree, scores_BDV)
    return Proposal(tokens=tokens_BN, q=None, parents=parents_BN)
