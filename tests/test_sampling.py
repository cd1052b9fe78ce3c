"""specjax.decoding.sampling: the one warper (temperature -> top-k -> top-p) and its edge cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import GREEDY, SamplingConfig
from specjax.decoding import sampling as warper
from specjax.decoding.sampling import distinct_configs, sampling_params


def jitted(function):
    """`function(..., sampling, ...)` jitted as a decoder runs it: a SamplingConfig is a
    constant of the program (static), SamplingParams are its data. Called eagerly, each
    operation of the warper would compile a program of its own (most of this module's
    time)."""
    flags = ("deterministic",) if function is warper.draw_with_q else ()
    with_constants = jax.jit(function, static_argnames=("sampling", *flags))
    with_data = jax.jit(function, static_argnames=flags)

    def call(*args, **kwargs):
        settings = kwargs.get("sampling", args[-1] if args else None)
        return (with_constants if isinstance(settings, SamplingConfig) else with_data)(
            *args, **kwargs)

    return call


warp_logits = jitted(warper.warp_logits)
probabilities = jitted(warper.probabilities)
sample_tokens = jitted(warper.sample_tokens)
draw_with_q = jitted(warper.draw_with_q)
tree_scores = jitted(warper.tree_scores)


def reference_warp(logits, temperature, top_k, top_p):
    """Independent numpy port of transformers' warpers (ascending-sort top-p form)."""
    x = np.asarray(logits, np.float64) / temperature
    if top_k:
        kth = np.sort(x, axis=-1)[..., -top_k][..., None]
        x = np.where(x < kth, -np.inf, x)
    if top_p < 1.0:
        out = np.empty_like(x)
        for i, row in enumerate(x):
            order = np.argsort(row, kind="stable")
            probs = np.exp(row[order] - row.max())
            probs /= probs.sum()
            remove = np.cumsum(probs) <= 1 - top_p
            remove[-1] = False  # min_tokens_to_keep = 1
            row = row.copy()
            row[order[remove]] = -np.inf
            out[i] = row
        x = out
    return x


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8), (0.5, 0, 0.9),
    (0.8, 6, 0.7), (2.0, 3, 0.95), (1.0, 1, 1.0),
])
def test_warp_matches_transformers_semantics(temperature, top_k, top_p):
    logits = np.random.default_rng(0).normal(size=(64, 20)).astype(np.float32) * 2
    config = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    ours = np.asarray(probabilities(jnp.asarray(logits), config))
    ref = _softmax(reference_warp(logits, temperature, top_k, top_p))
    np.testing.assert_array_equal(ours > 0, ref > 0)
    np.testing.assert_allclose(ours, ref, atol=1e-6)
    assert ours.dtype == np.float32


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.2]]))
    keep = lambda p: np.isfinite(np.asarray(warp_logits(logits, SamplingConfig(top_p=p))))[0]
    assert keep(0.5).tolist() == [True, False, False]  # 0.5 reaches 0.5 exactly
    assert keep(0.6).tolist() == [True, True, False]   # 0.3 crosses 0.6: kept
    assert keep(0.81).tolist() == [True, True, True]
    assert keep(0.01).tolist() == [True, False, False]  # the top token always stays


def test_order_is_temperature_then_top_k_then_top_p():
    # At temperature 1 the top-2 mass is 0.5+0.3=0.8 >= 0.75 so top_p keeps 2 tokens; a
    # low temperature sharpens first, so the top token alone reaches 0.75.
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    warm = warp_logits(logits, SamplingConfig(temperature=1.0, top_p=0.75))
    cold = warp_logits(logits, SamplingConfig(temperature=0.25, top_p=0.75))
    assert np.isfinite(np.asarray(warm)).sum() == 2
    assert np.isfinite(np.asarray(cold)).sum() == 1
    # top-k before top-p: top_k=1 leaves one token whatever top_p would keep.
    both = warp_logits(logits, SamplingConfig(top_k=1, top_p=0.99))
    assert np.isfinite(np.asarray(both)).sum() == 1


