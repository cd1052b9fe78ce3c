"""specjax_models.checkpoint and specjax_models.bundled: orbax round trips and the bundled pair."""

import jax
import numpy as np
import pytest
from conftest import build_lm, tiny_config

import specjax
import specjax_models


def test_save_load_round_trip_gives_identical_params_and_tokens(tmp_path):
    lm = build_lm(8)
    specjax_models.save_checkpoint(lm, tiny_config(), tmp_path / "ckpt", extra={"note": "test"})
    loaded = specjax_models.load_checkpoint(tmp_path / "ckpt")
    for a, b in zip(jax.tree.leaves(lm.params), jax.tree.leaves(loaded.params), strict=True):
        np.testing.assert_array_equal(a, b)
    config = specjax.SamplingConfig(temperature=1.0)
    a = specjax.generate(lm, [[1, 2, 3]], max_new_tokens=12, sampling=config,
                         key=jax.random.key(0))
    b = specjax.generate(loaded, [[1, 2, 3]], max_new_tokens=12, sampling=config,
                         key=jax.random.key(0))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert specjax_models.load_config(tmp_path / "ckpt") == tiny_config()


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a specjax checkpoint"):
        specjax_models.load_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="unknown bundled model"):
        specjax_models.load_bundled("teacher")


@pytest.fixture(scope="session")
def bundled_pair():
    return specjax_models.load_bundled("target"), specjax_models.load_bundled("draft")


def test_bundled_pair_sizes_and_tokenizer(bundled_pair):
    target, draft = bundled_pair
    count = lambda lm: sum(x.size for x in jax.tree.leaves(lm.params))
    assert 3e6 <= count(target) <= 10e6
    assert count(draft) <= count(target) / 10
    assert target.vocab_size == draft.vocab_size == specjax_models.ByteTokenizer.vocab_size


def test_bundled_pair_is_trained_and_agrees(bundled_pair):
    """Greedy speculative decoding of a held-out prompt: the draft is mostly accepted, and
    the output equals plain greedy decoding of the target."""
    target, draft = bundled_pair
    tok = specjax_models.ByteTokenizer()
    prompt = tok.encode(specjax_models.bundled_prompts()[0]["text"])
    plain = specjax.generate(target, [prompt], max_new_tokens=48, sampling=specjax.GREEDY)
    spec = specjax.speculative_generate(target, draft, [prompt], max_new_tokens=48,
                                        num_draft_tokens=4, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    assert spec.stats.acceptance_rate > 0.5
    # Trained: the held-out prompt costs far fewer than the 8 bits per byte of chance.
    logp = jax.nn.log_softmax(target.logits(np.array([prompt]))[0, :-1], axis=-1)
    nll = -np.take_along_axis(np.asarray(logp), np.array(prompt[1:])[:, None], axis=1).mean()
    assert nll / np.log(2) < 2.0


def test_dtypes_are_accepted_as_strings_or_jnp_types_and_first_layers_takes_a_causal_lm():
    import jax.numpy as jnp

    by_name = specjax_models.load_bundled("draft", dtype="bfloat16")
    by_type = specjax_models.load_bundled("draft", dtype=jnp.bfloat16)
    leaves = jax.tree.leaves(by_type.params)
    assert {x.dtype for x in leaves} == {jnp.dtype(jnp.bfloat16)}
    for a, b in zip(jax.tree.leaves(by_name.params), leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    with pytest.raises(ValueError, match="dtype 'int8' is not supported"):
        specjax_models.load_bundled("draft", dtype="int8")
    full = specjax_models.load_bundled("draft")
    shallow = specjax_models.first_layers(full, 1)  # a CausalLM in, a CausalLM out
    assert isinstance(shallow, specjax.CausalLM)
    count = lambda lm: sum(x.size for x in jax.tree.leaves(lm.params))
    assert count(shallow) < count(full)
    assert shallow.apply_fn.graphdef is not None  # a Transformer inside, one layer deep
    for kept, first in zip(jax.tree.leaves(shallow.params["layers"]),  # the first layer
                           jax.tree.leaves(full.params["layers"][0]), strict=True):
        np.testing.assert_array_equal(kept, first)
    out = specjax.speculative_generate(full, shallow, [[65, 66, 67]], max_new_tokens=8,
                                       num_draft_tokens=2, sampling=specjax.GREEDY)
    plain = specjax.generate(full, [[65, 66, 67]], max_new_tokens=8, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
