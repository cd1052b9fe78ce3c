"""A chat model's layer draft adapted into a parallel draft (models/recipes/smollm2_parallel.py):
trained from the autoregressive layer draft on the same cached answers, saved with its mask
token, loaded as a ParallelDraft that decodes exactly with one draft forward per step; run
on the tiny target with the toy chat template's work directory."""

import json

import numpy as np
import pytest
from conftest import tiny_config

import specjax
from specjax.training import ParallelTrainConfig, TrainConfig
from specjax_models import (
    load_layer_draft,
    load_parallel_layer_draft,
    parallel_layer_settings,
)
from specjax_models.recipes.smollm2_draft import train_chat_draft
from specjax_models.recipes.smollm2_head import load_chat_data
from specjax_models.recipes.smollm2_parallel import (
    train_chat_parallel_draft,
    write_parallel_card,
)

TRAIN = TrainConfig(steps=3, warmup_steps=1, log_every=1, eval_every=3, checkpoint_every=3)


@pytest.fixture(scope="module")
def mask_id(chat_work):
    """An id the cached texts never hold."""
    seen = set(np.unique(load_chat_data(chat_work, hidden=False)["tokens"]).tolist())
    return max(set(range(32)) - seen)


@pytest.fixture(scope="module")
def drafts(tiny_lm, chat_work, mask_id, tmp_path_factory):
    autoregressive = tmp_path_factory.mktemp("draft")
    train_chat_draft(tiny_lm, tiny_config(), chat_work, autoregressive, layers=(1,),
                     train_config=TRAIN, draft_vocab=12, batch_size=2, heldout_rows=2)
    parallel = tmp_path_factory.mktemp("parallel")
    metadata = train_chat_parallel_draft(
        tiny_lm, tiny_config(), chat_work, parallel,
        parallel=ParallelTrainConfig(mask_id=mask_id, positions=3, keep_ratio=0.7),
        train_config=TRAIN, start=autoregressive, batch_size=2, heldout_rows=2)
    return autoregressive, parallel, metadata


def test_the_parallel_draft_keeps_the_vocabulary_and_records_its_mask(drafts, mask_id):
    autoregressive, parallel, metadata = drafts
    assert metadata["steps_done"] == 3 and metadata["layers"] == [1]
    assert {"acceptance@1", "acceptance@3", "expected_accepted"} <= set(metadata["last_eval"])
    assert parallel_layer_settings(parallel) == {"mask_id": mask_id, "positions": 3}
    assert parallel_layer_settings(autoregressive) is None
    with np.load(parallel / "draft.npz") as new, np.load(autoregressive / "draft.npz") as old:
        np.testing.assert_array_equal(new["draft_vocab"], old["draft_vocab"])
        assert set(new.files) == set(old.files)
        # Adapted: the block moved from the autoregressive draft's.
        name = "layers.0.attention.q_proj.kernel"
        assert not np.array_equal(new[name], old[name])


def test_the_loaded_parallel_draft_decodes_exactly_in_one_forward_per_step(tiny_lm, drafts,
                                                                            mask_id):
    _, parallel, _ = drafts
    drafter = load_parallel_layer_draft(parallel, tiny_lm, "greedy")
    assert isinstance(drafter, specjax.ParallelDraft) and drafter.mask_id == mask_id
    assert drafter.draft_vocab.shape == (12,)
    prompts = [[1, 5, 9, 2], [1, 7, 7, 7, 3, 2]]
    plain = specjax.generate(tiny_lm, prompts, max_new_tokens=16, sampling=specjax.GREEDY)
    spec = specjax.speculative_generate(tiny_lm, drafter, prompts, max_new_tokens=16,
                                        num_draft_tokens=3, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.stats.draft_forwards, spec.stats.target_forwards)
    # It is a layer draft too: the autoregressive loader reads it.
    assert load_layer_draft(parallel, tiny_lm).draft_vocab.shape == (12,)


def test_the_card_and_refusals(tiny_lm, drafts, chat_work, mask_id, tmp_path):
    autoregressive, parallel, _ = drafts
    write_parallel_card(parallel, chat_work)
    card = (parallel / "MODEL_CARD.md").read_text()
    assert f"Mask token: id {mask_id}" in card and "| 3 |" in card
    with pytest.raises(ValueError, match="autoregressive layer draft"):
        load_parallel_layer_draft(autoregressive, tiny_lm)
    with pytest.raises(ValueError, match="parallel draft already"):
        train_chat_parallel_draft(tiny_lm, tiny_config(), chat_work, tmp_path,
                                  parallel=ParallelTrainConfig(mask_id=mask_id),
                                  train_config=TRAIN, start=parallel)
    seen = int(load_chat_data(chat_work, hidden=False)["tokens"][0, 0])
    with pytest.raises(ValueError, match="occurs in the cached texts"):
        train_chat_parallel_draft(tiny_lm, tiny_config(), chat_work, tmp_path,
                                  parallel=ParallelTrainConfig(mask_id=seen),
                                  train_config=TRAIN, start=autoregressive, batch_size=2,
                                  heldout_rows=2)
    meta = json.loads((parallel / "draft.json").read_text())
    meta["parallel"]["mask_id"] = 99
    (tmp_path / "draft.json").write_text(json.dumps(meta))
    (tmp_path / "draft.npz").write_bytes((parallel / "draft.npz").read_bytes())
    with pytest.raises(ValueError, match="mask id 99"):
        load_parallel_layer_draft(tmp_path, tiny_lm)
