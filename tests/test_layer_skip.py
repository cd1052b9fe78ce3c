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
from specjax.drafters.layer_skip import MAX_LAYERS
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
    """The drafter's one leaf is its skip mask, and the compiled step's inputs are the
    target's parameters, the decode state, the sampling values and that mask: no second
    copy of a weight."""
    target = build_lm(3, num_layers=3)
    drafter = LayerSkip(skip=(1,))
    (mask,) = jax.tree.leaves(drafter)
    assert mask.shape == (MAX_LAYERS,) and np.flatnonzero(mask).tolist() == [1]
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
    assert argument_bytes == (nbytes(target.params) + nbytes(state) + nbytes(sampling)
                              + MAX_LAYERS)


def test_every_skipped_set_shares_one_compiled_decoder():
    """The set is data: after the first set compiles the decoder, other sets of any size
    (and the search's candidates) compile nothing, and each still decodes exactly (greedy
    equals generate)."""
    from specjax.testing import count_compilations

    target = build_lm(3, num_layers=3)
    plain = specjax.generate(target, PROMPTS, max_new_tokens=10, sampling=specjax.GREEDY)
    run = lambda skip: specjax.speculative_generate(
        target, LayerSkip(skip=skip), PROMPTS, max_new_tokens=10, num_draft_tokens=3,
        sampling=specjax.GREEDY)
    np.testing.assert_array_equal(run((1,)).tokens, plain.tokens)
    with count_compilations() as compiled:
        outs = [run(skip) for skip in ((0,), (0, 2), (2,), (1, 2))]
    assert compiled == []
    for out in outs:
        np.testing.assert_array_equal(out.tokens, plain.tokens)
    # Different sets draft differently: the mask reaches the program.
    assert len({float(out.stats.acceptance_rate) for out in outs}) > 1


def test_a_layer_mask_runs_the_blocks_layers_would():
    """`CausalLM.apply(layer_mask=)` (data) gives `layers=` (static)'s logits and cache,
    scanned and unrolled, traced inside jit; a skipped block's cache is left alone."""
    tokens, positions = jnp.asarray([[3, 4]]), jnp.arange(2)[None]
    lengths = jnp.zeros(1, jnp.int32)
    masked = jax.jit(lambda lm, cache, m: lm.apply(tokens, positions, cache, lengths,
                                                   layer_mask=m))
    for scan in (False, True):
        target = build_lm(3, num_layers=3, scan_layers=scan)
        cache = target.init_cache(1, 8)
        by_layers = target.apply(tokens, positions, cache, lengths, layers=(0, 2))
        by_mask = masked(target, cache, jnp.asarray([True, False, True]))
        np.testing.assert_allclose(by_mask[0], by_layers[0], atol=1e-6)
        for mine, theirs in zip(jax.tree.leaves(by_mask[2]), jax.tree.leaves(by_layers[2]),
                                strict=True):
            np.testing.assert_allclose(mine, theirs, atol=1e-6)
        keys = by_mask[2].keys
        assert not bool(jnp.any(keys[1] != 0)) and bool(jnp.any(keys[0] != 0))
    with pytest.raises(ValueError, match="bool \\[3\\]"):
        target.apply(tokens, positions, cache, lengths, layer_mask=jnp.ones(2, bool))
    with pytest.raises(ValueError, match="without layers="):
        target.apply(tokens, positions, cache, lengths, layer_mask=jnp.ones(3, bool),
                     layers=(0,))


def test_the_set_round_trips_as_a_pytree_and_is_traced_inside_jit():
    drafter = LayerSkip(skip=(2, 0), method="greedy", min_confidence=0.3)
    again = jax.tree.map(lambda leaf: leaf, drafter)
    assert again == drafter and again.skip == (0, 2) and again.method == "greedy"
    # The threshold is a float32 leaf that still hashes and compares as a number.
    assert hash(drafter) == hash(LayerSkip(skip=(0, 2), method="greedy", min_confidence=0.3))
    assert drafter != LayerSkip(skip=(0, 2), method="greedy", min_confidence=0.4)
    assert jax.tree.structure(drafter) == jax.tree.structure(LayerSkip(skip=(5, 6, 7),
                                                                       method="greedy",
                                                                       min_confidence=0.3))
    seen = jax.jit(lambda d: (d.skip is None, d.kept_mask(4)))(drafter)
    assert bool(seen[0]) and np.asarray(seen[1]).tolist() == [False, True, False, True]
    with pytest.raises(ValueError, match=f"outside \\[0, {MAX_LAYERS}\\)"):
        LayerSkip(skip=(MAX_LAYERS,))


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
