"""Feature drafters (Medusa, EAGLE-1, EAGLE-3, MTP heads, Kangaroo adapters) built on a
Transformer target.

A head shares its target's token embedding and LM head (`embedding_and_head`) and, for
EAGLE/MTP and Kangaroo, the target's block shape (width, heads, MLP size): what the papers
do.
"""

from __future__ import annotations

from pathlib import Path

import jax

import specjax
from specjax.drafters import (
    Eagle,
    EarlyExit,
    FeatureHeadConfig,
    Medusa,
    eagle3_feature_layers,
)
from specjax.drafters.head_files import load_head
from specjax_models.transformer import TransformerConfig, embedding_and_head

# `specjax train-drafter --method` -> the head's kind.
HEAD_KINDS = {"eagle": "eagle1", "eagle3": "eagle3", "mtp": "mtp", "kangaroo": "kangaroo"}
METHODS = ("medusa", "eagle", "eagle3", "mtp", "kangaroo")
# Kangaroo's exit layer for Vicuna-7B and 13B (Liu et al. 2024): the stream after 2 blocks.
DEFAULT_EXIT_LAYER = 2


def feature_head_config(method: str, target_config: TransformerConfig, *,
                        feature_norm: bool = False,
                        exit_layer: int = DEFAULT_EXIT_LAYER) -> FeatureHeadConfig:
    """The head of `method` ("eagle", "eagle3", "mtp" or "kangaroo") for a target of this
    shape: one block of the target's width, heads and MLP size; eagle3 reads layers 2,
    L // 2, L - 3, a kangaroo adapter the stream entering `exit_layer`.
    feature_norm: see `FeatureHeadConfig` (eagle / eagle3)."""
    if method not in HEAD_KINDS:
        raise ValueError(f"method must be one of {tuple(HEAD_KINDS)} for a feature head "
                         f"(Medusa has no block), got {method!r}")
    kind = HEAD_KINDS[method]
    layers = eagle3_feature_layers(target_config.num_layers) if kind == "eagle3" else ()
    if kind == "kangaroo":
        if not 0 <= exit_layer < target_config.num_layers:
            raise ValueError(f"exit_layer {exit_layer} is outside the target's [0, "
                             f"{target_config.num_layers}) blocks")
        layers = (exit_layer,)
    return FeatureHeadConfig(kind=kind, d_model=target_config.d_model,
                             num_heads=target_config.num_heads,
                             num_kv_heads=target_config.num_kv_heads,
                             d_ff=target_config.d_ff, feature_layers=layers,
                             head_dim=target_config.head_dim,
                             rope_theta=target_config.rope_theta,
                             rms_norm_eps=target_config.rms_norm_eps,
                             feature_norm=feature_norm)


def create_head(method: str, target: specjax.CausalLM, target_config: TransformerConfig, *,
                seed: int = 0, medusa_heads: int = 4, draft_method: str | None = None,
                draft_vocab=None, feature_norm: bool = False,
                exit_layer: int = DEFAULT_EXIT_LAYER):
    """An untrained drafter of `method` (see METHODS) on `target`; `draft_vocab` (target
    ids) gives an EAGLE/MTP head or a Kangaroo adapter a reduced draft vocabulary;
    `feature_norm` normalises an EAGLE head's feature input (see `FeatureHeadConfig`);
    `exit_layer`: where a Kangaroo adapter (`EarlyExit`) reads the target's stream."""
    embedding, lm_head = embedding_and_head(target)
    if method == "medusa":
        if draft_vocab is not None:
            raise ValueError("a reduced draft vocabulary is for eagle / eagle3 / mtp heads")
        return Medusa.create(medusa_heads, lm_head, draft_method or "greedy")
    if method == "kangaroo":
        return EarlyExit.create(feature_head_config(method, target_config,
                                                    exit_layer=exit_layer),
                                lm_head, jax.random.key(seed), draft_method or "sample",
                                draft_vocab)
    if feature_norm and method not in ("eagle", "eagle3"):
        raise ValueError(f"feature_norm is for eagle / eagle3 heads, not {method!r}")
    return Eagle.create(feature_head_config(method, target_config, feature_norm=feature_norm),
                        embedding, lm_head,
                        jax.random.key(seed), draft_method or "sample", draft_vocab)


def load_head_for(directory: str | Path, target: specjax.CausalLM,
                  draft_method: str | None = None):
    """The trained head in `directory` (written by `specjax train-drafter`) on `target`."""
    kind, _, _ = load_head(directory)
    embedding, lm_head = embedding_and_head(target)
    if kind == "medusa":
        return Medusa.load(directory, lm_head, draft_method or "greedy")
    if kind == "early_exit":
        return EarlyExit.load(directory, lm_head, draft_method or "sample")
    return Eagle.load(directory, embedding, lm_head, draft_method or "sample")
