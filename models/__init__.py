"""Flax NNX model definitions for specjax: Llama-family decoders, checkpoints (orbax,
Hugging Face safetensors, GGUF), tokenizers, the bundled pair and the shipped drafters.

What trains the shipped models (the standard-library corpus, SmolLM2's chat data, head
and draft training, model cards) is in `specjax_models.recipes`; nothing here imports it.

Public names load on first use (PEP 562), as in `specjax`: loading a GGUF file never
imports orbax, and `import specjax_models` costs nothing until a name is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specjax.runtime.lazy import lazy_attributes

# Public name -> the module that defines it.
_SOURCES = {
    "DRAFT_CONFIG": "bundled", "SMOLLM2_DATASTORE": "bundled", "SMOLLM2_DRAFT": "bundled",
    "SMOLLM2_HEAD": "bundled", "SMOLLM2_KANGAROO": "bundled", "SMOLLM2_MASK_ID": "bundled",
    "SMOLLM2_PARALLEL": "bundled",
    "TARGET_CONFIG": "bundled", "bundled_prompts": "bundled", "load_bundled": "bundled",
    "load_checkpoint": "checkpoint", "load_config": "checkpoint",
    "save_checkpoint": "checkpoint",
    "from_gguf": "gguf", "gguf_config": "gguf", "gguf_tokenizer": "gguf",
    "smollm2_path": "gguf",
    "create_head": "heads", "load_head_for": "heads",
    "from_pretrained": "hf", "save_pretrained": "hf",
    "load_tokenizer": "hf_tokenizer",
    "load_drafter": "published_drafters",
    "load_layer_draft": "layer_draft", "save_layer_draft": "layer_draft",
    "load_parallel_layer_draft": "layer_draft", "parallel_layer_settings": "layer_draft",
    "load_parallel_draft": "parallel_drafts", "parallel_settings": "parallel_drafts",
    "save_parallel_draft": "parallel_drafts",
    "shard": "sharded",
    "random_model": "real_sizes", "real_size_config": "real_sizes",
    "real_size_names": "real_sizes",
    "ByteTokenizer": "tokenizer",
    "KVCache": "transformer", "Transformer": "transformer", "TransformerConfig": "transformer",
    "count_params": "transformer", "embedding_and_head": "transformer",
    "first_layers": "transformer", "select_layers": "transformer",
    "select_layers_config": "transformer", "with_attention_blocks": "transformer",
}

__all__ = [
    "DRAFT_CONFIG",
    "SMOLLM2_DATASTORE",
    "SMOLLM2_DRAFT",
    "SMOLLM2_HEAD",
    "SMOLLM2_KANGAROO",
    "SMOLLM2_MASK_ID",
    "SMOLLM2_PARALLEL",
    "TARGET_CONFIG",
    "ByteTokenizer",
    "KVCache",
    "Transformer",
    "TransformerConfig",
    "bundled_prompts",
    "count_params",
    "create_head",
    "embedding_and_head",
    "first_layers",
    "from_gguf",
    "from_pretrained",
    "gguf_config",
    "gguf_tokenizer",
    "load_bundled",
    "load_checkpoint",
    "load_config",
    "load_drafter",
    "load_head_for",
    "load_layer_draft",
    "load_parallel_draft",
    "load_parallel_layer_draft",
    "load_tokenizer",
    "parallel_layer_settings",
    "parallel_settings",
    "random_model",
    "real_size_config",
    "real_size_names",
    "save_checkpoint",
    "save_layer_draft",
    "save_parallel_draft",
    "save_pretrained",
    "select_layers",
    "shard",
    "select_layers_config",
    "smollm2_path",
    "with_attention_blocks",
]


__getattr__, __dir__ = lazy_attributes(
    __name__, {name: f"{__name__}.{module}" for name, module in _SOURCES.items()}, globals())


if TYPE_CHECKING:  # what type checkers and IDEs see: the eager imports
    from specjax_models.bundled import (
        DRAFT_CONFIG,
        SMOLLM2_DATASTORE,
        SMOLLM2_DRAFT,
        SMOLLM2_HEAD,
        SMOLLM2_KANGAROO,
        SMOLLM2_MASK_ID,
        SMOLLM2_PARALLEL,
        TARGET_CONFIG,
        bundled_prompts,
        load_bundled,
    )
    from specjax_models.checkpoint import load_checkpoint, load_config, save_checkpoint
    from specjax_models.gguf import from_gguf, gguf_config, gguf_tokenizer, smollm2_path
    from specjax_models.heads import create_head, load_head_for
    from specjax_models.hf import from_pretrained, save_pretrained
    from specjax_models.hf_tokenizer import load_tokenizer
    from specjax_models.layer_draft import (
        load_layer_draft,
        load_parallel_layer_draft,
        parallel_layer_settings,
        save_layer_draft,
    )
    from specjax_models.parallel_drafts import (
        load_parallel_draft,
        parallel_settings,
        save_parallel_draft,
    )
    from specjax_models.published_drafters import load_drafter
    from specjax_models.real_sizes import random_model, real_size_config, real_size_names
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
