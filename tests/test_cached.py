"""Distilling a draft model from cached target outputs (specjax/training/cached.py): the
soft-label loss against DistillSpec's forward KL, reduced vocabularies, frozen groups,
learning and exact resume, refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax_models
from specjax.training import (
    DistillConfig,
    TrainConfig,
    cache_target_outputs,
    distill_cached,
    distill_loss,
    draft_label_index,
    self_distillation_data,
)
from specjax.training.cached import draft_terms

EVERY_OTHER_ID = np.arange(0, 32, 2)


@pytest.fixture(scope="module")
def sequences(tiny_lm):
    """tiny_lm's own continuations of random prompts: int32 [160, 24]."""
    prompts = np.random.default_rng(1).integers(0, 32, (160, 4))
    return self_distillation_data(tiny_lm, prompts, 20, key=jax.random.key(1), batch_size=160)


def cached(target, tokens, top_k, draft_vocab=None, loss_mask=None) -> dict:
    outputs = jax.jit(lambda t: cache_target_outputs(target, t, (), top_k))(tokens)
    return {"tokens": np.asarray(tokens),
            "label_index": draft_label_index(np.asarray(outputs["top_ids"]), draft_vocab,
                                             target.vocab_size),
            "label_probs": np.asarray(outputs["top_probs"]),
            "loss_mask": np.ones(np.shape(tokens), bool) if loss_mask is None else loss_mask}


def test_the_cached_loss_is_the_forward_kl_plus_the_target_entropy(tiny_lm, close_draft,
                                                                    sequences):
    """With every id kept (top_k = V), soft cross-entropy - H(p) = DistillSpec's forward
    KL(p || q) on the same positions, and acceptance = sum min(p, q) computed directly."""
    tokens = jnp.asarray(sequences[:8])
    batch = jax.tree.map(jnp.asarray, cached(tiny_lm, tokens, 32))
    cross_entropy, accept = draft_terms(close_draft, batch)
    p = jax.nn.softmax(tiny_lm.logits(tokens), axis=-1)
    entropy = float(jnp.mean(-jnp.sum(p * jnp.log(p), axis=-1)))
    fkl = float(distill_loss(close_draft, tiny_lm, tokens, DistillConfig(), None))
    np.testing.assert_allclose(float(cross_entropy) - entropy, fkl, rtol=2e-3, atol=2e-4)
    q = jax.nn.softmax(close_draft.logits(tokens), axis=-1)
    np.testing.assert_allclose(float(accept), float(jnp.mean(jnp.sum(jnp.minimum(p, q), -1))),
                               rtol=2e-3)


def test_a_reduced_vocabulary_draft_is_scored_over_its_own_columns(tiny_lm, sequences):
    """A draft whose head keeps every other id: its logits cover 16 columns, the target's
    labels are mapped to them and the ids it cannot produce drop out of both terms (checked
    against a direct numpy computation)."""
    draft = specjax_models.select_layers(tiny_lm, (0, 1), EVERY_OTHER_ID)
    assert draft.vocab_size == 16
    batch = cached(tiny_lm, sequences[:4], 6, EVERY_OTHER_ID)
    cross_entropy, accept = draft_terms(draft, jax.tree.map(jnp.asarray, batch))
    log_q = np.asarray(jax.nn.log_softmax(draft.logits(sequences[:4]), axis=-1), np.float64)
    index, probs = batch["label_index"], batch["label_probs"].astype(np.float64)
    reach = index >= 0
    picked = np.take_along_axis(log_q, np.maximum(index, 0), axis=-1)
    want_ce = np.mean(-np.sum(np.where(reach, probs * picked, 0), -1))
    want_accept = np.mean(np.sum(np.where(reach, np.minimum(probs, np.exp(picked)), 0), -1))
    assert reach.any() and not reach.all()
    np.testing.assert_allclose(float(cross_entropy), want_ce, rtol=1e-4)
    np.testing.assert_allclose(float(accept), want_accept, rtol=1e-4)


