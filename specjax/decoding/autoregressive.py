"""Plain autoregressive decoding: the exact baseline every speedup is measured against.

`generate` prefills the prompts in one forward, then runs one `lax.while_loop` inside one
jit. Invariant of the decode state: the cache holds every committed token except the
last one, which is fed at the next step (`cache_lengths[b] = committed[b] - 1`). The
prefill therefore writes the whole padded prompt, sets each row's length one short of
its prompt, and the first loop step re-feeds the prompt's last token: one code path for
every step, and no wasted forward at the end.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Bool, Int, Key

from specjax.decoding.inputs import (
    check_pad_id,
    first_columns,
    first_rows,
    prepare_batch,
    resolve_key,
    running_rows,
    settings_for_padded_rows,
)
from specjax.decoding.sampling import SamplingConfig, SamplingParams, sample_tokens, sampling_params
from specjax.lm.causal_lm import CausalLM, prefill
from specjax.runtime.distributed import process_local
from specjax.runtime.xla_options import options_jit


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodeState:
    """Loop carry of autoregressive decoding (all buffers fixed-size).

    output: int32 [B, N] generated tokens (pad after each row's end).
    num_generated: int32 [B]. last_token: int32 [B], committed but not yet in the cache.
    cache: the model's cache; cache_lengths: int32 [B] slots holding committed tokens.
    done: bool [B]. key: the one PRNG key, split at the top of every step.
    """

    output: Int[Array, "B N"]
    num_generated: Int[Array, " B"]
    last_token: Int[Array, " B"]
    cache: Any
    cache_lengths: Int[Array, " B"]
    done: Bool[Array, " B"]
    key: Key[Array, ""]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GenerateOutput:
    """`tokens` int32 [B, max_new_tokens] (generated only, `pad_id` after the end, an EOS
    that ended a row included) and `lengths` int32 [B]."""

    tokens: Int[Array, "B N"]
    lengths: Int[Array, " B"]


@options_jit(static_argnames=("capacity",))
def _init_state(lm: CausalLM, prompt_tokens_BP: Array, prompt_lengths_B: Array, key: Array,
                pad_id: Array, running_B: Array, *, capacity: int) -> DecodeState:
    batch = prompt_tokens_BP.shape[0]
    cache = lm.init_cache(batch, capacity)
    cache, cache_lengths_B, last_token_B, _ = prefill(lm, cache, prompt_tokens_BP,
                                                      prompt_lengths_B, keep_hidden=False)
    return DecodeState(
        output=jnp.full((batch, capacity), pad_id, jnp.int32),
        num_generated=jnp.zeros((batch,), jnp.int32),
        last_token=last_token_B.astype(jnp.int32),
        cache=cache,
        cache_lengths=cache_lengths_B.astype(jnp.int32),
        done=~running_B,  # a mesh's padding rows are done from the start
        key=key,
    )


def decode_step(lm: CausalLM, state: DecodeState, max_new_tokens: Array, eos_ids: Array,
                sampling: SamplingConfig | SamplingParams) -> DecodeState:
    """One autoregressive step for every row still running (pure; jit-compatible).

    `eos_ids` int32 `[E]`: a row ends after emitting any of them (-1 entries never match).
    `sampling`: a `SamplingConfig` (its values become constants of the trace) or
    `SamplingParams` (per-row settings as traced data: new values never recompile).
    """
    batch = state.last_token.shape[0]
    key, k_sample = jax.random.split(state.key)
    logits_B1V, _, cache = lm.apply(state.last_token[:, None], state.cache_lengths[:, None],
                                    state.cache, state.cache_lengths)
    token_B = sample_tokens(k_sample, logits_B1V[:, 0], sampling)
    active_B = ~state.done
    rows_B = jnp.arange(batch)
    # Finished rows write out of bounds, which `drop` discards.
    write_at_B = jnp.where(active_B, state.num_generated, state.output.shape[1])
    output = state.output.at[rows_B, write_at_B].set(token_B, mode="drop")
    num_generated_B = state.num_generated + active_B.astype(jnp.int32)
    is_eos_B = jnp.any(token_B[:, None] == eos_ids[None, :], axis=1)
    done_B = state.done | (active_B & is_eos_B) | (num_generated_B >= max_new_tokens)
    return DecodeState(
        output=output,
        num_generated=num_generated_B,
        last_token=jnp.where(active_B, token_B, state.last_token),
        cache=cache,
        cache_lengths=state.cache_lengths + active_B.astype(jnp.int32),
        done=done_B,
        key=key,
    )


@options_jit(donate_argnames=("state",))
def _decode_loop(lm: CausalLM, state: DecodeState, max_new_tokens: Array, eos_ids: Array,
                 sampling: SamplingParams) -> DecodeState:
    # `sampling` is data: only its static `greedy` bit (every row greedy) is in the
    # compile key, so a new temperature, top-k or top-p reuses this program.
    return jax.lax.while_loop(
        lambda s: ~jnp.all(s.done),
        lambda s: decode_step(lm, s, max_new_tokens, eos_ids, sampling),
        state)


def generate(lm: CausalLM, prompts, *, max_new_tokens: int,
             sampling: SamplingConfig = SamplingConfig(), key: Array | None = None,
             eos_id: int | Sequence[int] | None = None, prompt_lengths=None, pad_id: int = 0,
             cache_size: int | None = None) -> GenerateOutput:
    """Autoregressive decoding of a batch of prompts, fully jitted.

    Args:
      lm: the model.
      prompts: a list of token-id lists (ragged), or an int array `[B, P]` with
        `prompt_lengths[B]` (row b's prompt is its first `prompt_lengths[b]` tokens).
      max_new_tokens: at most this many tokens per row. Traced: a new value reuses the
        compiled loop as long as the cache bucket (max(256, next power of two of the
        longest prompt + max_new_tokens), capped at the model's max_seq_len) is unchanged.
      sampling: `SamplingConfig` for every row, or a list of one per row (rows may mix
        greedy and sampled settings); temperature 0 is greedy. Traced: new values reuse
        the compiled loop (only "every row greedy" or not is compiled in).
      key: PRNG key (required when sampling). Row b draws from `fold_in(step_key, b)`.
      eos_id: one id or a list of ids (chat models often end on several); a row stops
        after emitting one (it is included in the output).
      pad_id: any int32, written after each row's end (never fed to the model).
      cache_size: pins the cache length (default: the bucket above); too small is refused.

    Returns:
      `GenerateOutput(tokens int32 [B, max_new_tokens], lengths int32 [B])`.
    """
    pad_id = check_pad_id(pad_id)
    sampling = settings_for_padded_rows(lm, prompts, sampling)
    batch, capacity, eos_ids = prepare_batch(lm, prompts, prompt_lengths, max_new_tokens,
                                             sampling, eos_id, cache_size=cache_size)
    state = _init_state(lm, jnp.asarray(batch.tokens), jnp.asarray(batch.lengths),
                        resolve_key(key, sampling), jnp.int32(pad_id), running_rows(batch),
                        capacity=capacity)
    state = _decode_loop(lm, state, jnp.int32(max_new_tokens), jnp.asarray(eos_ids),
                         sampling_params(sampling, batch.tokens.shape[0]))
    return GenerateOutput(tokens=first_columns(state.output, max_new_tokens, batch.rows),
                          lengths=first_rows(process_local(state.num_generated), batch.rows))
