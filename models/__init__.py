"""Flax NNX model definitions for specjax: Llama-family decoders, checkpoints, the
byte-level tokenizer and the bundled pair."""

from specjax_models.bundled import DRAFT_CONFIG, TARGET_CONFIG, bundled_prompts, load_bundled
from specjax_models.checkpoint import load_checkpoint, load_config, save_checkpoint
from specjax_models.gguf import from_gguf, gguf_config, gguf_tokenizer, smollm2_path
from specjax_models.hf import from_pretrained, save_pretrained
from specjax_models.hf_tokenizer import load_tokenizer
from specjax_models.tokenizer import ByteTokenizer
from specjax_models.transformer import (
    KVCache,
    Transformer,
    TransformerConfig,
    count_params,
    embedding_and_head,
    first_layers,
    select_layers,
    select_layers_config,
    with_attention_blocks,
)

__all__ = [
    "DRAFT_CONFIG",
    "TARGET_CONFIG",
    "ByteTokenizer",
    "KVCache",
    "Transformer",
    "TransformerConfig",
    "bundled_prompts",
    "count_params",
    "embedding_and_head",
    "first_layers",
    "from_gguf",
    "from_pretrained",
    "gguf_config",
    "gguf_tokenizer",
    "load_bundled",
    "load_checkpoint",
    "load_config",
    "load_tokenizer",
    "save_checkpoint",
    "save_pretrained",
    "select_layers",
    "select_layers_config",
    "smollm2_path",
    "with_attention_blocks",
]
