"""AdaptiveLength: each row's draft length follows its own acceptance (the heuristic: +grow
after a fully accepted offer, -shrink after a rejection, within [min_length, K]; the
expected-speed schedule: the length with the most expected tokens per unit of time under
the row's running acceptance estimate); rows accept only among the drafts they offered,
and the stats count those."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import GREEDY, DraftModel
from specjax.decoding.speculative_loop import init_speculative_state, speculative_config
from specjax.decoding.step import jitted_step
from specjax.drafters import AdaptiveLength, Lookahead, PromptLookup
from specjax.testing import PlusOneApply, TokenCache, plus_one_lm


@dataclasses.dataclass(frozen=True)
class PlusTwoApply(PlusOneApply):
    def __call__(self, params, tokens, positions, cache, cache_lengths, new_mask=None):
        return super().__call__(params, tokens + 1, positions, cache, cache_lengths, new_mask)


def offers(drafter, num_steps: int, num_draft_tokens: int = 6) -> list[list[int]]:
    """What each of two rows offered at each step, on the plus-one target."""
    target = plus_one_lm(16)
    config = speculative_config(num_draft_tokens, GREEDY, None)
    state, drafter = init_speculative_state(target, drafter, [[1, 2], [5]], max_new_tokens=60,
                                            num_draft_tokens=num_draft_tokens, sampling=GREEDY)
    seen = []
    for _ in range(num_steps):
        state = jitted_step(target, drafter, state, config)
        seen.append(np.asarray(state.drafter_state.offered).tolist())
    return seen, state


def test_a_fully_accepted_row_grows_its_offer_to_k():
    right = DraftModel(plus_one_lm(16), "greedy")
    seen, state = offers(AdaptiveLength(right, start=1), 5)
    assert [row[0] for row in seen] == [1, 3, 5, 6, 6]
    assert np.asarray(state.proposed).tolist() == [21, 21]  # only the drafts offered
    assert np.asarray(state.accepted).tolist() == [21, 21]


def test_the_draft_model_drafts_only_the_longest_offer():
    """After a step offering 1 draft, the draft model has fed the last token only (its
    cache is one token short of the accepted text: it stopped after 1 draft of 6)."""
    _, state = offers(AdaptiveLength(DraftModel(plus_one_lm(16), "greedy"), start=1), 1)
    assert np.asarray(state.drafter_state.drafter.cache_lengths).tolist() == [2, 1]
    assert np.asarray(state.lengths).tolist() == [4, 3]


def wrong_lm():
    """A draft whose every draft the plus-one target rejects (it adds two)."""
    return plus_one_lm(16).__class__({"unused": jnp.zeros((1,), jnp.float32)},
                                     PlusTwoApply(16), TokenCache(), vocab_size=16,
                                     max_seq_len=256)


def test_a_rejected_row_shrinks_its_offer_to_min_length():
    wrong = wrong_lm()
    seen, state = offers(AdaptiveLength(DraftModel(wrong, "greedy"), shrink=2,
                                        min_length=2), 4)
    assert [row[0] for row in seen] == [6, 4, 2, 2]
    assert np.asarray(state.accepted).tolist() == [0, 0]
    assert np.asarray(state.proposed).tolist() == [14, 14]


def test_the_offer_never_exceeds_what_the_drafter_has():
    """Prompt lookup without a match offers nothing: a one-token step, the schedule kept."""
    seen, state = offers(AdaptiveLength(PromptLookup(), start=3), 2)
    assert seen == [[0, 0], [0, 0]]
    assert np.asarray(state.proposed).tolist() == [0, 0]
    assert np.asarray(state.drafter_state.length).tolist() == [3, 3]


def test_greedy_output_equals_generate_with_rows_of_different_lengths(tiny_lm, close_draft):
    prompts = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3]]
    plain = specjax.generate(tiny_lm, prompts, max_new_tokens=16, sampling=GREEDY)
    out = specjax.speculative_generate(tiny_lm, AdaptiveLength(DraftModel(close_draft)),
                                       prompts, max_new_tokens=16, num_draft_tokens=4,
                                       sampling=GREEDY)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    assert out.stats.accepted.sum() <= out.stats.proposed.sum()


def expected_speed_offers(accepts: bool, num_steps: int, k: int, c: float, verify,
                          memory: float, prior: float) -> list[int]:
    """The expected-speed schedule written out in Python, for a row whose drafts are all
    accepted (`accepts`) or all rejected."""
    accepted = trials = 0.0
    seen = []
    for _ in range(num_steps):
        alpha = (accepted + prior) / (trials + 1.0)
        speeds = [sum(alpha ** i for i in range(n + 1)) / (n * c + verify[n])
                  for n in range(k + 1)]
        offer = speeds.index(max(speeds))
        seen.append(offer)
        new_accepted = offer if accepts else 0
        new_trials = new_accepted + (1 if offer and not accepts else 0)
        accepted, trials = memory * accepted + new_accepted, memory * trials + new_trials
    return seen


def expected_speed(drafter, **settings):
    return AdaptiveLength(drafter, schedule="expected_speed", **settings)


def test_expected_speed_offers_k_to_a_draft_that_is_always_right():
    right = DraftModel(plus_one_lm(16), "greedy")
    seen, state = offers(expected_speed(right, draft_cost=0.1), 3)
    assert seen == [[6, 6]] * 3
    assert np.asarray(state.accepted).tolist() == [18, 18]
    alpha = np.asarray(expected_speed(right).acceptance_estimate(state.drafter_state))
    assert np.all(alpha > 0.99)


def test_expected_speed_stops_drafting_when_it_cannot_pay_and_probes_again():
    """A draft that is always wrong: the first offer follows the prior, then one-token
    steps (offer 0) until the estimate has relaxed towards the prior enough for a one-draft
    probe, which fails, and so on: the Python reference, step for step."""
    settings = dict(draft_cost=0.5, verify_costs=(1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6),
                    memory=0.8, prior_acceptance=0.9)
    seen, state = offers(expected_speed(DraftModel(wrong_lm(), "greedy"), **settings), 14)
    reference = expected_speed_offers(False, 14, 6, 0.5, settings["verify_costs"], 0.8, 0.9)
    assert [row[0] for row in seen] == reference
    assert [row[1] for row in seen] == reference
    assert reference[0] > 1 and reference.count(0) >= 8 and reference[1:].count(1) >= 2
    assert np.asarray(state.proposed).tolist() == [sum(reference)] * 2
    assert np.asarray(state.accepted).tolist() == [0, 0]


def test_expected_speed_follows_the_verify_costs():
    """Free drafts, an always-right draft: the longest offer unless a wider verify costs
    more than it brings (here any verify past 2 drafts costs 10 forwards)."""
    right = DraftModel(plus_one_lm(16), "greedy")
    costs = (1.0, 1.0, 1.0) + (10.0,) * 4
    seen, _ = offers(expected_speed(right, verify_costs=costs), 3)
    reference = expected_speed_offers(True, 3, 6, 0.0, costs, 0.8, 0.9)
    assert [row[0] for row in seen] == reference == [2, 2, 2]


def test_expected_speed_with_a_draft_dearer_than_the_target_never_drafts():
    """c >= 1: no acceptance can pay for a draft (even an always-right one), so every step
    is a one-token step and no draft is offered."""
    right = DraftModel(plus_one_lm(16), "greedy")
    seen, state = offers(expected_speed(right, draft_cost=1.0), 3)
    assert seen == [[0, 0]] * 3
    assert np.asarray(state.proposed).tolist() == [0, 0]
    assert np.asarray(state.lengths).tolist() == [5, 4]  # one token per step


def test_expected_speed_needs_a_verify_cost_per_width():
    right = DraftModel(plus_one_lm(16), "greedy")
    with pytest.raises(ValueError, match="num_draft_tokens=6 needs 7"):
        offers(expected_speed(right, verify_costs=(1.0, 1.2, 1.4)), 1)


@pytest.mark.parametrize("make, error, message", [
    (lambda: AdaptiveLength(PromptLookup(), schedule="fastest"), ValueError, "schedule"),
    (lambda: expected_speed(PromptLookup(), start=2), ValueError, "prior_acceptance"),
    (lambda: expected_speed(PromptLookup(), draft_cost=-0.1), ValueError, "draft_cost"),
    (lambda: expected_speed(PromptLookup(), verify_costs=(1.0, 0.0)), ValueError,
     "verify_costs"),
    (lambda: expected_speed(PromptLookup(), verify_costs="1,2"), ValueError, "verify_costs"),
    (lambda: expected_speed(PromptLookup(), memory=1.0), ValueError, "memory"),
    (lambda: expected_speed(PromptLookup(), memory="0.5"), ValueError,
     "memory must be a number in"),
    (lambda: expected_speed(PromptLookup(), draft_cost=np.float32("nan")), ValueError,
     "draft_cost"),
    (lambda: expected_speed(PromptLookup(), verify_costs=np.ones((2, 2))), ValueError,
     "verify_costs"),
    (lambda: expected_speed(PromptLookup(), prior_acceptance=0.0), ValueError,
     "prior_acceptance"),
    (lambda: expected_speed(PromptLookup(), min_length=-1), ValueError, "min_length"),
    (lambda: AdaptiveLength(PromptLookup(), draft_cost=0.5), ValueError, "expected_speed"),
    (lambda: AdaptiveLength(PromptLookup(), grow=-1), ValueError, "grow"),
    (lambda: AdaptiveLength(PromptLookup(), min_length=0), ValueError, "min_length"),
    (lambda: AdaptiveLength(PromptLookup(), start=True), ValueError, "start"),
    (lambda: AdaptiveLength(Lookahead()), ValueError, "its own token tree"),
    (lambda: AdaptiveLength(object()), TypeError, "wraps a drafter"),
])
def test_bad_settings_are_refused(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_a_tree_step_is_refused(tiny_lm, close_draft):
    with pytest.raises(ValueError, match="chains only"):
        specjax.speculative_generate(tiny_lm, AdaptiveLength(DraftModel(close_draft)),
                                     [[1, 2]], max_new_tokens=4,
                                     tree=specjax.TreeShape.from_paths([[0], [1]]),
                                     key=jax.random.key(0))


def test_numpy_costs_and_settings_are_the_same_settings_as_python_numbers():
    measured = expected_speed(PromptLookup(), draft_cost=np.float32(0.25),
                              verify_costs=np.array([1.0, 1.1, 1.25], np.float32),
                              memory=np.float64(0.8), prior_acceptance=np.float32(0.5))
    plain = expected_speed(PromptLookup(), draft_cost=0.25, verify_costs=(1.0, 1.1, 1.25),
                           memory=0.8, prior_acceptance=0.5)
    assert measured.draft_cost == 0.25 and type(measured.draft_cost) is float
    assert measured.verify_costs == pytest.approx(plain.verify_costs)
    assert all(type(v) is float for v in measured.verify_costs)
    assert (measured.memory, measured.prior_acceptance) == (0.8, 0.5)
    hash(measured)  # static fields: hashable, as a compile key needs


def test_the_wrapped_drafter_is_placed_as_its_target():
    """`placed_like` (a draft model following its target onto a mesh) reaches the drafter
    AdaptiveLength wraps; one without it is kept as it is."""

    class Placeable(PromptLookup):
        def placed_like(self, target):
            return dataclasses.replace(self, max_ngram_size=5)

    wrapped = expected_speed(Placeable(), draft_cost=0.1)
    placed = wrapped.placed_like(target=None)
    assert placed.drafter.max_ngram_size == 5 and placed.draft_cost == 0.1
    plain = expected_speed(PromptLookup())
    assert plain.placed_like(target=None) is plain
