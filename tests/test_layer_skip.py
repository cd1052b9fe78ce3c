"""LayerSkip: the target drafts for itself with some blocks skipped, on its own weights and
cache. Its drafts are checked against an independent no-cache forward in which the drafted
positions skip those blocks; the weights enter the compiled step once."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import build_lm, tiny_config
from flax import nnx

import specjax
import specjax_models
from specjax import SamplingConfig
from specjax.decoding.sampling import sampling_params
from specjax.decoding.speculative_loop import init_speculative_state, speculative_config
from specjax.decoding.step import compile_key, compiled_step, propose
from specjax.drafters import AdaptiveLength, LayerSkip
from specjax.testing import plus_one_lm
from specjax_models.transformer import embedding_and_head

PROMPTS = [[1, 5, 9, 30, 2, 7], [4, 4, 8]]
T1 = SamplingConfig(temperature=1.0)


def gated_logits(lm: specjax.CausalLM, tokens: list[int], first_draft: int,
                 skip: tuple[int, ...]) -> np.ndarray:
    """float32 [T, V]: a no-cache forward over `tokens` in which positions from
    `first_draft` on pass through the skipped blocks unchanged (their keys and values in
    the blocks they run come from their own reduced residual streams; earlier positions
    run every block), built from the model's modules, not its cached decoder."""
    module = nnx.merge(lm.apply_fn.graphdef, lm.params)
    tokens_1T = jnp.asarray([tokens], jnp.int32)
    positions_1T = jnp.arange(len(tokens))[None]
    drafted_1T1 = (positions_1T >= first_draft)[..., None]
    x = module.embed(tokens_1T)
    for index, block in enumerate(module.layers):
        y, _ = block(x, positions_1T, None, index, None, None, None, None)
        x = jnp.where(drafted_1T1 & (index in skip), x, y)
    _, head_VD = embedding_and_head(lm)
    return np.asarray(jnp.einsum("TD,VD->TV", module.final_norm(x)[0], head_VD), np.float32)


def proposal_of(target, drafter, num_draft_tokens=3, sampling=T1, seed=0):
    state, drafter = init_speculative_state(target, drafter, PROMPTS, max_new_tokens=8,
                                            num_draft_tokens=num_draft_tokens,
                                            sampling=sampling, key=jax.random.key(seed))
    config = speculative_config(num_draft_tokens, sampling, None)
    return propose(drafter, state, jax.random.key(seed), config, target,
                   sampling_params(sampling, len(PROMPTS)))


@pytest.mark.parametrize("skip", [(1,), (0, 2)])
def test_drafts_follow_a_forward_that_skips_the_layers_at_drafted_positions(skip):
    target = build_lm(3, num_layers=3)
    _, proposal, _ = proposal_of(target, LayerSkip(skip=skip))
    tokens, q = np.asarray(proposal.tokens), np.asarray(proposal.q)
    for b, prompt in enumerate(PROMPTS):
        text = prompt + list(tokens[b, :-1])
        logits = gated_logits(target, text, len(prompt) - 1, skip)
        expected = jax.nn.softmax(logits[len(prompt) - 1:], axis=-1)
        np.testing.assert_allclose(q[b], expected, atol=2e-5)


def test_scanned_and_unrolled_layers_draft_alike(tmp_path):
    unrolled = build_lm(5, num_layers=3)
    specjax_models.save_checkpoint(unrolled, tiny_config(num_layers=3), tmp_path)
    scanned = specjax_models.load_checkpoint(tmp_path, scan_layers=True)
    outs = [proposal_of(lm, LayerSkip(skip=(1,)))[1] for lm in (unrolled, scanned)]
    np.testing.assert_array_equal(outs[0].tokens, outs[1].tokens)
    np.testing.assert_allclose(outs[0].q, outs[1].q, atol=1e-5)


