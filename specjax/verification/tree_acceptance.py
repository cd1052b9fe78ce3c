"""Exact acceptance of a token tree verified in ONE target forward (DESIGN.md section 6).

The walk starts at the root (the last committed token) with p = the target distribution
there. Among the current node's children, in draw order:

- a deterministic child x (top-k, argmax, copied) is accepted with probability p(x); on
  rejection p(x) is set to 0 and p renormalised, and the next sibling is tried;
- a sampled child x drawn from q (with or without replacement; q is the distribution it was
  actually drawn from, so without replacement it excludes the earlier siblings) is
  accepted with probability min(1, p(x) / q(x)); on rejection p <- norm((p - q)+)
  (recursive rejection sampling: SpecInfer, Jeon et al. 2024).

Accepting a child moves the walk there, with p = the target distribution at that node.
When no child is accepted, the next token is drawn from the current p (the correction);
at a leaf, from the target distribution there (the bonus). A deterministic child is the
sampled rule with a one-hot q, computed without building the one-hot. Nodes marked
"never accept" (lookahead, adaptive length) are verified but skipped by the walk, which
leaves p unchanged. Greedy (temperature 0) follows the target's argmax.

Every row walks its own tree at once: depth and siblings are static loops over [B, V]
arrays, float32 throughout, one uniform per node and one correction draw per row, each
from a per-row key.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Bool, Float, Int, Key

from specjax.decoding.sampling import row_keys, sample_from_probs
from specjax.trees.shapes import children_table
from specjax.verification.rejection import residual_distribution


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TreeAcceptance:
    """path int32 [B, D]: the accepted nodes, root first (-1 after the row's depth).
    num_accepted int32 [B]: accepted nodes (the path's length). next_token int32 [B]: the
    correction or bonus token."""

    path: Int[Array, "B D"]
    num_accepted: Int[Array, " B"]
    next_token: Int[Array, " B"]


def without_token(p_BV: Array, token_B: Array) -> Array:
    """p with one token zeroed and renormalised (the residual of a one-hot q); p itself
    when nothing is left (then the token had probability 1 and was never rejected)."""
    vocab = p_BV.shape[-1]
    zeroed = jnp.where(jnp.arange(vocab)[None, :] == token_B[:, None], 0.0, p_BV)
    mass = jnp.sum(zeroed, axis=-1, keepdims=True)
    return jnp.where(mass > 0, zeroed / jnp.where(mass > 0, mass, 1.0), p_BV)


def accept_tree_sampled(key_accept: Key[Array, ""], key_resample: Key[Array, ""],
                        tokens_BN: Int[Array, "B N"], parents_BN: Int[Array, "B N"],
                        p_BN1V: Float[Array, "B N+1 V"], q_BNV: Float[Array, "B N V"] | None,
                        *, max_depth: int, max_branching: int,
                        never_accept_BN: Bool[Array, "B N"] | None = None) -> TreeAcceptance:
    """Walk every row's tree (see the module docstring) with sampled target distributions.

    Args:
      tokens_BN, parents_BN: the tree (topological order, siblings in draw order).
      p_BN1V: float32 warped target distributions at the root (index 0) and at each node
        (index i + 1): what the verify forward computed.
      q_BNV: the distribution each node was drawn from, or None when every node is
        deterministic (top-k / argmax / copied).
      max_depth, max_branching: static bounds of the trees (a chain: K and 1).
      never_accept_BN: nodes verified but never accepted.
    """
    batch, num_nodes = tokens_BN.shape
    p_BN1V = p_BN1V.astype(jnp.float32)
    children_BNM = children_table(parents_BN, max_branching)
    uniform_BN = jax.vmap(lambda k: jax.random.uniform(k, (num_nodes,)))(
        row_keys(key_accept, batch))
    skip_BN = jnp.zeros((batch, num_nodes), bool) if never_accept_BN is None else never_accept_BN
    rows_B = jnp.arange(batch)

    def visit(depth, carry):
        node_B, p_BV, stopped_B, path_BD = carry  # node_B: input index (0 = root)
        moved_B = jnp.zeros((batch,), bool)
        next_node_B = node_B
        for rank in range(max_branching):  # siblings in draw order; static
            child_B = children_BNM[rows_B, node_B, rank]
            safe_B = jnp.maximum(child_B, 0)
            candidate_B = (child_B >= 0) & ~stopped_B & ~moved_B & ~skip_BN[rows_B, safe_B]
            token_B = tokens_BN[rows_B, safe_B]
            p_x_B = p_BV[rows_B, token_B]
            if q_BNV is None:
                accept_B = uniform_BN[rows_B, safe_B] < p_x_B
                residual_BV = without_token(p_BV, token_B)
            else:
                q_BV = q_BNV[rows_B, safe_B].astype(jnp.float32)
                accept_B = uniform_BN[rows_B, safe_B] * q_BV[rows_B, token_B] < p_x_B
                residual_BV = residual_distribution(p_BV, q_BV)
            accepted_B = candidate_B & accept_B
            rejected_B = candidate_B & ~accept_B
            p_BV = jnp.where(rejected_B[:, None], residual_BV, p_BV)
            next_node_B = jnp.where(accepted_B, child_B + 1, next_node_B)
            moved_B = moved_B | accepted_B
        path_BD = path_BD.at[:, depth].set(jnp.where(moved_B, next_node_B - 1, -1))
        p_BV = jnp.where(moved_B[:, None], p_BN1V[rows_B, next_node_B], p_BV)
        return next_node_B, p_BV, stopped_B | ~moved_B, path_BD

    start = (jnp.zeros((batch,), jnp.int32), p_BN1V[:, 0], jnp.zeros((batch,), bool),
             jnp.full((batch, max_depth), -1, jnp.int32))
    _, p_BV, _, path_BD = jax.lax.fori_loop(0, max_depth, visit, start)
    num_accepted_B = jnp.sum(path_BD >= 0, axis=1).astype(jnp.int32)
    next_token_B = sample_from_probs(row_keys(key_resample, batch), p_BV)
    return TreeAcceptance(path_BD, num_accepted_B, next_token_B)


def accept_tree_greedy(tokens_BN: Int[Array, "B N"], parents_BN: Int[Array, "B N"],
                       logits_BN1V: Float[Array, "B N+1 V"], *, max_depth: int,
                       max_branching: int,
                       never_accept_BN: Bool[Array, "B N"] | None = None) -> TreeAcceptance:
    """Greedy target: from the root, move to the first child (in draw order) whose token is
    the target's argmax at the current node; the next token is the argmax where no child
    matches. The sampled rule with one-hot p, decided at trace time with no draws."""
    batch, num_nodes = tokens_BN.shape
    argmax_BN1 = jnp.argmax(logits_BN1V, axis=-1).astype(jnp.int32)
    children_BNM = children_table(parents_BN, max_branching)
    skip_BN = jnp.zeros((batch, num_nodes), bool) if never_accept_BN is None else never_accept_BN
    rows_B = jnp.arange(batch)

    def visit(depth, carry):
        node_B, stopped_B, path_BD = carry
        target_B = argmax_BN1[rows_B, node_B]
        moved_B = jnp.zeros((batch,), bool)
        next_node_B = node_B
        for rank in range(max_branching):
            child_B = children_BNM[rows_B, node_B, rank]
            safe_B = jnp.maximum(child_B, 0)
            match_B = ((child_B >= 0) & ~stopped_B & ~moved_B & ~skip_BN[rows_B, safe_B]
                       & (tokens_BN[rows_B, safe_B] == target_B))
            next_node_B = jnp.where(match_B, child_B + 1, next_node_B)
            moved_B = moved_B | match_B
        path_BD = path_BD.at[:, depth].set(jnp.where(moved_B, next_node_B - 1, -1))
        return next_node_B, stopped_B | ~moved_B, path_BD

    start = (jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), bool),
             jnp.full((batch, max_depth), -1, jnp.int32))
    node_B, _, path_BD = jax.lax.fori_loop(0, max_depth, visit, start)
    num_accepted_B = jnp.sum(path_BD >= 0, axis=1).astype(jnp.int32)
    return TreeAcceptance(path_BD, num_accepted_B, argmax_BN1[rows_B, node_B])
