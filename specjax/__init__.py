"""specjax: batched, sampling-exact, fully jitted speculative decoding in JAX."""

from specjax.causal_lm import CausalLM
from specjax.generate import DecodeState, GenerateOutput, decode_step, generate
from specjax.sampling import (
    GREEDY,
    SamplingConfig,
    probabilities,
    sample_tokens,
    warp_logits,
)

__version__ = "0.1.0"

__all__ = [
    "GREEDY",
    "CausalLM",
    "DecodeState",
    "GenerateOutput",
    "SamplingConfig",
    "decode_step",
    "generate",
    "probabilities",
    "sample_tokens",
    "warp_logits",
]