def test_the_weights_enter_the_compiled_step_once():
    """The drafter has no leaves, and the compiled step's inputs are the target's
    parameters, the decode state and the sampling values: no second copy of a weight."""
    target = build_lm(3, num_layers=3)
    drafter = LayerSkip(skip=(1,))
    assert jax.tree.leaves(drafter) == []
    state, drafter = init_speculative_state(target, drafter, PROMPTS, max_new_tokens=8,
                                            num_draft_tokens=3, sampling=T1,
                                            key=jax.random.key(0))
    config = speculative_config(3, T1, None)
    sampling = sampling_params(T1, len(PROMPTS))
    lowered = compiled_step.lower(target, drafter, state, compile_key(config, sampling),
                                  sampling, drafter_type=(LayerSkip,))
    nbytes = lambda tree: sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))
    argument_bytes = sum(aval.size * aval.dtype.itemsize
                         for aval in jax.tree.leaves(lowered.in_avals))
    assert argument_bytes == nbytes(target.params) + nbytes(state) + nbytes(sampling)


def test_greedy_layer_skip_with_adaptive_length_equals_generate():
    target = build_lm(3, num_layers=3)
    plain = specjax.generate(target, PROMPTS, max_new_tokens=12, sampling=specjax.GREEDY)
    for drafter in (LayerSkip(skip=(2,), method="greedy"),
                    AdaptiveLength(LayerSkip(skip=(0,), min_confidence=0.2), start=2)):
        out = specjax.speculative_generate(target, drafter, PROMPTS, max_new_tokens=12,
                                           num_draft_tokens=3, sampling=specjax.GREEDY)
        np.testing.assert_array_equal(out.tokens, plain.tokens)
        assert out.stats.draft_forwards.sum() > 0


@pytest.mark.parametrize("make, message", [
    (lambda: LayerSkip(skip=()), "skip is empty"),
    (lambda: LayerSkip(skip=(1, 1)), "repeats"),
    (lambda: LayerSkip(skip=1), "sequence of block indices"),
    (lambda: LayerSkip(skip=(1,), method="top"), "method"),
    (lambda: LayerSkip(skip=(1,), min_confidence=1.5), "min_confidence"),
])
def test_bad_settings_are_refused(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()


@pytest.mark.parametrize("target, skip, message", [
    (lambda: build_lm(0), (2,), r"outside this target's \[0, 2\)"),
    (lambda: build_lm(0), (0, 1), "skips all 2 layers"),
    (lambda: plus_one_lm(), (0,), "run a subset of its layers"),
])
def test_a_target_that_cannot_serve_is_refused_before_tracing(target, skip, message):
    with pytest.raises(ValueError, match=message):
        specjax.speculative_generate(target(), LayerSkip(skip=skip), [[1, 2]],
                                     max_new_tokens=2, num_draft_tokens=2)


def test_a_subset_of_layers_leaves_the_skipped_layers_cache_alone():
    target = build_lm(3, num_layers=3)
    cache = target.init_cache(1, 8)
    tokens, positions = jnp.asarray([[3, 4]]), jnp.arange(2)[None]
    _, _, written = target.apply(tokens, positions, cache, jnp.zeros(1, jnp.int32),
                                 layers=(0, 2))
    for layer, touched in ((0, True), (1, False), (2, True)):
        assert bool(jnp.any(written.keys[layer] != 0)) == touched
    with pytest.raises(ValueError, match="increasing"):
        target.apply(tokens, positions, cache, jnp.zeros(1, jnp.int32), layers=(2, 0))


def test_drafting_in_the_targets_cache_copies_no_cache_array():
    """The drafts' keys and values go into the target's cache in place, with or without
    an adaptive length's early stop: the compiled loop holds no copy of a cache array."""
    from test_step import _cache_copies

    target = build_lm(0)
    assert _cache_copies(target, LayerSkip(skip=(1,)), 4) == []
    assert _cache_copies(target, AdaptiveLength(LayerSkip(skip=(1,))), 4) == []
