"""ParallelEagle (P-EAGLE): one head forward per step whose outputs at the last committed
pair and at each placeholder are exactly a full forward's over every committed pair and
the placeholders, whatever each step committed; one forward counted per step; trees take
each depth from its offset; bad heads refused by name. (Exactness under every rule:
tests/test_exactness.py.)"""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_trees_follow_offsets, causal_head_forward

import specjax
import specjax_models
from specjax import GREEDY, SamplingConfig
from specjax.drafters import (
    Commit,
    DraftContext,
    Eagle,
    FeatureHeadConfig,
    ParallelEagle,
    eagle3_feature_layers,
)

MASK = 31
PROMPTS = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3, 8]]


def parallel_head(target, method: str = "sample") -> ParallelEagle:
    """An untrained parallel EAGLE-3 head, sharpened (as the registry's heads), its
    placeholder feature far from zero."""
    embedding, lm_head = specjax_models.embedding_and_head(target)
    layers = eagle3_feature_layers(target.num_layers)
    config = FeatureHeadConfig(kind="eagle3", d_model=embedding.shape[1], num_heads=2,
                               num_kv_heads=1, d_ff=2 * embedding.shape[1],
                               feature_layers=layers, mask_id=MASK)
    head = Eagle.create(config, embedding, lm_head, jax.random.key(3), method)
    head = head.with_params(jax.tree.map(lambda x: 8.0 * x if x.ndim == 2 else x, head.params))
    mask_hidden = jax.random.normal(jax.random.key(4), head.params["mask_hidden"].shape)
    return ParallelEagle(head.with_params({**head.params, "mask_hidden": mask_hidden}))


def reference_outputs(drafter: ParallelEagle, sequence_BS: np.ndarray, lengths_B: np.ndarray,
                      fused_BSD: np.ndarray, offsets: int) -> np.ndarray:
    """`[B, offsets, D]`: each row's head outputs at its last committed pair and each of
    offsets - 1 placeholders, from one causal forward over every pair (feature t - 1,
    token t) and the placeholders, no cache. The rows' windows share one jitted call,
    padded at their end to the capacity (causal: padding never reaches a real pair)."""
    head = drafter.head
    batch, capacity = sequence_BS.shape
    width = capacity + offsets - 1
    mask_hidden = np.asarray(head.params["mask_hidden"])
    windows = np.zeros((batch, width), np.int32)
    features = np.zeros((batch, width, fused_BSD.shape[-1]), np.float32)
    for b, length in enumerate(lengths_B):
        windows[b, :length + offsets - 1] = list(sequence_BS[b, :length]) + \
            [MASK] * (offsets - 1)
        features[b, 1:length] = fused_BSD[b, :length - 1]
        features[b, length:length + offsets - 1] = mask_hidden
    out_BWD = np.asarray(causal_head_forward(head, jnp.asarray(windows),
                                             jnp.asarray(features)))
    return np.stack([out_BWD[b, length - 1:length - 1 + offsets]
                     for b, length in enumerate(lengths_B)])


@pytest.mark.parametrize("k", [1, 4])
def test_each_window_is_a_full_forward_over_the_committed_pairs_and_placeholders(tiny_lm, k):
    """Steps that commit 1 .. K + 1 tokens per row (random, different per row), each with
    its target features: the one head forward of every step gives, at the last committed
    pair and at each placeholder, the outputs of a fresh forward over the row's pairs."""
    drafter = parallel_head(tiny_lm)
    rng = np.random.default_rng(0)
    capacity, batch = 40, len(PROMPTS)
    layers = len(drafter.feature_layers) + 1
    d_model = drafter.config.d_model
    features_all = rng.normal(size=(batch, capacity, layers, d_model)).astype(np.float32)
    fused_all = np.asarray(drafter.head._features(jnp.asarray(features_all)))
    width = max(map(len, PROMPTS))
    sequence = np.zeros((batch, capacity), np.int32)
    for b, prompt in enumerate(PROMPTS):
        sequence[b, :len(prompt)] = prompt
    lengths = np.array([len(p) for p in PROMPTS], np.int32)
    init = jax.jit(drafter.init, static_argnums=2, static_argnames="num_draft_tokens")
    state = init(jnp.asarray(sequence[:, :width]), jnp.asarray(lengths), capacity,
                 features=jnp.asarray(features_all[:, :width]), num_draft_tokens=k)
    forward = jax.jit(drafter.offset_outputs, static_argnums=2)
    commit = jax.jit(drafter.commit)
    for _ in range(5):
        state, out_BKD = forward(state, DraftContext(jnp.asarray(sequence),
                                                     jnp.asarray(lengths)), k)
        want_BKD = reference_outputs(drafter, sequence, lengths, fused_all, k)
        np.testing.assert_allclose(np.asarray(out_BKD), want_BKD, atol=2e-4, rtol=2e-4)
        emitted = rng.integers(1, k + 2, size=batch)
        new_lengths = lengths + emitted
        for b in range(batch):
            sequence[b, lengths[b]:new_lengths[b]] = rng.integers(0, 30, size=emitted[b])
        verified = lengths[:, None] - 1 + np.arange(k + 1)[None]  # last token, then drafts
        hidden = np.take_along_axis(features_all, verified[:, :, None, None], axis=1)
        path = np.where(np.arange(k)[None] < (emitted - 1)[:, None], np.arange(k)[None], -1)
        state = commit(state, Commit(
            old_lengths=jnp.asarray(lengths), new_lengths=jnp.asarray(new_lengths),
            num_accepted=jnp.asarray(emitted - 1), sequence=jnp.asarray(sequence),
            target_hidden=jnp.asarray(hidden), active=jnp.ones((batch,), bool),
            path=jnp.asarray(path, jnp.int32)))
        lengths = new_lengths.astype(np.int32)


