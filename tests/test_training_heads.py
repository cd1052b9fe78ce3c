"""Training feature drafters (specjax/training/heads.py): losses, training-time test,
learning, exact resume."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax_models
from specjax.drafters import Eagle, EarlyExit, FeatureHeadConfig, Medusa
from specjax.training import (
    HeadTrainConfig,
    TrainConfig,
    cache_target_outputs,
    draft_label_index,
    heads,
    self_distillation_data,
    train_head,
    train_head_cached,
)
from specjax.training.heads import epoch_batches

# Jitted, as training runs them: eagerly, each operation would compile a program of its own.
head_loss = jax.jit(heads.head_loss, static_argnums=3)
_cached_terms = jax.jit(heads._cached_terms, static_argnums=2)
unrolled_head = jax.jit(heads.unrolled_head, static_argnums=3)


def small_head(lm, kind, seed=0) -> Eagle:
    embedding, lm_head = specjax_models.embedding_and_head(lm)
    layers = (0, 1) if kind == "eagle3" else ()
    config = FeatureHeadConfig(kind=kind, d_model=embedding.shape[1], num_heads=4,
                               num_kv_heads=2, d_ff=96, feature_layers=layers)
    head = Eagle.create(config, embedding, lm_head, jax.random.key(seed))
    return head.with_params(jax.tree.map(lambda x: 5.0 * x if x.ndim == 2 else x, head.params))


def kangaroo_adapter(lm, exit_layer=1, seed=0, draft_vocab=None) -> EarlyExit:
    _, lm_head = specjax_models.embedding_and_head(lm)
    config = FeatureHeadConfig(kind="kangaroo", d_model=lm_head.shape[1], num_heads=4,
                               num_kv_heads=2, d_ff=96, feature_layers=(exit_layer,))
    return EarlyExit.create(config, lm_head, jax.random.key(seed), draft_vocab=draft_vocab)


@pytest.mark.slow
def published_head(tiny_lm, layout, tmp_path):
    """A head read from a published layout (so fine-tuning one trains what it drafts with):
    MiMo's MTP module (first pair hidden, first embedding zeroed, q/k/v biases), or a
    speculators EAGLE-3 head with its concatenated input, fc_norm and norm_output."""
    from specjax_models.published_layouts import SyntheticShape, write_synthetic_drafter

    shape = SyntheticShape(d_model=64, vocab_size=32, num_layers=2, num_heads=4,
                           num_kv_heads=2)
    directory = write_synthetic_drafter(tmp_path, layout, shape, seed=2, scale=0.2,
                                        fc_norm=layout == "eagle3-speculators",
                                        norm_output=layout == "eagle3-speculators")
    return specjax_models.load_drafter(directory, tiny_lm)


@pytest.mark.parametrize("kind", ["mtp", pytest.param("mimo-mtp", marks=pytest.mark.slow),
                                  pytest.param("eagle3-speculators", marks=pytest.mark.slow)])
def test_training_time_test_matches_drafting_step_by_step(tiny_lm, kind, tmp_path):
    """Unrolled step j at position t equals what drafting computes: the teacher pairs up to
    t - j in the cache, then j pairs fed one at a time, each with the previous output as
    its feature (the attention mask of training-time test); for heads of specjax's own
    layout and for published ones."""
    head = (small_head(tiny_lm, "mtp", seed=1) if kind == "mtp"
            else published_head(tiny_lm, kind, tmp_path))
    length = 10
    tokens = jax.random.randint(jax.random.key(0), (2, length), 0, 32)
    features = jax.random.normal(jax.random.key(1), (2, length, 64))
    outputs = unrolled_head(head, tokens, features, 3)
    prev = jnp.concatenate([jnp.zeros_like(features[:, :1]), features[:, :-1]], axis=1)
    for committed in (2, 5):  # the prefix ends at position `committed`
        keys, values = jnp.zeros((2, 32, 2, 16)), jnp.zeros((2, 32, 2, 16))
        positions = jnp.broadcast_to(jnp.arange(committed + 1), (2, committed + 1))
        out, (keys, values) = head._block(tokens[:, :committed + 1], prev[:, :committed + 1],
                                          positions, (keys, values), jnp.zeros(2, jnp.int32))
        np.testing.assert_allclose(np.asarray(out), np.asarray(outputs[0][:, :committed + 1]),
                                   rtol=2e-4, atol=2e-5)
        hidden = out[:, -1]
        for step in (1, 2):
            position = jnp.full((2,), committed + step, jnp.int32)
            out, (keys, values) = head._block(tokens[:, committed + step][:, None],
                                              hidden[:, None], position[:, None],
                                              (keys, values), position)
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
    for drafter, method in ((head, "kangaroo"), (kangaroo_adapter(tiny_lm), "eagle3")):
        with pytest.raises(TypeError, match="EarlyExit"):
            train_head(drafter, tiny_lm, np.zeros((8, 12), np.int32), TrainConfig(steps=1),
                       HeadTrainConfig(method=method), batch_size=8, progress=False)
    with pytest.raises(ValueError, match="teacher-forced"):
        HeadTrainConfig(method="kangaroo", unroll=2)


@pytest.mark.parametrize("exit_layer", [0, 1])
def test_the_kangaroo_loss_on_cached_outputs_equals_the_online_loss(tiny_lm, distilled_data,
                                                                    exit_layer):
    """With every id kept and every position in the mask, the adapter's loss on cached
    target outputs is head_loss's; a reduced draft vocabulary trains on its own columns."""
    adapter = kangaroo_adapter(tiny_lm, exit_layer, seed=3)
    tokens = distilled_data[:8]
    config = HeadTrainConfig(method="kangaroo")
    online = float(head_loss(adapter, tiny_lm, jnp.asarray(tokens), config))
    batch = jax.tree.map(jnp.asarray, cached_arrays(tiny_lm, adapter, tokens, 32))
    (cached, _), = _cached_terms(adapter, batch, config)
    np.testing.assert_allclose(float(cached), online, rtol=3e-3)


