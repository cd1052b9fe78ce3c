"""specjax.decoding.step_counters: a draft counts as proposed and accepted only where it could
become output (cut at max_new_tokens and at the EOS that ends the row), so alpha and tau
agree on short requests."""

import numpy as np

import specjax
from specjax import GREEDY, DraftModel, PromptLookup, TreeShape

PROMPTS = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3], [7, 7, 7, 7, 7], [30, 2, 5, 9]]


def _self_drafted(tiny_lm, max_new_tokens, **options):
    """The target drafting for itself, greedy: every draft that can be used is accepted."""
    return specjax.speculative_generate(tiny_lm, DraftModel(tiny_lm, "greedy"), PROMPTS,
                                        max_new_tokens=max_new_tokens, num_draft_tokens=4,
                                        sampling=GREEDY, **options)


def test_drafts_past_the_token_limit_are_not_counted(tiny_lm):
    for limit in (1, 2, 3, 6):
        stats = _self_drafted(tiny_lm, limit).stats
        # Every counted draft was emitted, and all of them were accepted.
        assert np.all(stats.accepted <= stats.emitted), limit
        assert np.all(stats.proposed <= stats.emitted), limit
        np.testing.assert_array_equal(stats.accepted, stats.proposed)
        assert stats.acceptance_rate == 1.0
        # tau counts the same tokens: emitted = accepted drafts + one target token per
        # forward, less the forwards whose last token was a draft (the limit cut them).
        assert np.all(stats.emitted <= stats.accepted + stats.target_forwards)


def test_drafts_after_an_eos_are_not_counted(tiny_lm):
    plain = np.asarray(specjax.generate(tiny_lm, PROMPTS, max_new_tokens=12,
                                        sampling=GREEDY).tokens)
    # An EOS that row 0 first emits at its third token.
    eos = next(int(t) for i, t in enumerate(plain[0]) if i >= 2 and t not in plain[0][:i])
    out = _self_drafted(tiny_lm, 12, eos_id=eos)
    stats = out.stats
    assert int(out.lengths[0]) == list(plain[0]).index(eos) + 1
    assert np.all(stats.proposed <= stats.emitted)
    np.testing.assert_array_equal(stats.accepted, stats.proposed)


def test_prompt_lookup_at_four_tokens_reports_what_it_emitted(tiny_lm):
    out = specjax.speculative_generate(tiny_lm, PromptLookup(), PROMPTS, max_new_tokens=4,
                                       num_draft_tokens=6, sampling=GREEDY)
    stats = out.stats
    assert np.all(stats.proposed <= 4) and np.all(stats.accepted <= stats.emitted)
    assert np.all(stats.accepted <= stats.proposed)


def test_a_tree_counts_only_the_accepted_nodes_it_emitted(tiny_lm):
    tree = TreeShape.from_paths([[0], [1], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
    stats = specjax.speculative_generate(tiny_lm, DraftModel(tiny_lm, "greedy"), PROMPTS,
                                         max_new_tokens=2, tree=tree, sampling=GREEDY).stats
    assert np.all(stats.accepted <= stats.emitted)
    # The per-position counts stay uncut: what verification accepted at each node.
    on_path = np.rint(stats.row_accepted_per_position * stats.target_forwards[:, None])
    assert np.all(on_path.sum(1) >= stats.accepted) and np.any(on_path.sum(1) > stats.accepted)