def test_a_step_drafts_k_tokens_in_one_head_forward(tiny_lm):
    """K = 6 drafts, one head forward per step (the commit runs none)."""
    out = specjax.speculative_generate(
        tiny_lm, parallel_head(tiny_lm), PROMPTS, max_new_tokens=16, num_draft_tokens=6,
        sampling=SamplingConfig(temperature=1.0), key=jax.random.key(0))
    np.testing.assert_array_equal(out.stats.draft_forwards, out.stats.target_forwards)
    # Six drafts a step, near the row's end those that fit its room (step_counters): at
    # least the drafts it accepted (each step emits at most its accepted drafts + 1).
    stats = out.stats
    assert np.all(stats.proposed <= 6 * stats.target_forwards)
    assert np.all(stats.proposed >= stats.emitted - stats.target_forwards)


def test_tree_proposals_take_each_depth_from_its_offset(tiny_lm):
    """Greedy: every depth-d node of the first rank is the argmax at offset d + 1, the same
    for every parent; a dynamic tree's first level holds offset 1's argmax."""
    drafter = parallel_head(tiny_lm, "greedy")
    prompt = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
    layers = len(drafter.feature_layers) + 1
    features = jax.random.normal(jax.random.key(1), (1, 4, layers, drafter.config.d_model))
    init = jax.jit(drafter.init, static_argnums=2, static_argnames="num_draft_tokens")
    state = init(prompt, jnp.asarray([4]), 24, features=features, num_draft_tokens=5)
    context = DraftContext(jnp.zeros((1, 24), jnp.int32).at[:, :4].set(prompt),
                           jnp.asarray([4]))
    _, out = jax.jit(drafter.offset_outputs, static_argnums=2)(state, context, 3)
    argmax = np.asarray(jnp.argmax(drafter.head._logits(out[0]), axis=-1))
    assert_trees_follow_offsets(drafter, state, context, argmax)


def test_saved_and_loaded_it_drafts_the_same(tiny_lm, tmp_path):
    drafter = parallel_head(tiny_lm)
    drafter.save(tmp_path / "head")
    embedding, lm_head = specjax_models.embedding_and_head(tiny_lm)
    loaded = ParallelEagle.load(tmp_path / "head", embedding, lm_head)
    assert loaded.mask_id == MASK
    for name, value in drafter.head.params.items():
        np.testing.assert_array_equal(np.asarray(loaded.head.params[name]), np.asarray(value))
    kwargs = dict(max_new_tokens=12, num_draft_tokens=3, sampling=specjax.GREEDY)
    a = specjax.speculative_generate(tiny_lm, drafter, PROMPTS, **kwargs)
    b = specjax.speculative_generate(tiny_lm, loaded, PROMPTS, **kwargs)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))


