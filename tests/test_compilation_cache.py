"""Compiled programs are reused: in memory for new sampling settings, max_new_tokens and
EOS ids (settings are data), and on disk across processes (the persistent cache)."""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import specjax
from specjax import DraftModel, SamplingConfig
from specjax.runtime.compilation_cache import (
    cache_turned_off_by_env,
    default_cache_dir,
    enable_compilation_cache,
)
from specjax.testing import count_compilations
from specjax.trees.shapes import DynamicTree, TreeShape

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8], [9]]
FIRST = SamplingConfig(temperature=0.8)
# Every change a notebook user makes between two runs of the same shapes.
CHANGES = [
    dict(sampling=SamplingConfig(temperature=0.7)),
    dict(sampling=SamplingConfig(temperature=0.7, top_k=5)),
    dict(sampling=SamplingConfig(temperature=1.3, top_p=0.9)),
    dict(sampling=SamplingConfig(temperature=0.5, top_k=3, top_p=0.8), max_new_tokens=5),
    dict(sampling=[SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.9, top_k=4),
                   SamplingConfig(top_p=0.5)], eos_id=[3, 7]),
    dict(eos_id=11, max_new_tokens=12),
]


def _call(decode, change):
    kwargs = dict(max_new_tokens=8, sampling=FIRST, key=jax.random.key(1))
    kwargs.update(change)
    return decode(**kwargs)


@pytest.mark.parametrize("decoder", ["generate", "chain", "static tree", "dynamic tree",
                                     "stream"])
def test_new_settings_compile_nothing(tiny_lm, close_draft, decoder):
    draft = DraftModel(close_draft, "sample")
    tree = {"static tree": TreeShape.from_paths([[0], [1], [0, 0]]),
            "dynamic tree": DynamicTree(num_nodes=4, max_depth=2, top_k=2)}.get(decoder)
    if decoder == "generate":
        decode = lambda **kw: specjax.generate(tiny_lm, PROMPTS, **kw).tokens
    elif decoder == "stream":
        decode = lambda **kw: [chunk.block for chunk in specjax.speculative_stream(
            tiny_lm, draft, PROMPTS, num_draft_tokens=2, **kw)]
    else:
        decode = lambda **kw: specjax.speculative_generate(
            tiny_lm, draft, PROMPTS, num_draft_tokens=None if tree else 2, tree=tree,
            **kw).tokens
    _call(decode, {})  # compiles the decoder once
    for change in CHANGES:
        with count_compilations() as compiled:
            out = _call(decode, change)
        assert compiled == [], (change, compiled)
        assert out is not None


def test_jitted_step_reuses_its_program_for_new_settings(tiny_lm, close_draft):
    state, drafter = specjax.init_speculative_state(
        tiny_lm, DraftModel(close_draft), PROMPTS, max_new_tokens=8, num_draft_tokens=2,
        sampling=FIRST, key=jax.random.key(0))
    state = specjax.jitted_step(tiny_lm, drafter, state,
                                specjax.SpeculativeConfig(num_draft_tokens=2, sampling=FIRST))
    for sampling in (SamplingConfig(temperature=0.6, top_k=7), SamplingConfig(top_p=0.7),
                     (SamplingConfig(temperature=0.0), FIRST, SamplingConfig(top_k=2))):
        config = specjax.SpeculativeConfig(num_draft_tokens=2, sampling=sampling)
        with count_compilations() as compiled:
            state = specjax.jitted_step(tiny_lm, drafter, state, config)
        assert compiled == [], (sampling, compiled)
    # Every row greedy is the one setting that compiles (the argmax fast path), once.
    greedy = specjax.SpeculativeConfig(num_draft_tokens=2, sampling=specjax.GREEDY)
    with count_compilations() as compiled:
        state = specjax.jitted_step(tiny_lm, drafter, state, greedy)
    assert len(compiled) >= 1
    with count_compilations() as compiled:
        specjax.jitted_step(tiny_lm, drafter, state, greedy)
    assert compiled == []


def test_count_compilations_sees_a_new_shape(tiny_lm):
    specjax.generate(tiny_lm, PROMPTS, max_new_tokens=4, sampling=specjax.GREEDY)
    with count_compilations() as compiled:
        specjax.generate(tiny_lm, PROMPTS + [[1]], max_new_tokens=4, sampling=specjax.GREEDY)
    assert len(compiled) >= 1  # a new batch size is a new program


