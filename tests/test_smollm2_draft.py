"""A distilled layer draft for a chat model (models/recipes/smollm2_draft.py): training on
the cached answers, saving only what is trained, loading onto the target, exact decoding with it;
run on the tiny target with the toy chat template's work directory."""

import json

import jax
import numpy as np
import pytest
from conftest import build_lm, tiny_config

import specjax
import specjax_models
from specjax.training import TrainConfig
from specjax_models import load_layer_draft
from specjax_models.recipes.smollm2_draft import train_chat_draft, write_draft_card
from specjax_models.recipes.smollm2_head import heldout_split, load_chat_data

TRAIN = TrainConfig(steps=3, warmup_steps=1, log_every=1, eval_every=3, checkpoint_every=3)


@pytest.fixture(scope="module")
def trained(tiny_lm, chat_work, tmp_path_factory):
    out = tmp_path_factory.mktemp("draft")
    metadata = train_chat_draft(tiny_lm, tiny_config(), chat_work, out, layers=(1,),
                                train_config=TRAIN, draft_vocab=12, batch_size=2,
                                heldout_rows=2)
    return out, metadata


def test_training_writes_the_trained_layers_and_the_draft_vocabulary_only(trained):
    out, metadata = trained
    assert metadata["steps_done"] == 3 and metadata["layers"] == [1]
    assert metadata["draft_vocab"] == 12 and 0 < metadata["draft_vocab_coverage"] <= 1
    assert "acceptance@1" in metadata["last_eval"]
    with np.load(out / "draft.npz") as f:
        names = set(f.files)
        assert f["draft_vocab"].shape == (12,)
    assert not any(n.startswith(("embed", "lm_head")) for n in names)
    assert {"final_norm.weight", "layers.0.attention.q_proj.kernel"} <= names
    assert json.loads((out / "draft.json").read_text())["config"]["input_vocab_size"] == 32


def test_the_loaded_draft_decodes_exactly_and_has_the_trained_weights(tiny_lm, trained,
                                                                      chat_work):
    out, _ = trained
    drafter = load_layer_draft(out, tiny_lm, "greedy")
    assert drafter.lm.vocab_size == 12 and drafter.draft_vocab.shape == (12,)
    # The shared groups are the target's (head rows of the draft vocabulary).
    ids = np.asarray(drafter.draft_vocab)
    np.testing.assert_array_equal(np.asarray(drafter.lm.params["lm_head"]["kernel"][...]),
                                  np.asarray(tiny_lm.params["lm_head"]["kernel"][...])[:, ids])
    # Trained: the block differs from target layer 1 it started from.
    assert not np.array_equal(
        np.asarray(drafter.lm.params["layers"][0]["attention"]["q_proj"]["kernel"][...]),
        np.asarray(tiny_lm.params["layers"][1]["attention"]["q_proj"]["kernel"][...]))
    prompts = [[1, 5, 9, 2], [1, 7, 7, 7, 3, 2]]
    plain = specjax.generate(tiny_lm, prompts, max_new_tokens=16, sampling=specjax.GREEDY)
    spec = specjax.speculative_generate(tiny_lm, drafter, prompts, max_new_tokens=16,
                                        num_draft_tokens=3, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    # The held-out rows are the EAGLE-3 head's (same split function and seed).
    rows = len(load_chat_data(chat_work, hidden=False)["tokens"])
    assert len(heldout_split(rows, 2, 2, 0)[0]) == 2


def test_a_target_with_scanned_layers_takes_the_same_draft(tiny_lm, trained, tmp_path):
    """On a scanned copy of the target (`--layers scanned`) the draft's layers are stacked
    from the file's per-layer arrays: the same weights, the same greedy text."""
    out, _ = trained
    specjax_models.save_checkpoint(tiny_lm, tiny_config(), tmp_path)
    scanned = specjax_models.load_checkpoint(tmp_path, scan_layers=True)
    unrolled_draft = load_layer_draft(out, tiny_lm, "greedy")
    scanned_draft = load_layer_draft(out, scanned, "greedy")
    np.testing.assert_array_equal(
        np.asarray(scanned_draft.lm.params["layers"]["attention"]["q_proj"]["kernel"][...])[0],
        np.asarray(unrolled_draft.lm.params["layers"][0]["attention"]["q_proj"]["kernel"][...]))
    prompts = [[1, 5, 9, 2], [1, 7, 7, 7, 3, 2]]
    plain = specjax.generate(tiny_lm, prompts, max_new_tokens=12, sampling=specjax.GREEDY)
    spec = specjax.speculative_generate(scanned, scanned_draft, prompts, max_new_tokens=12,
                                        num_draft_tokens=3, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)


def test_the_card_and_refusals(tiny_lm, trained, chat_work, tmp_path):
    out, _ = trained
    write_draft_card(out, chat_work)
    card = (out / "MODEL_CARD.md").read_text()
    assert "1 decoder layers" in card and "12 most frequent" in card and "6 chat" in card
    assert (out / "data_settings.json").exists()
    other = build_lm(0, d_model=32, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="does not fit this target"):
        load_layer_draft(out, other)
    with pytest.raises(FileNotFoundError, match="no distilled draft"):
        load_layer_draft(tmp_path, tiny_lm)
    with pytest.raises(ValueError, match="layer indices in \\[0, 2\\)"):
        train_chat_draft(tiny_lm, tiny_config(), chat_work, tmp_path, layers=(5,),
                         train_config=TRAIN)
    assert jax.tree.leaves(load_layer_draft(out, tiny_lm))  # sample method loads too
