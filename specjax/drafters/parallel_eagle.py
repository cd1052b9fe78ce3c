"""P-EAGLE: an EAGLE head that drafts K positions in ONE head forward.

An autoregressive EAGLE head (`Eagle`) feeds each draft back as the next pair (its own
output as the feature, the drafted token), K - 1 head forwards after the commit's. A
parallel head (`FeatureHeadConfig.mask_id`; trained by
`specjax.training.parallel_heads`, `specjax train-drafter --method p-eagle`) instead reads
K - 1 placeholder pairs after the last committed token: the mask token `mask_id` with a
learned feature `mask_hidden`. Its output at the last committed pair predicts draft 1 and
its output at the j-th placeholder predicts draft j + 1, as vLLM's parallel drafting runs
P-EAGLE heads (a learned mask hidden state in place of the target's feature, the mask token
in place of the token).

One forward per step, and no separate commit forward: the commit only stores the target
features of the newly committed tokens (`pending`), and the next propose feeds, in one
window, the pairs not yet final in the head's cache (the last committed token's, re-fed
every step because its output gives draft 1, and the newly committed ones) followed by the
K - 1 placeholders. The pairs of committed tokens are then final in the cache; the
placeholders lie past them, scratch that the next window overwrites. `pending` holds at
most K + 2 features (the last pair and the K + 1 a chain step can commit), so the state's
shape depends on K: `init` takes `num_draft_tokens` (the decoders pass it).

Proposals: chains (sampled, q_j = the head's warped distribution at offset j; greedy,
one-hot q), static and EAGLE-2 dynamic trees (`specjax.drafters.offset_proposals`: a
depth-d node's children from offset d + 1), a reduced draft vocabulary and a confidence
threshold as the head has them. Exact under every verification rule.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
from jax import Array

from specjax.decoding.sampling import SamplingConfig, SamplingParams
from specjax.drafters.base import Commit, DraftContext, Proposal, check_trained_positions
from specjax.drafters.eagle import HEAD_SCRATCH_SLOTS, Eagle, accepted_feature_index
from specjax.drafters.feature_head import init_head_cache
from specjax.drafters.offset_proposals import (
    chain_from_offsets,
    dynamic_tree_from_offsets,
    static_tree_from_offsets,
)
from specjax.lm.causal_lm import CausalLM
from specjax.trees.shapes import DynamicTree, TreeShape


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ParallelEagleState:
    """keys / values: the head's cache [B, S, H_kv, hd], final below `settled`;
    settled int32 [B]: the committed length minus one after every propose (the last
    committed pair is re-fed, its output being draft 1's); pending float32 [B, K + 2, D]:
    the features preceding the tokens at settled, settled + 1, ... (the target's fused
    features, as the head reads them), valid up to the committed length."""

    keys: Array
    values: Array
    settled: Array
    pending: Array


def head_trained_positions(directory: str | Path) -> int | None:
    """The K a parallel head in `directory` was trained for (`positions` in the
    metadata.json `specjax train-drafter --method p-eagle` writes), None when unrecorded."""
    import json

    try:
        positions = json.loads((Path(directory) / "metadata.json").read_text()).get("positions")
    except (OSError, ValueError, AttributeError):
        return None
    return positions if isinstance(positions, int) and not isinstance(positions, bool) \
        and positions >= 1 else None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class ParallelEagle:
    """Draft K positions in one forward of a parallel EAGLE head (module docstring).

    head: an `Eagle` whose config has a `mask_id` (its parameters hold `mask_hidden`); its
    method ("sample" or "greedy"), draft vocabulary and `min_confidence` apply as they do
    to the head drafting autoregressively. trained_positions: the K it was trained to
    draft at once (None: unknown); decoding with more drafts warns (exact, but the drafts
    past it are guesses the head never learned).
    """

    head: Eagle
    trained_positions: int | None = dataclasses.field(default=None,
                                                      metadata={"static": True})

    reads_target_features: ClassVar[bool] = True
    drafts_trees: ClassVar[bool] = True
    drafts_dynamic_trees: ClassVar[bool] = True
    init_takes_draft_tokens: ClassVar[bool] = True

    def __post_init__(self):
        if not isinstance(self.head, Eagle):
            raise TypeError(f"head must be a specjax.drafters.Eagle, got {type(self.head)}")
        if self.head.config.mask_id is None:
            raise ValueError("this head drafts autoregressively (its config has no mask_id): "
                             "a parallel head is trained with `specjax train-drafter --method "
                             "p-eagle` (or specjax.training.train_parallel_head); run this "
                             "one with specjax.drafters.Eagle")
        if "mask_hidden" not in self.head.params:
            raise ValueError(f"the head's config has mask_id={self.head.config.mask_id} but its "
                             "parameters hold no placeholder feature 'mask_hidden' (a head "
                             "given a mask id by hand): adapt a trained head with "
                             "specjax.training.with_placeholder(head, mask_id) and train it "
                             "(`specjax train-drafter --method p-eagle`)")
        rows = self.head.embedding.shape[0]
        if self.mask_id >= rows:
            raise ValueError(f"the head's mask_id {self.mask_id} is not a row of its "
                             f"embedding ({rows} rows, ids 0..{rows - 1})")
        check_trained_positions(self.trained_positions)

    @classmethod
    def load(cls, directory: str | Path, embedding: Array, lm_head: Array,
             method: str = "sample") -> ParallelEagle:
        """A parallel head saved by `save` (or `specjax train-drafter --method p-eagle`),
        with the K it was trained for when its metadata.json records it."""
        return cls(Eagle.load(directory, embedding, lm_head, method),
                   trained_positions=head_trained_positions(directory))

    def save(self, directory: str | Path) -> None:
        self.head.save(directory)

    @property
    def config(self):
        return self.head.config

    @property
    def mask_id(self) -> int:
        return self.head.config.mask_id

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.head.feature_layers

    @property
    def graded_num_real(self) -> bool:
        return self.head.min_confidence is not None

    def with_method(self, method: str) -> ParallelEagle:
        return dataclasses.replace(self, head=self.head.with_method(method))

    def with_params(self, params: dict) -> ParallelEagle:
        return dataclasses.replace(self, head=self.head.with_params(params))

    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        self.head.check(target, sampling)

    def forwards_per_step(self, num_draft_tokens: int,
                          tree: TreeShape | DynamicTree | None = None) -> int:
        return 1  # the point: one head forward whatever K or the tree

    # -- traced ------------------------------------------------------------------------------
    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array, capacity: int, *,
             features: Array, num_draft_tokens: int) -> ParallelEagleState:
        """The prompt's pairs into the head's cache, every one final but the last (kept
        pending: the first propose re-feeds it)."""
        batch, width = prompt_tokens_BP.shape
        pending_width = num_draft_tokens + 2
        fused_BPD = self.head._features(features)
        previous_BPD = jnp.concatenate([jnp.zeros_like(fused_BPD[:, :1]), fused_BPD[:, :-1]],
                                       axis=1)
        # Room past the capacity for the widest window (pending pairs and placeholders).
        keys, values = init_head_cache(self.config, batch,
                                       capacity + 2 * pending_width + HEAD_SCRATCH_SLOTS)
        positions_BP = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch, width))
        _, (keys, values) = self.head._block(prompt_tokens_BP, previous_BPD, positions_BP,
                                             (keys, values), jnp.zeros((batch,), jnp.int32))
        last_BD = jnp.take_along_axis(previous_BPD, (prompt_lengths_B - 1)[:, None, None],
                                      axis=1)[:, 0]
        pending_BPD = jnp.zeros((batch, pending_width, self.config.d_model),
                                jnp.float32).at[:, 0].set(last_BD)
        return ParallelEagleState(keys, values, (prompt_lengths_B - 1).astype(jnp.int32),
                                  pending_BPD)

    def offset_outputs(self, state: ParallelEagleState, context: DraftContext,
                       offsets: int) -> tuple[ParallelEagleState, Array]:
        """One head forward over the pending pairs and offsets - 1 placeholders:
        `(state, out float32 [B, offsets, D])`, the head's outputs whose logits are the
        drafts at offsets 1 .. offsets."""
        lengths_B, settled_B = context.lengths, state.settled
        pending_width = state.pending.shape[1]
        width = pending_width + offsets - 1
        capacity = context.sequence.shape[1]
        count_B = lengths_B - settled_B  # pending pairs: 1 .. K + 2
        slots_W = jnp.arange(width, dtype=jnp.int32)
        positions_BW = settled_B[:, None] + slots_W[None]
        is_pair_BW = slots_W[None] < count_B[:, None]
        committed_BW = jnp.take_along_axis(context.sequence,
                                           jnp.minimum(positions_BW, capacity - 1), axis=1)
        tokens_BW = jnp.where(is_pair_BW, committed_BW, self.mask_id)
        pending_BWD = jnp.pad(state.pending, ((0, 0), (0, offsets - 1), (0, 0)))
        features_BWD = jnp.where(is_pair_BW[..., None], pending_BWD,
                                 self.head.params["mask_hidden"].astype(jnp.float32))
        out_BWD, (keys, values) = self.head._block(tokens_BW, features_BWD, positions_BW,
                                                   (state.keys, state.values), settled_B)
        wanted_BK = (count_B - 1)[:, None] + jnp.arange(offsets, dtype=jnp.int32)[None]
        out_BKD = jnp.take_along_axis(out_BWD, wanted_BK[..., None], axis=1)
        last_BD = jnp.take_along_axis(state.pending, (count_B - 1)[:, None, None],
                                      axis=1)[:, 0]
        pending_BPD = jnp.zeros_like(state.pending).at[:, 0].set(last_BD)
        return ParallelEagleState(keys, values, (lengths_B - 1).astype(jnp.int32),
                                  pending_BPD), out_BKD

    def propose(self, state: ParallelEagleState, context: DraftContext, key: Array, *,
                num_draft_tokens: int, sampling: SamplingParams, vocab_size: int,
                tree: TreeShape | DynamicTree | None = None
                ) -> tuple[ParallelEagleState, Proposal]:
        """K drafts per row from one head forward (a chain), or the nodes of `tree`."""
        depth = num_draft_tokens if tree is None else tree.max_depth
        new_state, out_BKD = self.offset_outputs(state, context, depth)
        offsets = lambda d: self.head._logits(out_BKD[:, d])
        deterministic = self.head.method == "greedy"
        if isinstance(tree, DynamicTree):
            return new_state, dynamic_tree_from_offsets(offsets, tree, sampling)
        if tree is not None:
            return new_state, static_tree_from_offsets(key, offsets, tree, sampling,
                                                       vocab_size, deterministic=deterministic)
        return new_state, chain_from_offsets(key, offsets, num_draft_tokens, sampling,
                                             deterministic=deterministic,
                                             min_confidence=self.head.min_confidence)

    def commit(self, state: ParallelEagleState, commit: Commit) -> ParallelEagleState:
        """No forward: the features preceding the committed tokens join `pending` after the
        last pair (the next propose feeds them)."""
        feature_index_BW = accepted_feature_index(commit)
        width = feature_index_BW.shape[1]
        if width + 1 > state.pending.shape[1]:
            raise ValueError(f"a step committing up to {width} tokens needs a state built "
                             f"for num_draft_tokens >= {width - 1}; this one holds "
                             f"{state.pending.shape[1] - 2} (init with the step's K)")
        fused_BND = self.head._features(commit.target_hidden)
        new_BWD = jnp.take_along_axis(fused_BND, feature_index_BW[:, :, None], axis=1)
        return dataclasses.replace(state, pending=state.pending.at[:, 1:1 + width].set(new_BWD))
