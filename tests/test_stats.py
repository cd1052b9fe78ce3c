"""specjax.decoding.stats: metrics from per-row counts, and merging runs."""

import jax
import numpy as np
import pytest

import specjax
from specjax.testing import perturbed


@pytest.mark.slow  # keeps the unit suite under 10 minutes
def test_merging_runs_equals_one_batched_run(tiny_lm):
    """Stats of prompts decoded one at a time, merged, equal the stats of the same prompts
    decoded as one batch (greedy: the same tokens either way)."""
    draft = perturbed(tiny_lm, 0.05, seed=1)
    prompts = [[1, 2, 3], [7, 7], [30, 2, 5, 9]]
    call = lambda ps: specjax.speculative_generate(tiny_lm, draft, ps, max_new_tokens=12,
                                                   num_draft_tokens=3, sampling=specjax.GREEDY)
    batched = call(prompts).stats
    merged = specjax.SpeculativeStats.merge([call([p]).stats for p in prompts])
    for name in ("proposed", "accepted", "checked", "emitted", "target_forwards",
                 "draft_forwards"):
        np.testing.assert_array_equal(getattr(merged, name), getattr(batched, name))
    for name in ("acceptance_rate", "position_acceptance_rate", "mean_accepted_length"):
        assert getattr(merged, name) == pytest.approx(getattr(batched, name))
    np.testing.assert_allclose(merged.accepted_per_position, batched.accepted_per_position)
    np.testing.assert_array_equal(merged.row_accepted_length_counts,
                                  batched.row_accepted_length_counts)
    np.testing.assert_allclose(merged.accepted_length_distribution,
                               batched.accepted_length_distribution)
    # The depth histogram agrees with the per-position counts (both what verification
    # accepted, uncut); the accepted count (drafts that became output) is at most that.
    depths = np.arange(4)
    on_path = np.rint(batched.row_accepted_per_position * batched.target_forwards[:, None])
    np.testing.assert_array_equal(batched.row_accepted_length_counts @ depths, on_path.sum(1))
    assert np.all(batched.accepted <= on_path.sum(1))
    # Three drafts verified per forward, of which those that could become output count.
    assert batched.nodes_per_step == pytest.approx(
        batched.proposed.sum() / batched.target_forwards.sum())
    assert 2 < batched.nodes_per_step <= 3
    assert merged.num_steps >= batched.num_steps  # three loops run at least as many steps


def test_merge_refuses_nothing_and_mixed_k(tiny_lm):
    run = lambda k: specjax.speculative_generate(
        tiny_lm, tiny_lm, [[1, 2]], max_new_tokens=4, num_draft_tokens=k,
        sampling=specjax.SamplingConfig(temperature=1.0), key=jax.random.key(0)).stats
    with pytest.raises(ValueError, match="at least one"):
        specjax.SpeculativeStats.merge([])
    with pytest.raises(ValueError, match="different K"):
        specjax.SpeculativeStats.merge([run(2), run(3)])
