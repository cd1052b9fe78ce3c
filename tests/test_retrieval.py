"""specjax.drafters.retrieval: the row's own matches against brute force, the tree drafted
from a hand-made datastore, the sources' precedence, the frequency threshold and the
adaptive length, and a datastore that grows between calls."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.drafters.base import DraftContext
from specjax.drafters.datastore import Datastore
from specjax.drafters.retrieval import Retrieval, own_text_matches
from specjax.trees.shapes import node_paths


def _context(rows, capacity=16, junk=9):
    sequence = np.full((len(rows), capacity), junk, np.int32)
    for b, row in enumerate(rows):
        sequence[b, :len(row)] = row
    return DraftContext(jnp.asarray(sequence), jnp.asarray([len(r) for r in rows], jnp.int32))


def test_own_text_matches_are_the_latest_occurrences_of_the_longest_suffix():
    rows = [[1, 2, 3, 1, 2, 4, 1, 2, 5, 7, 1, 2],  # [1 2] at ends 1, 4, 7
            [4, 5, 6, 4, 5],                        # [4 5] at end 1
            [1, 2, 3]]                              # nothing earlier
    context = _context(rows)
    tokens, lengths, match = jax.jit(own_text_matches, static_argnums=(2, 3, 4, 5))(
        context.sequence, context.lengths, 4, 1, 2, 3)
    assert match.tolist() == [2, 2, 0]
    read = lambda b: [tuple(tokens[b, c, :lengths[b, c]].tolist()) for c in range(2)
                      if lengths[b, c] > 0]
    assert read(0) == [(5, 7, 1), (4, 1, 2)]     # the two most recent, newest first
    assert read(1) == [(6, 4, 5)]                # cut at the row's end
    assert read(2) == []


def _tree(drafter, rows, vocab=10, capacity=16):
    _, proposal = drafter.propose(0, _context(rows, capacity), jax.random.key(0),
                                  num_draft_tokens=drafter.max_nodes, sampling=None,
                                  vocab_size=vocab, tree=drafter.proposal_tree)
    trees = [sorted(node_paths(proposal.tokens[b], proposal.parents[b],
                               ~proposal.never_accept[b])) for b in range(len(rows))]
    return trees, proposal


STORE = Datastore.build([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6], [8, 8]], vocab_size=10)


def test_the_tree_merges_what_followed_the_match_in_the_datastore():
    drafter = Retrieval(STORE, max_nodes=6, depth=3, search_own_text=False,
                        min_probability=0.0)
    trees, proposal = _tree(drafter, [[0, 1, 2], [7, 7]])
    assert trees[0] == [(3,), (3, 4), (3, 5), (6,)]
    assert trees[1] == []  # no match: nothing offered
    assert proposal.num_real.tolist() == [4, 0]
    # The most frequent branch first: 3 (2 of the 3 occurrences) is the first child.
    assert int(proposal.tokens[0, 0]) == 3
    frequent = Retrieval(STORE, max_nodes=6, depth=3, search_own_text=False,
                         min_probability=0.5)
    assert _tree(frequent, [[0, 1, 2]])[0][0] == [(3,)]
    short = Retrieval(STORE, max_nodes=6, depth=3, search_own_text=False,
                      min_probability=0.0, speculation_factor=0.5)  # a 2-token match: 1 node
    assert _tree(short, [[0, 1, 2]])[0][0] == [(3,)]


def test_the_longest_match_wins_and_equal_matches_are_merged():
    drafter = Retrieval(STORE, max_nodes=8, depth=2, min_probability=0.0)
    # Own text: [0 1 2] occurs earlier (a 3-token match), the datastore has only [1 2].
    longer_own, _ = _tree(drafter, [[0, 1, 2, 7, 0, 1, 2]])
    assert longer_own[0] == [(7,), (7, 0)]
    # Own text [1 2] (2 tokens) ties with the datastore's: both sources count.
    tied, _ = _tree(drafter, [[1, 2, 9, 5, 1, 2]])
    assert tied[0] == [(3,), (3, 4), (3, 5), (6,), (9,), (9, 5)]
    # A bonus for the row's own text breaks the tie its way.
    own_first = Retrieval(STORE, max_nodes=8, depth=2, min_probability=0.0, own_text_bonus=1)
    assert _tree(own_first, [[1, 2, 9, 5, 1, 2]])[0][0] == [(9,), (9, 5)]


def test_remember_grows_the_datastore_and_the_next_call_drafts_from_it(tiny_lm):
    prompts = [[3, 1, 4, 1, 5], [2, 7]]
    plain = specjax.generate(tiny_lm, prompts, max_new_tokens=20, sampling=specjax.GREEDY)
    drafter = Retrieval(None, max_nodes=8, depth=4, search_own_text=True)
    first = specjax.speculative_generate(tiny_lm, drafter, prompts, max_new_tokens=20,
                                         sampling=specjax.GREEDY)
    np.testing.assert_array_equal(first.tokens, plain.tokens)
    answers = [prompt + np.asarray(first.tokens[b]).tolist()
               for b, prompt in enumerate(prompts)]
    drafter = drafter.remember(answers, vocab_size=tiny_lm.vocab_size)
    assert drafter.datastore.num_documents == 2
    again = specjax.speculative_generate(tiny_lm, drafter, prompts, max_new_tokens=20,
                                         sampling=specjax.GREEDY)
    np.testing.assert_array_equal(again.tokens, plain.tokens)
    assert again.stats.mean_accepted_length > 3  # the answers are drafted whole
    assert drafter.remember([[1, 2]]).datastore.num_documents == 3


def test_settings_and_vocabularies_are_validated(tiny_lm):
    with pytest.raises(ValueError, match="nothing to search"):
        Retrieval(None, search_own_text=False)
    with pytest.raises(ValueError, match="depth=7\\) exceeds max_nodes=6"):
        Retrieval(max_nodes=6, depth=7)
    with pytest.raises(ValueError, match="min_probability"):
        Retrieval(min_probability=2.0)
    with pytest.raises(ValueError, match="own_text_bonus"):
        Retrieval(own_text_bonus=-1)
    with pytest.raises(TypeError, match="Datastore"):
        Retrieval(np.zeros(4))
    with pytest.raises(ValueError, match="pass vocab_size"):
        Retrieval().remember([[1]])
    with pytest.raises(ValueError, match="10-token vocabulary but the target's has 32"):
        specjax.speculative_generate(tiny_lm, Retrieval(STORE), [[1, 2]], max_new_tokens=4)


def test_a_step_verifies_only_the_nodes_the_rows_offer(tiny_lm):
    """Graded widths: 0, 1, 2, 4, 8 of a 16-node budget; the row's own short repeats make
    small trees, verified at the width of their real nodes, never the whole budget."""
    from specjax.decoding.step import SpeculativeConfig, verify_widths

    drafter = Retrieval(None, max_nodes=16, depth=4)
    config = SpeculativeConfig(num_draft_tokens=16, tree=drafter.proposal_tree)
    assert verify_widths(drafter, config) == (0, 1, 2, 4, 8, 16)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6] * 3  # own text: one continuation per match
    out = specjax.speculative_generate(tiny_lm, drafter, [prompt], max_new_tokens=16,
                                       sampling=specjax.GREEDY)
    plain = specjax.generate(tiny_lm, [prompt], max_new_tokens=16, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    assert 0 < out.stats.nodes_per_step <= 8


def test_more_samples_than_the_request_has_tokens_drafts_what_there_is():
    rows = [[1, 2, 3, 1, 2], [4, 5]]
    context = _context(rows, capacity=6)
    tokens, lengths, match = own_text_matches(context.sequence, context.lengths, 4, 1, 8, 3)
    assert tokens.shape == (2, 8, 3) and match.tolist() == [2, 0]  # 8 samples, 6 slots
    assert [tokens[0, 0, :lengths[0, 0]].tolist()] == [[3, 1, 2]]
    assert int(jnp.sum(lengths > 0)) == 1
    # The drafter itself (the datastore's samples and the row's own, 8 each) on a 6-slot
    # request: JAX's top_k refused k > 6 here before.
    trees, _ = _tree(Retrieval(STORE, samples=8, max_nodes=4, depth=3, min_match=1),
                     rows, vocab=10, capacity=6)
    assert trees[0] and trees[1] == []
