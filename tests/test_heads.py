"""Training feature drafters (specjax/training/heads.py): losses, training-time test,
learning, exact resume."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax_models
from specjax.drafters import Eagle, FeatureHeadConfig, Medusa
from specjax.training import HeadTrainConfig, TrainConfig, self_distillation_data, train_head
from specjax.training.heads import epoch_batches, unrolled_head


def small_head(lm, kind, seed=0) -> Eagle:
    embedding, lm_head = specjax_models.embedding_and_head(lm)
    layers = (0, 1) if kind == "eagle3" else ()
    config = FeatureHeadConfig(kind=kind, d_model=embedding.shape[1], num_heads=4,
                               num_kv_heads=2, d_ff=96, feature_layers=layers)
    head = Eagle.create(config, embedding, lm_head, jax.random.key(seed))
    return head.with_params(jax.tree.map(lambda x: 5.0 * x if x.ndim == 2 else x, head.params))


@pytest.mark.slow
def test_training_time_test_matches_drafting_step_by_step(tiny_lm):
    """Unrolled step j at position t equals what drafting computes: the teacher pairs up to
    t - j in the cache, then j pairs fed one at a time, each with the previous output as
    its feature (the attention mask of training-time test)."""
    head = small_head(tiny_lm, "mtp", seed=1)
    length = 10
    tokens = jax.random.randint(jax.random.key(0), (2, length), 0, 32)
    features = jax.random.normal(jax.random.key(1), (2, length, 64))
    outputs = unrolled_head(head, tokens, features, 3)
    prev = jnp.concatenate([jnp.zeros_like(features[:, :1]), features[:, :-1]], axis=1)
    for committed in (2, 5):  # the prefix ends at position `committed`
        keys, values = jnp.zeros((2, 32, 2, 16)), jnp.zeros((2, 32, 2, 16))
        positions = jnp.broadcast_to(jnp.arange(committed + 1), (2, committed + 1))
        out, keys, values = head._block(tokens[:, :committed + 1], prev[:, :committed + 1],
                                        positions, keys, values, jnp.zeros(2, jnp.int32))
        np.testing.assert_allclose(np.asarray(out), np.asarray(outputs[0][:, :committed + 1]),
                                   rtol=2e-4, atol=2e-5)
        hidden = out[:, -1]
        for step in (1, 2):
            position = jnp.full((2,), committed + step, jnp.int32)
            out, keys, values = head._block(tokens[:, committed + step][:, None],
                                            hidden[:, None], position[:, None], keys, values,
                                            position)
            hidden = out[:, 0]
            np.testing.assert_allclose(np.asarray(hidden),
                                       np.asarray(outputs[step][:, committed + step]),
                                       rtol=2e-4, atol=2e-5)


@pytest.fixture(scope="module")
def distilled_data(tiny_lm):
    prompts = np.random.default_rng(0).integers(0, 32, (192, 4))
    return self_distillation_data(tiny_lm, prompts, 20, key=jax.random.key(0), batch_size=192)


def test_self_distillation_data_continues_each_prompt(tiny_lm, distilled_data):
    assert distilled_data.shape == (192, 24) and distilled_data.dtype == np.int32
    prompts = np.random.default_rng(0).integers(0, 32, (192, 4))
    np.testing.assert_array_equal(distilled_data[:, :4], prompts)


# A few hundred optimizer steps each: the slow set (CI runs it).
@pytest.mark.slow
@pytest.mark.parametrize("method", ["eagle3", "medusa", "eagle", "mtp"])
def test_training_raises_held_out_acceptance(tiny_lm, distilled_data, method):
    """A few hundred steps on a tiny target: the loss falls and the held-out expected
    acceptance at depth 1 rises above the untrained head's (Medusa starts at the
    target's own head, already a fair guess two tokens ahead on this tiny random target)."""
    if method == "medusa":
        drafter = Medusa.create(2, specjax_models.embedding_and_head(tiny_lm)[1])
    else:
        drafter = small_head(tiny_lm, {"eagle": "eagle1"}.get(method, method))
    config = HeadTrainConfig(method=method, unroll=2 if method in ("eagle3", "mtp") else None)
    steps = 150
    heldout = [distilled_data[:32]]
    result = train_head(drafter, tiny_lm, distilled_data[32:], TrainConfig(
        steps=steps, learning_rate=3e-3, warmup_steps=10, log_every=steps, eval_every=steps),
        config, batch_size=16, heldout=heldout, progress=False)
    untrained = train_head(drafter, tiny_lm, distilled_data[32:], TrainConfig(
        steps=1, learning_rate=1e-9, warmup_steps=0, log_every=1, eval_every=1),
        config, batch_size=16, heldout=heldout, progress=False)
    first, last = result.history[0], result.history[-1]
    before = untrained.history[-1]["acceptance@1"]
    assert last["loss"] < first["loss"], (first, last)
    assert last["acceptance@1"] > before + 0.03, (before, last)


