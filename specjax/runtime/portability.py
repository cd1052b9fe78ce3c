"""Every decoder lowers for the chips our users run, checked from any machine.

A Colab user on a TPU or a GPU must never meet an operation their chip cannot run.
`jax.export` lowers a jitted program for named platforms without those devices: the
StableHLO it produces is what XLA on a TPU or CUDA would compile, so a primitive without
a lowering for the platform fails here, on a CPU, in CI.

`lower_generate(lm, prompts, ...)` lowers plain decoding's programs (the prefill and the
decode loop) and `lower_speculative(target, drafter, prompts, ...)` a speculative
decoder's (the prefill with the drafter's init, and the loop of `speculative_generate`
with its step), with the same arguments as the decoders: nothing is run, only traced and
lowered (on a mesh, for its shardings). Each returns `{(program, platform): bytes of
StableHLO}`; a program that cannot lower raises `LoweringError`, naming the program, the
platform and JAX's reason.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from specjax.decoding.sampling import SamplingConfig, sampling_params
from specjax.lm.causal_lm import CausalLM

PLATFORMS = ("tpu", "cuda")


class LoweringError(ValueError):
    """A decoder program that does not lower for a platform."""


def _export(name: str, jitted, args: tuple, kwargs: dict, platforms: Sequence[str]) -> dict:
    """One trace lowered for every platform at once (a multi-platform module); when that
    fails, each platform alone, to name the one that cannot take the program."""
    try:
        exported = jax.export.export(jitted, platforms=tuple(platforms))(*args, **kwargs)
        return {(name, platform): len(exported.mlir_module_serialized)
                for platform in platforms}
    except Exception:  # JAX raises many types for an op it cannot lower
        pass
    sizes = {}
    for platform in platforms:
        try:
            exported = jax.export.export(jitted, platforms=(platform,))(*args, **kwargs)
        except Exception as error:
            reason = str(error).strip().split("\n")[0][:400]
            raise LoweringError(f"the {name} program does not lower for {platform}: "
                                f"{type(error).__name__}: {reason}") from error
        sizes[(name, platform)] = len(exported.mlir_module_serialized)
    return sizes


def lower_generate(lm: CausalLM, prompts, *, max_new_tokens: int,
                   sampling: SamplingConfig | Sequence[SamplingConfig] = SamplingConfig(),
                   eos_id=None, cache_size: int | None = None,
                   platforms: Sequence[str] = PLATFORMS) -> dict:
    """Lower `specjax.generate`'s programs for `platforms` (its arguments; a key is made
    up when sampling needs one)."""
    from specjax.decoding.autoregressive import _decode_loop, _init_state
    from specjax.decoding.inputs import prepare_batch, running_rows, settings_for_padded_rows

    sampling = settings_for_padded_rows(lm, prompts, sampling)
    batch, capacity, eos_ids = prepare_batch(lm, prompts, None, max_new_tokens, sampling,
                                             eos_id, cache_size=cache_size)
    init_args = (lm, jnp.asarray(batch.tokens), jnp.asarray(batch.lengths),
                 jax.random.key(0), jnp.int32(0), running_rows(batch))
    sizes = _export("prefill", _init_state.current(), init_args, {"capacity": capacity},
                    platforms)
    state = _init_state.eval_shape(*init_args, capacity=capacity)
    loop_args = (lm, _placed_like(state, init_args), jnp.int32(max_new_tokens),
                 jnp.asarray(eos_ids), sampling_params(sampling, batch.tokens.shape[0]))
    sizes.update(_export("decode loop", _decode_loop.current(), loop_args, {}, platforms))
    return sizes


def lower_speculative(target: CausalLM, draft, prompts, *, max_new_tokens: int,
                      num_draft_tokens: int | None = None,
                      sampling: SamplingConfig | Sequence[SamplingConfig] = SamplingConfig(),
                      eos_id=None, cache_size: int | None = None, tree=None,
                      verification=None, platforms: Sequence[str] = PLATFORMS) -> dict:
    """Lower `specjax.speculative_generate`'s programs for `platforms` (its arguments):
    the prefill (target and drafter) and the loop of speculative steps."""
    from specjax.decoding.speculative_loop import _init_state, _speculative_loop, prefill_inputs
    from specjax.decoding.step import compile_key
    from specjax.drafters.base import drafter_key

    config, drafter, prefill_args, prefill_static, batch = prefill_inputs(
        target, draft, prompts, max_new_tokens=max_new_tokens,
        num_draft_tokens=num_draft_tokens, sampling=sampling, key=jax.random.key(0),
        eos_id=eos_id, prompt_lengths=None, cache_size=cache_size, tree=tree,
        verification=verification)
    sizes = _export("prefill", _init_state.current(), prefill_args, prefill_static, platforms)
    state = _placed_like(_init_state.eval_shape(*prefill_args, **prefill_static),
                         prefill_args)
    params = sampling_params(config.sampling, len(batch.lengths))
    sizes.update(_export("speculative loop", _speculative_loop.current(),
                         (target, drafter, state, compile_key(config, params), params),
                         {"drafter_type": drafter_key(drafter)}, platforms))
    return sizes


def _placed_like(shapes, inputs):
    """Output shapes with the placement the program gives them: its device's on one
    device; on a mesh, where the compiler would choose the layouts, unplaced (the loop is
    then lowered for the layouts its own sharding constraints give the state)."""
    from specjax.runtime.background_compile import placed_as_outputs

    placed = placed_as_outputs(shapes, inputs)
    return shapes if placed is None else placed
