"""specjax.drafters.prompt_lookup: known drafts on hand-made rows, greedy equality with
generate, and a chi-square test of the sampled joint where repeats are common."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import GREEDY, PromptLookup, generate, speculative_generate


def _lookup(rows, k, capacity=24, junk=7, **kwargs):
    sequence = np.full((len(rows), capacity), junk, np.int32)  # stale slots hold junk
    for b, row in enumerate(rows):
        sequence[b, : len(row)] = row
    lengths = jnp.array([len(r) for r in rows], jnp.int32)
    drafts, sizes = jax.jit(lambda s, n: PromptLookup(**kwargs).lookup(s, n, k))(
        jnp.asarray(sequence), lengths)
    return np.asarray(drafts).tolist(), np.asarray(sizes).tolist()


def test_most_recent_occurrence_of_the_longest_ngram():
    assert PromptLookup().min_ngram_size == 2  # the default; 1-grams are tested here
    drafts, sizes = _lookup([
        [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3],   # [1 2 3] at ends 2 and 6: the later wins
        [5, 9, 1, 6, 3, 1, 8, 9, 1],         # 2-gram [9 1] beats the more recent 1-gram [1]
        [1, 2, 3],                           # no earlier occurrence of anything
        [4, 4],                              # 1-gram [4] at end 0
    ], k=6, min_ngram_size=1)
    assert drafts[0] == [5, 1, 2, 3, 5, 1]   # continuation 5 1 2 3, then it wraps (period 4)
    assert sizes == [3, 2, 0, 1]
    assert drafts[1] == [6, 3, 1, 8, 9, 1]
    assert drafts[2] == [3, 3, 3, 3, 3, 3]   # no match: the last token, one-hot, exact
    assert drafts[3] == [4, 4, 4, 4, 4, 4]


def test_min_ngram_size_and_stale_slots_are_respected():
    # Junk 7s after the row's end must never be matched or copied.
    drafts, sizes = _lookup([[7, 1, 2, 9, 1]], k=3, junk=7, max_ngram_size=3, min_ngram_size=2)
    assert sizes == [0] and drafts == [[1, 1, 1]]
    drafts, sizes = _lookup([[7, 1, 2, 9, 1]], k=3, junk=7, max_ngram_size=3, min_ngram_size=1)
    assert sizes == [1] and drafts == [[2, 9, 1]]


def test_settings_are_validated():
    with pytest.raises(ValueError, match="min_ngram_size"):
        PromptLookup(max_ngram_size=2, min_ngram_size=3)
    with pytest.raises(ValueError, match="max_ngram_size must be an int >= 1"):
        PromptLookup(max_ngram_size=0)


@pytest.mark.parametrize("num_draft_tokens", [1, 3, 6])
def test_greedy_equals_generate_with_and_without_matches(tiny_lm, num_draft_tokens):
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [9, 8, 7], [5, 6, 5, 6, 5], [11]]
    plain = generate(tiny_lm, prompts, max_new_tokens=24, sampling=GREEDY, eos_id=0)
    spec = speculative_generate(tiny_lm, PromptLookup(), prompts, max_new_tokens=24,
                                num_draft_tokens=num_draft_tokens, sampling=GREEDY, eos_id=0)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.lengths, plain.lengths)
    assert int(spec.stats.draft_forwards.sum()) == 0


def test_a_batch_without_matches_runs_a_one_token_step(tiny_lm):
    """No row has an earlier occurrence of its last token: the step verifies nothing and
    runs one target forward on the last token (plain decoding's cost), with generate's
    output. One row with a match makes the step verify its K drafts; the other row
    offers none and takes one token."""
    no_match = [[1, 2, 3], [9, 8, 7, 6]]
    plain = generate(tiny_lm, no_match, max_new_tokens=1, sampling=GREEDY)
    spec = speculative_generate(tiny_lm, PromptLookup(), no_match, max_new_tokens=1,
                                num_draft_tokens=4, sampling=GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.stats.target_forwards, [1, 1])
    np.testing.assert_array_equal(spec.stats.proposed, [0, 0])  # nothing was verified
    mixed = [[1, 2, 3], [9, 8, 4, 9, 8]]  # row 1's last bigram occurred before
    spec = speculative_generate(tiny_lm, PromptLookup(), mixed, max_new_tokens=1,
                                num_draft_tokens=4, sampling=GREEDY)
    # Row 1's four drafts are verified; with room for one token, one of them counts.
    np.testing.assert_array_equal(spec.stats.proposed, [0, 1])
    # Over a longer run both kinds of step happen, and the output is still generate's.
    prompts = [[1, 2, 3, 4, 5, 6], [20, 21, 22]]
    plain = generate(tiny_lm, prompts, max_new_tokens=30, sampling=GREEDY)
    spec = speculative_generate(tiny_lm, PromptLookup(min_ngram_size=1), prompts,
                                max_new_tokens=30,
                                num_draft_tokens=4, sampling=GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    forwards = int(spec.stats.target_forwards.max())
    assert 0 < int(spec.stats.proposed.max()) < 4 * forwards  # some steps were narrow