def test_bad_heads_are_refused_by_name(tiny_lm):
    embedding, lm_head = specjax_models.embedding_and_head(tiny_lm)
    config = FeatureHeadConfig(kind="eagle1", d_model=embedding.shape[1], num_heads=2,
                               num_kv_heads=1, d_ff=8)
    autoregressive = Eagle.create(config, embedding, lm_head, jax.random.key(0))
    with pytest.raises(ValueError, match="drafts autoregressively.*--method p-eagle"):
        ParallelEagle(autoregressive)
    with pytest.raises(TypeError, match="must be a specjax.drafters.Eagle"):
        ParallelEagle(tiny_lm)
    for bad in (-1, True, "7"):
        with pytest.raises(ValueError, match="mask_id must be a token id"):
            FeatureHeadConfig(kind="eagle1", d_model=8, num_heads=2, num_kv_heads=1, d_ff=8,
                              mask_id=bad)
    with pytest.raises(ValueError, match="parallel \\(P-EAGLE\\) head of kind eagle1 or"):
        FeatureHeadConfig(kind="mtp", d_model=8, num_heads=2, num_kv_heads=1, d_ff=8,
                          mask_id=3)
    outside = FeatureHeadConfig(kind="eagle1", d_model=embedding.shape[1], num_heads=2,
                                num_kv_heads=1, d_ff=8, mask_id=embedding.shape[0])
    # Refused when the drafter is made, not when decoding starts.
    with pytest.raises(ValueError, match="mask_id 32 is not a row of its embedding"):
        ParallelEagle(Eagle.create(outside, embedding, lm_head, jax.random.key(0)))
    # A trained autoregressive head given a mask id by hand has no placeholder feature.
    by_hand = dataclasses.replace(autoregressive, config=dataclasses.replace(
        autoregressive.config, mask_id=MASK))
    with pytest.raises(ValueError, match="no placeholder feature 'mask_hidden'.*"
                                         "with_placeholder"):
        ParallelEagle(by_hand)
    with pytest.raises(ValueError, match="trained_positions must be"):
        ParallelEagle(parallel_head(tiny_lm).head, trained_positions=0)


def test_more_drafts_than_it_was_trained_for_warn_and_stay_exact(tiny_lm):
    drafter = dataclasses.replace(parallel_head(tiny_lm, "greedy"), trained_positions=2)
    plain = specjax.generate(tiny_lm, PROMPTS, max_new_tokens=6, sampling=GREEDY)
    with pytest.warns(UserWarning, match="trained to draft 2 tokens at once; K=3"):
        out = specjax.speculative_generate(tiny_lm, drafter, PROMPTS, max_new_tokens=6,
                                           num_draft_tokens=3, sampling=GREEDY)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # within what it learned: no word
        specjax.speculative_generate(tiny_lm, drafter, PROMPTS, max_new_tokens=6,
                                     num_draft_tokens=2, sampling=GREEDY)


def test_the_shipped_head_knows_the_drafts_it_was_trained_for():
    assert specjax_models.load_bundled("p-eagle").trained_positions == 8


def test_a_state_built_for_a_smaller_k_is_refused_at_commit(tiny_lm):
    drafter = parallel_head(tiny_lm)
    layers = len(drafter.feature_layers) + 1
    d_model = drafter.config.d_model
    state = drafter.init(jnp.asarray([[1, 2]]), jnp.asarray([2]), 16,
                         features=jnp.zeros((1, 2, layers, d_model)), num_draft_tokens=2)
    commit = Commit(old_lengths=jnp.asarray([2]), new_lengths=jnp.asarray([3]),
                    num_accepted=jnp.asarray([0]), sequence=jnp.zeros((1, 16), jnp.int32),
                    target_hidden=jnp.zeros((1, 5, layers, d_model)),
                    active=jnp.ones((1,), bool), path=-jnp.ones((1, 4), jnp.int32))
    with pytest.raises(ValueError, match="needs a state built for num_draft_tokens >= 4"):
        drafter.commit(state, commit)


def test_adaptive_length_wraps_it(tiny_lm):
    """AdaptiveLength passes the K its state is built for through to the head: greedy
    output equal to generate's, one head forward per step."""
    drafter = specjax.AdaptiveLength(parallel_head(tiny_lm, "greedy"))
    plain = specjax.generate(tiny_lm, PROMPTS, max_new_tokens=12, sampling=specjax.GREEDY)
    out = specjax.speculative_generate(tiny_lm, drafter, PROMPTS, max_new_tokens=12,
                                       num_draft_tokens=4, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(plain.tokens))
    np.testing.assert_array_equal(np.asarray(out.stats.draft_forwards),
                                  np.asarray(out.stats.target_forwards))
