"""specjax: batched, sampling-exact, fully jitted speculative decoding in JAX.

The public names load on first use (PEP 562): `import specjax` costs nothing, so the
command line answers `--help` and bad input before jax loads, and a script pays only for
what it touches. `from specjax import speculative_generate` and `specjax.generate(...)`
work as with eager imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specjax.lazy import lazy_attributes

__version__ = "0.1.0"

# Public name -> the module that defines it (a module itself where the name is a module).
_SOURCES = {
    "CausalLM": "specjax.causal_lm",
    "enable_compilation_cache": "specjax.compilation_cache",
    "compiler_options": "specjax.xla_options",
    "DraftModel": "specjax.drafters",
    "PromptLookup": "specjax.drafters",
    "ParallelDraft": "specjax.drafters",
    "ParallelEagle": "specjax.drafters",
    "Lookahead": "specjax.drafters",
    "LayerSkip": "specjax.drafters",
    "EarlyExit": "specjax.drafters",
    "AdaptiveLength": "specjax.drafters",
    "Retrieval": "specjax.drafters",
    "Datastore": "specjax.datastore",
    "DecodeState": "specjax.autoregressive",
    "GenerateOutput": "specjax.autoregressive",
    "decode_step": "specjax.autoregressive",
    "generate": "specjax.autoregressive",
    "GREEDY": "specjax.sampling",
    "SamplingConfig": "specjax.sampling",
    "SamplingParams": "specjax.sampling",
    "probabilities": "specjax.sampling",
    "sample_tokens": "specjax.sampling",
    "sampling_params": "specjax.sampling",
    "warp_logits": "specjax.sampling",
    "SpeculativeConfig": "specjax.step",
    "SpeculativeState": "specjax.step",
    "jitted_step": "specjax.step",
    "speculative_step": "specjax.step",
    "SpeculativeOutput": "specjax.speculative_loop",
    "init_speculative_state": "specjax.speculative_loop",
    "speculative_generate": "specjax.speculative_loop",
    "SpeculativeStats": "specjax.stats",
    "StreamChunk": "specjax.streaming",
    "speculative_stream": "specjax.streaming",
    "DynamicTree": "specjax.trees",
    "TreeBudget": "specjax.trees",
    "TreeShape": "specjax.trees",
    "TypicalAcceptance": "specjax.typical_acceptance",
}
_MODULES = ("analysis", "bench", "datastore", "distributed", "drafters", "layer_search",
            "portability", "sharding", "verification")

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


__getattr__, __dir__ = lazy_attributes(__name__, _SOURCES, globals())


if TYPE_CHECKING:  # what type checkers and IDEs see: the eager imports
    from specjax import (
        analysis,
        bench,
        datastore,
        distributed,
        drafters,
        layer_search,
        portability,
        sharding,
        verification,
    )
    from specjax.autoregressive import DecodeState, GenerateOutput, decode_step, generate
    from specjax.causal_lm import CausalLM
    from specjax.compilation_cache import enable_compilation_cache
    from specjax.datastore import Datastore
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
    )
    from specjax.sampling import (
        GREEDY,
        SamplingConfig,
        SamplingParams,
        probabilities,
        sample_tokens,
        sampling_params,
        warp_logits,
    )
    from specjax.speculative_loop import (
        SpeculativeOutput,
        init_speculative_state,
        speculative_generate,
    )
    from specjax.stats import SpeculativeStats
    from specjax.step import SpeculativeConfig, SpeculativeState, jitted_step, speculative_step
    from specjax.streaming import StreamChunk, speculative_stream
    from specjax.trees import DynamicTree, TreeBudget, TreeShape
    from specjax.typical_acceptance import TypicalAcceptance
    from specjax.xla_options import compiler_options
