"""Verifying fewer drafts: the widths a step may verify, and one of several branches that
update a buffer, chosen by a traced index, in place."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array

from specjax.trees.shapes import TreeBudget


def verify_widths(drafter, config) -> tuple[int, ...]:
    """The numbers of drafts a step (`SpeculativeConfig` `config`) may verify when the
    drafter says how many of its drafts are real (`Proposal.num_real`): 0 (a one-token
    forward) or all N, or, for a drafter whose count is graded (`graded_num_real`), every
    width from 0 to K of a chain (e.g. a confidence threshold), or 0, 1, 2, 4, ... N nodes
    of a `TreeBudget` tree whose real nodes come first (retrieval). Each width is its own
    compiled target forward."""
    k = config.num_draft_tokens
    if not getattr(drafter, "graded_num_real", False):
        return (0, k)
    if config.tree is None:
        return tuple(range(k + 1))
    if isinstance(config.tree, TreeBudget):
        # A tree drafter whose count is graded puts its real nodes first, in topological
        # order, so a prefix of its nodes is a tree: widths in powers of two, then N.
        return (0,) + tuple(1 << i for i in range(k.bit_length()) if 1 << i < k) + (k,)
    return (0, k)


def run_one_of(index: Array, branches, cache):
    """`branches[index](cache)`, each branch returning `(*outputs, new_cache)`, with the
    cache updated in place.

    A `lax.switch` whose branches return the cache makes XLA copy the whole KV cache once
    or twice per step (each branch gets its own operand tuple holding the same buffer, and
    the result is copied back into the decode loop's carry: on SmolLM2 with 512 slots,
    24 MB per copy). A loop carry is updated in place, so each branch runs as a
    `while_loop` of 0 or 1 trips over `(outputs, cache)`: the chosen one runs its body
    once, the others pass the carry through untouched."""
    shapes = jax.eval_shape(branches[-1], cache)
    carry = tuple(jax.tree.map(lambda leaf: jnp.zeros(leaf.shape, leaf.dtype), shapes[:-1]))
    carry = carry + (cache,)
    for i, branch in enumerate(branches):
        def run_branch(trip_and_carry, branch=branch):
            trip, carried = trip_and_carry
            return trip + 1, tuple(branch(carried[-1]))

        def chosen_and_not_run(trip_and_carry, i=i):
            return (trip_and_carry[0] == 0) & (index == i)

        _, carry = jax.lax.while_loop(chosen_and_not_run, run_branch, (jnp.int32(0), carry))
    return carry