def test_positions_outside_the_loss_mask_change_nothing(tiny_lm, sequences):
    draft = specjax_models.select_layers(tiny_lm, (1,), EVERY_OTHER_ID)
    mask = np.zeros(sequences[:4].shape, bool)
    mask[:, 5:17] = True
    batch = cached(tiny_lm, sequences[:4], 8, EVERY_OTHER_ID, mask)
    changed = dict(batch, label_probs=np.where(mask[..., None], batch["label_probs"], 0.7))
    one = draft_terms(draft, jax.tree.map(jnp.asarray, batch))
    two = draft_terms(draft, jax.tree.map(jnp.asarray, changed))
    assert [float(x) for x in one] == [float(x) for x in two]


@pytest.mark.slow
def test_distillation_learns_keeps_frozen_groups_and_resumes_exactly(tiny_lm, sequences,
                                                                     tmp_path):
    """A one-layer draft (the target's last layer, every other id) trained with the
    embedding and head frozen: held-out acceptance rises, the frozen groups come back
    untouched, and a run stopped and resumed equals the whole run."""
    draft = specjax_models.select_layers(tiny_lm, (1,), EVERY_OTHER_ID)
    data = cached(tiny_lm, sequences, 8, EVERY_OTHER_ID)
    train = {k: v[32:] for k, v in data.items()}
    heldout = [{k: v[:32] for k, v in data.items()}]
    config = TrainConfig(steps=40, learning_rate=3e-3, warmup_steps=5, log_every=20,
                         eval_every=20, checkpoint_every=20)
    frozen = ("embed", "lm_head")
    whole = distill_cached(draft, train, config, frozen=frozen, heldout=heldout,
                           progress=False)
    before = float(draft_terms(draft, jax.tree.map(jnp.asarray, heldout[0]))[1])
    assert whole.history[-1]["acceptance@1"] > before + 0.03
    assert whole.history[-1]["loss"] < whole.history[0]["loss"]
    for name in frozen:
        for new, old in zip(jax.tree.leaves(whole.lm.params[name]),
                            jax.tree.leaves(draft.params[name]), strict=True):
            np.testing.assert_array_equal(np.asarray(new), np.asarray(old))
    distill_cached(draft, train, config, frozen=frozen, checkpoint_dir=tmp_path / "run",
                   progress=False, max_seconds=0.0)
    resumed = distill_cached(draft, train, config, frozen=frozen,
                             checkpoint_dir=tmp_path / "run", progress=False)
    for new, old in zip(jax.tree.leaves(resumed.lm.params), jax.tree.leaves(whole.lm.params),
                        strict=True):
        np.testing.assert_array_equal(np.asarray(new), np.asarray(old))


def test_distillation_refuses_what_it_cannot_train(tiny_lm, sequences):
    draft = specjax_models.select_layers(tiny_lm, (1,), EVERY_OTHER_ID)
    data = cached(tiny_lm, sequences[:16], 4, EVERY_OTHER_ID)
    config = TrainConfig(steps=1)
    with pytest.raises(ValueError, match="lacks \\['loss_mask'\\]"):
        distill_cached(draft, {k: v for k, v in data.items() if k != "loss_mask"}, config,
                       batch_size=8, progress=False)
    with pytest.raises(ValueError, match="beyond the draft's 16 outputs"):
        distill_cached(draft, cached(tiny_lm, sequences[:16], 4), config, batch_size=8,
                       progress=False)
    with pytest.raises(ValueError, match="must both be \\[N, T, k\\]"):
        distill_cached(draft, dict(data, label_probs=data["label_probs"][:, :, :2]), config,
                       batch_size=8, progress=False)
    with pytest.raises(ValueError, match="not parameter groups"):
        distill_cached(draft, data, config, frozen=("embedding",), batch_size=8,
                       progress=False)
    with pytest.raises(ValueError, match="nothing to train"):
        distill_cached(draft, data, config, frozen=tuple(draft.params), batch_size=8,
                       progress=False)
    with pytest.raises(ValueError, match="cannot fill a batch"):
        distill_cached(draft, data, config, batch_size=32, progress=False)
