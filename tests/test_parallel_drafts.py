"""specjax_models.parallel_drafts: our parallel drafts and published PARD checkpoints (the
Hugging Face Llama / Qwen2 layouts, the mask token in config.json's `pard_token`, as
AMD-AGI/PARD's pard/pard_train.py writes it and pard/pard_infer.py reads it) load as
`ParallelDraft`s that compute what the saved model computes; anything else is refused
by name."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx

import specjax
import specjax_models
from specjax.drafters import ParallelDraft
from specjax_models.parallel_drafts import (
    load_parallel_draft,
    parallel_settings,
    save_parallel_draft,
)

TOKENS = jnp.asarray([[3, 9, 1, 4, 30, 30]], jnp.int32)


def logits_of(lm):
    cache = lm.init_cache(1, 8)
    out, _, _ = lm.apply(TOKENS, jnp.arange(6)[None], cache, jnp.zeros((1,), jnp.int32))
    return np.asarray(out)


def test_ours_round_trip(tmp_path):
    config = tiny_config()
    lm = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(1)))
    save_parallel_draft(lm, config, tmp_path / "pard", mask_id=30, positions=6)
    assert parallel_settings(tmp_path / "pard") == {"mask_id": 30, "positions": 6,
                                                    "layout": "specjax"}
    drafter = load_parallel_draft(tmp_path / "pard", method="greedy")
    assert isinstance(drafter, ParallelDraft)
    assert (drafter.mask_id, drafter.method) == (30, "greedy")
    np.testing.assert_allclose(logits_of(drafter.lm), logits_of(lm), atol=1e-5)


@pytest.mark.parametrize("qkv_bias,model_type", [(False, "llama"), (True, "qwen2")])
def test_a_published_pard_checkpoint_loads_with_its_mask_token(tmp_path, qkv_bias,
                                                                model_type):
    config = tiny_config(qkv_bias=qkv_bias)
    lm = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(2)))
    directory = specjax_models.save_pretrained(lm, tmp_path / "hf")
    hf_config = json.loads((directory / "config.json").read_text())
    assert hf_config["model_type"] == model_type
    hf_config["pard_token"] = 29  # what PARD's training adds to the draft's config
    (directory / "config.json").write_text(json.dumps(hf_config))
    drafter = load_parallel_draft(directory)
    assert drafter.mask_id == 29 and drafter.method == "sample"
    np.testing.assert_allclose(logits_of(drafter.lm), logits_of(lm), atol=1e-5)
    assert parallel_settings(directory)["positions"] is None


def test_the_mask_may_be_named_in_the_tokenizer(tmp_path):
    config = tiny_config()
    lm = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(4)))
    directory = specjax_models.save_pretrained(lm, tmp_path / "hf")
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"mask_token": {"content": "<|mask|>", "special": True}}))
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_parallel_draft(directory)
    (directory / "tokenizer.json").write_text(json.dumps(
        {"added_tokens": [{"id": 27, "content": "<|end|>"}, {"id": 28, "content": "<|mask|>"}]}))
    assert load_parallel_draft(directory).mask_id == 28
    (directory / "tokenizer.json").write_text(json.dumps({"added_tokens": []}))
    with pytest.raises(ValueError, match="not among tokenizer.json's added tokens"):
        load_parallel_draft(directory)


def test_what_is_not_a_parallel_draft_is_refused_by_name(tmp_path):
    config = tiny_config()
    lm = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(3)))
    plain = specjax_models.save_pretrained(lm, tmp_path / "plain")
    with pytest.raises(ValueError, match="no 'pard_token'"):
        load_parallel_draft(plain)
    hf_config = json.loads((plain / "config.json").read_text())
    hf_config["pard_token"] = 32
    (plain / "config.json").write_text(json.dumps(hf_config))
    with pytest.raises(ValueError, match="outside the draft's vocabulary"):
        load_parallel_draft(plain)
    hf_config["pard_token"] = "mask"
    (plain / "config.json").write_text(json.dumps(hf_config))
    with pytest.raises(ValueError, match="must be an int id"):
        load_parallel_draft(plain)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_parallel_draft(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither parallel.json nor config.json"):
        load_parallel_draft(tmp_path / "empty")
