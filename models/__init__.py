"""Flax NNX model definitions for specjax (Llama-family decoders)."""

from models.transformer import (
    KVCache,
    Transformer,
    TransformerConfig,
    count_params,
    first_layers,
)

__all__ = ["KVCache", "Transformer", "TransformerConfig", "count_params", "first_layers"]
