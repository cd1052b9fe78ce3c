"""specjax.portability: every decoder (plain, each drafter of the exactness registry in
chains and trees, greedy and sampled, on one device and on a mesh) lowers for TPU and
for CUDA from this CPU machine, and a program that cannot is named with its platform."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_script

from specjax import GREEDY, DraftModel, DynamicTree, SamplingConfig
from specjax.runtime.portability import (
    PLATFORMS,
    LoweringError,
    _export,
    lower_generate,
    lower_speculative,
)

PROMPTS = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3]]
SAMPLED = SamplingConfig(temperature=0.8, top_k=5, top_p=0.9)


def _every_platform(sizes: dict, programs: set) -> None:
    assert set(sizes) == {(p, platform) for p in programs for platform in PLATFORMS}
    assert all(size > 1000 for size in sizes.values())


def test_plain_and_speculative_decoders_lower_for_tpu_and_cuda(tiny_lm, close_draft):
    for sampling in (GREEDY, SAMPLED):
        _every_platform(lower_generate(tiny_lm, PROMPTS, max_new_tokens=8, sampling=sampling),
                        {"prefill", "decode loop"})
    _every_platform(lower_speculative(tiny_lm, DraftModel(close_draft), PROMPTS,
                                      max_new_tokens=8, num_draft_tokens=3, sampling=SAMPLED),
                    {"prefill", "speculative loop"})
    _every_platform(lower_speculative(tiny_lm, DraftModel(close_draft), PROMPTS,
                                      max_new_tokens=8, sampling=GREEDY,
                                      tree=DynamicTree(num_nodes=6, max_depth=3, top_k=2)),
                    {"prefill", "speculative loop"})


def test_a_program_that_does_not_lower_is_named_with_its_platform():
    def host_bound(x):  # a host callback: no export on any platform
        return jax.pure_callback(lambda a: np.asarray(a) + 1,
                                 jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    with pytest.raises(LoweringError, match="the step program does not lower for tpu: "):
        _export("step", jax.jit(host_bound), (jnp.zeros(3),), {}, PLATFORMS)


@pytest.mark.slow  # every registry entry, greedy and sampled: about a minute
def test_every_registry_decoder_lowers_for_tpu_and_cuda(tiny_lm, close_draft):
    from test_exactness import ENTRIES

    for name, entry in sorted(ENTRIES.items()):
        for sampling in (GREEDY, SAMPLED):
            drafter = entry.make(close_draft, tiny_lm)
            try:
                sizes = lower_speculative(tiny_lm, drafter, PROMPTS, max_new_tokens=8,
                                          num_draft_tokens=entry.num_draft_tokens,
                                          sampling=sampling, tree=entry.tree,
                                          verification=entry.verification)
            except LoweringError as error:
                raise AssertionError(f"{name}: {error}") from None
            _every_platform(sizes, {"prefill", "speculative loop"})


MESH_SCRIPT = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_num_cpu_devices", 2)
    sys.path.insert(0, {tests!r})
    from conftest import build_lm
    import specjax, specjax_models
    from specjax import DraftModel, DynamicTree, SamplingConfig
    from specjax.runtime.portability import lower_generate, lower_speculative
    from specjax.runtime.sharding import mesh_from_spec
    sampling = SamplingConfig(temperature=0.8, top_k=5)
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9]]
    for spec in ("data=2", "model=2"):
        mesh = mesh_from_spec(spec)
        target = specjax_models.shard(build_lm(0), mesh, specjax.sharding.default_rules(mesh))
        draft = DraftModel(build_lm(1))
        sizes = lower_generate(target, prompts, max_new_tokens=6, sampling=sampling)
        sizes.update(lower_speculative(target, draft, prompts, max_new_tokens=6,
                                       num_draft_tokens=3, sampling=sampling))
        sizes.update(lower_speculative(target, draft, prompts, max_new_tokens=6,
                                       tree=DynamicTree(num_nodes=6, max_depth=3, top_k=2)))
        print(spec, sorted(sizes))
""")


@pytest.mark.slow  # a process of its own on 2 virtual devices
def test_decoders_on_a_mesh_lower_for_tpu_and_cuda():
    out = run_script(MESH_SCRIPT)
    assert out.returncode == 0, out.stderr
    for spec in ("data=2", "model=2"):
        line = next(x for x in out.stdout.splitlines() if x.startswith(spec))
        for program in ("prefill", "decode loop", "speculative loop"):
            for platform in ("tpu", "cuda"):
                assert f"('{program}', '{platform}')" in line, line


def _weight_shapes(lm) -> set[str]:
    """The shapes of the model's kernels and embeddings, as StableHLO writes them."""
    return {"x".join(map(str, x.shape)) for x in jax.tree.leaves(lm.params) if x.ndim >= 2}


def test_the_step_a_chip_runs_converts_no_weight(tiny_lm):
    """bfloat16 weights enter the accelerator's matmuls as they are: the speculative loop
    lowered for TPU and CUDA holds no conversion of a weight-sized buffer (on CPU, XLA's
    own backend upcasts bfloat16 dots: docs/benchmarks.md, "Roofline")."""
    import re

    from conftest import build_lm

    from specjax.decoding.sampling import sampling_params
    from specjax.decoding.speculative_loop import _speculative_loop, init_speculative_state
    from specjax.decoding.step import SpeculativeConfig, compile_key
    from specjax.drafters.base import drafter_key

    lm = build_lm(0, d_model=96, d_ff=160, vocab_size=48, dtype="bfloat16",
                  param_dtype="bfloat16")
    weights = _weight_shapes(lm)
    state, drafter = init_speculative_state(lm, DraftModel(lm), [[1, 2, 3, 1, 2]],
                                            max_new_tokens=8, num_draft_tokens=3,
                                            sampling=SAMPLED, key=jax.random.key(0))
    config = SpeculativeConfig(num_draft_tokens=3, sampling=SAMPLED)
    params = sampling_params(SAMPLED, 1)
    exported = jax.export.export(_speculative_loop.current(), platforms=PLATFORMS)(
        lm, drafter, state, compile_key(config, params), params,
        drafter_type=drafter_key(drafter))
    converted = re.findall(r"stablehlo\.convert.*: \(tensor<([\dx]+)xbf16>\) -> tensor<",
                           exported.mlir_module())
    assert converted, "the check must see the program's conversions (activations)"
    assert [shape for shape in converted if shape in weights] == []
