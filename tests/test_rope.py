"""specjax.lm.rope: inverse frequencies against transformers' own, and the rotation."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from specjax.lm import rope


@pytest.mark.parametrize("scaling", [None, ("linear", 4.0), ("llama3", 8.0, 1.0, 4.0, 64),
                                     ("yarn", 40.0, 64, 32.0, 1.0, 1.0, True),
                                     ("yarn", 4.0, 100, 16.0, 2.0, 1.0, False)])
def test_inverse_frequencies_equal_transformers(scaling):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    spec = {"rope_type": "default", "rope_theta": 500_000.0}
    if scaling is not None and scaling[0] == "linear":
        spec = {**spec, "rope_type": "linear", "factor": scaling[1]}
    elif scaling is not None and scaling[0] == "yarn":
        spec = {**spec, "rope_type": "yarn", "factor": scaling[1],
                "original_max_position_embeddings": scaling[2], "beta_fast": scaling[3],
                "beta_slow": scaling[4], "truncate": scaling[6]}
    elif scaling is not None:
        spec = {**spec, "rope_type": "llama3", "factor": scaling[1],
                "low_freq_factor": scaling[2], "high_freq_factor": scaling[3],
                "original_max_position_embeddings": scaling[4]}
    config = transformers.LlamaConfig(hidden_size=256, num_attention_heads=4,
                                      max_position_embeddings=512, rope_parameters=spec)
    if scaling is None:  # transformers computes the default inline
        expected = 1.0 / 500_000.0 ** (np.arange(0, 64, 2) / 64)
    else:
        expected = ROPE_INIT_FUNCTIONS[spec["rope_type"]](config, "cpu")[0].numpy()
    ours = rope.inverse_frequencies(64, 500_000.0, scaling)
    np.testing.assert_allclose(np.asarray(ours), expected, rtol=1e-6)


def test_rotation_turns_each_pair_by_its_angle():
    """Dimension i and i + H/2 form a complex number rotated by position * inv_freq[i]."""
    x = np.random.default_rng(0).standard_normal((1, 3, 2, 8)).astype(np.float32)
    positions = np.asarray([[0, 5, 11]])
    inv_freq = np.asarray(rope.inverse_frequencies(8, 10_000.0))
    out = np.asarray(rope.apply_rotary(jnp.asarray(x), jnp.asarray(positions),
                                       jnp.asarray(inv_freq)))
    complex_in = x[..., :4] + 1j * x[..., 4:]
    turned = complex_in * np.exp(1j * positions[..., None, None] * inv_freq)
    np.testing.assert_allclose(out, np.concatenate([turned.real, turned.imag], -1),
                               rtol=1e-5, atol=1e-5)


def test_bad_scaling_is_refused():
    for bad in (("yarn", 2.0), ("llama3", 8.0), ("longrope", 2.0), ()):
        with pytest.raises(ValueError, match="rope_scaling must be"):
            rope.check_rope_scaling(bad)


def test_yarn_scales_cos_and_sin_by_its_attention_factor():
    x = np.random.default_rng(1).standard_normal((1, 2, 1, 8)).astype(np.float32)
    positions, inv_freq = jnp.asarray([[3, 9]]), rope.inverse_frequencies(8, 10_000.0)
    plain = np.asarray(rope.apply_rotary(jnp.asarray(x), positions, inv_freq))
    scaled = np.asarray(rope.apply_rotary(jnp.asarray(x), positions, inv_freq, 1.37))
    np.testing.assert_allclose(scaled, 1.37 * plain, rtol=1e-6)
    assert rope.rotary_scale(("yarn", 40.0, 64, 32.0, 1.0, 1.37, True)) == 1.37
    assert rope.rotary_scale(("linear", 4.0)) == 1.0 and rope.rotary_scale(None) == 1.0