@pytest.mark.slow
def test_a_kangaroo_adapter_learns_on_cached_outputs_and_drafts_better(tiny_lm,
                                                                       distilled_data):
    """Trained on cached outputs (reduced draft vocabulary), the adapter's held-out
    acceptance rises, and decoding with it accepts more drafts than with the untrained
    one (the same greedy output either way)."""
    import specjax

    adapter = kangaroo_adapter(tiny_lm, 1, seed=5, draft_vocab=np.arange(0, 32))
    data = cached_arrays(tiny_lm, adapter, distilled_data, 8)
    train, heldout = ({k: v[32:] for k, v in data.items()},
                      [{k: v[:32] for k, v in data.items()}])
    head_config = HeadTrainConfig(method="kangaroo")
    result = train_head_cached(adapter, train, TrainConfig(
        steps=120, learning_rate=3e-3, warmup_steps=5, log_every=60, eval_every=60),
        head_config, batch_size=16, heldout=heldout, progress=False)
    (_, before), = _cached_terms(adapter, jax.tree.map(jnp.asarray, heldout[0]), head_config)
    assert result.history[-1]["acceptance@1"] > float(before) + 0.05
    prompts = [list(row[:6]) for row in distilled_data[:4]]
    plain = specjax.generate(tiny_lm, prompts, max_new_tokens=16, sampling=specjax.GREEDY)
    rates = []
    for drafter in (adapter, result.lm):
        out = specjax.speculative_generate(tiny_lm, drafter.with_stop_below(None), prompts,
                                           max_new_tokens=16, num_draft_tokens=3,
                                           sampling=specjax.GREEDY)
        np.testing.assert_array_equal(out.tokens, plain.tokens)
        rates.append(out.stats.acceptance_rate)
    assert rates[1] > rates[0], rates


def cached_arrays(lm, head, tokens, top_k, loss_mask=None):
    outputs = jax.jit(lambda t: cache_target_outputs(lm, t, head.feature_layers, top_k))(
        tokens)
    vocab = lm.vocab_size
    return {"tokens": np.asarray(tokens), "hidden": np.asarray(outputs["hidden"]),
            "label_index": draft_label_index(np.asarray(outputs["top_ids"]), head.draft_vocab,
                                             vocab),
            "label_probs": np.asarray(outputs["top_probs"]),
            "loss_mask": np.ones(tokens.shape, bool) if loss_mask is None else loss_mask}


@pytest.mark.slow
def test_cached_training_loss_equals_the_online_loss(tiny_lm, distilled_data):
    """With every id kept (top_k = V) and every position in the mask, the loss on cached
    target outputs is head_loss's EAGLE-3 loss (up to the float16 storage)."""
    head = small_head(tiny_lm, "eagle3", seed=4)
    tokens = distilled_data[:8]
    config = HeadTrainConfig(method="eagle3", unroll=3)
    online = float(head_loss(head, tiny_lm, jnp.asarray(tokens), config))
    batch = jax.tree.map(jnp.asarray, cached_arrays(tiny_lm, head, tokens, 32))
    terms = _cached_terms(head, batch, config)
    weights = [0.8 ** i for i in range(3)]
    cached = sum(w * float(loss) for w, (loss, _) in zip(weights, terms, strict=True)) / sum(
        weights)
    np.testing.assert_allclose(cached, online, rtol=3e-3)
    # A truncated label (top 4 of 32) gives less cross-entropy mass and lower acceptance.
    few = _cached_terms(head, jax.tree.map(jnp.asarray, cached_arrays(tiny_lm, head, tokens,
                                                                      4)), config)
    assert float(few[0][0]) < float(terms[0][0]) and float(few[0][1]) < float(terms[0][1])