@pytest.mark.slow
def test_a_reduced_draft_vocabulary_trains(tiny_lm, distilled_data):
    """With a draft vocabulary the losses stay finite (the target's mass outside it is
    simply out of reach) and training still raises the held-out acceptance."""
    embedding, lm_head = specjax_models.embedding_and_head(tiny_lm)
    config = small_head(tiny_lm, "mtp").config
    head = Eagle.create(config, embedding, lm_head, jax.random.key(3), "sample",
                        np.arange(0, 32, 2))
    for method, unroll in (("mtp", 2),):
        result = train_head(head, tiny_lm, distilled_data[32:], TrainConfig(
            steps=40, learning_rate=3e-3, warmup_steps=5, log_every=40, eval_every=40),
            HeadTrainConfig(method=method, unroll=unroll), batch_size=16,
            heldout=[distilled_data[:32]], progress=False)
        first, last = result.history[0], result.history[-1]
        assert np.isfinite(first["loss"]) and np.isfinite(last["heldout_loss"])
        assert last["loss"] < first["loss"] and 0 < last["acceptance@1"] < 1


@pytest.mark.slow
def test_a_resumed_run_is_bit_identical(tiny_lm, distilled_data, tmp_path):
    drafter = small_head(tiny_lm, "eagle3", seed=2)
    config = HeadTrainConfig(method="eagle3", unroll=2)
    train_config = TrainConfig(steps=6, learning_rate=1e-2, warmup_steps=2, log_every=1,
                               eval_every=3, checkpoint_every=3)
    whole = train_head(drafter, tiny_lm, distilled_data, train_config, config, batch_size=8,
                       progress=False)
    # Stopped after its first step (max_seconds=0 checkpoints, then stops), then resumed.
    train_head(drafter, tiny_lm, distilled_data, train_config, config, batch_size=8,
               checkpoint_dir=tmp_path / "run", progress=False, max_seconds=0.0)
    resumed = train_head(drafter, tiny_lm, distilled_data, train_config, config, batch_size=8,
                         checkpoint_dir=tmp_path / "run", progress=False)
    for name, value in whole.lm.params.items():
        np.testing.assert_array_equal(np.asarray(resumed.lm.params[name]), np.asarray(value))
    assert resumed.history[-1]["step"] == 6


def test_batches_are_a_pure_function_of_seed_and_step():
    data = np.arange(40, dtype=np.int32).reshape(10, 4)
    first, again = epoch_batches(data, 3, 7), epoch_batches(data, 3, 7)
    for step in (0, 2, 3, 9):
        np.testing.assert_array_equal(first(step), again(step))
    epoch = np.concatenate([first(s) for s in range(3)])
    assert len({tuple(r) for r in epoch}) == 9  # no row twice within an epoch
    with pytest.raises(ValueError, match="cannot fill a batch"):
        epoch_batches(data, 11, 0)


def test_config_and_method_errors(tiny_lm):
    with pytest.raises(ValueError, match="method must be one of"):
        HeadTrainConfig(method="hydra")
    with pytest.raises(ValueError, match="teacher-forced"):
        HeadTrainConfig(method="eagle", unroll=3)
    head = small_head(tiny_lm, "mtp")
    with pytest.raises(ValueError, match="kind 'eagle3'"):
        train_head(head, tiny_lm, np.zeros((8, 12), np.int32), TrainConfig(steps=1),
                   HeadTrainConfig(method="eagle3"), batch_size=8, progress=False)
    with pytest.raises(TypeError, match="Medusa"):
        train_head(head, tiny_lm, np.zeros((8, 12), np.int32), TrainConfig(steps=1),
                   HeadTrainConfig(method="medusa"), batch_size=8, progress=False)
