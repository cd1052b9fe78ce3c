"""Drafters: where the K guessed tokens come from."""

from specjax.drafters.base import Commit, DraftContext, Drafter, Proposal
from specjax.drafters.draft_model import DraftModel, DraftModelState

__all__ = ["Commit", "DraftContext", "DraftModel", "DraftModelState", "Drafter", "Proposal"]
