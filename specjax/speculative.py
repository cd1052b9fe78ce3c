"""Speculative decoding: draft K tokens, verify K+1 positions in ONE target forward, accept
the longest valid prefix per row with exact rejection sampling.

Invariants of `SpeculativeState` (shared with `generate`): `sequence[b, :lengths[b]]` are
row b's committed tokens (prompt, then generated); the target cache holds all of them but
the last, which is fed first in the next verify forward (`cache_lengths = lengths - 1`).
Rows advance by their own number of tokens; a batch is never advanced by the minimum.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import Bool, Int, Key

from specjax.causal_lm import CausalLM
from specjax.drafters.base import Commit, DraftContext, Proposal
from specjax.rejection import accept_greedy, accept_sampled
from specjax.sampling import SamplingConfig, probabilities


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """Static settings of a speculative step (frozen, hashable)."""

    num_draft_tokens: int
    sampling: SamplingConfig = SamplingConfig()

    def __post_init__(self):
        k = self.num_draft_tokens
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"num_draft_tokens must be an int >= 1, got {k!r}")
        object.__setattr__(self, "num_draft_tokens", int(k))
        if not isinstance(self.sampling, SamplingConfig):
            raise TypeError(f"sampling must be a SamplingConfig, got {type(self.sampling)}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SpeculativeState:
    """Everything that changes during speculative decoding (one pytree, donated).

    sequence int32 [B, S]; lengths, prompt_lengths int32 [B]; target_cache; drafter_state;
    done bool [B]; key (the one PRNG key); max_new_tokens int32 scalar and eos_ids int32
    [E] (traced: new values do not recompile; -1 entries are no EOS). Counters per row,
    int32: target_forwards, draft_forwards, proposed, checked (drafts up to and
    including the first rejection), accepted, accepted_per_position [B, K]. Last step, per row:
    step_accepted (drafts accepted), step_emitted (tokens committed). num_steps: verify
    forwards run for the batch.
    """

    sequence: Int[Array, "B S"]
    lengths: Int[Array, " B"]
    prompt_lengths: Int[Array, " B"]
    target_cache: Any
    drafter_state: Any
    done: Bool[Array, " B"]
    key: Key[Array, ""]
    max_new_tokens: Int[Array, ""]
    eos_ids: Int[Array, " E"]
    target_forwards: Int[Array, " B"]
    draft_forwards: Int[Array, " B"]
    proposed: Int[Array, " B"]
    checked: Int[Array, " B"]
    accepted: Int[Array, " B"]
    accepted_per_position: Int[Array, "B K"]
    step_accepted: Int[Array, " B"]
    step_emitted: Int[Array, " B"]
    num_steps: Int[Array, ""]

    @property
    def num_generated(self) -> Array:
        return self.lengths - self.prompt_lengths

    @property
    def num_draft_tokens(self) -> int:
        """The K this state was built for (its counters and scratch slots have that size)."""
        return self.accepted_per_position.shape[1]


def check_config_matches_state(state: SpeculativeState, config: SpeculativeConfig) -> None:
    """Refuse (at trace time) a step whose K differs from the K the state was built for:
    its per-position counters have K columns and its caches reserve K + 1 scratch slots."""
    built_for = state.num_draft_tokens
    if config.num_draft_tokens != built_for:
        raise ValueError(
            f"this SpeculativeState was built for num_draft_tokens={built_for}, but the "
            f"SpeculativeConfig asks for {config.num_draft_tokens}; step it with "
            f"SpeculativeConfig(num_draft_tokens={built_for}, ...), or build a new state with "
            f"init_speculative_state(..., num_draft_tokens={config.num_draft_tokens})")


def check_proposal(drafter, proposal, batch: int, num_draft_tokens: int,
                   vocab_size: int) -> None:
    """Refuse (at trace time) a proposal that breaks the drafter contract, naming the
    drafter, the field and the expected shape."""
    name = type(drafter).__name__
    if not isinstance(proposal, Proposal):
        raise TypeError(f"{name}.propose must return (state, specjax.drafters.Proposal), got "
                        f"{type(proposal).__name__}")
    expected = {"tokens": (batch, num_draft_tokens), "q": (batch, num_draft_tokens, vocab_size)}
    meaning = {"tokens": "int [batch, num_draft_tokens]",
               "q": "float [batch, num_draft_tokens, target vocab_size]: the distribution "
                    "each draft was drawn from, over the TARGET's vocabulary (give ids the "
                    "draft lacks probability 0)"}
    for field, shape in expected.items():
        value = getattr(proposal, field)
        if tuple(value.shape) != shape:
            raise ValueError(f"{name}.propose returned Proposal.{field} with shape "
                             f"{tuple(value.shape)}; expected {shape} ({meaning[field]})")
    if not jnp.issubdtype(proposal.tokens.dtype, jnp.integer):
        raise TypeError(f"{name}.propose returned Proposal.tokens of dtype "
                        f"{proposal.tokens.dtype}; token ids must be integers")
    if not jnp.issubdtype(proposal.q.dtype, jnp.floating):
        raise TypeError(f"{name}.propose returned Proposal.q of dtype {proposal.q.dtype}; "
                        "q must be floating-point probabilities")


def speculative_step(target: CausalLM, drafter, state: SpeculativeState,
                     config: SpeculativeConfig) -> SpeculativeState:
    """One speculative step for every row still running (pure; jit with `config` static).

    (a) the drafter proposes K tokens per row, (b) the target runs ONCE on the last
    committed token plus the K drafts, (c) acceptance for all rows and positions at once,
    (d) the correction from the residual or the bonus from p_{K+1}, (e) each row commits
    its own number of tokens (cut at EOS and max_new_tokens); both caches roll back by
    length.
    """
    check_config_matches_state(state, config)
    num_draft = config.num_draft_tokens
    sampling = config.sampling
    key, k_draft, k_accept, k_resample = jax.random.split(state.key, 4)
    active_B = ~state.done
    lengths_B = state.lengths

    drafter_state, proposal = drafter.propose(
        state.drafter_state, DraftContext(state.sequence, lengths_B), k_draft,
        num_draft_tokens=num_draft, sampling=sampling, vocab_size=target.vocab_size)
    check_proposal(drafter, proposal, lengths_B.shape[0], num_draft, target.vocab_size)
    proposal = Proposal(tokens=proposal.tokens.astype(jnp.int32), q=proposal.q)

    last_token_B = jnp.take_along_axis(state.sequence, lengths_B[:, None] - 1, axis=1)[:, 0]
    verify_tokens_BK1 = jnp.concatenate([last_token_B[:, None], proposal.tokens], axis=1)
    positions_BK1 = (lengths_B - 1)[:, None] + jnp.arange(num_draft + 1, dtype=jnp.int32)[None]
    logits_BK1V, hidden_BK1D, target_cache = target.apply(
        verify_tokens_BK1, positions_BK1, state.target_cache, lengths_B - 1)

    if sampling.greedy:
        acceptance = accept_greedy(proposal.tokens, logits_BK1V)
    else:
        acceptance = accept_sampled(k_accept, k_resample, proposal.tokens, proposal.q,
                                    probabilities(logits_BK1V, sampling))
    num_accepted_B = acceptance.num_accepted

    # Emitted block: accepted drafts, then the correction/bonus token at index n.
    index_K1 = jnp.arange(num_draft + 1, dtype=jnp.int32)[None]
    drafts_BK1 = jnp.concatenate([proposal.tokens, proposal.tokens[:, :1]], axis=1)
    emitted_BK1 = jnp.where(index_K1 < num_accepted_B[:, None], drafts_BK1,
                            acceptance.next_token[:, None])
    num_emitted_B = jnp.minimum(num_accepted_B + 1,
                                state.max_new_tokens - (lengths_B - state.prompt_lengths))
    matches_eos_BK1 = jnp.any(emitted_BK1[:, :, None] == state.eos_ids[None, None, :], axis=2)
    is_eos_BK1 = matches_eos_BK1 & (index_K1 < num_emitted_B[:, None])
    hit_eos_B = jnp.any(is_eos_BK1, axis=1)
    num_emitted_B = jnp.where(hit_eos_B, jnp.argmax(is_eos_BK1, axis=1) + 1, num_emitted_B)
    num_emitted_B = jnp.where(active_B, num_emitted_B, 0).astype(jnp.int32)

    write = lambda row_S, new_K1, start: jax.lax.dynamic_update_slice(row_S, new_K1, (start,))
    written = jax.vmap(write)(state.sequence, emitted_BK1, lengths_B)
    # Only emitted slots change; the rest of the write (and finished rows) keeps old values.
    slot_S = jnp.arange(state.sequence.shape[1], dtype=jnp.int32)[None]
    keep_new = (slot_S >= lengths_B[:, None]) & (slot_S < (lengths_B + num_emitted_B)[:, None])
    sequence = jnp.where(keep_new, written, state.sequence)
    new_lengths_B = lengths_B + num_emitted_B
    done_B = state.done | (active_B & hit_eos_B) | (
        new_lengths_B - state.prompt_lengths >= state.max_new_tokens)

    drafter_state = drafter.commit(drafter_state, Commit(
        old_lengths=lengths_B, new_lengths=new_lengths_B, num_accepted=num_accepted_B,
        sequence=sequence, target_hidden=hidden_BK1D, active=active_B))

    active_i = active_B.astype(jnp.int32)
    return SpeculativeState(
        sequence=sequence, lengths=new_lengths_B, prompt_lengths=state.prompt_lengths,
        target_cache=target_cache, drafter_state=drafter_state, done=done_B, key=key,
        max_new_tokens=state.max_new_tokens, eos_ids=state.eos_ids,
        target_forwards=state.target_forwards + active_i,
        draft_forwards=state.draft_forwards + active_i * drafter.forwards_per_step(num_draft),
        proposed=state.proposed + active_i * num_draft,
        checked=state.checked + active_i * jnp.minimum(num_accepted_B + 1, num_draft),
        accepted=state.accepted + active_i * num_accepted_B,
        accepted_per_position=state.accepted_per_position
        + (acceptance.accepted & active_B[:, None]).astype(jnp.int32),
        step_accepted=jnp.where(active_B, jnp.minimum(num_accepted_B, num_emitted_B), 0),
        step_emitted=num_emitted_B,
        num_steps=state.num_steps + jnp.any(active_B).astype(jnp.int32))


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("state",))
def jitted_step(target: CausalLM, drafter, state: SpeculativeState,
                config: SpeculativeConfig) -> SpeculativeState:
    """`speculative_step` compiled once per (shapes, config); the state is donated."""
    return speculative_step(target, drafter, state, config)


