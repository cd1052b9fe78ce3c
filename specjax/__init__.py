"""specjax: batched, sampling-exact, fully jitted speculative decoding in JAX."""

from specjax import analysis, drafters
from specjax.causal_lm import CausalLM
from specjax.compilation_cache import enable_compilation_cache
from specjax.drafters import DraftModel, PromptLookup
from specjax.generate import DecodeState, GenerateOutput, decode_step, generate
from specjax.sampling import (
    GREEDY,
    SamplingConfig,
    SamplingParams,
    probabilities,
    sample_tokens,
    sampling_params,
    warp_logits,
)
from specjax.speculative import (
    SpeculativeConfig,
    SpeculativeState,
    jitted_step,
    speculative_step,
)
from specjax.speculative_decoding import (
    SpeculativeOutput,
    init_speculative_state,
    speculative_generate,
)
from specjax.stats import SpeculativeStats
from specjax.streaming import StreamChunk, speculative_stream
from specjax.trees import DynamicTree, TreeShape

__version__ = "0.1.0"

__all__ = [
    "GREEDY",
    "CausalLM",
    "DecodeState",
    "DraftModel",
    "DynamicTree",
    "GenerateOutput",
    "PromptLookup",
    "SamplingConfig",
    "SamplingParams",
    "SpeculativeConfig",
    "SpeculativeOutput",
    "SpeculativeState",
    "SpeculativeStats",
    "StreamChunk",
    "TreeShape",
    "analysis",
    "decode_step",
    "drafters",
    "enable_compilation_cache",
    "generate",
    "init_speculative_state",
    "jitted_step",
    "probabilities",
    "sample_tokens",
    "sampling_params",
    "speculative_generate",
    "speculative_step",
    "speculative_stream",
    "warp_logits",
]
