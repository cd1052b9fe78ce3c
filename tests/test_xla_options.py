"""specjax.runtime.xla_options: `specjax.compiler_options` blocks reach XLA, compile one program per
set of options (the default program untouched), travel to the background compile, and
the chi-square harness compiles its tree decoders with its own options on CPU."""

import jax
import numpy as np
import pytest

import specjax
from specjax.decoding.autoregressive import _decode_loop
from specjax.decoding.speculative_loop import _speculative_loop
from specjax.runtime.xla_options import options_in_force
from specjax.testing import (
    HARNESS_CPU_COMPILER_OPTIONS,
    count_compilations,
    plus_one_lm,
    speculative_joint_pvalue,
    table_lm,
)

GREEDY_RUN = dict(max_new_tokens=3, sampling=specjax.GREEDY)


def successor_lm():
    """A bigram model whose next token is t + 1 (mod 8) with certainty (it compiles in a
    fraction of a transformer's time, and has the cache compaction trees need)."""
    successor = (np.arange(8)[:, None] + 1) % 8 == np.arange(8)[None]
    return table_lm(np.where(successor, 0.0, -np.inf))


def test_an_option_reaches_xla_only_inside_its_block():
    lm = plus_one_lm(16)
    jax.clear_caches()
    with specjax.compiler_options(xla_no_such_option=1), \
            pytest.raises(Exception, match="No such compile option: 'xla_no_such_option'"):
        specjax.generate(lm, [[1, 2]], **GREEDY_RUN)
    out = specjax.generate(lm, [[1, 2]], **GREEDY_RUN)  # outside: the default program
    np.testing.assert_array_equal(out.tokens, [[3, 4, 5]])


def test_each_set_of_options_is_its_own_program_compiled_once():
    lm = plus_one_lm(16)
    jax.clear_caches()
    specjax.generate(lm, [[1, 2]], **GREEDY_RUN)
    with specjax.compiler_options(xla_backend_optimization_level=1):
        with count_compilations() as compiled:
            out = specjax.generate(lm, [[1, 2]], **GREEDY_RUN)
        assert any("_decode_loop" in name for name in compiled), compiled
        with count_compilations() as again:
            specjax.generate(lm, [[1, 2]], **GREEDY_RUN)
        assert again == []
        assert _decode_loop._cache_size() == 1  # the block's program
    np.testing.assert_array_equal(out.tokens, [[3, 4, 5]])
    with count_compilations() as outside:
        specjax.generate(lm, [[1, 2]], **GREEDY_RUN)
    assert outside == []  # the default program, compiled before the block, is kept


def test_nested_blocks_merge_and_close():
    assert options_in_force() == {}
    with specjax.compiler_options(xla_backend_optimization_level=1, xla_cpu_enable_fast_math=False):
        with specjax.compiler_options(xla_backend_optimization_level=2):
            assert options_in_force() == {"xla_backend_optimization_level": 2,
                                          "xla_cpu_enable_fast_math": False}
        assert options_in_force()["xla_backend_optimization_level"] == 1
    assert options_in_force() == {}


def test_the_background_compile_takes_the_blocks_options():
    """speculative_generate compiles its loop in a thread while the prefill runs: under a
    block that thread compiles the block's program, so the loop compiles once."""
    lm = successor_lm()
    jax.clear_caches()
    with specjax.compiler_options(xla_backend_optimization_level=1):
        with count_compilations() as compiled:
            out = specjax.speculative_generate(lm, specjax.DraftModel(lm), [[1, 2, 3]],
                                               num_draft_tokens=2, **GREEDY_RUN)
        assert sum("_speculative_loop" in name for name in compiled) == 1, compiled
        assert _speculative_loop._cache_size() == 1
    assert _speculative_loop._cache_size() == 0  # nothing compiled outside the block
    np.testing.assert_array_equal(out.tokens, [[4, 5, 6]])


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the harness's options are for CPU")
def test_the_harness_compiles_a_trees_decoder_with_its_options():
    """A token tree's many-row decoder compiles with the harness's options; a chain's with
    the process's own."""
    lm = successor_lm()
    tree = specjax.TreeShape.from_paths([[0], [1], [0, 0]])
    jax.clear_caches()
    for shape in (dict(tree=tree, num_draft_tokens=None), dict(num_draft_tokens=2)):
        pvalue, out = speculative_joint_pvalue(lm, specjax.DraftModel(lm), [1, 5, 2],
                                               specjax.SamplingConfig(temperature=1.0),
                                               rows=64, **shape)
        assert pvalue == 1.0  # its one continuation
        np.testing.assert_array_equal(np.asarray(out.tokens)[:, :3], [[3, 4, 5]] * 64)
    assert _speculative_loop._cache_size() == 1  # the chain's
    with specjax.compiler_options(**HARNESS_CPU_COMPILER_OPTIONS):
        assert _speculative_loop._cache_size() == 1  # the tree's
