"""specjax: batched, sampling-exact, fully jitted speculative decoding in JAX.

The public names load on first use (PEP 562): `import specjax` costs nothing, so the
command line answers `--help` and bad input before jax loads, and a script pays only for
what it touches. `from specjax import speculative_generate` and `specjax.generate(...)`
work as with eager imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specjax.runtime.lazy import lazy_attributes

__version__ = "0.1.0"

# Public name -> the module that defines it.
_SOURCES = {
    "CausalLM": "specjax.lm.causal_lm",
    "enable_compilation_cache": "specjax.runtime.compilation_cache",
    "compiler_options": "specjax.runtime.xla_options",
    "DraftModel": "specjax.drafters",
    "PromptLookup": "specjax.drafters",
    "ParallelDraft": "specjax.drafters",
    "ParallelEagle": "specjax.drafters",
    "Lookahead": "specjax.drafters",
    "LayerSkip": "specjax.drafters",
    "EarlyExit": "specjax.drafters",
    "AdaptiveLength": "specjax.drafters",
    "Retrieval": "specjax.drafters",
    "Datastore": "specjax.drafters.datastore",
    "DecodeState": "specjax.decoding.autoregressive",
    "GenerateOutput": "specjax.decoding.autoregressive",
    "decode_step": "specjax.decoding.autoregressive",
    "generate": "specjax.decoding.autoregressive",
    "GREEDY": "specjax.decoding.sampling",
    "SamplingConfig": "specjax.decoding.sampling",
    "SamplingParams": "specjax.decoding.sampling",
    "probabilities": "specjax.decoding.sampling",
    "sample_tokens": "specjax.decoding.sampling",
    "sampling_params": "specjax.decoding.sampling",
    "warp_logits": "specjax.decoding.sampling",
    "SpeculativeConfig": "specjax.decoding.step",
    "SpeculativeState": "specjax.decoding.step",
    "jitted_step": "specjax.decoding.step",
    "speculative_step": "specjax.decoding.step",
    "SpeculativeOutput": "specjax.decoding.speculative_loop",
    "init_speculative_state": "specjax.decoding.speculative_loop",
    "speculative_generate": "specjax.decoding.speculative_loop",
    "SpeculativeStats": "specjax.decoding.stats",
    "StreamChunk": "specjax.decoding.streaming",
    "speculative_stream": "specjax.decoding.streaming",
    "DynamicTree": "specjax.trees",
    "TreeBudget": "specjax.trees",
    "TreeShape": "specjax.trees",
    "TypicalAcceptance": "specjax.verification.typical_acceptance",
}
# Public modules -> where they live (the package by concern: specjax/<concern>/).
_MODULES = {
    "analysis": "specjax.bench.analysis",
    "bench": "specjax.bench",
    "datastore": "specjax.drafters.datastore",
    "distributed": "specjax.runtime.distributed",
    "drafters": "specjax.drafters",
    "layer_search": "specjax.drafters.layer_search",
    "portability": "specjax.runtime.portability",
    "sharding": "specjax.runtime.sharding",
    "verification": "specjax.verification",
}

__all__ = [
    "GREEDY",
    "AdaptiveLength",
    "CausalLM",
    "Datastore",
    "DecodeState",
    "DraftModel",
    "DynamicTree",
    "EarlyExit",
    "GenerateOutput",
    "LayerSkip",
    "Lookahead",
    "ParallelDraft",
    "ParallelEagle",
    "PromptLookup",
    "Retrieval",
    "SamplingConfig",
    "SamplingParams",
    "SpeculativeConfig",
    "SpeculativeOutput",
    "SpeculativeState",
    "SpeculativeStats",
    "StreamChunk",
    "TreeBudget",
    "TreeShape",
    "TypicalAcceptance",
    "analysis",
    "bench",
    "compiler_options",
    "datastore",
    "decode_step",
    "distributed",
    "drafters",
    "enable_compilation_cache",
    "generate",
    "init_speculative_state",
    "layer_search",
    "jitted_step",
    "portability",
    "probabilities",
    "sample_tokens",
    "sampling_params",
    "sharding",
    "speculative_generate",
    "speculative_step",
    "speculative_stream",
    "verification",
    "warp_logits",
]


__getattr__, __dir__ = lazy_attributes(__name__, _SOURCES, globals(), _MODULES)


if TYPE_CHECKING:  # what type checkers and IDEs see: the eager imports
    from specjax import bench, drafters, verification
    from specjax.bench import analysis
    from specjax.decoding.autoregressive import DecodeState, GenerateOutput, decode_step, generate
    from specjax.decoding.sampling import (
        GREEDY,
        SamplingConfig,
        SamplingParams,
        probabilities,
        sample_tokens,
        sampling_params,
        warp_logits,
    )
    from specjax.decoding.speculative_loop import (
        SpeculativeOutput,
        init_speculative_state,
        speculative_generate,
    )
    from specjax.decoding.stats import SpeculativeStats
    from specjax.decoding.step import (
        SpeculativeConfig,
        SpeculativeState,
        jitted_step,
        speculative_step,
    )
    from specjax.decoding.streaming import StreamChunk, speculative_stream
    from specjax.drafters import (
        AdaptiveLength,
        DraftModel,
        EarlyExit,
        LayerSkip,
        Lookahead,
        ParallelDraft,
        ParallelEagle,
        PromptLookup,
        Retrieval,
        datastore,
        layer_search,
    )
    from specjax.drafters.datastore import Datastore
    from specjax.lm.causal_lm import CausalLM
    from specjax.runtime import distributed, portability, sharding
    from specjax.runtime.compilation_cache import enable_compilation_cache
    from specjax.runtime.xla_options import compiler_options
    from specjax.trees.shapes import DynamicTree, TreeBudget, TreeShape
    from specjax.verification.typical_acceptance import TypicalAcceptance
