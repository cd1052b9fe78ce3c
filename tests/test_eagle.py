"""EAGLE / MTP heads as drafters: the cache after each commit, proposals, errors, saving.

Greedy equality and the chi-square tests are in tests/test_exactness.py (the registry)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import specjax_models
from specjax import GREEDY, DynamicTree, SamplingConfig, SpeculativeConfig, TreeShape
from specjax.decoding.speculative_loop import init_speculative_state
from specjax.decoding.step import jitted_step
from specjax.drafters import Eagle, FeatureHeadConfig, eagle3_feature_layers
from specjax.lm.causal_lm import prefill

TREE = TreeShape.from_paths([[0], [1], [0, 0], [1, 0], [0, 0, 0]])


def make_head(lm, kind: str, seed: int = 0, method: str = "sample") -> Eagle:
    embedding, lm_head = specjax_models.embedding_and_head(lm)
    layers = eagle3_feature_layers(2) if kind == "eagle3" else ()
    config = FeatureHeadConfig(kind=kind, d_model=embedding.shape[1], num_heads=4,
                               num_kv_heads=2, d_ff=96, feature_layers=layers)
    head = Eagle.create(config, embedding, lm_head, jax.random.key(seed), method)
    return head.with_params(jax.tree.map(lambda x: 6.0 * x if x.ndim == 2 else x, head.params))


def run_steps(target, drafter, prompts, steps, config, seed=0):
    state, drafter = init_speculative_state(
        target, drafter, prompts, max_new_tokens=40, cache_size=96,
        num_draft_tokens=None if config.tree is not None else config.num_draft_tokens,
        sampling=config.sampling, key=jax.random.key(seed), tree=config.tree)
    for _ in range(steps):
        state = jitted_step(target, drafter, state, config)
    return state


def head_state_from_scratch(target, drafter, sequence, lengths, capacity):
    """The head's state built by feeding each row's committed tokens in one go (prefill of
    the target for its features, then the head's init)."""
    cache = target.init_cache(sequence.shape[0], sequence.shape[1])
    _, _, _, features = prefill(target, cache, sequence, lengths,
                                feature_layers=drafter.feature_layers)
    return drafter.init(sequence, lengths, capacity, features=features)


@pytest.mark.parametrize("kind,tree", [
    ("eagle3", None),
    pytest.param("eagle1", TREE, marks=pytest.mark.slow),
    pytest.param("mtp", DynamicTree(6, 3, 2), marks=pytest.mark.slow)])
def test_the_head_cache_after_commits_equals_one_built_from_scratch(tiny_lm, kind, tree):
    """After several verify/commit rounds (rows accepting different numbers of drafts,
    rejected drafts left in scratch slots), the head's cache holds exactly the pairs of the
    committed tokens and its root output equals a from-scratch build: no stale drafts."""
    drafter = make_head(tiny_lm, kind, seed=3)
    num = 4 if tree is None else tree.num_nodes
    config = SpeculativeConfig(num_draft_tokens=num, sampling=SamplingConfig(temperature=1.0),
                               tree=tree)
    prompts = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3, 8, 8, 1]]
    state = run_steps(tiny_lm, drafter, prompts, 5, config)
    lengths = np.asarray(state.lengths)
    assert len(set(lengths - np.asarray([len(p) for p in prompts]))) > 1  # rows differ
    head = state.drafter_state
    np.testing.assert_array_equal(np.asarray(head.cache_lengths), lengths)
    width = int(lengths.max())
    fresh = head_state_from_scratch(tiny_lm, drafter, state.sequence[:, :width],
                                    state.lengths, 96)
    for row, length in enumerate(lengths):
        for got, want in ((head.keys, fresh.keys), (head.values, fresh.values)):
            np.testing.assert_allclose(np.asarray(got[row, :length]),
                                       np.asarray(want[row, :length]), rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(np.asarray(head.root_hidden), np.asarray(fresh.root_hidden),
                               rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_chain_drafts_follow_the_head_run_step_by_step(tiny_lm):
    """A greedy chain proposal equals feeding the head its own argmax one token at a time."""
    from specjax.drafters.base import DraftContext

    drafter = make_head(tiny_lm, "eagle3", seed=4, method="greedy")
    prompts = jnp.asarray([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], jnp.int32)
    lengths = jnp.asarray([5, 3], jnp.int32)
    cache = tiny_lm.init_cache(2, 32)
    _, _, _, features = prefill(tiny_lm, cache, prompts, lengths,
                                feature_layers=drafter.feature_layers)
    state = drafter.init(prompts, lengths, 32, features=features)
    sequence = jnp.zeros((2, 32), jnp.int32).at[:, :5].set(prompts)
    _, proposal = drafter.propose(state, DraftContext(sequence, lengths), jax.random.key(0),
                                  num_draft_tokens=3, sampling=GREEDY, vocab_size=32)
    hidden, token = state.root_hidden, None
    keys, values = state.keys, state.values
    for depth in range(3):
        logits = drafter._logits(hidden)
        token = jnp.argmax(logits, axis=-1)
        np.testing.assert_array_equal(np.asarray(proposal.tokens[:, depth]), np.asarray(token))
        position = lengths + depth
        out, (keys, values) = drafter._block(token[:, None], hidden[:, None],
                                             position[:, None], (keys, values), position)
        hidden = out[:, 0]
    np.testing.assert_array_equal(np.asarray(proposal.q.argmax(-1)),
                                  np.asarray(proposal.tokens))


def test_refuses_a_head_built_for_another_vocabulary(tiny_lm, micro_lm):
    drafter = make_head(tiny_lm, "eagle1")
    with pytest.raises(ValueError, match="vocab_size is 8"):
        specjax.speculative_generate(micro_lm, drafter, [[1, 2]], max_new_tokens=4,
                                     num_draft_tokens=2)


def test_refuses_features_of_another_width(tiny_lm):
    embedding, lm_head = specjax_models.embedding_and_head(tiny_lm)
    config = FeatureHeadConfig(kind="eagle1", d_model=64, num_heads=4, num_kv_heads=2, d_ff=96)
    drafter = Eagle.create(config, embedding, lm_head, jax.random.key(0))
    with pytest.raises(ValueError, match="width"):
        drafter.init(jnp.ones((1, 3), jnp.int32), jnp.asarray([3]), 16,
                     features=jnp.zeros((1, 3, 32)))


def test_head_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="feature_layers"):
        FeatureHeadConfig(kind="eagle3", d_model=64, num_heads=4, num_kv_heads=2, d_ff=96)
    with pytest.raises(ValueError, match="kind='eagle3'"):
        FeatureHeadConfig(kind="mtp", d_model=64, num_heads=4, num_kv_heads=2, d_ff=96,
                          feature_layers=(0,))
    with pytest.raises(ValueError, match="kind must be"):
        FeatureHeadConfig(kind="hydra", d_model=64, num_heads=4, num_kv_heads=2, d_ff=96)
    with pytest.raises(ValueError, match="multiple of"):
        FeatureHeadConfig(kind="mtp", d_model=64, num_heads=3, num_kv_heads=2, d_ff=96,
                          head_dim=16)
    with pytest.raises(ValueError, match="always normalises"):
        FeatureHeadConfig(kind="mtp", d_model=64, num_heads=4, num_kv_heads=2, d_ff=96,
                          feature_norm=True)


def test_feature_norm_makes_the_head_blind_to_the_feature_scale(tiny_lm, tmp_path):
    """feature_norm (EAGLE-3's hidden_norm): scaling the target's features leaves the head's
    input unchanged (without it, the input moves); the flag survives save/load."""
    from specjax.drafters.feature_head import fuse_features, head_inputs

    embedding, lm_head = specjax_models.embedding_and_head(tiny_lm)
    tokens = jnp.asarray([[1, 5, 7, 2]])
    hidden = jax.random.normal(jax.random.key(0), (1, 4, 3, 64))
    for norm in (True, False):
        config = FeatureHeadConfig(kind="eagle3", d_model=64, num_heads=4, num_kv_heads=2,
                                   d_ff=96, feature_layers=(0, 1), feature_norm=norm)
        head = Eagle.create(config, embedding, lm_head, jax.random.key(1))
        inputs = [head_inputs(head.params, config, embedding, tokens,
                              fuse_features(head.params, config, scale * hidden))[0]
                  for scale in (1.0, 50.0)]
        close = np.allclose(np.asarray(inputs[0]), np.asarray(inputs[1]), rtol=1e-3, atol=1e-4)
        assert close == norm
    head.with_params(head.params).save(tmp_path / "plain")
    normed = Eagle.create(dataclasses.replace(config, feature_norm=True), embedding, lm_head,
                          jax.random.key(1))
    normed.save(tmp_path / "normed")
    for name, expected in (("plain", False), ("normed", True)):
        loaded = Eagle.load(tmp_path / name, embedding, lm_head)
        assert loaded.config.feature_norm is expected
        assert ("feature_norm" in loaded.params) is expected


def test_a_dynamic_tree_wider_than_the_scratch_room_is_refused(tiny_lm):
    drafter = make_head(tiny_lm, "mtp")
    with pytest.raises(ValueError, match="lower top_k or max_depth"):
        specjax.speculative_generate(tiny_lm, drafter, [[1, 2]], max_new_tokens=4,
                                     sampling=GREEDY,
                                     tree=DynamicTree(num_nodes=12, max_depth=10, top_k=9))


def test_save_and_load_round_trip(tiny_lm, tmp_path):
    drafter = make_head(tiny_lm, "eagle3", seed=9)
    drafter.save(tmp_path / "head")
    embedding, lm_head = specjax_models.embedding_and_head(tiny_lm)
    loaded = Eagle.load(tmp_path / "head", embedding, lm_head)
    assert loaded.config == drafter.config
    for name, value in drafter.params.items():
        np.testing.assert_array_equal(np.asarray(loaded.params[name]), np.asarray(value))
    with pytest.raises(FileNotFoundError, match="train-drafter"):
        Eagle.load(tmp_path / "nothing", embedding, lm_head)


@pytest.mark.slow
def test_a_reduced_draft_vocabulary_drafts_only_its_ids(tiny_lm, tmp_path):
    """EAGLE-3's draft vocabulary: the head scores only those ids (through those rows of
    the LM head), every draft comes from it, q is 0 elsewhere, and it survives save/load."""
    from specjax.drafters.eagle import most_frequent_tokens

    embedding, lm_head = specjax_models.embedding_and_head(tiny_lm)
    vocab = np.asarray([1, 3, 4, 9, 17, 30])
    drafter = Eagle.create(make_head(tiny_lm, "eagle3").config, embedding, lm_head,
                           jax.random.key(2), "sample", vocab)
    assert drafter.lm_head.shape == (6, 64)
    out = specjax.speculative_generate(tiny_lm, drafter, [[1, 2, 3], [5, 6, 7, 8]],
                                       max_new_tokens=16, num_draft_tokens=3,
                                       sampling=SamplingConfig(temperature=1.0),
                                       key=jax.random.key(0))
    assert out.stats.acceptance_rate > 0
    from specjax.drafters.base import DraftContext

    state = drafter.init(jnp.asarray([[1, 2, 3]]), jnp.asarray([3]), 16,
                         features=jnp.ones((1, 3, 3, 64)))
    _, proposal = drafter.propose(state, DraftContext(jnp.zeros((1, 16), jnp.int32),
                                                      jnp.asarray([3])),
                                  jax.random.key(1), num_draft_tokens=4,
                                  sampling=SamplingConfig(temperature=1.0), vocab_size=32)
    assert set(np.asarray(proposal.tokens).ravel()) <= set(vocab.tolist())
    outside = np.setdiff1d(np.arange(32), vocab)
    assert np.all(np.asarray(proposal.q)[..., outside] == 0)
    drafter.save(tmp_path / "head")
    loaded = Eagle.load(tmp_path / "head", embedding, lm_head)
    np.testing.assert_array_equal(np.asarray(loaded.draft_vocab), vocab)
    np.testing.assert_array_equal(np.asarray(loaded.lm_head), np.asarray(lm_head)[vocab])
    assert "draft_vocab" not in loaded.params
    np.testing.assert_array_equal(most_frequent_tokens([[5, 5, 2, 7, 7, 7, 1]], 2), [5, 7])
    with pytest.raises(ValueError, match="draft_vocab must hold ids"):
        Eagle.create(drafter.config, embedding, lm_head, jax.random.key(0), "sample", [40])


def test_the_head_is_a_pytree_whose_leaves_are_arrays(tiny_lm):
    drafter = make_head(tiny_lm, "mtp")
    leaves, treedef = jax.tree.flatten(drafter)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert rebuilt.config == drafter.config and rebuilt.method == drafter.method
    assert dataclasses.replace(drafter, method="greedy").method == "greedy"
