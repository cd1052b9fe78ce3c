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

from specjax.causal_lm import CausalLM
from specjax.drafters.base import Commit, DraftContext
from specjax.drafters.draft_model import DraftModel
from specjax.generate import prefill, prepare_batch, resolve_key
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
    done bool [B]; key (the one PRNG key); max_new_tokens, eos_id int32 scalars (traced:
    new values do not recompile; eos -1 is none). Counters per row, int32: target_forwards,
    draft_forwards, proposed, checked (drafts up to and including the first rejection),
    accepted, accepted_per_position [B, K]. Last step, per row:
    step_accepted (drafts accepted), step_emitted (tokens committed). num_steps: verify
    forwards run for the batch.
    """

    sequence: Array
    lengths: Array
    prompt_lengths: Array
    target_cache: Any
    drafter_state: Any
    done: Array
    key: Array
    max_new_tokens: Array
    eos_id: Array
    target_forwards: Array
    draft_forwards: Array
    proposed: Array
    checked: Array
    accepted: Array
    accepted_per_position: Array
    step_accepted: Array
    step_emitted: Array
    num_steps: Array

    @property
    def num_generated(self) -> Array:
        return self.lengths - self.prompt_lengths


def as_drafter(draft):
    """A CausalLM becomes `DraftModel(draft, method="sample")`; drafters pass through."""
    if isinstance(draft, CausalLM):
        return DraftModel(draft, method="sample")
    for name in ("check", "init", "propose", "commit", "forwards_per_step"):
        if not callable(getattr(draft, name, None)):
            raise TypeError(f"draft must be a specjax.CausalLM or a drafter (see "
                            f"specjax.drafters.Drafter); {type(draft).__name__} has no {name}()")
    return draft


@functools.partial(jax.jit, static_argnames=("capacity", "num_draft_tokens"))
def _init_state(target: CausalLM, drafter, prompt_tokens_BP: Array, prompt_lengths_B: Array,
                key: Array, max_new_tokens: Array, eos_id: Array, *, capacity: int,
                num_draft_tokens: int) -> SpeculativeState:
    batch, width = prompt_tokens_BP.shape
    cache = target.init_cache(batch, capacity)
    cache, _, _ = prefill(target, cache, prompt_tokens_BP, prompt_lengths_B)
    sequence = jnp.zeros((batch, capacity), jnp.int32).at[:, :width].set(prompt_tokens_BP)
    zeros = jnp.zeros((batch,), jnp.int32)
    return SpeculativeState(
        sequence=sequence, lengths=prompt_lengths_B, prompt_lengths=prompt_lengths_B,
        target_cache=cache,
        drafter_state=drafter.init(prompt_tokens_BP, prompt_lengths_B, capacity),
        done=jnp.zeros((batch,), bool), key=key, max_new_tokens=max_new_tokens,
        eos_id=eos_id, target_forwards=zeros, draft_forwards=zeros, proposed=zeros,
        checked=zeros, accepted=zeros,
        accepted_per_position=jnp.zeros((batch, num_draft_tokens), jnp.int32),
        step_accepted=zeros, step_emitted=zeros, num_steps=jnp.zeros((), jnp.int32))


def init_speculative_state(target: CausalLM, draft, prompts, *, max_new_tokens: int,
                           num_draft_tokens: int, sampling: SamplingConfig = SamplingConfig(),
                           key: Array | None = None, eos_id: int | None = None,
                           prompt_lengths=None,
                           cache_size: int | None = None) -> tuple[SpeculativeState, Any]:
    """Validate the inputs on the host, then prefill target and drafter.

    `cache_size` pins the slots of the caches and the token buffer (by default a power of
    two >= longest prompt + max_new_tokens + K + 1); too small a value is refused.
    Returns `(state, drafter)`; pass both to `speculative_step` with
    `SpeculativeConfig(num_draft_tokens=..., sampling=...)`.
    """
    config = SpeculativeConfig(num_draft_tokens=num_draft_tokens, sampling=sampling)
    drafter = as_drafter(draft)
    batch, capacity, eos = prepare_batch(target, prompts, prompt_lengths, max_new_tokens,
                                         sampling, eos_id, 0,
                                         extra_slots=config.num_draft_tokens + 1,
                                         cache_size=cache_size)
    drafter.check(target, sampling)
    state = _init_state(target, drafter, jnp.asarray(batch.tokens), jnp.asarray(batch.lengths),
                        resolve_key(key, sampling), jnp.int32(max_new_tokens), jnp.int32(eos),
                        capacity=capacity, num_draft_tokens=config.num_draft_tokens)
    return state, drafter


def speculative_step(target: CausalLM, drafter, state: SpeculativeState,
                     config: SpeculativeConfig) -> SpeculativeState:
    """One speculative step for every row still running (pure; jit with `config` static).

    (a) the drafter proposes K tokens per row, (b) the target runs ONCE on the last
    committed token plus the K drafts, (c) acceptance for all rows and positions at once,
    (d) the correction from the residual or the bonus from p_{K+1}, (e) each row commits
    its own number of tokens (cut at EOS and max_new_tokens); both caches roll back by
    length.
    """
    num_draft = config.num_draft_tokens
    sampling = config.sampling
    key, k_draft, k_accept, k_resample = jax.random.split(state.key, 4)
    active_B = ~state.done
    lengths_B = state.lengths

    drafter_state, proposal = drafter.propose(
        state.drafter_state, DraftContext(state.sequence, lengths_B), k_draft,
        num_draft_tokens=num_draft, sampling=sampling, vocab_size=target.vocab_size)

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
    is_eos_BK1 = (emitted_BK1 == state.eos_id) & (index_K1 < num_emitted_B[:, None])
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
        max_new_tokens=state.max_new_tokens, eos_id=state.eos_id,
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


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("state",))
def _speculative_loop(target: CausalLM, drafter, state: SpeculativeState,
                      config: SpeculativeConfig) -> SpeculativeState:
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done),
                              lambda s: speculative_step(target, drafter, s, config), state)


@jax.jit
def _generated_tokens(state: SpeculativeState, pad_id: Array) -> Array:
    """int32 [B, S]: each row's generated tokens from slot 0, pad after its end."""
    index_BS = state.prompt_lengths[:, None] + jnp.arange(state.sequence.shape[1],
                                                          dtype=jnp.int32)[None]
    last_slot = state.sequence.shape[1] - 1
    tokens_BS = jnp.take_along_axis(state.sequence, jnp.minimum(index_BS, last_slot), axis=1)
    return jnp.where(index_BS < state.lengths[:, None], tokens_BS, pad_id)


