"""The per-row counters a speculative step advances (DESIGN.md section 7's metrics, read by
`specjax.SpeculativeStats`).

A draft counts as proposed and as accepted only where it could become output: a chain's
drafts past the row's room (its max_new_tokens, or the EOS that ended it) are neither, so
that at a short limit the acceptance rate and tau tell the same story (a step with one
token of room verifies K drafts but can use one). A tree's proposed count stays its nodes
(depth, not a node's index, decides what fits); its accepted count is cut the same way.
The per-position counts (`accepted_per_position`, `accepted_length_counts`) stay uncut:
they describe what verification accepted at each offset, an estimate of the drafter's
per-position acceptance that a short request does not bias.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array


def advance_counters(state, verdict, offered_B: Array, num_emitted_B: Array, done_B: Array,
                     *, chain: bool, draft_forwards: int) -> dict[str, Array]:
    """The counter fields of the next `SpeculativeState`, from the state before the step,
    the step's `Verdict`, the drafts it verified per row (`offered_B` int32 [B]), the tokens
    each row emitted and the rows now done; `chain` when the proposal is a chain;
    `draft_forwards` the drafter's forwards per step."""
    active_B = ~state.done
    active_i = active_B.astype(jnp.int32)
    depth = verdict.path.shape[1]
    num_nodes = state.accepted_per_position.shape[1]
    num_accepted_B = jnp.minimum(verdict.num_accepted, num_emitted_B)
    if chain:
        room_B = state.max_new_tokens - (state.lengths - state.prompt_lengths)
        ended_B = done_B & (num_emitted_B < jnp.minimum(verdict.num_accepted + 1, room_B))
        offered_B = jnp.minimum(offered_B, jnp.where(ended_B, num_emitted_B, room_B))
    # The per-position counts describe the verification itself, uncut: an unbiased
    # estimate of each offset's acceptance whatever the token limit (DESIGN.md section 7).
    on_path_BN = jnp.any(verdict.path[:, :, None] == jnp.arange(num_nodes)[None, None, :],
                         axis=1)
    return dict(
        target_forwards=state.target_forwards + active_i,
        draft_forwards=state.draft_forwards + active_i * draft_forwards,
        proposed=state.proposed + active_i * offered_B,
        checked=state.checked + active_i * jnp.minimum(num_accepted_B + 1,
                                                       jnp.minimum(offered_B, depth)),
        accepted=state.accepted + active_i * num_accepted_B,
        accepted_per_position=state.accepted_per_position
        + (on_path_BN & active_B[:, None]).astype(jnp.int32),
        accepted_length_counts=state.accepted_length_counts
        + ((verdict.num_accepted[:, None] == jnp.arange(num_nodes + 1)[None])
           & active_B[:, None]).astype(jnp.int32),
        step_accepted=jnp.where(active_B, num_accepted_B, 0),
        step_emitted=num_emitted_B,
        num_steps=state.num_steps + jnp.any(active_B).astype(jnp.int32))
