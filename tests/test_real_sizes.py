"""specjax_models.real_sizes: the published architectures by name (their parameter counts
are the published checkpoints'), pseudo-random weights drawn where they live (one device,
or each shard on its device), and a size that does not fit refused before anything is
allocated."""

import textwrap

import jax
import numpy as np
import pytest
from conftest import run_script

import specjax
from specjax_models import real_sizes

TINY = dict(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=64, tie_word_embeddings=False, torch_dtype="bfloat16")


@pytest.mark.parametrize("name", real_sizes.real_size_names())
def test_each_architecture_has_its_published_parameter_count(name):
    config = real_sizes.real_size_config(name, "bfloat16")
    assert real_sizes.param_bytes(config) == 2 * real_sizes.PUBLISHED_PARAMS[name]
    assert real_sizes.param_bytes(real_sizes.real_size_config(name, "float32")) == \
        4 * real_sizes.PUBLISHED_PARAMS[name]


def test_names_and_dtypes_are_checked():
    with pytest.raises(ValueError, match="unknown real-size model 'llama-9b'; the names are: "
                                         "llama-3.2-1b, llama-3.2-3b"):
        real_sizes.real_size_config("llama-9b")
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16"):
        real_sizes.real_size_config("qwen2.5-0.5b", "float16")
    config = real_sizes.real_size_config("gemma-2-2b", scan_layers=True, max_seq_len=512)
    assert config.scan_layers and config.max_seq_len == 512 and config.sliding_window == 4096


def test_a_model_that_does_not_fit_is_refused_with_both_sizes(monkeypatch):
    monkeypatch.setattr(real_sizes, "device_memory_bytes", lambda device=None: 10 * 2**30)
    allocated = []
    monkeypatch.setattr(real_sizes, "abstract_params", lambda config, real=real_sizes.
                        abstract_params: allocated.append(1) or real(config))
    with pytest.raises(MemoryError, match=r"llama-3.1-8b in bfloat16 needs 16,060,522,496 "
                                          r"bytes \(15.0 GiB\) per device, and the device has "
                                          r"10,737,418,240 bytes \(10.0 GiB\) free"):
        real_sizes.random_model("llama-3.1-8b", "bfloat16")
    # Over a mesh of 2 devices it would fit.
    config = real_sizes.real_size_config("llama-3.1-8b")
    assert real_sizes.check_fits("llama-3.1-8b", config, devices=2) == 8_030_261_248


def test_the_memory_of_the_device_is_known():
    assert real_sizes.device_memory_bytes() > 2**20


def test_random_weights_are_drawn_on_the_device_with_sane_scales(monkeypatch):
    monkeypatch.setitem(real_sizes.PUBLISHED, "tiny", TINY)
    lm = real_sizes.random_model("tiny", "float32", seed=3)
    assert isinstance(lm, specjax.CausalLM)
    leaves = {jax.tree_util.keystr(p): x for p, x in
              jax.tree_util.tree_flatten_with_path(lm.params)[0]}
    device = jax.devices()[0]
    assert all(x.devices() == {device} for x in leaves.values())
    kernel = np.asarray(next(x for k, x in leaves.items() if "q_proj" in k and "kernel" in k))
    assert abs(kernel.std() - 1 / np.sqrt(32)) < 0.2 / np.sqrt(32) and abs(kernel.mean()) < 0.02
    norm = np.asarray(next(x for k, x in leaves.items() if "norm" in k))
    np.testing.assert_array_equal(norm, 1.0)
    logits = np.asarray(lm.logits(np.array([[1, 2, 3, 4]])))
    assert np.all(np.isfinite(logits)) and logits.std() > 0.1
    again = real_sizes.random_model("tiny", "float32", seed=3)
    np.testing.assert_array_equal(np.asarray(jax.tree.leaves(again.params)[3]),
                                  np.asarray(jax.tree.leaves(lm.params)[3]))
    other = real_sizes.random_model("tiny", "float32", seed=4)
    assert not np.array_equal(np.asarray(jax.tree.leaves(other.params)[3]),
                              np.asarray(jax.tree.leaves(lm.params)[3]))
    bf16 = real_sizes.random_model("tiny", "bfloat16")
    assert {str(x.dtype) for x in jax.tree.leaves(bf16.params)} == {"bfloat16"}


MESH_SCRIPT = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    import numpy as np
    from jax.sharding import NamedSharding
    sys.path.insert(0, {tests!r})
    from test_real_sizes import TINY
    import specjax
    from specjax.runtime.sharding import mesh_from_spec
    from specjax_models import real_sizes
    real_sizes.PUBLISHED["tiny"] = TINY
    mesh = mesh_from_spec("data=2,model=2")
    lm = real_sizes.random_model("tiny", "float32", mesh=mesh)
    one = real_sizes.random_model("tiny", "float32")
    split = 0
    for x, y in zip(jax.tree.leaves(lm.params), jax.tree.leaves(one.params), strict=True):
        assert isinstance(x.sharding, NamedSharding), x.sharding
        shard = x.addressable_shards[0].data.shape
        split += shard != x.shape  # this device holds a part only
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # the same values
    tokens = np.array([[1, 2, 3, 4]])
    np.testing.assert_allclose(np.asarray(lm.logits(tokens)), np.asarray(one.logits(tokens)),
                               rtol=1e-4, atol=1e-4)
    print("SPLIT", split)
""")


@pytest.mark.slow  # a process of its own on 4 virtual devices
def test_on_a_mesh_each_device_draws_its_own_shards():
    out = run_script(MESH_SCRIPT)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split("SPLIT")[1]) >= 8  # the kernels are split over the mesh
