"""AdaptiveLength: each row's draft length follows its own acceptance (+grow after a fully
accepted offer, -shrink after a rejection, within [min_length, K]); rows accept only among
the drafts they offered, and the stats count those."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax import GREEDY, DraftModel
from specjax.drafters import AdaptiveLength, Lookahead, PromptLookup
from specjax.speculative_loop import init_speculative_state, speculative_config
from specjax.step import jitted_step
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


def test_a_rejected_row_shrinks_its_offer_to_min_length():
    wrong = plus_one_lm(16).__class__({"unused": jnp.zeros((1,), jnp.float32)},
                                      PlusTwoApply(16), TokenCache(), vocab_size=16,
                                      max_seq_len=256)
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


@pytest.mark.parametrize("make, error, message", [
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
