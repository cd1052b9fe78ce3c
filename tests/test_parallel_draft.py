"""ParallelDraft: one draft forward per step whose logits are exactly a full forward's over
the committed text and the masks, whatever each step committed; one forward counted per
step; bad settings refused by name. (Exactness under every rule: tests/test_exactness.py.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_trees_follow_offsets

import specjax
from specjax import SamplingConfig
from specjax.drafters import Commit, DraftContext, ParallelDraft

MASK = 31
PROMPTS = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3, 8]]


def full_forward_logits(lm, tokens: list, positions: int) -> np.ndarray:
    """The draft's logits at the last token and at each of `positions - 1` masks after it,
    from one forward over the whole text on an empty cache."""
    window = tokens + [MASK] * (positions - 1)
    return np.asarray(lm.logits([window])[0, len(tokens) - 1:])  # CausalLM.logits: jitted


@pytest.mark.parametrize("k", [1, 4])
def test_each_window_is_a_full_forward_over_the_committed_text_and_masks(close_draft, k):
    """Steps that commit 1 .. K + 1 tokens per row (random, different per row): the one
    forward of every step gives, at the last committed token and at each mask, the logits
    of a fresh forward over the row's whole text."""
    drafter = ParallelDraft(close_draft, mask_id=MASK)
    rng = np.random.default_rng(0)
    capacity = 40
    batch = len(PROMPTS)
    width = max(map(len, PROMPTS))
    prompt_BP = np.zeros((batch, width), np.int32)
    for b, prompt in enumerate(PROMPTS):
        prompt_BP[b, :len(prompt)] = prompt
    lengths = np.array([len(p) for p in PROMPTS], np.int32)
    sequence = np.zeros((batch, capacity), np.int32)
    sequence[:, :width] = prompt_BP
    state = jax.jit(drafter.init, static_argnums=2)(jnp.asarray(prompt_BP),
                                                     jnp.asarray(lengths), capacity)
    forward = jax.jit(drafter.position_logits, static_argnums=2)
    commit = jax.jit(drafter.commit)
    for _ in range(5):
        context = DraftContext(jnp.asarray(sequence), jnp.asarray(lengths))
        cache, logits_BKV = forward(state, context, k)
        for b in range(batch):
            want = full_forward_logits(close_draft, sequence[b, :lengths[b]].tolist(), k)
            np.testing.assert_allclose(np.asarray(logits_BKV[b]), want, atol=2e-4)
        state = type(state)(cache)
        emitted = rng.integers(1, k + 2, size=batch)
        new_lengths = lengths + emitted
        for b in range(batch):
            sequence[b, lengths[b]:new_lengths[b]] = rng.integers(0, 30, size=emitted[b])
        state = commit(state, Commit(
            old_lengths=jnp.asarray(lengths), new_lengths=jnp.asarray(new_lengths),
            num_accepted=jnp.asarray(emitted - 1), sequence=jnp.asarray(sequence),
            target_hidden=jnp.zeros((batch, k + 1, 1)), active=jnp.ones((batch,), bool)))
        lengths = new_lengths.astype(np.int32)


def test_a_step_drafts_k_tokens_in_one_draft_forward(tiny_lm, close_draft):
    """K = 6 drafts, one draft forward per step: the stats count one per target forward;
    the draws are q's (sampled) or the argmax (greedy)."""
    out = specjax.speculative_generate(
        tiny_lm, ParallelDraft(close_draft, mask_id=MASK), PROMPTS, max_new_tokens=16,
        num_draft_tokens=6, sampling=SamplingConfig(temperature=1.0), key=jax.random.key(0))
    np.testing.assert_array_equal(out.stats.draft_forwards, out.stats.target_forwards)
    # Six drafts a step, near the row's end those that fit its room (step_counters): at
    # least the drafts it accepted (each step emits at most its accepted drafts + 1).
    stats = out.stats
    assert np.all(stats.proposed <= 6 * stats.target_forwards)
    assert np.all(stats.proposed >= stats.emitted - stats.target_forwards)


def test_tree_proposals_take_each_depth_from_its_position(close_draft):
    """A static tree's depth-d nodes are drawn from position d + 1: with greedy drafting
    every depth-d node of the first rank is the argmax there, the same for every parent;
    a dynamic tree's nodes score along their paths with those same distributions."""
    drafter = ParallelDraft(close_draft, mask_id=MASK, method="greedy")
    prompt = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
    state = jax.jit(drafter.init, static_argnums=2)(prompt, jnp.asarray([4]), 24)
    context = DraftContext(jnp.zeros((1, 24), jnp.int32).at[:, :4].set(prompt),
                           jnp.asarray([4]))
    _, logits = jax.jit(drafter.position_logits, static_argnums=2)(state, context, 3)
    argmax = np.asarray(jnp.argmax(logits[0], axis=-1))
    assert_trees_follow_offsets(drafter, state, context, argmax)


@pytest.mark.parametrize("settings,message", [
    (dict(mask_id=32), "mask_id must be a token id the draft reads"),
    (dict(mask_id=-1), "mask_id must be a token id the draft reads"),
    (dict(mask_id=True), "mask_id must be a token id the draft reads"),
    (dict(mask_id=3, method="beam"), "method must be one of"),
    (dict(mask_id=3, min_confidence=0.0), "min_confidence"),
])
def test_bad_settings_are_refused_by_name(close_draft, settings, message):
    with pytest.raises(ValueError, match=message):
        ParallelDraft(close_draft, **settings)


def test_a_numpy_integer_mask_is_an_id_like_any_other(close_draft):
    drafter = ParallelDraft(close_draft, mask_id=np.int64(31))
    assert drafter.mask_id == 31 and type(drafter.mask_id) is int
    with pytest.raises(ValueError, match="in \\[0, 32\\), got 32"):
        ParallelDraft(close_draft, mask_id=np.int32(32))


def test_a_published_mask_outside_the_vocabulary_is_refused_before_any_weight_is_read(
        tmp_path, monkeypatch):
    import json

    import specjax_models
    from specjax_models import hf

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 64,
                                                      "pard_token": 64}))
    monkeypatch.setattr(hf, "from_pretrained", lambda *a, **k: pytest.fail("weights read"))
    with pytest.raises(ValueError, match="mask token 64 is outside the draft's vocabulary "
                                         "\\[0, 64\\) \\(config.json's vocab_size\\)"):
        specjax_models.load_parallel_draft(tmp_path)


def test_the_shipped_draft_knows_the_drafts_it_was_trained_for(tiny_lm):
    import specjax_models

    assert specjax_models.load_bundled("parallel").trained_positions == 8
