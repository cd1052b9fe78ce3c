"""Streaming speculative decoding: a Python generator over the jitted step.

Each iteration runs one compiled `speculative_step` (compiled once per shapes and
config, never retraced) and yields the tokens each row committed in that step, marking
which were accepted drafts and which the target supplied (the correction or bonus), so
notebooks and the command line can print text as it is accepted.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.decoding.inputs import count_rows
from specjax.decoding.sampling import SamplingConfig, sampling_params
from specjax.decoding.speculative_loop import start_decoding
from specjax.decoding.stats import SpeculativeStats
from specjax.decoding.step import SpeculativeState, compile_key, compiled_step
from specjax.drafters.base import drafter_key
from specjax.lm.causal_lm import CausalLM
from specjax.runtime.distributed import fetch
from specjax.verification.rules import rule_that_ran


@dataclasses.dataclass(frozen=True)
class StreamChunk:
    """What one speculative step committed.

    tokens[b]: row b's new tokens (possibly none). from_draft[b][i]: True when tokens[b][i]
    was an accepted draft token, False when the target supplied it. done[b]: row b ended.
    step: 1-based step number. block: int32 [B, K+1], the same tokens as one array padded
    with `pad_id` after each row's count. stats: filled on the last chunk only.
    """

    step: int
    tokens: list[list[int]]
    from_draft: list[list[bool]]
    done: list[bool]
    block: np.ndarray
    stats: SpeculativeStats | None = None


@functools.partial(jax.jit, static_argnames=("width",))
def _step_window(state: SpeculativeState, *, width: int) -> Array:
    """int32 [B, width]: the slots the last step may have committed (its first emitted)."""
    start_B = state.lengths - state.step_emitted
    index_BW = start_B[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
    index_BW = jnp.minimum(index_BW, state.sequence.shape[1] - 1)
    return jnp.take_along_axis(state.sequence, index_BW, axis=1)


def speculative_stream(target: CausalLM, draft, prompts, *, max_new_tokens: int,
                       num_draft_tokens: int | None = None,
                       sampling: SamplingConfig | Sequence[SamplingConfig] = SamplingConfig(),
                       key: Array | None = None, eos_id=None, prompt_lengths=None,
                       pad_id: int = 0, cache_size: int | None = None,
                       tree=None, verification=None) -> Iterator[StreamChunk]:
    """Yield one `StreamChunk` per speculative step until every row is done.

    Same arguments and the same tokens as `speculative_generate` with the same key (a
    `tree` and a `verification` rule too); `pad_id` fills each chunk's `block` array
    after the row's new tokens (`block` is [B, D + 1] for a tree of depth D).
    """
    config, pad_id, state, drafter = start_decoding(
        target, draft, prompts, max_new_tokens=max_new_tokens,
        num_draft_tokens=num_draft_tokens, sampling=sampling, key=key, eos_id=eos_id,
        prompt_lengths=prompt_lengths, pad_id=pad_id, cache_size=cache_size, tree=tree,
        verification=verification, program=compiled_step)
    # A step commits at most one token per accepted depth, plus one.
    tree = config.tree  # the drafter's own (lookahead, retrieval) when none is given
    width = (config.num_draft_tokens if tree is None else tree.max_depth) + 1
    params = sampling_params(config.sampling, state.lengths.shape[0])
    step_config = compile_key(config, params)
    rows = count_rows(prompts)  # the caller's; a mesh's padding rows follow them
    step = 0
    while True:
        state = compiled_step(target, drafter, state, step_config, params,
                              drafter_type=drafter_key(drafter))
        step += 1
        emitted, accepted, done, window = (x[:rows] for x in fetch(
            (state.step_emitted, state.step_accepted, state.done,
             _step_window(state, width=width))))
        tokens = [window[b, : emitted[b]].tolist() for b in range(len(emitted))]
        from_draft = [[i < accepted[b] for i in range(emitted[b])] for b in range(len(emitted))]
        finished = bool(np.all(done))
        block = np.where(np.arange(width)[None, :] < emitted[:, None], window,
                         pad_id).astype(np.int32)
        yield StreamChunk(step=step, tokens=tokens, from_draft=from_draft,
                          done=[bool(d) for d in done], block=block,
                          stats=SpeculativeStats.from_state(
                              state, rows, rule_that_ran(
                                  config.verification, config.tree, params.greedy))
                          if finished else None)
        if finished:
            return
