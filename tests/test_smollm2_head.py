"""An EAGLE-3 head for a chat model (models/recipes/smollm2_head.py): answers, cached target
outputs, loss mask, resumable phases, training; run on the tiny target with a toy chat template."""

import json

import jax
import numpy as np
import pytest
from conftest import CHAT_DATA, ToyChatTokenizer, tiny_config

from specjax.training import TrainConfig
from specjax_models.recipes.smollm2_head import (
    ChatDataConfig,
    answer_tokens,
    load_chat_data,
    prepare_chat_data,
    train_chat_head,
    write_model_card,
)

CONFIG = CHAT_DATA


@pytest.fixture(scope="module")
def work(chat_work):
    return chat_work


def test_rows_are_prompt_then_answer_with_the_target_outputs(tiny_lm, work):
    names = sorted(p.name for p in (work / "chunks").glob("*.npz"))
    assert names == ["chat_0000.npz", "chat_0001.npz", "rewrite_0000.npz"]
    data = load_chat_data(work)
    rows = len(data["tokens"])
    assert rows == 8 and data["hidden"].shape == (8, 48, 3, 64)
    assert data["top_ids"].shape == data["top_probs"].shape == (8, 48, 4)
    for row in range(rows):
        start, end = data["prompt_lengths"][row], data["lengths"][row]
        assert data["tokens"][row, start - 1] == 2  # the template's last prompt token
        assert np.all(data["tokens"][row, end:] == 0)
        # A drafter proposes the answer's tokens: positions start - 1 .. end - 2.
        np.testing.assert_array_equal(np.flatnonzero(data["loss_mask"][row]),
                                      np.arange(start - 1, end - 1))
    assert answer_tokens(data).size == int(data["loss_mask"].sum())
    # The top-k labels are the target's own next-token distribution.
    logits = np.asarray(tiny_lm.apply(
        data["tokens"][:1], np.arange(48)[None], tiny_lm.init_cache(1, 48),
        np.zeros(1, np.int32))[0])[0]
    expected = np.sort(np.asarray(jax.nn.softmax(logits, axis=-1)), axis=-1)[:, ::-1][:, :4]
    np.testing.assert_allclose(data["top_probs"][0].astype(np.float32), expected, atol=2e-3)


def test_a_rerun_reuses_the_chunks(tiny_lm, work):
    before = {p: p.stat().st_mtime_ns for p in (work / "chunks").glob("*.npz")}
    prepare_chat_data(tiny_lm, ToyChatTokenizer(), work, (0, 1), CONFIG)
    assert before == {p: p.stat().st_mtime_ns for p in (work / "chunks").glob("*.npz")}


def test_training_writes_a_loadable_head(tiny_lm, work, tmp_path):
    from specjax_models.heads import load_head_for

    metadata = train_chat_head(
        tiny_lm, tiny_config(), work, tmp_path / "head",
        train_config=TrainConfig(steps=2, warmup_steps=1, log_every=1, eval_every=2,
                                 checkpoint_every=2),
        draft_vocab=12, batch_size=2, heldout_rows=2, unroll=2)
    assert metadata["steps_done"] == 2 and 0 < metadata["draft_vocab_coverage"] <= 1
    assert json.loads((tmp_path / "head" / "metadata.json").read_text())["train_rows"] == 6
    head = load_head_for(tmp_path / "head", tiny_lm)
    assert head.config.feature_norm and head.draft_vocab.shape == (12,)
    write_model_card(tmp_path / "head", work)
    card = (tmp_path / "head" / "MODEL_CARD.md").read_text()
    assert "6 chat prompts" in card and "depth 2:" in card and "12 most frequent" in card


def test_a_kangaroo_adapter_trains_on_the_same_cached_streams(tiny_lm, work, tmp_path):
    """The cached streams serve a Kangaroo adapter too (its exit layer one of them): it
    trains, loads onto its target, decodes exactly and gets its own card."""
    import specjax
    from specjax.drafters import EarlyExit
    from specjax_models.heads import load_head_for

    settings = dict(train_config=TrainConfig(steps=2, warmup_steps=1, log_every=1,
                                             eval_every=2, checkpoint_every=2),
                    draft_vocab=12, batch_size=2, heldout_rows=2, method="kangaroo")
    metadata = train_chat_head(tiny_lm, tiny_config(), work, tmp_path / "adapter",
                               exit_layer=1, **settings)
    assert metadata["method"] == "kangaroo" and metadata["exit_layer"] == 1
    adapter = load_head_for(tmp_path / "adapter", tiny_lm)
    assert isinstance(adapter, EarlyExit) and adapter.exit_layer == 1
    plain = specjax.generate(tiny_lm, [[3, 4, 5, 6]], max_new_tokens=10,
                             sampling=specjax.GREEDY)
    out = specjax.speculative_generate(tiny_lm, adapter.with_stop_below(None), [[3, 4, 5, 6]],
                                       max_new_tokens=10, num_draft_tokens=3,
                                       sampling=specjax.GREEDY)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    write_model_card(tmp_path / "adapter", work)
    card = (tmp_path / "adapter" / "MODEL_CARD.md").read_text()
    assert card.startswith("# Kangaroo adapter") and "first 1 blocks" in card
    with pytest.raises(ValueError, match="exits at one of them, not 3"):
        train_chat_head(tiny_lm, tiny_config(), work, tmp_path / "other", exit_layer=3,
                        **settings)


def test_a_work_directory_made_with_other_settings_is_refused(tiny_lm, work):
    import dataclasses

    with pytest.raises(ValueError, match="other settings"):
        prepare_chat_data(tiny_lm, ToyChatTokenizer(), work, (0, 1),
                          dataclasses.replace(CONFIG, temperature=1.0))


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="rewrite must be"):
        ChatDataConfig(chat=2, rewrite=3)
    with pytest.raises(ValueError, match="temperature"):
        ChatDataConfig(temperature=0.0)


def test_a_work_directory_grows_by_whole_chunks(tiny_lm, tmp_path):
    """More chat prompts on an existing work directory: the old chunk is reused as it is
    and the new prompts fill new chunks; a partial last chunk refuses growth."""
    import dataclasses

    small = dataclasses.replace(CONFIG, chat=4, rewrite=0)
    prepare_chat_data(tiny_lm, ToyChatTokenizer(), tmp_path, (0, 1), small)
    first = tmp_path / "chunks" / "chat_0000.npz"
    stamp = first.stat().st_mtime_ns
    prepare_chat_data(tiny_lm, ToyChatTokenizer(), tmp_path, (0, 1),
                      dataclasses.replace(small, chat=8))
    assert first.stat().st_mtime_ns == stamp
    assert (tmp_path / "chunks" / "chat_0001.npz").exists()
    assert len(load_chat_data(tmp_path)["tokens"]) == 8
    with pytest.raises(ValueError, match="whole chunks"):
        prepare_chat_data(tiny_lm, ToyChatTokenizer(), tmp_path, (0, 1),
                          dataclasses.replace(small, chat=6))  # fewer: refused
    partial = tmp_path / "partial"
    prepare_chat_data(tiny_lm, ToyChatTokenizer(), partial, (0, 1),
                      dataclasses.replace(small, chat=6))
    with pytest.raises(ValueError, match="whole chunks"):
        prepare_chat_data(tiny_lm, ToyChatTokenizer(), partial, (0, 1),
                          dataclasses.replace(small, chat=8))