def test_cached_loss_ignores_masked_positions(tiny_lm, distilled_data):
    """Changing the target's outputs where the mask is off changes nothing."""
    head = small_head(tiny_lm, "eagle3", seed=4)
    mask = np.zeros(distilled_data[:4].shape, bool)
    mask[:, 6:15] = True
    batch = cached_arrays(tiny_lm, head, distilled_data[:4], 8, mask)
    changed = dict(batch, label_probs=np.where(mask[..., None], batch["label_probs"], 0.5))
    config = HeadTrainConfig(method="eagle3", unroll=2)
    one = _cached_terms(head, jax.tree.map(jnp.asarray, batch), config)
    two = _cached_terms(head, jax.tree.map(jnp.asarray, changed), config)
    for (loss_a, accept_a), (loss_b, accept_b) in zip(one, two, strict=True):
        assert float(loss_a) == float(loss_b) and float(accept_a) == float(accept_b)


def test_draft_label_index_maps_ids_to_draft_columns():
    top_ids = np.array([[3, 7, 1], [0, 5, 3]])
    np.testing.assert_array_equal(draft_label_index(top_ids, None, 8), top_ids)
    np.testing.assert_array_equal(draft_label_index(top_ids, np.array([1, 3, 5]), 8),
                                  [[1, -1, 0], [-1, 2, 1]])


@pytest.mark.slow
def test_cached_training_learns_and_resumes_exactly(tiny_lm, distilled_data, tmp_path):
    """A reduced-vocabulary EAGLE-3 head with feature_norm trained on cached outputs:
    held-out acceptance rises, and a run stopped and resumed equals the whole run."""
    embedding, lm_head = specjax_models.embedding_and_head(tiny_lm)
    config = FeatureHeadConfig(kind="eagle3", d_model=64, num_heads=4, num_kv_heads=2,
                               d_ff=96, feature_layers=(0, 1), feature_norm=True)
    head = Eagle.create(config, embedding, lm_head, jax.random.key(5), "sample",
                        np.arange(0, 32, 2))
    data = cached_arrays(tiny_lm, head, distilled_data, 8)
    train, heldout = ({k: v[32:] for k, v in data.items()},
                      [{k: v[:32] for k, v in data.items()}])
    head_config = HeadTrainConfig(method="eagle3", unroll=2)
    train_config = TrainConfig(steps=60, learning_rate=3e-3, warmup_steps=5, log_every=30,
                               eval_every=30, checkpoint_every=30)
    whole = train_head_cached(head, train, train_config, head_config, batch_size=16,
                              heldout=heldout, progress=False)
    before = _cached_terms(head, jax.tree.map(jnp.asarray, heldout[0]), head_config)
    assert whole.history[-1]["acceptance@1"] > float(before[0][1]) + 0.05
    assert whole.history[-1]["loss"] < whole.history[0]["loss"]
    train_head_cached(head, train, train_config, head_config, batch_size=16,
                      checkpoint_dir=tmp_path / "run", progress=False, max_seconds=0.0)
    resumed = train_head_cached(head, train, train_config, head_config, batch_size=16,
                                checkpoint_dir=tmp_path / "run", progress=False)
    for name, value in whole.lm.params.items():
        np.testing.assert_array_equal(np.asarray(resumed.lm.params[name]), np.asarray(value))


def test_cached_training_refuses_what_it_cannot_train(tiny_lm, distilled_data):
    head = small_head(tiny_lm, "eagle3")
    data = cached_arrays(tiny_lm, head, distilled_data[:16], 4)
    config = TrainConfig(steps=1)
    with pytest.raises(ValueError, match="for EAGLE-3 heads"):
        train_head_cached(small_head(tiny_lm, "mtp"), data, config,
                          HeadTrainConfig(method="mtp"), batch_size=8, progress=False)
    with pytest.raises(ValueError, match="lacks \\['loss_mask'\\]"):
        train_head_cached(head, {k: v for k, v in data.items() if k != "loss_mask"}, config,
                          HeadTrainConfig(method="eagle3"), batch_size=8, progress=False)
    with pytest.raises(ValueError, match="hidden must have shape"):
        train_head_cached(head, dict(data, hidden=data["hidden"][:, :, :2]), config,
                          HeadTrainConfig(method="eagle3"), batch_size=8, progress=False)
    reduced = Eagle.create(head.config, *specjax_models.embedding_and_head(tiny_lm),
                           jax.random.key(0), "sample", np.arange(8))
    with pytest.raises(ValueError, match="beyond the head's vocabulary"):
        train_head_cached(reduced, data, config, HeadTrainConfig(method="eagle3"),
                          batch_size=8, progress=False)


def test_dict_batches_keep_rows_together():
    data = {"a": np.arange(10), "b": np.arange(10) * 10}
    batch = epoch_batches(data, 4, 3)(1)
    np.testing.assert_array_equal(batch["b"], batch["a"] * 10)
