"""specjax.testing: the public exactness harness agrees with scipy, knows its toy models,
and fails a drafter that misreports q (so a user's drafter can be checked with it)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.testing import (
    chi_square_pvalue,
    enumerate_joint,
    plus_one_lm,
    speculative_joint_pvalue,
    unigram_lm,
)


def test_chi_square_pvalue_equals_scipys():
    from scipy import stats  # here: every test process collects this module

    rng = np.random.default_rng(0)
    joint = rng.dirichlet(np.full(36, 50.0)).reshape(6, 6)  # every cell well above 5 / N
    for bias in (0.0, 0.05):
        probs = joint.reshape(-1) * (1 + bias * np.arange(36) / 36)
        samples = rng.choice(36, size=4000, p=probs / probs.sum())
        pairs = np.stack(np.unravel_index(samples, (6, 6)), axis=1)
        observed = np.bincount(samples, minlength=36)
        expected = joint.reshape(-1) * 4000
        assert expected.min() >= 5  # no pooling: the plain Pearson test applies
        reference = stats.chisquare(observed, expected).pvalue
        assert chi_square_pvalue(pairs, joint) == pytest.approx(reference, rel=1e-3, abs=1e-12)
    zero = joint.copy()
    zero[0, 0] = 0
    assert chi_square_pvalue(np.array([[0, 0]] * 10), zero) == 0.0


def test_enumerate_joint_of_toy_models():
    joint = enumerate_joint(plus_one_lm(vocab=5), [3], 2, specjax.GREEDY)
    assert joint[4, 0] == 1.0 and joint.sum() == 1.0
    logits = np.log([0.5, 0.3, 0.2])
    iid = enumerate_joint(unigram_lm(logits), [0], 2, specjax.SamplingConfig(temperature=1.0))
    np.testing.assert_allclose(iid, np.outer([0.5, 0.3, 0.2], [0.5, 0.3, 0.2]), rtol=1e-6)


def test_a_repeated_enumeration_is_remembered_by_weights_not_by_object():
    lm = unigram_lm(np.log([0.5, 0.3, 0.2]))
    t1 = specjax.SamplingConfig(temperature=1.0)
    first = enumerate_joint(lm, [0], 2, t1)
    first[0, 0] = -1.0  # the caller's copy: the remembered joint is untouched
    again = enumerate_joint(lm, [0], 2, t1)
    np.testing.assert_allclose(again, np.outer([0.5, 0.3, 0.2], [0.5, 0.3, 0.2]), rtol=1e-6)
    sharper = enumerate_joint(lm, [0], 2, specjax.SamplingConfig(temperature=0.5))
    assert sharper[0, 0] > again[0, 0]  # another setting is another joint
    # New weights in a model of the same apply: enumerated anew, not the old joint.
    flat = lm.with_params(jax.tree.map(jnp.zeros_like, lm.params))
    np.testing.assert_allclose(enumerate_joint(flat, [0], 2, t1), np.full((3, 3), 1 / 9),
                               rtol=1e-6)
    assert enumerate_joint(lm, [1], 2, t1)[0, 0] == pytest.approx(0.25, rel=1e-6)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _LyingDrafter(specjax.DraftModel):
    """Draws from the draft's q but reports a uniform q: inexact, and the harness says so."""

    def propose(self, state, context, key, *, num_draft_tokens, sampling, vocab_size):
        state, proposal = super().propose(state, context, key,
                                          num_draft_tokens=num_draft_tokens,
                                          sampling=sampling, vocab_size=vocab_size)
        uniform = jnp.full_like(proposal.q, 1.0 / vocab_size)
        return state, specjax.drafters.Proposal(tokens=proposal.tokens, q=uniform)


def test_the_harness_passes_an_exact_drafter_and_fails_a_lying_one():
    target = unigram_lm(np.log([0.6, 0.25, 0.1, 0.05]))
    draft = unigram_lm(np.log([0.1, 0.2, 0.3, 0.4]))
    sampling = specjax.SamplingConfig(temperature=1.0)
    exact, out = speculative_joint_pvalue(target, specjax.DraftModel(draft), [0], sampling,
                                          rows=8000, seed=1)
    assert exact > 1e-3 and 0 < out.stats.acceptance_rate < 1
    lying, _ = speculative_joint_pvalue(target, _LyingDrafter(draft), [0], sampling,
                                        rows=8000, seed=1)
    assert lying < 1e-6
