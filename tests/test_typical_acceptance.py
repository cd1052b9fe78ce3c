"""Typical acceptance (lossy, labelled): the threshold, the longest passing prefix of a
chain, the deepest passing path of a tree, greedy rows unchanged."""

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from specjax import GREEDY, DraftModel, SamplingConfig, TypicalAcceptance
from specjax.trees.shapes import TreeShape
from specjax.verification.typical_acceptance import (
    accept_typical_chain,
    accept_typical_tree,
    typical_thresholds,
)


def test_the_threshold_is_min_of_epsilon_and_delta_times_exp_minus_entropy():
    p_BNV = jnp.asarray([[[0.25, 0.25, 0.25, 0.25], [1.0, 0.0, 0.0, 0.0],
                          [0.7, 0.1, 0.1, 0.1]]])
    rule = TypicalAcceptance(epsilon=0.2, delta=0.6)
    entropy = -(0.7 * np.log(0.7) + 3 * 0.1 * np.log(0.1))
    expected = [min(0.2, 0.6 / 4), 0.2, min(0.2, 0.6 * np.exp(-entropy))]
    np.testing.assert_allclose(typical_thresholds(p_BNV, rule)[0], expected, rtol=1e-6)


def test_a_chain_keeps_its_longest_passing_prefix_and_draws_from_p_where_it_ends():
    # Uniform p over 4 ids: threshold min(0.09, 0.3 / 4) = 0.075; p = 0.25 passes, an id
    # with p = 0 does not. Position 2 holds an id outside p's support.
    uniform, one_hot = [0.25] * 4, [0.0, 0.0, 1.0, 0.0]
    p_BK1V = jnp.asarray([[uniform, uniform, [0.0, 0.5, 0.5, 0.0], one_hot],
                          [uniform, uniform, uniform, one_hot]])
    tokens_BK = jnp.asarray([[1, 3, 0], [1, 3, 0]])
    verdict = accept_typical_chain(jax.random.key(0), tokens_BK, p_BK1V, TypicalAcceptance())
    np.testing.assert_array_equal(verdict.num_accepted, [2, 3])
    assert int(verdict.next_token[1]) == 2  # the bonus from p_4 (one-hot at id 2)
    assert int(verdict.next_token[0]) in (1, 2)  # from p_3, where row 0 stopped
    limited = accept_typical_chain(jax.random.key(0), tokens_BK, p_BK1V, TypicalAcceptance(),
                                   jnp.asarray([3, 1]))
    np.testing.assert_array_equal(limited.num_accepted, [2, 1])


def test_a_tree_keeps_its_deepest_passing_path():
    """Root children A (0) and B (1); A's child C (2) fails; B -> D (3) -> E (4) passes:
    the path is B, D, E although A comes first, and the next token is drawn at E."""
    vocab = 4
    p = np.full((1, 6, vocab), 0.25, np.float32)  # root, then nodes 0..4
    p[0, 1] = [0.0, 0.0, 0.0, 1.0]  # at A: C's token (0) has p = 0
    p[0, 5] = [0.0, 1.0, 0.0, 0.0]  # at E: the next token is id 1
    tokens = jnp.asarray([[0, 2, 0, 3, 2]])
    parents = jnp.asarray([[-1, -1, 0, 1, 3]])
    walk = accept_typical_tree(jax.random.key(0), tokens, parents, jnp.asarray(p),
                               TypicalAcceptance(), max_depth=3)
    np.testing.assert_array_equal(walk.path, [[1, 3, 4]])
    assert int(walk.num_accepted[0]) == 3 and int(walk.next_token[0]) == 1
    skipped = accept_typical_tree(jax.random.key(0), tokens, parents, jnp.asarray(p),
                                  TypicalAcceptance(), max_depth=3,
                                  never_accept_BN=jnp.asarray([[False, False, False, True,
                                                                False]]))
    np.testing.assert_array_equal(skipped.path, [[0, -1, -1]])  # A: first among depth 1
    at_root_only_3 = p.copy()
    at_root_only_3[0, 0] = [0.0, 0.0, 0.0, 1.0]  # neither A's id 0 nor B's id 2 passes
    nothing = accept_typical_tree(jax.random.key(0), tokens, parents,
                                  jnp.asarray(at_root_only_3), TypicalAcceptance(),
                                  max_depth=3)
    np.testing.assert_array_equal(nothing.path, [[-1, -1, -1]])
    assert int(nothing.next_token[0]) == 3


def test_greedy_rows_of_a_tree_batch_follow_generate(tiny_lm, close_draft):
    tree = TreeShape.from_paths([[0], [1], [0, 0], [1, 0]])
    prompts = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3]]
    plain = specjax.generate(tiny_lm, prompts, max_new_tokens=16, sampling=GREEDY)
    out = specjax.speculative_generate(
        tiny_lm, DraftModel(close_draft, "sample"), prompts, max_new_tokens=16, tree=tree,
        sampling=[GREEDY, SamplingConfig(temperature=1.0), GREEDY], key=jax.random.key(2),
        verification=TypicalAcceptance(epsilon=0.2, delta=0.4))
    assert out.stats.verification == "typical (not exact; epsilon=0.2, delta=0.4)"
    for row in (0, 2):
        np.testing.assert_array_equal(out.tokens[row], plain.tokens[row])
