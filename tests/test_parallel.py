"""specjax.training.parallel: the packed COD layout is PARD's (every kept mask has its whole
chain), the packed forward gives at each slot exactly the logits the parallel draft
computes at inference, the aligned weights are the chains' products, and training raises
the acceptance of the masked offsets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.drafters import DraftContext, ParallelDraft
from specjax.training import TrainConfig, self_distillation_data
from specjax.training.parallel import (
    ParallelTrainConfig,
    cached_labels,
    parallel_layout,
    parallel_logits,
    parallel_terms,
    slot_terms,
    train_parallel,
)

MASK = 31


@pytest.mark.parametrize("keep_ratio,min_keep", [(1.0, 1.0), (0.5, 0.1), (0.3, 0.3)])
def test_the_layout_keeps_every_chain_and_sees_what_inference_sees(keep_ratio, min_keep):
    config = ParallelTrainConfig(mask_id=MASK, positions=4, keep_ratio=keep_ratio,
                                 min_keep=min_keep)
    length = 20
    layout = parallel_layout(length, config, np.random.default_rng(0))
    copy, position, chain, mask = (layout[k] for k in ("copy", "position", "chain", "mask"))
    counts = [int(np.sum(copy == c)) for c in range(4)]
    assert counts == config.kept(length) and counts[0] == length
    if keep_ratio == 1.0:
        assert counts == [20, 19, 18, 17]
    slot = {(int(c), int(j)): s for s, (c, j) in enumerate(zip(copy, position, strict=True))}
    for s, (c, j) in enumerate(zip(copy, position, strict=True)):
        c, j = int(c), int(j)
        if c == 0:
            assert chain[s] == -1
        else:
            assert chain[s] == slot[(c - 1, j - 1)]  # the predecessor is kept
        # What it attends to: real tokens 0 .. j - c, then the masks j - c + 1 .. j.
        want = {slot[(0, t)] for t in range(j - c + 1)}
        want |= {slot[(m, j - c + m)] for m in range(1, c + 1)}
        assert set(np.flatnonzero(mask[s]).tolist()) == want


def test_each_slot_is_the_parallel_draft_at_inference(close_draft):
    """The logits of slot (c, j) equal the inference forward's at offset c after the text
    up to j - c (ParallelDraft.position_logits)."""
    config = ParallelTrainConfig(mask_id=MASK, positions=3, keep_ratio=0.7, min_keep=0.2)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 30, size=(2, 12)).astype(np.int32)
    layout = parallel_layout(12, config, rng)
    logits = np.asarray(jax.jit(parallel_logits, static_argnums=3)(
        close_draft, jnp.asarray(tokens), {k: jnp.asarray(v) for k, v in layout.items()},
        MASK))
    drafter = ParallelDraft(close_draft, mask_id=MASK)
    forward = jax.jit(drafter.position_logits, static_argnums=2)
    checked = 0
    for s, (c, j) in enumerate(zip(layout["copy"], layout["position"], strict=True)):
        base = int(j) - int(c)
        if base < 0 or s % 3:
            continue
        for b in range(2):
            text = tokens[b, :base + 1]
            state = drafter.init(jnp.asarray(text[None]), jnp.asarray([len(text)]), 24)
            sequence = jnp.zeros((1, 24), jnp.int32).at[0, :len(text)].set(text)
            _, want = forward(state, DraftContext(sequence, jnp.asarray([len(text)])),
                              config.positions)
            np.testing.assert_allclose(logits[b, s], np.asarray(want[0, int(c)]), atol=2e-4)
            checked += 1
    assert checked >= 8


@pytest.fixture(scope="module")
def cached(tiny_lm):
    prompts = np.random.default_rng(2).integers(0, 30, size=(160, 4))
    sequences = self_distillation_data(tiny_lm, prompts, 16, key=jax.random.key(3))
    return cached_labels(tiny_lm, sequences, prompt_len=4, top_k=8)


def test_aligned_weights_are_the_chain_products(close_draft, cached):
    config = ParallelTrainConfig(mask_id=MASK, positions=3, keep_ratio=0.6, aligned=True)
    layout = parallel_layout(20, config, np.random.default_rng(4))
    batch = {**{k: jnp.asarray(v[:4]) for k, v in cached.items()},
             **{k: jnp.asarray(v) for k, v in layout.items()}}
    terms = jax.tree.map(np.asarray, slot_terms(close_draft, batch, config))
    for s, link in enumerate(layout["chain"]):
        want, at = np.ones(4), int(link)
        while at >= 0:
            want = want * terms["acceptance"][:, at]
            at = int(layout["chain"][at])
        np.testing.assert_allclose(terms["reached"][:, s], want, rtol=1e-5)
    loss, _ = parallel_terms(close_draft, batch, config)
    weight = terms["reached"] * terms["valid"]
    assert float(loss) == pytest.approx(
        float(np.sum(terms["cross_entropy"] * weight) / np.sum(weight)), rel=1e-5)


def test_training_raises_the_masked_offsets_acceptance(close_draft, cached):
    config = ParallelTrainConfig(mask_id=MASK, positions=3, keep_ratio=0.7)
    train = {k: v[:128] for k, v in cached.items()}
    held = {k: jnp.asarray(v[128:]) for k, v in cached.items()}
    held.update({k: jnp.asarray(v) for k, v in
                 parallel_layout(20, config, np.random.default_rng(5)).items()})
    metrics = jax.jit(lambda lm: parallel_terms(lm, held, config)[1])
    after = train_parallel(close_draft, train, TrainConfig(steps=80, learning_rate=3e-3,
                                                           warmup_steps=5, eval_every=80,
                                                           log_every=80),
                           config, batch_size=16, progress=False)
    first, last = (jax.tree.map(float, metrics(lm)) for lm in (close_draft, after.lm))
    assert last["acceptance@2"] > first["acceptance@2"] + 0.03, (first, last)
    assert last["acceptance@3"] > first["acceptance@3"] + 0.03, (first, last)
    assert last["expected_accepted"] > first["expected_accepted"]
    assert last["acceptance@1"] > first["acceptance@1"] - 0.05


@pytest.mark.parametrize("settings,message", [
    (dict(mask_id=-1), "mask_id"), (dict(mask_id=3, positions=0), "positions"),
    (dict(mask_id=3, keep_ratio=0.0), "keep_ratio"), (dict(mask_id=3, min_keep=1.5),
                                                      "min_keep")])
def test_bad_settings_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        ParallelTrainConfig(**settings)
