"""specjax.runtime.timing: wall time waits for the arrays, step costs time what a decode loop runs,
alternation and medians. No speed is asserted (benchmarks measure it)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.runtime.timing import (
    forward_timer,
    interleaved_medians,
    spread_tokens,
    step_costs,
    wall_seconds,
)


def test_wall_seconds_returns_the_result_and_a_duration():
    result, seconds = wall_seconds(lambda: jnp.arange(5) * 2)
    assert result.tolist() == [0, 2, 4, 6, 8] and seconds >= 0


def test_interleaved_medians_alternate_the_timers_at_least_five_times():
    calls = []
    timers = {"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 3.0}
    medians = interleaved_medians(timers, reps=2)
    assert medians == {"a": 1.0, "b": 3.0}
    assert calls == ["a", "b"] * 5  # alternated, and never fewer than five rounds


@pytest.mark.slow  # four decode loops compiled
def test_step_costs_time_each_forward_the_loop_runs(tiny_lm, close_draft):
    costs = step_costs(tiny_lm, close_draft, 2, [1, 3], reps=1, cache_slots=32, position=8)
    assert set(costs) == {"target", "draft", 2, 4}
    assert all(seconds > 0 for seconds in costs.values())


def test_a_forward_that_does_not_fit_its_cache_is_refused(tiny_lm):
    with pytest.raises(ValueError, match="does not fit in 16 cache slots"):
        forward_timer(tiny_lm, 1, 4, cache_slots=16, position=12)


def test_a_timed_forward_feeds_different_tokens_to_each_row_and_position():
    """A verify's drafts differ; a mixture of experts routes by token, so the timed forward
    must not repeat one token (it would touch one token's experts only)."""
    tokens = np.asarray(spread_tokens(jnp.asarray([5, 5, 0, 31999], jnp.int32), 33, 32_000))
    assert tokens.shape == (4, 33) and tokens.dtype == np.int32
    assert tokens.min() >= 0 and tokens.max() < 32_000
    assert all(len(set(row)) == 33 for row in tokens.tolist())  # positions differ
    assert len({tuple(row) for row in tokens.tolist()}) == 4  # rows differ, same start too
    assert tokens[:, 0].tolist() == [5, (5 + 104_729) % 32_000, (2 * 104_729) % 32_000,
                                     (31_999 + 3 * 104_729) % 32_000]


def test_the_spread_does_not_overflow_at_any_batch():
    """Row offsets of 104,729 x B pass int32's range past ~20,500 rows: reduced modulo V
    first, every token stays in the vocabulary and row r's first token is r's offset."""
    rows = 30_000
    tokens = np.asarray(spread_tokens(jnp.zeros((rows,), jnp.int32), 2, 50_000))
    assert tokens.min() >= 0 and tokens.max() < 50_000
    assert tokens[-1, 0] == (104_729 * (rows - 1)) % 50_000
    assert tokens[-1, 1] == (104_729 * (rows - 1) + 7919) % 50_000


def test_the_timed_program_takes_the_weights_as_arguments(tiny_lm):
    """The weights are arguments of the timed program, not constants baked into it (a
    closure over the model did that: a real-size model then took half a minute and 9 GB
    to compile each timer), and one program serves every timer of the same shapes."""
    from specjax.runtime.timing import forward_loop

    cache = tiny_lm.init_cache(2, 32)
    token = jnp.zeros((2,), jnp.int32)
    compiled = forward_loop.lower(tiny_lm, cache, token, num_tokens=3, position=8,
                                  steps=2).compile()
    weights = sum(x.nbytes for x in jax.tree.leaves(tiny_lm.params))
    assert compiled.memory_analysis().argument_size_in_bytes >= weights
    before = forward_loop._cache_size()
    forward_timer(tiny_lm, 2, 3, cache_slots=32, position=8, steps=2)
    forward_timer(tiny_lm, 2, 3, cache_slots=32, position=8, steps=2)
    assert forward_loop._cache_size() - before <= 1