def test_top_k_keeps_ties_at_the_kth_value():
    logits = jnp.array([[3.0, 1.0, 2.0, 2.0, 0.0]])
    kept = np.isfinite(np.asarray(warp_logits(logits, SamplingConfig(top_k=2))))[0]
    assert kept.tolist() == [True, False, True, True, False]


def test_top_k_one_equals_greedy():
    logits = jax.random.normal(jax.random.key(0), (500, 17))
    sampled = sample_tokens(jax.random.key(1), logits, SamplingConfig(top_k=1))
    greedy = sample_tokens(jax.random.key(1), logits, SamplingConfig(temperature=0.0))
    np.testing.assert_array_equal(sampled, greedy)
    np.testing.assert_array_equal(greedy, np.argmax(np.asarray(logits), -1))


def test_greedy_distribution_is_one_hot_argmax():
    logits = jnp.array([[0.1, 2.0, -1.0], [5.0, 5.0, 1.0]])
    probs = probabilities(logits, SamplingConfig(temperature=0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]  # ties: first index


def test_warp_is_float32_for_bfloat16_logits():
    logits = jnp.array([[0.1, 2.0, -1.0]], jnp.bfloat16)
    assert warp_logits(logits, SamplingConfig(temperature=0.7, top_p=0.9)).dtype == jnp.float32


def test_row_draws_do_not_depend_on_batch_mates():
    logits = jax.random.normal(jax.random.key(0), (8, 50))
    config = SamplingConfig(temperature=1.0)
    full = sample_tokens(jax.random.key(5), logits, config)
    half = sample_tokens(jax.random.key(5), logits[:4], config)
    np.testing.assert_array_equal(full[:4], half)


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"temperature": float("nan")}, "temperature must be >= 0"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -1}, "top_k must be an int >= 0"),
    ({"top_k": 2.5}, "top_k must be an int >= 0"),
])
def test_invalid_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def test_top_k_larger_than_vocab_is_refused():
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        SamplingConfig(top_k=40).check_vocab(32)


def test_top_p_keeps_tied_tokens_together_and_handles_minus_inf():
    # Mass before the two tied 0.25 tokens is 0.5 < 0.6: the first crosses, its twin stays.
    logits = jnp.log(jnp.array([[0.5, 0.25, 0.25, 0.0]]))
    kept = np.isfinite(np.asarray(warp_logits(logits, SamplingConfig(top_p=0.6))))[0]
    assert kept.tolist() == [True, True, True, False]
    kept = np.isfinite(np.asarray(warp_logits(logits, SamplingConfig(top_k=2))))[0]
    assert kept.tolist() == [True, True, True, False]


def test_cutoffs_are_exact_for_nearly_equal_logits():
    """The bisection cut-offs work on float bit patterns: one ulp apart is resolved."""
    base = np.float32(1.5)
    logits = jnp.array([[base, np.nextafter(base, np.float32(2)), base - 1, -3.0]], jnp.float32)
    kept = np.isfinite(np.asarray(warp_logits(logits, SamplingConfig(top_k=1))))[0]
    assert kept.tolist() == [False, True, False, False]


def test_numpy_scalars_are_accepted_everywhere():
    config = SamplingConfig(temperature=np.float32(0.5), top_k=np.int64(3),
                            top_p=np.float32(0.9))
    assert config == SamplingConfig(temperature=float(np.float32(0.5)), top_k=3,
                                    top_p=float(np.float32(0.9)))
    assert isinstance(config.top_k, int) and isinstance(config.temperature, float)
    hash(config)  # still a static jit argument
    with pytest.raises(TypeError, match="temperature must be a number"):
        SamplingConfig(temperature=np.bool_(True))


def test_tiny_temperature_warps_to_the_greedy_limit_without_nan():
    logits = jnp.asarray([[1.0, 3.0, 2.0, 3.0], [0.5, -1.0, 0.0, 0.2]])
    probs = np.asarray(probabilities(logits, SamplingConfig(temperature=1e-30)))
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs, [[0, 0.5, 0, 0.5], [1, 0, 0, 0]])  # ties share