def test_per_row_sampling_must_match_the_batch(tiny_lm):
    with pytest.raises(ValueError, match="lists 2 settings but the batch has 3 rows"):
        specjax.generate(tiny_lm, PROMPTS, max_new_tokens=4,
                         sampling=[FIRST, FIRST], key=jax.random.key(0))
    with pytest.raises(TypeError, match=r"sampling\[1\] must be a specjax.SamplingConfig"):
        specjax.generate(tiny_lm, PROMPTS, max_new_tokens=4,
                         sampling=[FIRST, 0.7, FIRST], key=jax.random.key(0))
    with pytest.raises(ValueError, match="needs a PRNG key"):
        specjax.generate(tiny_lm, PROMPTS, max_new_tokens=4,
                         sampling=[specjax.GREEDY, FIRST, specjax.GREEDY])
    with pytest.raises(ValueError, match="top_k=40 exceeds the vocabulary size 32"):
        specjax.generate(tiny_lm, PROMPTS, max_new_tokens=4, key=jax.random.key(0),
                         sampling=[FIRST, SamplingConfig(top_k=40), FIRST])


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECJAX_COMPILATION_CACHE", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine" and not cache_turned_off_by_env()
    monkeypatch.setenv("SPECJAX_COMPILATION_CACHE", "off")
    assert cache_turned_off_by_env()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "specjax" / "jax"


def test_enable_refuses_a_file_and_a_bad_threshold(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file"):
        enable_compilation_cache(tmp_path / "file")
    with pytest.raises(ValueError, match="min_compile_secs must be a number >= 0"):
        enable_compilation_cache(tmp_path, min_compile_secs=-1)


# A new process: decode with a small model, print the cache events it saw.
_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax
    from flax import nnx
    import specjax, specjax_models
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    # Every program stored: with the default threshold, one that compiled in under 0.2 s
    # on a busy machine was not written, and the second process missed it.
    folder = specjax.enable_compilation_cache(sys.argv[1], min_compile_secs=0)
    config = specjax_models.TransformerConfig(vocab_size=32, num_layers=2, d_model=64,
                                              num_heads=4, num_kv_heads=2, d_ff=128,
                                              max_seq_len=128)
    lm = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(0)))
    out = specjax.speculative_generate(lm, specjax.PromptLookup(), [[1, 2, 1, 2]],
                                       max_new_tokens=6, num_draft_tokens=2,
                                       sampling=specjax.SamplingConfig(temperature=0.7),
                                       key=jax.random.key(0))
    print(json.dumps({"folder": str(folder), "tokens": out.tokens.tolist(),
                      "hits": events.count("/jax/compilation_cache/cache_hits"),
                      "misses": events.count("/jax/compilation_cache/cache_misses")}))
""")


@pytest.mark.slow
def test_a_second_process_loads_the_compiled_decoder_from_disk(tmp_path):
    import json

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    runs = [subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path / "cache")],
                           capture_output=True, text=True, timeout=300, env=env)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (json.loads(run.stdout.strip().splitlines()[-1]) for run in runs)
    assert first["misses"] >= 1 and first["hits"] == 0
    assert second["hits"] >= 1 and second["misses"] == 0
    assert second["tokens"] == first["tokens"]
    assert any(os.scandir(tmp_path / "cache"))
    mode = os.stat(tmp_path / "cache").st_mode & 0o777
    assert mode == 0o700 or np.bitwise_and(mode, 0o077) == 0


def test_a_cache_set_up_before_jax_loads_receives_its_programs(tmp_path):
    """The command line's path: the cache is chosen before jax is imported (so a refused
    command never loads jax), and the programs compiled later land in it."""
    script = textwrap.dedent(f"""
        import sys
        from specjax.runtime.compilation_cache import cache_for_next_jax_import
        folder = cache_for_next_jax_import({str(tmp_path / "early")!r}, min_compile_secs=0)
        assert "jax" not in sys.modules
        import jax, jax.numpy as jnp
        jax.jit(lambda x: jnp.sin(x) * 3)(jnp.ones(5)).block_until_ready()
        print(sum(1 for _ in folder.iterdir()))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= 1
