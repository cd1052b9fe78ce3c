"""specjax_models.published_layouts: the synthetic checkpoints carry the published names."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import specjax_models
from specjax_models.published_layouts import SyntheticShape, write_synthetic_drafter
from tests.conftest import build_lm

SHAPE = SyntheticShape(d_model=64, vocab_size=32, num_layers=8, draft_vocab_size=20)


def names(directory) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), framework="numpy") as handle:
        return set(handle.keys())


def test_each_layout_has_its_authors_names(tmp_path):
    eagle3 = names(write_synthetic_drafter(tmp_path / "a", "eagle3", SHAPE))
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
            "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight", "d2t",
            "t2d"} <= eagle3
    speculators = write_synthetic_drafter(tmp_path / "s", "eagle3-speculators", SHAPE)
    assert {n.replace("midlayer.", "layers.0.") for n in eagle3} <= names(speculators)
    config = json.loads((speculators / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    eagle1 = names(write_synthetic_drafter(tmp_path / "e", "eagle1", SHAPE))
    assert "fc.bias" in eagle1 and "layers.0.input_layernorm.weight" not in eagle1
    medusa = names(write_synthetic_drafter(tmp_path / "m", "medusa1",
                                           SyntheticShape(d_model=64, vocab_size=32,
                                                          num_layers=2, medusa_heads=2,
                                                          medusa_layers=2)))
    assert medusa == {f"medusa_head.{i}.{j}.linear.{p}" for i in range(2) for j in range(2)
                      for p in ("weight", "bias")} | {"medusa_head.0.2.weight",
                                                      "medusa_head.1.2.weight"}
    mimo = write_synthetic_drafter(tmp_path / "mimo", "mimo-mtp", SHAPE)
    assert {"model.mtp_layers.0.input_proj.weight", "model.mtp_layers.0.token_layernorm.weight",
            "model.mtp_layers.0.self_attn.q_proj.bias"} <= names(mimo)
    assert json.loads((mimo / "config.json").read_text())["model_type"] == "mimo"
    with pytest.raises(ValueError, match="layout must be"):
        write_synthetic_drafter(tmp_path / "x", "hydra", SHAPE)


def test_a_bfloat16_checkpoint_loads_as_float32_or_kept_in_bfloat16(tmp_path):
    import jax
    import jax.numpy as jnp

    directory = write_synthetic_drafter(tmp_path, "eagle3", SHAPE, dtype=ml_dtypes.bfloat16)
    target = build_lm(2, num_layers=8)
    wide = specjax_models.load_drafter(directory, target)
    assert all(np.asarray(p).dtype == np.float32 for p in wide.params.values())
    assert wide.draft_vocab.shape == (20,)
    narrow = specjax_models.load_drafter(directory, target, dtype="bfloat16")
    assert {str(p.dtype) for p in narrow.params.values()} == {"bfloat16"}
    features = jax.random.normal(jax.random.key(0), (1, 5, 4, 64))
    tokens, lengths = jnp.asarray([[1, 2, 3, 4, 5]]), jnp.asarray([5])
    roots = [d._logits(d.init(tokens, lengths, 16, features=features).root_hidden)
             for d in (wide, narrow)]
    # The checkpoint holds bfloat16 values: both load them exactly, and compute in float32.
    np.testing.assert_allclose(np.asarray(roots[0]), np.asarray(roots[1]), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(ValueError, match="dtype must be"):
        specjax_models.load_drafter(directory, target, dtype="float16")
