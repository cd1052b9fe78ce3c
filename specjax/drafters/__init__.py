"""Drafters: where the K guessed tokens come from."""

from specjax.drafters.adaptive_length import AdaptiveLength, AdaptiveLengthState
from specjax.drafters.base import (
    Commit,
    DraftContext,
    Drafter,
    Proposal,
    eagle3_feature_layers,
)
from specjax.drafters.draft_model import DraftModel, DraftModelState
from specjax.drafters.eagle import Eagle, EagleState
from specjax.drafters.early_exit import EarlyExit, EarlyExitState
from specjax.drafters.feature_head import FeatureHeadConfig
from specjax.drafters.layer_skip import LayerSkip
from specjax.drafters.lookahead import Lookahead, LookaheadState
from specjax.drafters.medusa import Medusa, MedusaState
from specjax.drafters.model_block import ModelBlock
from specjax.drafters.parallel_draft import ParallelDraft, ParallelDraftState
from specjax.drafters.parallel_eagle import ParallelEagle, ParallelEagleState
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.drafters.retrieval import Retrieval

__all__ = ["AdaptiveLength", "AdaptiveLengthState", "Commit", "DraftContext", "DraftModel",
           "DraftModelState", "Drafter", "Eagle", "EagleState", "EarlyExit", "EarlyExitState",
           "FeatureHeadConfig", "LayerSkip", "Lookahead", "LookaheadState", "Medusa",
           "MedusaState", "ModelBlock", "ParallelDraft", "ParallelDraftState", "ParallelEagle",
           "ParallelEagleState", "PromptLookup", "Proposal", "Retrieval", "eagle3_feature_layers"]