def test_top_p_ties_at_the_cutoff_are_all_kept_where_transformers_keeps_some():
    """The documented difference from transformers' rule, against the port above."""
    probs = np.array([[0.4, 0.2, 0.2, 0.2]])  # tokens 1-3 tie with the crossing token
    logits = np.log(probs).astype(np.float32)
    ours = np.isfinite(np.asarray(warp_logits(jnp.asarray(logits), SamplingConfig(top_p=0.5))))
    theirs = np.isfinite(reference_warp(logits, 1.0, 0, 0.5))
    assert ours.tolist() == [[True, True, True, True]]
    # transformers' ascending stable sort drops the lower ids among the tied tokens.
    assert theirs.tolist() == [[True, False, False, True]]
    # Without ties the two rules agree exactly (random logits, many top_p values).
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(256, 24)).astype(np.float32) * 3
    for top_p in (0.1, 0.5, 0.77, 0.9, 0.99):
        ours = np.isfinite(np.asarray(warp_logits(jnp.asarray(logits),
                                                  SamplingConfig(top_p=top_p))))
        np.testing.assert_array_equal(ours, np.isfinite(reference_warp(logits, 1.0, 0, top_p)))


# ------------------------------------------------------------- per-row settings as data

ROW_CONFIGS = [SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.7, top_k=5),
               SamplingConfig(temperature=1.3, top_p=0.8), SamplingConfig(),
               SamplingConfig(temperature=0.5, top_k=3, top_p=0.9),
               SamplingConfig(temperature=1e-30)]


@pytest.mark.parametrize("traced", [False, True])
def test_per_row_settings_warp_each_row_as_its_own_config(traced):
    """One batch, one call, each row warped exactly as its own SamplingConfig warps it
    alone (also under jit, where the settings are traced arrays and the top-k / top-p
    searches run under a lax.cond)."""
    logits = jax.random.normal(jax.random.key(2), (len(ROW_CONFIGS), 3, 40)) * 3
    params = sampling_params(ROW_CONFIGS, len(ROW_CONFIGS))
    assert not params.greedy
    run = jax.jit(probabilities) if traced else probabilities
    warp = jax.jit(warp_logits) if traced else warp_logits
    probs, warped = np.asarray(run(logits, params)), np.asarray(warp(logits, params))
    for row, config in enumerate(ROW_CONFIGS):
        alone = np.asarray(probabilities(logits[row], config))
        np.testing.assert_array_equal(probs[row] > 0, alone > 0)
        np.testing.assert_allclose(probs[row], alone, atol=1e-6)
        if not config.greedy:
            np.testing.assert_allclose(warped[row], np.asarray(warp_logits(logits[row], config)),
                                       rtol=1e-6)
    np.testing.assert_array_equal(probs[0], np.eye(40)[np.argmax(logits[0], -1)])


def test_mixed_batch_samples_greedy_rows_by_argmax_and_others_as_alone():
    logits = jax.random.normal(jax.random.key(3), (len(ROW_CONFIGS), 30))
    tokens = np.asarray(jax.jit(sample_tokens)(jax.random.key(4), logits,
                                                sampling_params(ROW_CONFIGS, len(ROW_CONFIGS))))
    for row, config in enumerate(ROW_CONFIGS):
        # Row b draws with fold_in(key, b) whatever its batch mates: the same token as a
        # batch where every row has its setting.
        same = sample_tokens(jax.random.key(4), logits, config)
        assert tokens[row] == int(same[row]), (row, config)
    assert tokens[0] == int(np.argmax(logits[0]))


