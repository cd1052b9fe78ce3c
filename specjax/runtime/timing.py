"""Timing what DESIGN.md section 7 defines: wall time of a decoder call with compilation
kept apart, and the step costs c (draft step / target step) and v (verify forward /
target step) measured as a decode loop runs them.

Speed is measured, never asserted: these helpers serve the command line and the
benchmarks, which report medians of alternating repetitions and ratios from one run.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.lm.causal_lm import CausalLM


def wall_seconds(call: Callable):
    """`(result, seconds)` of `call()`, waiting for its arrays (a decoder output's
    `tokens` and `lengths`, or every array of a pytree result)."""
    start = time.perf_counter()
    result = call()
    if hasattr(result, "tokens") and hasattr(result, "lengths"):
        jax.block_until_ready((result.tokens, result.lengths))
    else:
        jax.block_until_ready(result)
    return result, time.perf_counter() - start


def forward_timer(lm: CausalLM, batch: int, num_tokens: int, *, cache_slots: int = 256,
                  position: int = 64, steps: int = 16) -> Callable[[], float]:
    """A compiled, warmed-up function returning the seconds of one cached forward of
    `num_tokens` new tokens per row at `position`, timed as a decode loop runs it: `steps`
    forwards inside one jit (no per-call dispatch), each writing its keys/values into the
    carried cache and feeding its argmax to the next. The tokens of a forward differ from
    row to row and position to position, as drafts do: a mixture of experts routes them
    to different experts (the same token repeated would touch one token's experts only)."""
    if position + num_tokens + 1 > cache_slots:
        raise ValueError(f"position {position} + {num_tokens} tokens does not fit in "
                         f"{cache_slots} cache slots")

    loop = functools.partial(forward_loop, num_tokens=num_tokens, position=position,
                             steps=steps)
    cache = lm.init_cache(batch, cache_slots)
    first = jnp.zeros((batch,), jnp.int32)
    jax.block_until_ready(loop(lm, cache, first))
    return lambda: wall_seconds(lambda: loop(lm, cache, first))[1] / steps


@functools.partial(jax.jit, static_argnames=("num_tokens", "position", "steps"))
def forward_loop(lm: CausalLM, cache, token_B: Array, *, num_tokens: int, position: int,
                 steps: int) -> Array:
    """`steps` cached forwards of `num_tokens` tokens per row at `position` (alternating
    with position + 1), each feeding its argmax to the next: what `forward_timer` times.
    The model is an argument of the program, never a constant of it (a closure over the
    caller's model would bake every weight into the program: for a 0.5B model, 27 s of
    compiling and 9 GB of memory per program)."""
    batch = token_B.shape[0]

    def body(step, carry):
        cache, token_B = carry
        tokens_BT = spread_tokens(token_B, num_tokens, lm.vocab_size)
        start = position + step % 2  # alternate so no two forwards are identical
        positions_BT = start + jnp.broadcast_to(jnp.arange(num_tokens), (batch, num_tokens))
        logits_BTV, _, cache = lm.apply(tokens_BT, positions_BT, cache,
                                        jnp.full((batch,), start, jnp.int32))
        return cache, jnp.argmax(logits_BTV[:, -1], axis=-1).astype(jnp.int32)

    return jax.lax.fori_loop(0, steps, body, (cache, token_B))[1]


def spread_tokens(token_B: Array, num_tokens: int, vocab_size: int) -> Array:
    """`int32 [B, T]`: `token_B` moved by 7919 per position and 104,729 per row (primes),
    modulo the vocabulary: a row's positions differ (for T up to V, V not a multiple of
    7919), and so do rows, as the drafts of a verify do. The offsets are reduced modulo V
    on the host in int64 (a constant of the program), so no batch or length overflows."""
    spread_BT = np.mod(7919 * np.arange(num_tokens, dtype=np.int64)[None, :]
                       + 104_729 * np.arange(token_B.shape[0], dtype=np.int64)[:, None],
                       vocab_size).astype(np.int32)
    return (jnp.mod(token_B.astype(jnp.int32), vocab_size)[:, None] + spread_BT) % vocab_size


def interleaved_medians(timers: dict[object, Callable[[], float]], reps: int) -> dict:
    """Median seconds of each timer over `reps` rounds (at least 5), run in alternation so
    that machine noise hits them alike (their ratios are what matter)."""
    times = {name: [] for name in timers}
    for _ in range(max(reps, 5)):
        for name, timer in timers.items():
            times[name].append(timer())
    return {name: float(statistics.median(values)) for name, values in times.items()}


def step_costs(target: CausalLM, draft: CausalLM | None, batch: int, ks, reps: int = 5,
               **where) -> dict:
    """Seconds of a 1-token target forward ("target"), a 1-token draft forward ("draft",
    when a draft model is given) and each (K+1)-token verify (key K + 1), in alternation;
    `where` sets `cache_slots` and `position` (use the decoder's)."""
    timers = {"target": forward_timer(target, batch, 1, **where)}
    if draft is not None:
        timers["draft"] = forward_timer(draft, batch, 1, **where)
    for k in ks:
        timers[k + 1] = forward_timer(target, batch, k + 1, **where)
    return interleaved_medians(timers, reps)
