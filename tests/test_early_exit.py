"""EarlyExit (Kangaroo): the target's first blocks, a trained adapter and the target's LM
head. Its drafts are checked against the adapter run over an independent no-cache forward
of the text, its cache after several steps against one built from scratch, its early exit
against the rule, and its refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import build_lm, tiny_config
from test_layer_skip import PROMPTS, T1, proposal_of  # the same prompts and proposals

import specjax
import specjax_models
from specjax import GREEDY
from specjax.decoding.speculative_loop import init_speculative_state, speculative_config
from specjax.decoding.step import jitted_step
from specjax.drafters import AdaptiveLength, EarlyExit, FeatureHeadConfig
from specjax.drafters.feature_head import head_block, head_inputs, head_logits
from specjax.testing import plus_one_lm
from specjax.training.heads import target_outputs

STEPS = 4


def adapter(target, exit_layer: int, seed: int = 5, **settings) -> EarlyExit:
    """A random adapter, sharper than its init so its distribution is far from uniform."""
    _, lm_head = specjax_models.embedding_and_head(target)
    d_model = lm_head.shape[1]
    config = FeatureHeadConfig(kind="kangaroo", d_model=d_model, num_heads=2, num_kv_heads=1,
                               d_ff=2 * d_model, feature_layers=(exit_layer,))
    drafter = EarlyExit.create(config, lm_head, jax.random.key(seed), **settings)
    return drafter.with_params(jax.tree.map(lambda x: 8.0 * x if x.ndim == 2 else x,
                                            drafter.params))


def reference_logits(target, drafter: EarlyExit, tokens: list[int]) -> np.ndarray:
    """float32 [T, V]: the adapter over the stream entering its exit layer at every
    position of `tokens`, from a no-cache forward of the whole text (causal, no cache)."""
    return np.asarray(_reference_logits(target, drafter, jnp.asarray([tokens], jnp.int32)))


def _exit_stream(target, drafter: EarlyExit, tokens_1T):
    """(the stream entering the drafter's exit layer [1, T, D], positions [1, T]) from a
    no-cache forward of the whole text (the frozen target as training reads it)."""
    _, hidden = target_outputs(target, tokens_1T, drafter.feature_layers)
    return hidden[:, :, 0], jnp.arange(tokens_1T.shape[1])[None]


@jax.jit  # one program per text length: eagerly, each operation would compile its own
def _reference_logits(target, drafter: EarlyExit, tokens_1T):
    stream, positions_1T = _exit_stream(target, drafter, tokens_1T)
    inputs = head_inputs(drafter.params, drafter.config, None, None, stream)
    out, _ = head_block(drafter.params, drafter.config, inputs, positions_1T, None)
    return head_logits(drafter.params, drafter.config, drafter.lm_head, out)[0]


@pytest.mark.parametrize("exit_layer", [0, 1, 2])
def test_drafts_follow_the_adapter_over_the_streams_of_the_text(exit_layer):
    target = build_lm(3, num_layers=3)
    drafter = adapter(target, exit_layer, stop_below=None)
    _, proposal, _ = proposal_of(target, drafter)
    tokens, q = np.asarray(proposal.tokens), np.asarray(proposal.q)
    for b, prompt in enumerate(PROMPTS):
        logits = reference_logits(target, drafter, prompt + list(tokens[b, :-1]))
        expected = jax.nn.softmax(logits[len(prompt) - 1:], axis=-1)
        np.testing.assert_allclose(q[b], expected, atol=2e-5)


def test_scanned_and_unrolled_layers_draft_alike(tmp_path):
    unrolled = build_lm(5, num_layers=3)
    specjax_models.save_checkpoint(unrolled, tiny_config(num_layers=3), tmp_path)
    scanned = specjax_models.load_checkpoint(tmp_path, scan_layers=True)
    drafter = adapter(unrolled, 2, stop_below=None)
    outs = [proposal_of(lm, drafter)[1] for lm in (unrolled, scanned)]
    np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
    np.testing.assert_allclose(outs[0].q, outs[1].q, atol=1e-5)


@jax.jit
def _fresh_adapter_keys(target, drafter: EarlyExit, tokens_1T, empty_keys, empty_values):
    """The adapter's keys over a no-cache forward of the text."""
    stream, positions_1T = _exit_stream(target, drafter, tokens_1T)
    return drafter.adapter(stream, positions_1T, empty_keys, empty_values,
                           jnp.zeros(1, jnp.int32))[1]


def test_the_adapter_cache_after_steps_equals_one_built_from_scratch():
    """After several steps (accepted and rejected drafts, ragged rows) every committed
    position's adapter keys equal those of a fresh forward over the committed text."""
    target = build_lm(3, num_layers=3)
    drafter = adapter(target, 2, stop_below=None)
    state, drafter = init_speculative_state(target, drafter, PROMPTS, max_new_tokens=20,
                                            num_draft_tokens=3, sampling=T1,
                                            key=jax.random.key(1))
    config = speculative_config(3, T1, None)
    for _ in range(STEPS):
        state = jitted_step(target, drafter, state, config)
    own = state.drafter_state
    lengths = np.asarray(state.lengths)
    np.testing.assert_array_equal(np.asarray(own.cache_lengths), lengths - 1)
    for b in range(len(PROMPTS)):
        text = [int(t) for t in np.asarray(state.sequence)[b, :lengths[b]]]
        keys = _fresh_adapter_keys(target, drafter, jnp.asarray([text], jnp.int32),
                                   own.keys[b:b + 1] * 0, own.values[b:b + 1] * 0)
        committed = lengths[b] - 1
        np.testing.assert_allclose(own.keys[b, :committed], keys[0, :committed], atol=2e-5)
    # Some drafts were accepted (their slots are the ones the commit keeps) and some
    # rejected (one committed token per step would be 3 per row).
    grown = lengths - np.asarray([len(p) for p in PROMPTS])
    assert grown.max() > STEPS and grown.min() < STEPS * 4


def test_the_early_exit_offers_drafts_up_to_the_first_unsure_one():
    target = build_lm(3, num_layers=3)
    full = adapter(target, 1, stop_below=None)
    _, proposal, _ = proposal_of(target, full, num_draft_tokens=4, sampling=GREEDY)
    tokens = np.asarray(proposal.tokens)
    tops = []
    for b, prompt in enumerate(PROMPTS):
        logits = reference_logits(target, full, prompt + list(tokens[b, :-1]))
        tops.append(np.asarray(jax.nn.softmax(logits[len(prompt) - 1:], axis=-1)).max(-1))
    tops = np.stack(tops)  # [B, K]: the adapter's top probability at each draft
    for threshold in (float(np.median(tops)), float(tops.min()) / 2, 0.999):
        _, cut, _ = proposal_of(target, full.with_stop_below(threshold), num_draft_tokens=4,
                                sampling=GREEDY)
        expected = np.cumprod(tops >= threshold, axis=1).sum(axis=1)
        np.testing.assert_array_equal(np.asarray(cut.num_real), expected)
        offered = np.arange(4)[None] < expected[:, None]
        np.testing.assert_array_equal(np.asarray(cut.tokens)[offered], tokens[offered])
        if expected.max() < 4:  # the loop stopped when every row had exited
            assert np.all(np.asarray(cut.tokens)[:, expected.max() + 1:] == 0)


def test_greedy_early_exit_equals_generate_alone_and_with_adaptive_length():
    target = build_lm(3, num_layers=3)
    plain = specjax.generate(target, PROMPTS, max_new_tokens=12, sampling=GREEDY)
    for drafter in (adapter(target, 1, method="greedy", stop_below=0.3),
                    AdaptiveLength(adapter(target, 2, stop_below=None), start=2)):
        out = specjax.speculative_generate(target, drafter, PROMPTS, max_new_tokens=12,
                                           num_draft_tokens=3, sampling=GREEDY)
        np.testing.assert_array_equal(out.tokens, plain.tokens)


def test_save_and_load_round_trip(tmp_path):
    target = build_lm(3, num_layers=3)
    drafter = adapter(target, 1, draft_vocab=np.arange(0, 32, 2))
    drafter.save(tmp_path)
    _, lm_head = specjax_models.embedding_and_head(target)
    loaded = EarlyExit.load(tmp_path, lm_head, stop_below=drafter.stop_below)
    assert loaded.config == drafter.config
    np.testing.assert_array_equal(loaded.draft_vocab, drafter.draft_vocab)
    for name, value in drafter.params.items():
        np.testing.assert_array_equal(loaded.params[name], value)
    a, b = (proposal_of(target, d.with_stop_below(None))[1] for d in (drafter, loaded))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert set(np.unique(np.asarray(a.tokens))) <= set(range(0, 32, 2))
    with pytest.raises(ValueError, match="EarlyExit.load"):
        specjax.drafters.Eagle.load(tmp_path, lm_head, lm_head)
    # An archive that lost an array is refused by name, not loaded half.
    arrays = dict(np.load(tmp_path / "head.npz"))
    del arrays["wq"]
    np.savez(tmp_path / "head.npz", **arrays)
    with pytest.raises(ValueError, match="head.npz"):
        EarlyExit.load(tmp_path, lm_head)


@pytest.mark.parametrize("make, message", [
    (lambda t: adapter(t, 1, stop_below=1.5), "stop_below"),
    (lambda t: adapter(t, 1, method="top"), "method"),
    (lambda t: EarlyExit.create(FeatureHeadConfig(kind="eagle1", d_model=32, num_heads=2,
                                                  num_kv_heads=1, d_ff=8),
                                jnp.zeros((32, 32)), jax.random.key(0)), "kangaroo"),
    (lambda t: FeatureHeadConfig(kind="kangaroo", d_model=32, num_heads=2, num_kv_heads=1,
                                 d_ff=8, feature_layers=(1, 2)), "one target layer"),
])
def test_bad_settings_are_refused(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make(build_lm(3, num_layers=3))


@pytest.mark.parametrize("target, exit_layer, message", [
    (lambda: build_lm(0), 2, r"outside this target's \[0, 2\)"),
    (lambda: plus_one_lm(vocab=32), 0, "subset of its layers"),
])
def test_a_target_that_cannot_serve_is_refused_before_tracing(target, exit_layer, message):
    drafter = adapter(build_lm(0), exit_layer)
    with pytest.raises(ValueError, match=message):
        specjax.speculative_generate(target(), drafter, [[1, 2]], max_new_tokens=2,
                                     num_draft_tokens=2)


def test_an_early_exit_forward_returns_the_stream_before_the_final_norm():
    target = build_lm(3, num_layers=3)
    tokens, positions = jnp.asarray([[3, 4, 5]]), jnp.arange(3)[None]
    logits, stream, _ = target.apply(tokens, positions, target.init_cache(1, 3),
                                     jnp.zeros(1, jnp.int32), layers=(0, 1), head=False)
    assert logits is None
    _, hidden, _ = target.apply(tokens, positions, target.init_cache(1, 3),
                                jnp.zeros(1, jnp.int32), feature_layers=(2,))
    np.testing.assert_allclose(stream, hidden[:, :, 0], atol=1e-5)
    with pytest.raises(ValueError, match="pass layers="):
        target.apply(tokens, positions, target.init_cache(1, 3), jnp.zeros(1, jnp.int32),
                     head=False)
