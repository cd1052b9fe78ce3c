"""One of several branches that update a buffer, chosen by a traced index, in place."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array


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