@dataclasses.dataclass(frozen=True)
class SpeculativeStats:
    """Metrics of DESIGN.md section 7, per row (numpy arrays [B]) and overall (floats).

    acceptance_rate: accepted drafts / proposed drafts (DESIGN.md's alpha).
    position_acceptance_rate: accepted drafts / checked drafts, where a step checks its
      drafts up to and including the first rejection. This estimates the per-position
      acceptance probability beta that the i.i.d. model uses: E[tau] = (1 - beta^(K+1)) /
      (1 - beta). The two differ: with i.i.d. beta, acceptance_rate = sum_j beta^j / K.
    mean_accepted_length: emitted tokens / target forwards (includes the bonus or
      correction token; plain AR = 1.0).
    accepted_per_position [K]: fraction of verify steps whose draft j was accepted.
    target_forwards / draft_forwards: per row, while the row was running (prefill
    excluded); num_steps: batched verify forwards run.
    """

    acceptance_rate: float
    position_acceptance_rate: float
    mean_accepted_length: float
    accepted_per_position: np.ndarray
    target_forwards: np.ndarray
    draft_forwards: np.ndarray
    emitted: np.ndarray
    proposed: np.ndarray
    accepted: np.ndarray
    row_acceptance_rate: np.ndarray
    row_mean_accepted_length: np.ndarray
    row_accepted_per_position: np.ndarray
    num_steps: int

    @classmethod
    def from_state(cls, state: SpeculativeState) -> SpeculativeStats:
        host = jax.device_get
        proposed = np.asarray(host(state.proposed))
        accepted = np.asarray(host(state.accepted))
        forwards = np.asarray(host(state.target_forwards))
        emitted = np.asarray(host(state.lengths - state.prompt_lengths))
        per_pos = np.asarray(host(state.accepted_per_position))
        safe = lambda n: np.maximum(n, 1)
        return cls(
            acceptance_rate=float(accepted.sum() / max(proposed.sum(), 1)),
            position_acceptance_rate=float(accepted.sum()
                                           / max(np.asarray(host(state.checked)).sum(), 1)),
            mean_accepted_length=float(emitted.sum() / max(forwards.sum(), 1)),
            accepted_per_position=per_pos.sum(0) / max(forwards.sum(), 1),
            target_forwards=forwards, draft_forwards=np.asarray(host(state.draft_forwards)),
            emitted=emitted, proposed=proposed, accepted=accepted,
            row_acceptance_rate=accepted / safe(proposed),
            row_mean_accepted_length=emitted / safe(forwards),
            row_accepted_per_position=per_pos / safe(forwards)[:, None],
            num_steps=int(host(state.num_steps)))

    def as_dict(self) -> dict:
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            out[field.name] = value.tolist() if isinstance(value, np.ndarray) else value
        return out


@dataclasses.dataclass(frozen=True)
class SpeculativeOutput:
    """`tokens` int32 [B, max_new_tokens] and `lengths` int32 [B] exactly as `generate`
    returns them, plus `stats` (SpeculativeStats)."""

    tokens: Array
    lengths: Array
    stats: SpeculativeStats


def speculative_generate(target: CausalLM, draft, prompts, *, max_new_tokens: int,
                         num_draft_tokens: int, sampling: SamplingConfig = SamplingConfig(),
                         key: Array | None = None, eos_id: int | None = None,
                         prompt_lengths=None, pad_id: int = 0,
                         cache_size: int | None = None) -> SpeculativeOutput:
    """Speculative decoding of a batch of prompts in one jit and one `lax.while_loop`.

    Args:
      target: the model whose distribution the output follows exactly.
      draft: a CausalLM sharing the target's tokenizer (wrapped as
        `DraftModel(draft, method="sample")`) or any drafter.
      prompts, prompt_lengths, max_new_tokens, sampling, key, eos_id, pad_id: as in
        `specjax.generate`; `max_new_tokens` is traced.
      num_draft_tokens: K, the drafts verified per target forward.
      cache_size: optional fixed cache length (see `init_speculative_state`).

    Returns:
      `SpeculativeOutput(tokens [B, max_new_tokens], lengths [B], stats)`. A block that
      overshoots `max_new_tokens` is cut; an EOS inside an accepted block ends the row there.
    """
    config = SpeculativeConfig(num_draft_tokens=num_draft_tokens, sampling=sampling)
    state, drafter = init_speculative_state(
        target, draft, prompts, max_new_tokens=max_new_tokens,
        num_draft_tokens=config.num_draft_tokens, sampling=sampling, key=key, eos_id=eos_id,
        prompt_lengths=prompt_lengths, cache_size=cache_size)
    state = _speculative_loop(target, drafter, state, config)
    tokens = _generated_tokens(state, jnp.int32(pad_id))[:, :max_new_tokens]
    return SpeculativeOutput(tokens=tokens, lengths=state.num_generated,
                             stats=SpeculativeStats.from_state(state))
