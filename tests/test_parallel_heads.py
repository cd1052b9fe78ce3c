"""specjax.training.parallel_heads (P-EAGLE training): the packed forward gives at each slot
exactly the output the parallel head computes at inference after the text up to j - c
with c placeholders; training raises the acceptance of the placeholder offsets; a trained
autoregressive head is adapted by `with_placeholder`; bad heads and settings are refused
by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import causal_head_forward

import specjax_models
from specjax.drafters import Eagle, FeatureHeadConfig, ParallelEagle, eagle3_feature_layers
from specjax.training import (
    ParallelTrainConfig,
    TrainConfig,
    self_distillation_data,
    train_parallel_head,
    with_placeholder,
)
from specjax.training.heads import target_outputs
from specjax.training.parallel import parallel_layout
from specjax.training.parallel_heads import parallel_head_outputs, parallel_head_terms

MASK = 31


def make_head(target, kind: str = "eagle3", mask_id: int | None = MASK,
              first_pair: bool = True, scale: float = 1.0) -> Eagle:
    embedding, lm_head = specjax_models.embedding_and_head(target)
    d_model = embedding.shape[1]
    layers = eagle3_feature_layers(target.num_layers) if kind == "eagle3" else ()
    config = FeatureHeadConfig(kind=kind, d_model=d_model, num_heads=2, num_kv_heads=1,
                               d_ff=2 * d_model, feature_layers=layers, mask_id=mask_id,
                               first_pair=first_pair)
    head = Eagle.create(config, embedding, lm_head, jax.random.key(2))
    if scale != 1.0:
        head = head.with_params(jax.tree.map(lambda x: scale * x if x.ndim == 2 else x,
                                             head.params))
    if mask_id is not None:
        mask_hidden = jax.random.normal(jax.random.key(9), (d_model,))
        head = head.with_params({**head.params, "mask_hidden": mask_hidden})
    return head


def inference_outputs(head: Eagle, tokens: np.ndarray, fused_TD: np.ndarray,
                      reals: list[int], placeholders: list[int]) -> np.ndarray:
    """`[S, D]`: the head's output after `reals[s]` teacher pairs and `placeholders[s]`
    placeholder pairs, each from one causal forward over its own window (what
    ParallelEagle's window computes: tests/test_parallel_eagle.py). The windows share one
    jitted call, padded at their end to a common width (causal: padding after a window's
    last pair never reaches it)."""
    width = max(r + p for r, p in zip(reals, placeholders, strict=True))
    mask_hidden = np.asarray(head.params["mask_hidden"])
    windows, features, last = [], [], []
    for real, count in zip(reals, placeholders, strict=True):
        pad = width - real - count
        features.append(np.concatenate([np.zeros_like(fused_TD[:1]), fused_TD[:real - 1],
                                        np.tile(mask_hidden, (count, 1)),
                                        np.zeros((pad, fused_TD.shape[1]), fused_TD.dtype)]))
        windows.append(list(tokens[:real]) + [MASK] * count + [0] * pad)
        last.append(real + count - 1)
    out_SWD = causal_head_forward(head, jnp.asarray(windows, jnp.int32),
                                  jnp.asarray(np.stack(features)))
    return np.asarray(out_SWD)[np.arange(len(last)), last]


@pytest.mark.parametrize("kind,first_pair", [("eagle3", True), ("eagle1", False)])
def test_each_slot_is_the_parallel_head_at_inference(tiny_lm, kind, first_pair):
    """Slot (c, j) of the packed forward equals the head's output at offset c + 1 after
    the text up to j - c, for every kept slot (COD thinning the copies)."""
    head = make_head(tiny_lm, kind, first_pair=first_pair, scale=8.0)
    config = ParallelTrainConfig(mask_id=MASK, positions=4, keep_ratio=0.7, min_keep=0.2)
    length = 12
    layout = parallel_layout(length, config, np.random.default_rng(3))
    tokens = np.random.default_rng(1).integers(0, MASK, (2, length)).astype(np.int32)
    _, hidden = target_outputs(tiny_lm, jnp.asarray(tokens), head.feature_layers)
    fused_BTD = head._features(hidden)
    out_BSD = np.asarray(parallel_head_outputs(head, jnp.asarray(tokens), fused_BTD,
                                               {k: jnp.asarray(v) for k, v in
                                                layout.items()}))
    assert len(set(layout["copy"].tolist())) == 4
    copies, positions = layout["copy"].tolist(), layout["position"].tolist()
    for b in range(2):
        expected_SD = inference_outputs(head, tokens[b], np.asarray(fused_BTD[b]),
                                        [p - c + 1 for c, p in zip(copies, positions, strict=True)],
                                        copies)
        for slot, (copy, position) in enumerate(zip(copies, positions, strict=True)):
            np.testing.assert_allclose(out_BSD[b, slot], expected_SD[slot], rtol=2e-4,
                                       atol=2e-4,
                                       err_msg=f"row {b}, copy {copy}, position {position}")


@pytest.fixture(scope="module")
def sequences(tiny_lm):
    prompts = np.random.default_rng(0).integers(0, MASK, (160, 4)).astype(np.int32)
    return self_distillation_data(tiny_lm, prompts, 16, key=jax.random.key(1))


def test_training_raises_the_placeholder_offsets_acceptance(tiny_lm, sequences):
    config = ParallelTrainConfig(mask_id=MASK, positions=3, keep_ratio=0.7)
    head = make_head(tiny_lm)
    held = {"tokens": jnp.asarray(sequences[128:]),
            **{k: jnp.asarray(v) for k, v in
               parallel_layout(20, config, np.random.default_rng(5)).items()}}
    metrics = jax.jit(lambda h: parallel_head_terms(h, tiny_lm, held, config)[1])
    result = train_parallel_head(head, tiny_lm, sequences[:128],
                                 TrainConfig(steps=60, learning_rate=3e-3, warmup_steps=5,
                                             eval_every=60, log_every=60),
                                 config, batch_size=16, heldout=[sequences[128:]],
                                 progress=False)
    first, last = (jax.tree.map(float, metrics(h)) for h in (head, result.lm))
    for offset in (1, 2, 3):
        assert last[f"acceptance@{offset}"] > first[f"acceptance@{offset}"] + 0.03, \
            (first, last)
    assert last["expected_accepted"] > first["expected_accepted"]
    # The placeholder feature is trained with the head; the target's tables are not.
    assert not np.allclose(result.lm.params["mask_hidden"], head.params["mask_hidden"])
    assert result.lm.embedding is head.embedding
    assert "acceptance@3" in result.history[-1]
    ParallelEagle(result.lm)  # a parallel head as the decoders take it


def test_a_trained_head_gains_a_placeholder(tiny_lm):
    head = make_head(tiny_lm, mask_id=None)
    adapted = with_placeholder(head, MASK, jax.random.key(4))
    assert adapted.config.mask_id == MASK
    assert adapted.params["mask_hidden"].shape == (head.config.d_model,)
    for name, value in head.params.items():
        assert adapted.params[name] is value
    ParallelEagle(adapted)


@pytest.mark.parametrize("change,message", [
    (dict(mask_id=None), "no placeholder"),
    (dict(config_mask=5), "differs"),
    (dict(positions=40), "exceeds"),
])
def test_bad_heads_and_settings_are_refused_by_name(tiny_lm, sequences, change, message):
    head = make_head(tiny_lm, mask_id=change.get("mask_id", MASK))
    config = ParallelTrainConfig(mask_id=change.get("config_mask", MASK),
                                 positions=change.get("positions", 3))
    with pytest.raises(ValueError, match=message):
        train_parallel_head(head, tiny_lm, sequences, TrainConfig(steps=1), config,
                            progress=False)


def test_a_head_that_is_not_an_eagle_head_is_refused(tiny_lm, sequences):
    with pytest.raises(TypeError, match="Eagle"):
        train_parallel_head(tiny_lm, tiny_lm, sequences, TrainConfig(steps=1),
                            ParallelTrainConfig(mask_id=MASK), progress=False)