def test_all_greedy_is_known_on_the_host():
    assert sampling_params(GREEDY, 3).greedy
    assert sampling_params([GREEDY, SamplingConfig(temperature=0.0)], 2).greedy
    assert not sampling_params([GREEDY, SamplingConfig()], 2).greedy
    params = sampling_params([GREEDY, SamplingConfig(temperature=0.5, top_k=2, top_p=0.3)], 2)
    np.testing.assert_array_equal(params.temperature, np.float32([0.0, 0.5]))
    np.testing.assert_array_equal(params.top_k, [0, 2])
    np.testing.assert_array_equal(params.top_p, np.float32([1.0, 0.3]))
    # The static bit is part of the pytree's structure, the values are its leaves.
    assert len(jax.tree.leaves(params)) == 3


def test_tree_scores_rank_greedy_rows_by_the_raw_distribution():
    logits = jnp.asarray([[2.0, 1.0, 0.5, -1.0], [2.0, 1.0, 0.5, -1.0]])
    params = sampling_params([GREEDY, SamplingConfig(top_k=2)], 2)
    scores = np.asarray(tree_scores(logits, params))
    np.testing.assert_allclose(scores[0], np.asarray(jax.nn.log_softmax(logits[0])), rtol=1e-6)
    assert np.isfinite(scores[1]).tolist() == [True, True, False, False]
    assert np.all(np.diff(scores[0]) < 0)  # no ties among a greedy row's ranks


@pytest.mark.parametrize("sampling, batch, error, message", [
    ([SamplingConfig()] * 2, 3, ValueError, "lists 2 settings but the batch has 3 rows"),
    ([SamplingConfig(), 0.5], 2, TypeError, r"sampling\[1\] must be a specjax.SamplingConfig"),
    ("greedy", 1, TypeError, "sampling must be a specjax.SamplingConfig"),
    ([], 0, ValueError, "sampling is an empty list"),
])
def test_bad_per_row_settings_are_refused(sampling, batch, error, message):
    with pytest.raises(error, match=message):
        sampling_params(sampling, batch)


def test_settings_of_the_wrong_shape_are_refused_by_the_warper():
    params = sampling_params(SamplingConfig(temperature=0.5), 3)
    with pytest.raises(ValueError, match="do not match logits of shape"):
        warp_logits(jnp.zeros((4, 10)), params)


def test_draw_with_q_returns_the_distribution_each_token_was_drawn_from():
    logits = jax.random.normal(jax.random.key(5), (3, 12)) * 2
    params = sampling_params([GREEDY, SamplingConfig(top_k=3), SamplingConfig(top_p=0.6)], 3)
    tokens, q = draw_with_q(jax.random.key(6), logits, params)
    np.testing.assert_array_equal(q, probabilities(logits, params))
    assert int(tokens[0]) == int(np.argmax(logits[0]))
    assert np.all(np.asarray(q)[np.arange(3), np.asarray(tokens)] > 0)  # drawn from q
    tokens, q = draw_with_q(jax.random.key(6), logits, params, deterministic=True)
    np.testing.assert_array_equal(tokens, np.argmax(np.asarray(logits), -1))
    np.testing.assert_array_equal(q, np.eye(12)[np.asarray(tokens)])


def test_per_row_settings_map_equal_and_repeated_objects_to_their_rows():
    """A batch repeats a few settings thousands of times (the same object, or equal ones):
    each row gets its own values, and a wrong entry is named by its row."""
    hot, top = SamplingConfig(temperature=0.9), SamplingConfig(top_k=3, top_p=0.5)
    rows = [hot, GREEDY, top, SamplingConfig(temperature=0.9)] * 3000
    params = sampling_params(rows, len(rows))
    np.testing.assert_array_equal(params.temperature,
                                  np.float32([c.temperature for c in rows]))
    np.testing.assert_array_equal(params.top_k, [c.top_k for c in rows])
    np.testing.assert_array_equal(params.top_p, np.float32([c.top_p for c in rows]))
    assert not params.greedy and sampling_params([GREEDY] * 5, 5).greedy
    assert distinct_configs(rows) == (hot, GREEDY, top)
    with pytest.raises(TypeError, match=r"sampling\[7001\] must be a specjax.SamplingConfig"):
        sampling_params(rows[:7001] + [None] + rows[7002:], len(rows))
