"""Traversal verification of a token tree (Weng et al., "Traversal Verification for
Speculative Tree Decoding", NeurIPS 2025, arXiv 2505.12398): block verification's running
weight carried down every path, judged leaf to root.

The token rule (specjax.verification.tree_acceptance) walks down from the root and gives
up a subtree with its rejected parent. Traversal verification visits the tree in
post-order (a node's subtrees first, siblings in draw order, the node itself last) and
keeps, for each node on the current path, a weight w and a target distribution r for the
token after it:

- the root starts with w = 1 and r = the target distribution there; a node x drawn from q
  (its own q: without replacement it excludes the earlier siblings; one-hot for a
  deterministic child) starts with w_x = min(1, w r(x) / q(x)) and r = the target
  distribution at x;
- a node whose subtrees all failed is kept with probability w (its own uniform); then the
  step accepts the path to it and draws the next token from its r;
- a node that is not kept fails, and its parent absorbs the failure:
      R = sum_y (w r(y) - q(y))+,   w <- R / (R + 1 - w),   r <- normalise((w r - q)+)
  with the parent's w and r and the failed child's q; the next sibling then starts from
  them.

Why it is exact (docs/exactness.md has the proof): by induction from the leaves, a subtree
rooted at a node with weight w is kept somewhere with probability exactly w, and what it
emits (the path below the node, then a token from r, then the target's own sampling)
follows the target's distribution after the node. The update keeps that true for the rest
of the node's children: the mass a failed child did not deliver, (w r - q)+ of total R,
is owed with probability R + 1 - w of the failure. At the root w stays 1: the step always
emits. On a chain this is block verification (specjax.verification.block_verification: the same keep
probabilities, uniforms and residuals); at depth 1 it is recursive rejection sampling
(the token rule); the root's own weight never drops. Greedy rows (one-hot p) keep weight 1
along the argmax path and 0 off it, so they accept exactly the argmax matches, the first
in draw order where siblings repeat, as the token rule does.

Every quantity that decides the step is a function of the drafted tree alone: one
post-order pass of at most 2N + 1 traced steps over [B, V] arrays (float32) gives every
node its weight and r when its turn comes (`traverse` returns them all); the step draws
one uniform per node and, in the same pass, stops each row at the first node in
post-order whose uniform falls under its weight (`accept_traversal`). Nodes marked "never
accept" (lookahead, adaptive length) are left out of the walk with their subtrees and
change nothing, as in the token rule.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Bool, Float, Int, Key

from specjax.decoding.sampling import row_keys, sample_from_probs
from specjax.trees.shapes import children_table, tree_depths
from specjax.verification.tree_acceptance import TreeAcceptance, without_token


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Traversal:
    """What the post-order pass computes for the root (index 0) and every node (i + 1).

    weight float32 [B, N+1]: the probability that the node is kept when its turn comes (1
    at the root; 0 for a node never visited). residual float32 [B, N+1, V]: the next
    token's distribution if the step stops there. order int32 [B, N+1]: the node's turn in
    post-order (the root last), -1 for a node never visited."""

    weight: Float[Array, "B N+1"]
    residual: Float[Array, "B N+1 V"]
    order: Int[Array, "B N+1"]


def _failure_update(weight_B: Array, r_BV: Array, token_B: Array,
                    q_BV: Array | None) -> tuple[Array, Array]:
    """The parent's (w, r) after a child drawn from q (one-hot on `token_B` when None)
    failed: w <- R / (R + 1 - w), r <- normalise((w r - q)+). R + 1 - w is the child's
    failure probability; it is 0 only where the child could not fail (then 1 is kept)."""
    if q_BV is None:
        r_x_B = jnp.take_along_axis(r_BV, token_B[:, None], axis=1)[:, 0]
        mass_B = weight_B * (1.0 - r_x_B)
        new_r_BV = without_token(r_BV, token_B)
    else:
        excess_BV = jnp.maximum(weight_B[:, None] * r_BV - q_BV, 0.0)
        mass_B = jnp.sum(excess_BV, axis=-1)
        new_r_BV = jnp.where(mass_B[:, None] > 0,
                             excess_BV / jnp.where(mass_B > 0, mass_B, 1.0)[:, None], r_BV)
    failure_B = mass_B + (1.0 - weight_B)
    new_weight_B = jnp.where(failure_B > 0, mass_B / jnp.where(failure_B > 0, failure_B, 1.0),
                             1.0)
    return jnp.clip(new_weight_B, 0.0, 1.0), new_r_BV


def parent_inputs(parents_BN: Int[Array, "B N"]) -> Int[Array, "B N+1"]:
    """The input index (0 = the root) of each input index's parent; the root's is 0."""
    return jnp.concatenate([jnp.zeros((parents_BN.shape[0], 1), jnp.int32),
                            parents_BN.astype(jnp.int32) + 1], axis=1)


def traverse(tokens_BN: Int[Array, "B N"], parents_BN: Int[Array, "B N"],
             p_BN1V: Float[Array, "B N+1 V"], q_BNV: Float[Array, "B N V"] | None, *,
             max_depth: int, max_branching: int,
             never_accept_BN: Bool[Array, "B N"] | None = None) -> Traversal:
    """Every node's weight and residual at its turn (module docstring), per row.

    Args: as `specjax.verification.tree_acceptance.accept_tree_sampled` (q None: every node
    deterministic, one-hot q; the stack of weights and residuals has max_depth + 1
    levels). One traced step per descent or return, 2N + 1 in all.
    """
    weight_BN1, residual_BN1V, order_BN1 = _post_order(
        tokens_BN, parents_BN, p_BN1V, q_BNV, max_depth, max_branching, never_accept_BN, None)
    return Traversal(weight_BN1.at[:, 0].set(1.0), residual_BN1V, order_BN1)


def _post_order(tokens_BN, parents_BN, p_BN1V, q_BNV, max_depth: int, max_branching: int,
                never_accept_BN, uniform_BN):
    """The post-order pass. `uniform_BN` None: record every node's (weight, residual,
    turn). Given: stop each row at its first node whose uniform falls under its weight (the
    root always) and return `(stop node, its residual)`, storing nothing per node."""
    batch, num_nodes = tokens_BN.shape
    vocab = p_BN1V.shape[-1]
    p_BN1V = p_BN1V.astype(jnp.float32)
    children_BNM = children_table(parents_BN, max_branching)
    parent_of_BN1 = parent_inputs(parents_BN)  # where a return goes
    skip_BN = jnp.zeros((batch, num_nodes), bool) if never_accept_BN is None else never_accept_BN
    rows_B = jnp.arange(batch)
    rank_M = jnp.arange(max_branching)
    decide = uniform_BN is not None  # static

    def step(_, carry):
        (node_B, depth_B, finished_B, next_rank_BN1, stack_w_BD1, stack_r_BD1V, turn_B,
         records) = carry
        # The current node's next child still to visit (present and not skipped).
        children_BM = children_BNM[rows_B, node_B]
        skipped_BM = jnp.take_along_axis(skip_BN, jnp.maximum(children_BM, 0), axis=1)
        open_BM = ((children_BM >= 0) & ~skipped_BM
                   & (rank_M[None] >= next_rank_BN1[rows_B, node_B][:, None]))
        has_child_B = jnp.any(open_BM, axis=1)
        rank_B = jnp.argmax(open_BM, axis=1).astype(jnp.int32)
        child_B = jnp.maximum(children_BM[rows_B, rank_B], 0)
        descend_B = has_child_B & ~finished_B
        finish_B = ~has_child_B & ~finished_B

        w_B = stack_w_BD1[rows_B, depth_B]
        r_BV = stack_r_BD1V[rows_B, depth_B]
        # Descend: the child's weight from the current node's (w, r) and the child's q.
        token_B = tokens_BN[rows_B, child_B]
        r_x_B = r_BV[rows_B, token_B]
        q_x_B = (jnp.ones((batch,), jnp.float32) if q_BNV is None
                 else q_BNV[rows_B, child_B, token_B].astype(jnp.float32))
        child_w_B = jnp.where(q_x_B > 0,
                              jnp.minimum(1.0, w_B * r_x_B / jnp.where(q_x_B > 0, q_x_B, 1.0)),
                              0.0)
        failed_B = jnp.maximum(node_B - 1, 0)  # the finishing node, as a node index
        # Finish: the root always ends the row; another node when its uniform says so.
        kept_B = finish_B & (depth_B == 0)
        if decide:
            kept_B |= finish_B & (uniform_BN[rows_B, failed_B] < w_B)
            stop_B, stop_r_BV = records
            records = (jnp.where(kept_B, node_B, stop_B),
                       jnp.where(kept_B[:, None], r_BV, stop_r_BV))
        else:
            weight_BN1, residual_BN1V, order_BN1 = records
            records = (
                weight_BN1.at[rows_B, node_B].set(
                    jnp.where(finish_B, w_B, weight_BN1[rows_B, node_B])),
                residual_BN1V.at[rows_B, node_B].set(
                    jnp.where(finish_B[:, None], r_BV, residual_BN1V[rows_B, node_B])),
                order_BN1.at[rows_B, node_B].set(
                    jnp.where(finish_B, turn_B, order_BN1[rows_B, node_B])))
        # A node not kept fails: its parent absorbs it.
        parent_depth_B = jnp.maximum(depth_B - 1, 0)
        parent_w_B, parent_r_BV = _failure_update(
            stack_w_BD1[rows_B, parent_depth_B], stack_r_BD1V[rows_B, parent_depth_B],
            tokens_BN[rows_B, failed_B],
            None if q_BNV is None else q_BNV[rows_B, failed_B].astype(jnp.float32))
        returns_B = finish_B & ~kept_B
        # One stack write per row: the child's slot on a descent, the parent's on a return.
        slot_B = jnp.where(descend_B, depth_B + 1, parent_depth_B)
        slot_B = jnp.minimum(slot_B, max_depth)
        new_w_B = jnp.where(descend_B, child_w_B,
                            jnp.where(returns_B, parent_w_B, stack_w_BD1[rows_B, slot_B]))
        new_r_BV = jnp.where(descend_B[:, None], p_BN1V[rows_B, child_B + 1],
                             jnp.where(returns_B[:, None], parent_r_BV,
                                       stack_r_BD1V[rows_B, slot_B]))
        stack_w_BD1 = stack_w_BD1.at[rows_B, slot_B].set(new_w_B)
        stack_r_BD1V = stack_r_BD1V.at[rows_B, slot_B].set(new_r_BV)
        next_rank_BN1 = next_rank_BN1.at[rows_B, node_B].set(
            jnp.where(descend_B, rank_B + 1, next_rank_BN1[rows_B, node_B]))
        node_B = jnp.where(descend_B, child_B + 1,
                           jnp.where(returns_B, parent_of_BN1[rows_B, node_B], node_B))
        depth_B = jnp.where(descend_B, depth_B + 1, jnp.where(returns_B, depth_B - 1, depth_B))
        return (node_B, depth_B, finished_B | kept_B, next_rank_BN1, stack_w_BD1,
                stack_r_BD1V, turn_B + finish_B.astype(jnp.int32), records)

    zeros_B = jnp.zeros((batch,), jnp.int32)
    stack_w_BD1 = jnp.zeros((batch, max_depth + 1), jnp.float32).at[:, 0].set(1.0)
    stack_r_BD1V = jnp.zeros((batch, max_depth + 1, vocab), jnp.float32).at[:, 0].set(
        p_BN1V[:, 0])
    records = ((zeros_B, jnp.zeros((batch, vocab), jnp.float32)) if decide else
               (jnp.zeros((batch, num_nodes + 1), jnp.float32),
                jnp.zeros((batch, num_nodes + 1, vocab), jnp.float32),
                jnp.full((batch, num_nodes + 1), -1, jnp.int32)))
    start = (zeros_B, zeros_B, jnp.zeros((batch,), bool),
             jnp.zeros((batch, num_nodes + 1), jnp.int32), stack_w_BD1, stack_r_BD1V, zeros_B,
             records)
    return jax.lax.fori_loop(0, 2 * num_nodes + 1, step, start)[-1]


def accept_traversal(key_accept: Key[Array, ""], key_resample: Key[Array, ""],
                     tokens_BN: Int[Array, "B N"], parents_BN: Int[Array, "B N"],
                     p_BN1V: Float[Array, "B N+1 V"], q_BNV: Float[Array, "B N V"] | None, *,
                     max_depth: int, max_branching: int,
                     never_accept_BN: Bool[Array, "B N"] | None = None) -> TreeAcceptance:
    """Traversal verification of every row's tree; the arguments and the result are
    `specjax.verification.tree_acceptance.accept_tree_sampled`'s. Node i uses the i-th of
    its row's N uniforms, as position i + 1 of a chain does in
    `specjax.verification.block_verification`."""
    batch, num_nodes = tokens_BN.shape
    uniform_BN = jax.vmap(lambda k: jax.random.uniform(k, (num_nodes,)))(
        row_keys(key_accept, batch))
    stop_B, stop_r_BV = _post_order(tokens_BN, parents_BN, p_BN1V, q_BNV, max_depth,
                                    max_branching, never_accept_BN, uniform_BN)
    rows_B = jnp.arange(batch)
    depths_BN1 = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), tree_depths(parents_BN)],
                                 axis=1)
    num_accepted_B = depths_BN1[rows_B, stop_B]
    # The path, root first: climb from the stop node, writing each node at its depth.
    parent_of_BN1 = parent_inputs(parents_BN)
    path_BD = jnp.full((batch, max_depth), -1, jnp.int32)
    node_B = stop_B
    for _ in range(max_depth):  # static: one level per pass
        depth_B = depths_BN1[rows_B, node_B]
        path_BD = path_BD.at[rows_B, jnp.maximum(depth_B - 1, 0)].set(
            jnp.where(depth_B > 0, node_B - 1, path_BD[rows_B, jnp.maximum(depth_B - 1, 0)]))
        node_B = parent_of_BN1[rows_B, node_B]
    next_token_B = sample_from_probs(row_keys(key_resample, batch), stop_r_BV)
    return TreeAcceptance(path_BD, num_accepted_B, next_token_B)
