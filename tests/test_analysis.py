"""specjax.analysis: the speed model, and its agreement with measured acceptance."""

import jax
import numpy as np
import pytest

import specjax
from specjax import DraftModel, SamplingConfig, analysis, speculative_generate
from specjax.testing import unigram_lm


def test_expected_tokens_formula_and_limits():
    assert analysis.expected_tokens_per_forward(0.0, 4) == 1.0
    assert analysis.expected_tokens_per_forward(1.0, 4) == 5.0
    assert analysis.expected_tokens_per_forward(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    grid = analysis.expected_tokens_per_forward(np.array([0.2, 0.9]), np.array([3, 3]))
    np.testing.assert_allclose(grid, [(1 - 0.2**4) / 0.8, (1 - 0.9**4) / 0.1])


def test_ideal_speedup_and_best_k():
    assert analysis.ideal_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    assert analysis.ideal_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / 0.2 / 1.4)
    k, speedup = analysis.best_num_draft_tokens(0.8, 0.05)
    ks = range(1, 33)
    assert speedup == pytest.approx(max(analysis.ideal_speedup(0.8, j, 0.05) for j in ks))
    assert analysis.ideal_speedup(0.8, k, 0.05) == pytest.approx(speedup)
    assert analysis.best_num_draft_tokens(0.3, 0.5)[0] == 1  # a poor, costly draft: K=1


@pytest.mark.parametrize("call", [
    lambda: analysis.expected_tokens_per_forward(1.2, 3),
    lambda: analysis.expected_tokens_per_forward(0.5, 0),
    lambda: analysis.ideal_speedup(0.5, 3, -1.0),
    lambda: analysis.expected_acceptance_rate([0.5, 0.5], [1.0]),
])
def test_bad_arguments_are_refused(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("method", ["sample", "greedy"])
def test_formula_matches_measured_acceptance_for_iid_drafts(method):
    """Context-free target and draft make acceptance i.i.d. with a known alpha:
    sum min(p, q) for sampled drafts, p(argmax q) for greedy drafts. The measured
    acceptance rate, per-position rates alpha^j and tokens per forward match the model."""
    p_logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    q_logits = np.log(np.array([0.25, 0.25, 0.25, 0.25]))
    p, q = np.exp(p_logits), np.exp(q_logits)
    k = 4
    out = speculative_generate(unigram_lm(p_logits), DraftModel(unigram_lm(q_logits), method),
                               [[0]] * 4000, max_new_tokens=40, num_draft_tokens=k,
                               sampling=SamplingConfig(temperature=1.0), key=jax.random.key(0))
    alpha = analysis.expected_acceptance_rate(p, q) if method == "sample" else p[0]
    positions = out.stats.accepted_per_position
    np.testing.assert_allclose(positions, alpha ** np.arange(1, k + 1), atol=0.01)
    # The uncut estimate of tokens per forward: accepted per step + the correction/bonus.
    measured_tau = out.stats.accepted.sum() / out.stats.target_forwards.sum() + 1
    assert measured_tau == pytest.approx(analysis.expected_tokens_per_forward(alpha, k),
                                         abs=0.03)
    # The acceptance rate is the mean of the per-position rates; the checked-position rate
    # estimates alpha itself.
    assert out.stats.acceptance_rate == pytest.approx(positions.mean(), abs=1e-9)
    assert out.stats.position_acceptance_rate == pytest.approx(alpha, abs=0.01)


def test_rank_acceptance_of_a_pair(tiny_lm):
    """Deterministic top-k children: the rank-r child is accepted with the target's
    probability of the draft's r-th token (accept x with p(x), else p without x)."""
    same = analysis.measure_rank_acceptance(tiny_lm, tiny_lm, [[1, 2, 3], [7, 7, 1], [30, 2]],
                                            specjax.GREEDY, num_ranks=3, max_new_tokens=12)
    np.testing.assert_allclose(same, [1.0, 0.0, 0.0])  # the top draft is always the target's
    target = unigram_lm(np.log([0.5, 0.3, 0.15, 0.05]))
    draft = unigram_lm(np.log([0.4, 0.35, 0.2, 0.05]))  # the same order of tokens
    measured = analysis.measure_rank_acceptance(target, draft, [[0]] * 2000,
                                                SamplingConfig(temperature=1.0), num_ranks=3,
                                                max_new_tokens=4, key=jax.random.key(0))
    np.testing.assert_allclose(measured, [0.5, 0.3, 0.15], atol=0.02)
