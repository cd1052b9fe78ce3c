"""specjax.verification.rejection: the acceptance rule and residual, checked on exact small
cases."""

import jax
import jax.numpy as jnp
import numpy as np

from specjax.verification import rejection

# Jitted, as a decoder runs them: called eagerly, each of their operations would compile
# a program of its own (hundreds per module, most of its time).
accept_greedy = jax.jit(rejection.accept_greedy)
accept_sampled = jax.jit(rejection.accept_sampled)
residual_distribution = jax.jit(rejection.residual_distribution)

MAT, SAT, RAN = 0, 1, 2


def _broadcast(x, rows):
    return jnp.broadcast_to(jnp.asarray(x, jnp.float32), (rows,) + np.shape(x))


def test_worked_example_of_the_seed():
    """q = {mat .6, sat .3, ran .1}, p = {mat .5, sat .4, ran .1}, draft 'mat':
    accepted with probability 0.5/0.6 = 0.833; the residual is all on 'sat'."""
    q = [0.6, 0.3, 0.1]
    p = [0.5, 0.4, 0.1]
    np.testing.assert_allclose(residual_distribution(jnp.array([p]), jnp.array([q])),
                               [[0.0, 1.0, 0.0]], atol=1e-6)
    rows = 200_000
    out = accept_sampled(jax.random.key(0), jax.random.key(1),
                         jnp.full((rows, 1), MAT, jnp.int32), _broadcast([q], rows),
                         _broadcast([p, [1 / 3] * 3], rows))
    accepted = np.asarray(out.num_accepted) == 1
    assert abs(accepted.mean() - 5 / 6) < 5 * np.sqrt(5 / 36 / rows)
    assert set(np.asarray(out.next_token)[~accepted].tolist()) == {SAT}


def test_first_token_follows_p_for_any_q_chi_square():
    """Drafts drawn from q, accepted or corrected: the committed token is ~ p."""
    from scipy import stats  # here, not at the top: every test process collects this module

    rows, vocab = 100_000, 5
    p = np.array([0.05, 0.4, 0.25, 0.3, 0.0])
    q = np.array([0.5, 0.1, 0.1, 0.1, 0.2])
    drafts = jax.random.choice(jax.random.key(2), vocab, (rows, 1), p=jnp.asarray(q))
    out = accept_sampled(jax.random.key(3), jax.random.key(4), drafts.astype(jnp.int32),
                         _broadcast([q], rows), _broadcast([p, np.full(vocab, 0.2)], rows))
    first = np.where(np.asarray(out.num_accepted) == 1, np.asarray(drafts[:, 0]),
                     np.asarray(out.next_token))
    counts = np.bincount(first, minlength=vocab)
    assert counts[4] == 0  # p(4) = 0: never emitted though q drafts it 20% of the time
    assert stats.chisquare(counts[:4], p[:4] * rows).pvalue > 1e-3


def test_one_hot_q_accepts_with_probability_p_and_resamples_without_x():
    rows = 100_000
    p = np.array([0.3, 0.5, 0.2])
    q = np.array([0.0, 1.0, 0.0])  # greedy draft of token 1
    out = accept_sampled(jax.random.key(5), jax.random.key(6), jnp.ones((rows, 1), jnp.int32),
                         _broadcast([q], rows), _broadcast([p, p], rows))
    accepted = np.asarray(out.num_accepted) == 1
    assert abs(accepted.mean() - 0.5) < 5 * np.sqrt(0.25 / rows)
    corrections = np.asarray(out.next_token)[~accepted]
    assert 1 not in corrections
    assert abs((corrections == 0).mean() - 0.6) < 0.01  # 0.3 / (0.3 + 0.2)


def test_only_the_leading_accepted_prefix_counts_and_bonus_comes_from_p_last():
    # Greedy target: drafts [match, mismatch, match] -> 1 accepted, correction = argmax at 1.
    logits = jnp.array([[[0.0, 5.0, 0.0], [9.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 7.0, 0.0]],
                        [[0.0, 5.0, 0.0], [9.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 7.0, 0.0]]])
    drafts = jnp.array([[1, 2, 2], [1, 0, 2]], jnp.int32)
    out = accept_greedy(drafts, logits)
    assert out.num_accepted.tolist() == [1, 3]
    assert out.accepted.tolist() == [[True, False, False], [True, True, True]]
    assert out.next_token.tolist() == [0, 1]  # row 1: all accepted, bonus argmax p_4


def test_all_accepted_rows_draw_the_bonus_from_p_k_plus_1():
    rows = 50_000
    q = np.array([0.0, 1.0, 0.0])
    certain = np.array([0.0, 1.0, 0.0])
    bonus = np.array([0.7, 0.0, 0.3])
    out = accept_sampled(jax.random.key(7), jax.random.key(8), jnp.ones((rows, 1), jnp.int32),
                         _broadcast([q], rows), _broadcast([certain, bonus], rows))
    assert np.all(np.asarray(out.num_accepted) == 1)
    tokens = np.asarray(out.next_token)
    assert abs((tokens == 0).mean() - 0.7) < 0.01 and not np.any(tokens == 1)


def test_a_row_accepts_only_the_drafts_it_offers_and_takes_its_bonus_there():
    logits = jnp.array([[[0.0, 5.0, 0.0], [0.0, 0.0, 9.0], [0.0, 0.0, 3.0], [7.0, 0.0, 0.0]]] * 3)
    drafts = jnp.array([[1, 2, 2]] * 3, jnp.int32)  # all equal the argmax
    out = accept_greedy(drafts, logits, jnp.array([1, 0, 3]))
    assert out.num_accepted.tolist() == [1, 0, 3]
    assert out.next_token.tolist() == [2, 1, 0]  # the argmax after the offered drafts
    # Sampled: q of the draft after the offer is ignored; the bonus comes from p there.
    rows = 50_000
    certain, bonus = np.array([0.0, 1.0, 0.0]), np.array([0.7, 0.0, 0.3])
    out = accept_sampled(jax.random.key(7), jax.random.key(8), jnp.ones((rows, 2), jnp.int32),
                         _broadcast([certain, np.array([0.0, 0.0, 1.0])], rows),
                         _broadcast([certain, bonus, certain], rows),
                         jnp.ones((rows,), jnp.int32))
    assert np.all(np.asarray(out.num_accepted) == 1)
    tokens = np.asarray(out.next_token)
    assert abs((tokens == 0).mean() - 0.7) < 0.01 and abs((tokens == 2).mean() - 0.3) < 0.01


def test_residual_falls_back_to_p_when_rounding_leaves_no_mass():
    p = jnp.array([[0.5, 0.5]])
    np.testing.assert_array_equal(residual_distribution(p, p), p)


def test_rows_use_their_own_keys():
    rows = 64
    q = _broadcast([[0.5, 0.5]], rows)
    p = _broadcast([[0.2, 0.8], [0.5, 0.5]], rows)
    drafts = jnp.zeros((rows, 1), jnp.int32)
    full = accept_sampled(jax.random.key(9), jax.random.key(10), drafts, q, p)
    half = accept_sampled(jax.random.key(9), jax.random.key(10), drafts[:8], q[:8], p[:8])
    np.testing.assert_array_equal(full.num_accepted[:8], half.num_accepted)
    np.testing.assert_array_equal(full.next_token[:8], half.next_token)
