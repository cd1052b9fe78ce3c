"""specjax.drafters.lookahead: the n-gram pool, the window's tree and its Jacobi update,
and the combined forward (window and candidates under one mask) against a reference
that runs every node's own text alone."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
from specjax.decoding.sampling import sampling_params
from specjax.decoding.speculative_loop import init_speculative_state
from specjax.decoding.step import SpeculativeConfig, propose, verify
from specjax.drafters.base import Commit, DraftContext
from specjax.drafters.lookahead import Lookahead
from specjax.lm.causal_lm import full_logits
from specjax.trees.shapes import TreeBudget, node_paths


def _empty_state(drafter, batch=1, prompt=(0, 1)):
    prompt = jnp.asarray([list(prompt)] * batch, jnp.int32)
    return drafter.init(prompt, jnp.full((batch,), prompt.shape[1], jnp.int32), 16)


def _pool(drafter, state, token, row=0):
    ngrams, lengths = drafter.candidates(state, jnp.asarray([token] * state.window.shape[0]))
    return [tuple(ngrams[row, g].tolist()) for g in range(drafter.guesses)
            if lengths[row, g] > 0]


def test_the_pool_keeps_the_newest_distinct_ngrams_per_first_token():
    drafter = Lookahead(window=2, ngram=3, guesses=2, buckets=4)
    state = _empty_state(drafter, prompt=(0, 1))  # shorter than an n-gram: nothing added
    assert _pool(drafter, state, 0) == []
    add = lambda s, key, ngram: drafter.insert(
        s, jnp.asarray([key]), jnp.asarray([ngram]), jnp.asarray([True]))
    state = add(state, 5, [1, 2])
    state = add(state, 5, [1, 2])  # held already: not added twice
    state = add(state, 9, [7, 7])  # 9 % 4 == 5 % 4: same bucket, another key
    assert _pool(drafter, state, 5) == [(1, 2)]
    assert _pool(drafter, state, 9) == [(7, 7)]
    state = add(state, 5, [3, 4])  # the bucket is full: the oldest, 5 [1 2], goes
    assert _pool(drafter, state, 5) == [(3, 4)] and _pool(drafter, state, 9) == [(7, 7)]
    state = add(state, 13, [0, 0])  # then the oldest is 9 [7 7]
    assert _pool(drafter, state, 13) == [(0, 0)] and _pool(drafter, state, 9) == []
    assert _pool(drafter, state, 5) == [(3, 4)]
    invalid = drafter.insert(state, jnp.asarray([5]), jnp.asarray([[6, 6]]),
                             jnp.asarray([False]))
    assert _pool(drafter, invalid, 5) == [(3, 4)]


def test_init_pools_the_prompts_ngrams_per_row():
    drafter = Lookahead(window=2, ngram=3, guesses=3, buckets=64)
    prompt = jnp.asarray([[1, 2, 3, 1, 2, 4, 9], [1, 5, 6, 0, 0, 0, 0]], jnp.int32)
    state = drafter.init(prompt, jnp.asarray([7, 3]), 32)
    assert _pool(drafter, state, 1, row=0) == [(2, 4), (2, 3)]  # newest first
    assert _pool(drafter, state, 2, row=0) == [(4, 9), (3, 1)]
    assert _pool(drafter, state, 1, row=1) == [(5, 6)]  # padding is not text
    assert _pool(drafter, state, 0, row=1) == []


def test_the_window_is_a_tree_whose_paths_are_jacobi_trajectories():
    drafter = Lookahead(window=3, ngram=4, guesses=2)
    assert drafter.proposal_tree == TreeBudget(num_nodes=15, max_depth=3, max_branching=3)
    parents = np.asarray(drafter.window_parents()).tolist()
    base = 6  # G (N - 1) candidate slots first
    node = lambda level, column: base + column * 3 + level
    for column in range(3):
        for level in range(3):
            # Ancestors of (l, j): level 0 of columns 0..j, then column j's levels < l.
            ancestors, current = [], parents[node(level, column) - base]
            while current >= 0:
                ancestors.append(current)
                current = parents[current - base]
            expected = ({node(0, c) for c in range(column + 1)}
                        | {node(lv, column) for lv in range(level)}) - {node(level, column)}
            assert set(ancestors) == expected


def test_one_forward_gives_every_node_the_logits_of_its_own_text(tiny_lm):
    """The combined mask against a reference built node by node: each node's logits in
    the verify forward equal a plain forward over the committed tokens and the node's
    ancestors, then the node."""
    drafter = Lookahead(window=3, ngram=3, guesses=3, buckets=16)
    prompts = [[1, 2, 3, 1, 2, 4, 1, 2], [5, 6, 7, 5, 6]]
    state, drafter = init_speculative_state(tiny_lm, drafter, prompts, max_new_tokens=8,
                                            sampling=specjax.GREEDY)
    config = SpeculativeConfig(num_draft_tokens=drafter.proposal_tree.num_nodes,
                               sampling=specjax.GREEDY, tree=drafter.proposal_tree)
    _, proposal, _ = propose(drafter, state, jax.random.key(0), config, tiny_lm,
                             sampling_params(specjax.GREEDY, 2))
    assert bool(jnp.any(~proposal.never_accept[:, :6]))  # row 0 has candidates for 2
    logits, _, _ = verify(tiny_lm, state, proposal, config)
    tokens, parents = np.asarray(proposal.tokens), np.asarray(proposal.parents)
    texts, where = [], []
    for b, prompt in enumerate(prompts):
        for n, path in enumerate(node_paths(tokens[b], parents[b])):
            texts.append(prompt + list(path))
            where.append((b, n))
    # One causal forward over every node's text, right-padded: a position never sees the
    # padding after it.
    width = max(len(text) for text in texts)
    padded = jnp.asarray([text + [0] * (width - len(text)) for text in texts])
    reference = full_logits(tiny_lm, padded)
    for i, (b, n) in enumerate(where):
        np.testing.assert_allclose(logits[b, n + 1], reference[i, len(texts[i]) - 1],
                                   atol=2e-4)


def test_commit_moves_the_window_up_and_pools_its_columns():
    drafter = Lookahead(window=2, ngram=3, guesses=2, buckets=32)
    state = _empty_state(drafter, batch=2)
    state = dataclasses.replace(state, window=jnp.asarray([[[1, 2], [3, 4]]] * 2, jnp.int32))
    nodes = drafter.proposal_tree.num_nodes  # 8: 4 candidate slots, then (0,0) (1,0) (0,1) (1,1)
    target_tokens = np.full((2, nodes + 1), -1, np.int32)
    target_tokens[:, 1 + 4 + 1] = 7   # after (1, 0): the update of column 0
    target_tokens[:, 1 + 4 + 3] = 8   # after (1, 1): the update of column 1
    sequence = jnp.asarray([[0, 1, 9, 9, 0, 0]] * 2, jnp.int32)
    commit = Commit(old_lengths=jnp.asarray([2, 2]), new_lengths=jnp.asarray([4, 3]),
                    num_accepted=jnp.asarray([1, 0]), sequence=sequence,
                    target_hidden=jnp.zeros((2, nodes + 1, 4)),
                    active=jnp.asarray([True, False]), path=None,
                    target_tokens=jnp.asarray(target_tokens))
    new = drafter.commit(state, commit)
    assert new.window[0].tolist() == [[3, 4], [7, 8]]     # level 1 moved up, updates below
    assert new.window[1].tolist() == [[1, 2], [3, 4]]     # an inactive row is left alone
    assert _pool(drafter, new, 2) == [(4, 8)]
    # The committed text 0 1 9 9 adds 0 [1 9] and 1 [9 9], newer than the column 1 [3 7].
    assert _pool(drafter, new, 1) == [(9, 9), (3, 7)]
    assert _pool(drafter, new, 0) == [(1, 9)]
    assert _pool(drafter, new, 1, row=1) == []


def test_greedy_decoding_equals_generate_and_accepts_window_ngrams(tiny_lm):
    prompts = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3], [4]]
    plain = specjax.generate(tiny_lm, prompts, max_new_tokens=32, sampling=specjax.GREEDY)
    spec = specjax.speculative_generate(tiny_lm, Lookahead(window=4, ngram=3, guesses=3,
                                                           buckets=32),
                                        prompts, max_new_tokens=32, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    assert spec.stats.mean_accepted_length > 1.2


def test_settings_and_trees_are_validated(tiny_lm):
    with pytest.raises(ValueError, match="ngram=...\\) must be an int >= 2"):
        Lookahead(ngram=1)
    with pytest.raises(ValueError, match="window"):
        Lookahead(window=0)
    with pytest.raises(ValueError, match="builds its own tree"):
        specjax.speculative_generate(tiny_lm, Lookahead(), [[1, 2]], max_new_tokens=4,
                                     tree=specjax.TreeShape.chain(3))
    with pytest.raises(ValueError, match="TreeBudget is the tree of a drafter"):
        specjax.speculative_generate(tiny_lm, specjax.PromptLookup(), [[1, 2]],
                                     max_new_tokens=4, tree=Lookahead().proposal_tree)
    context = DraftContext(jnp.zeros((1, 8), jnp.int32), jnp.asarray([2]))
    with pytest.raises(ValueError, match="proposes its own tree"):
        Lookahead().propose(_empty_state(Lookahead()), context, jax.random.key(0),
                            num_draft_tokens=3, sampling=None, vocab_size=32, tree=None)
