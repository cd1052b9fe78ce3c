"""A parallel draft (PARD, An et al., ICLR 2026, arXiv 2504.18583): K drafts in ONE draft
forward.

An autoregressive draft spends K forwards on K drafts. A parallel draft is an ordinary
causal LM trained (`specjax.training.parallel`, `specjax train-drafter --method pard`) to
read the committed text followed by K - 1 copies of a mask token and to predict, at the
last committed token and at each mask, the next K tokens: draft j + 1 comes from the
mask j places after the last committed token. Its draft cost does not grow with K (one
forward over at most 2K tokens), and the draft is target-independent (AMD publishes PARD
drafts for whole model families; `specjax_models.from_pretrained` reads their
`pard_token`).

Each step feeds one window of W = 2K slots (min(2K, cache capacity)) ending at the last
mask: the committed tokens the draft has not seen (at most K + 1: the accepted drafts and
the correction), re-fed committed tokens before them (their cache entries are rewritten
with the same values), then the K - 1 masks. The cache then holds every committed token;
the mask entries lie past the committed length, scratch that the next step's window
overwrites, so a step needs no commit bookkeeping beyond that length.

Drafts are sampled (q_j = the draft's warped distribution at position j: the drafts are
drawn independently given the committed text, and q_j is exactly what draft j was drawn
from) or greedy (argmax, one-hot q). Token trees: every node at depth d takes its
children from the distribution at position d + 1 (sampled without replacement, or the
top-k; `draw_children`), static (`TreeShape`) and EAGLE-2 dynamic trees (`DynamicTree`,
scored along each path by those same distributions), still one forward. A reduced draft
vocabulary (`draft_vocab`) and a confidence threshold (`min_confidence`) work as in
`DraftModel`. Exact under every verification rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.decoding.sampling import SamplingConfig, SamplingParams
from specjax.drafters.base import Commit, DraftContext, Proposal, check_trained_positions
from specjax.drafters.draft_model import DraftModel, check_draft_fields
from specjax.drafters.offset_proposals import (
    chain_from_offsets,
    dynamic_tree_from_offsets,
    static_tree_from_offsets,
)
from specjax.lm.causal_lm import CausalLM, prefill
from specjax.runtime.sharding import place_like_target
from specjax.trees.shapes import DynamicTree, TreeShape


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ParallelDraftState:
    """cache: the draft's cache. It holds every committed token before each row's next
    window (the window starts at most K + 1 tokens before the committed length, and every
    step's window ends past it), so no count of its entries is kept: the window's start
    follows from the committed length alone."""

    cache: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class ParallelDraft:
    """Draft K tokens in one forward of a parallel draft model (module docstring).

    lm: the parallel draft, a causal LM sharing the target's tokenizer. mask_id: its mask
      token (PARD's `pard_token`), an id of the draft's vocabulary. method: "sample"
      (q = the warped draft distribution at each position) or "greedy" (argmax, one-hot
      q); both exact. draft_vocab, min_confidence, max_vocab_padding: as in `DraftModel`.
      trained_positions: the K it was trained to draft at once (None: unknown); decoding
      with more drafts warns (exact, but the drafts past it are rarely accepted).

    A pytree: the draft's parameters (and draft_vocab) are its leaves, the rest static.
    """

    lm: CausalLM
    mask_id: int = dataclasses.field(metadata={"static": True})
    method: str = dataclasses.field(default="sample", metadata={"static": True})
    _: dataclasses.KW_ONLY
    max_vocab_padding: int = dataclasses.field(default=1024, metadata={"static": True})
    draft_vocab: Array | None = None
    min_confidence: float | None = None  # data: a float32 leaf (see confidence_leaf)
    trained_positions: int | None = dataclasses.field(default=None, metadata={"static": True})

    def __post_init__(self):
        check_draft_fields(self)
        check_trained_positions(self.trained_positions)
        if isinstance(self.mask_id, np.integer):  # an id read from an array or a file
            object.__setattr__(self, "mask_id", int(self.mask_id))
        # With a reduced draft vocabulary the draft reads every target id: `check` bounds
        # the mask by the target's vocabulary then.
        bound = self.lm.vocab_size if self.draft_vocab is None else None
        if (isinstance(self.mask_id, bool) or not isinstance(self.mask_id, int)
                or self.mask_id < 0 or (bound is not None and self.mask_id >= bound)):
            raise ValueError(f"mask_id must be a token id the draft reads, in [0, "
                             f"{bound or 'the vocabulary size'}), got {self.mask_id!r} (a "
                             "PARD checkpoint names it `pard_token` in its config.json)")

    @property
    def _vocab(self) -> DraftModel:
        """The draft's vocabulary handling (checks, logits over the target's ids)."""
        return DraftModel(self.lm, self.method, max_vocab_padding=self.max_vocab_padding,
                          draft_vocab=self.draft_vocab)

    def placed_like(self, target: CausalLM) -> ParallelDraft:
        """This drafter with its draft split over the target's mesh by the target's rules;
        itself on one device."""
        lm = place_like_target(self.lm, target)
        return self if lm is self.lm else dataclasses.replace(self, lm=lm)

    def with_method(self, method: str) -> ParallelDraft:
        return dataclasses.replace(self, method=method)

    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        self._vocab.check(target, sampling)
        if self.draft_vocab is not None and self.mask_id >= target.vocab_size:
            raise ValueError(f"mask_id {self.mask_id} is not a target id (the draft reads "
                             f"target ids, [0, {target.vocab_size}))")

    @property
    def graded_num_real(self) -> bool:
        return self.min_confidence is not None

    drafts_trees: ClassVar[bool] = True
    drafts_dynamic_trees: ClassVar[bool] = True

    def forwards_per_step(self, num_draft_tokens: int,
                          tree: TreeShape | DynamicTree | None = None) -> int:
        return 1  # the point: one draft forward whatever K or the tree

    # -- traced ----------------------------------------------------------------------------
    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array,
             capacity: int) -> ParallelDraftState:
        batch = prompt_tokens_BP.shape[0]
        cache = self.lm.init_cache(batch, capacity)
        cache, _, _, _ = prefill(self.lm, cache, self._vocab._clip(prompt_tokens_BP),
                                 prompt_lengths_B, keep_hidden=False)
        return ParallelDraftState(cache)

    def position_logits(self, state: ParallelDraftState, context: DraftContext,
                        positions: int) -> tuple[Any, Array]:
        """One forward: `(cache, logits f32 [B, positions, V_target])`, the draft's logits
        for the next `positions` tokens (the last committed token, then positions - 1
        masks)."""
        lengths_B = context.lengths
        capacity = context.sequence.shape[1]
        width = min(2 * positions, capacity)
        # The window ends at the last mask (lengths + positions - 2) and starts early enough
        # to cover every committed token the cache lacks (at most positions + 1 of them).
        start_B = jnp.clip(lengths_B + positions - 1 - width, 0, capacity - width)
        slots_BW = start_B[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
        committed_BW = jnp.take_along_axis(context.sequence,
                                           jnp.minimum(slots_BW, capacity - 1), axis=1)
        tokens_BW = jnp.where(slots_BW < lengths_B[:, None], self._vocab._clip(committed_BW),
                              self.mask_id)
        logits_BWV, _, cache = self.lm.apply(tokens_BW, slots_BW, state.cache, start_B)
        wanted_BK = (lengths_B - 1 - start_B)[:, None] + jnp.arange(positions)[None]
        logits_BKV = jnp.take_along_axis(logits_BWV, wanted_BK[..., None], axis=1)
        return cache, logits_BKV

    def propose(self, state: ParallelDraftState, context: DraftContext, key: Array, *,
                num_draft_tokens: int, sampling: SamplingParams, vocab_size: int,
                tree: TreeShape | DynamicTree | None = None
                ) -> tuple[ParallelDraftState, Proposal]:
        """K drafts per row from one forward (a chain), or the nodes of `tree`."""
        depth = num_draft_tokens if tree is None else tree.max_depth
        cache, logits_BKV = self.position_logits(state, context, depth)
        new_state = ParallelDraftState(cache)
        offsets = lambda d: self._vocab.target_logits(logits_BKV[:, d], vocab_size)
        if isinstance(tree, DynamicTree):
            return new_state, dynamic_tree_from_offsets(offsets, tree, sampling)
        if tree is not None:
            return new_state, static_tree_from_offsets(
                key, offsets, tree, sampling, vocab_size, deterministic=self.method == "greedy")
        return new_state, chain_from_offsets(
            key, offsets, num_draft_tokens, sampling, deterministic=self.method == "greedy",
            min_confidence=self.min_confidence)

    def commit(self, state: ParallelDraftState, commit: Commit) -> ParallelDraftState:
        # The cache holds the committed tokens up to the step's old length; the rest of the
        # window (masks) is scratch that the next window rewrites.
        del commit
        return state
