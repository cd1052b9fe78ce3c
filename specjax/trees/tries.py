"""Candidate continuations merged into a token tree (a trie), inside jit, per row.

Model-free drafters find several guesses of what comes next: the n-grams a lookahead pool
keeps for the last token, the continuations a retrieval datastore or the row's own text
holds after its longest matching suffix. Verifying them as separate chains wastes the
forward on repeated prefixes and, at a sampled step, a repeated first token: after one
copy is rejected the next has p = 0. Merging them into a trie keeps one node per distinct
prefix, with distinct siblings, so every node is a real alternative.

`merge_into_trie` takes C candidate sequences of up to L tokens per row and returns the
trie's nodes in a static budget of M, ordered by how many candidates pass through each
node (its count: the frequency estimate REST and SuffixDecoding rank by), then by depth,
then by the first candidate that holds it. That order is topological (a child's count
never exceeds its parent's, and on a tie the parent is shallower), and siblings come in
decreasing frequency, the order the acceptance walk tries them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Bool, Int


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Trie:
    """M node slots per row. tokens int32 [B, M]; parents int32 [B, M] (-1: a child of the
    root, else an earlier slot); counts int32 [B, M] (candidates through the node);
    real bool [B, M] (False: an empty slot, token 0 and parent -1, for the walk to skip).
    Real nodes come first."""

    tokens: Int[Array, "B M"]
    parents: Int[Array, "B M"]
    counts: Int[Array, "B M"]
    real: Bool[Array, "B M"]

    @property
    def num_real(self) -> Array:
        return jnp.sum(self.real, axis=1).astype(jnp.int32)


def merge_into_trie(sequences_BCL: Int[Array, "B C L"], lengths_BC: Int[Array, "B C"],
                    num_nodes: int, *, min_count_B: Int[Array, " B"] | None = None,
                    max_nodes_B: Int[Array, " B"] | None = None,
                    max_branching: int | None = None) -> Trie:
    """The trie of each row's candidates (`sequences[b, c, :lengths[b, c]]`; length 0 is no
    candidate), its `num_nodes` best nodes by (count, shallower, earlier candidate).

    min_count_B: a node needs at least this many candidates through it (a frequency
      threshold; default 1). max_nodes_B: at most this many nodes for the row (a
      per-row budget under `num_nodes`; default all). Both keep the set ancestor-closed:
      a node's ancestors have counts at least its own and come before it.
    max_branching: keep only each node's best children, this many (the acceptance walk
      tries that many siblings per depth), and their subtrees.
    """
    batch, num_candidates, length = sequences_BCL.shape
    depth_L = jnp.arange(length, dtype=jnp.int32)
    valid_BCL = depth_L[None, None, :] < lengths_BC[:, :, None]
    equal_BCCL = sequences_BCL[:, :, None, :] == sequences_BCL[:, None, :, :]
    both_BCCL = valid_BCL[:, :, None, :] & valid_BCL[:, None, :, :]
    # Candidates c and c2 share the node at depth d when their first d + 1 tokens agree.
    shared_BCCL = jnp.cumprod((equal_BCCL & both_BCCL).astype(jnp.int32), axis=3) > 0
    counts_BCL = jnp.sum(shared_BCCL, axis=2).astype(jnp.int32)
    # The node of (c, d) is named by the first candidate that holds it.
    owner_BCL = jnp.argmax(shared_BCCL, axis=2).astype(jnp.int32)
    candidate_C = jnp.arange(num_candidates, dtype=jnp.int32)
    canonical_BCL = valid_BCL & (owner_BCL == candidate_C[None, :, None])
    min_count_B = jnp.ones((batch,), jnp.int32) if min_count_B is None else min_count_B
    eligible_BCL = canonical_BCL & (counts_BCL >= min_count_B[:, None, None])
    # Flat node id: c * L + d. Priority: count, then shallower, then earlier candidate.
    span = num_candidates * length
    priority_BCL = (counts_BCL * span + (length - 1 - depth_L)[None, None, :] * num_candidates
                    + (num_candidates - 1 - candidate_C)[None, :, None])
    # The parent of (c, d) is the node (owner of (c, d - 1), d - 1); -1 for the root.
    parent_owner_BCL = jnp.concatenate([jnp.zeros_like(owner_BCL[:, :, :1]),
                                        owner_BCL[:, :, :-1]], axis=2)
    parent_BCL = jnp.where(depth_L[None, None, :] > 0,
                           parent_owner_BCL * length + depth_L[None, None, :] - 1, -1)
    if max_branching is not None:
        eligible_BCL = _best_children(eligible_BCL, priority_BCL, parent_BCL, max_branching)
    priority_BF = jnp.where(eligible_BCL, priority_BCL, -1).reshape(batch, span)
    if num_nodes > span:
        priority_BF = jnp.pad(priority_BF, [(0, 0), (0, num_nodes - span)],
                              constant_values=-1)
    best_BM, chosen_BM = jax.lax.top_k(priority_BF, num_nodes)
    real_BM = best_BM >= 0
    if max_nodes_B is not None:
        real_BM = real_BM & (jnp.arange(num_nodes)[None, :] < max_nodes_B[:, None])
    chosen_BM = jnp.where(real_BM, chosen_BM, span)  # `span`: no node
    tokens_BM = sequences_BCL.reshape(batch, span)[
        jnp.arange(batch)[:, None], jnp.minimum(chosen_BM, span - 1)]
    counts_BM = counts_BCL.reshape(batch, span)[
        jnp.arange(batch)[:, None], jnp.minimum(chosen_BM, span - 1)]
    parent_flat_BM = parent_BCL.reshape(batch, span)[
        jnp.arange(batch)[:, None], jnp.minimum(chosen_BM, span - 1)]
    is_parent_BMM = (chosen_BM[:, None, :] == parent_flat_BM[:, :, None]) & real_BM[:, None, :]
    parents_BM = jnp.where(jnp.any(is_parent_BMM, axis=2),
                           jnp.argmax(is_parent_BMM, axis=2), -1).astype(jnp.int32)
    return Trie(tokens=jnp.where(real_BM, tokens_BM, 0).astype(jnp.int32),
                parents=jnp.where(real_BM, parents_BM, -1),
                counts=jnp.where(real_BM, counts_BM, 0), real=real_BM)


def _best_children(eligible_BCL: Array, priority_BCL: Array, parent_BCL: Array,
                   max_branching: int) -> Array:
    """`eligible` without the nodes that rank past `max_branching` among their siblings
    (by priority) and without their descendants."""
    batch, num_candidates, length = eligible_BCL.shape
    span = num_candidates * length
    eligible_BF = eligible_BCL.reshape(batch, span)
    priority_BF = priority_BCL.reshape(batch, span)
    parent_BF = parent_BCL.reshape(batch, span)
    siblings_BFF = ((parent_BF[:, :, None] == parent_BF[:, None, :]) & eligible_BF[:, None, :]
                    & (priority_BF[:, None, :] > priority_BF[:, :, None]))
    kept_BF = eligible_BF & (jnp.sum(siblings_BFF, axis=2) < max_branching)
    for _ in range(length - 1):  # static: a dropped node's subtree goes, one depth a pass
        parent_kept_BF = jnp.take_along_axis(kept_BF, jnp.maximum(parent_BF, 0), axis=1)
        kept_BF = kept_BF & ((parent_BF < 0) | parent_kept_BF)
    return kept_BF.reshape(batch, num_candidates, length)
