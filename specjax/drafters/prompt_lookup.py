"""Prompt lookup (n-gram) drafting: copy what followed the last n tokens the previous
time they occurred in the row (Saxena 2023; transformers' `prompt_lookup_num_tokens`,
vLLM's `ngram`). No model, no cache, deterministic drafts, so q is one-hot.

Search, for every row at once with static shapes: `match[b, k, e]` says whether the token
k places before slot e equals the token k places before the row's end, for k < n_max.
A match of size n ends at e when the first n of these hold. The most recent occurrence is
the largest such e below the row's last token, and the longest n (from `max_ngram_size`
down to `min_ngram_size`) that has one wins. Its continuation starts at c = e + 1; when it
runs into the row's own end it wraps with period L - c, which extends a repeating pattern
the way it repeats.

Rows without any match propose their last token K times (one-hot q) and report no real
draft (`Proposal.num_real` 0): when no running row of the batch has a match, the step
runs a one-token forward instead of verifying K + 1 (plain decoding's cost, as
transformers' prompt lookup falls back to); otherwise the filler is verified with the
rest, which exactness allows.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import Array

from specjax.decoding.sampling import SamplingConfig, SamplingParams
from specjax.drafters.base import Commit, DraftContext, Proposal
from specjax.lm.causal_lm import CausalLM


def suffix_match_lengths(sequence_BS: Array, lengths_B: Array, max_length: int) -> Array:
    """int32 [B, S]: for each slot e before the row's last token, how many tokens (at most
    `max_length`) ending at e equal the row's last ones (`sequence[b, :lengths[b]]`); 0
    elsewhere. The earlier occurrences of the row's suffixes, for prompt lookup and for
    retrieval from the row's own text."""
    batch, slots = sequence_BS.shape
    last_B = lengths_B - 1
    end_S = jnp.arange(slots, dtype=jnp.int32)
    back_K = jnp.arange(max_length, dtype=jnp.int32)
    # Token k places before the row's last token, and before each candidate end e.
    suffix_BK = jnp.take_along_axis(sequence_BS, jnp.maximum(last_B[:, None] - back_K[None], 0),
                                    axis=1)
    window_KS = end_S[None, :] - back_K[:, None]
    window_BKS = jnp.broadcast_to(jnp.maximum(window_KS, 0)[None], (batch, max_length, slots))
    tokens_BKS = jnp.take_along_axis(sequence_BS[:, None, :], window_BKS, axis=2)
    equal_BKS = ((tokens_BKS == suffix_BK[:, :, None]) & (window_KS >= 0)[None]
                 & (back_K[None, :, None] <= last_B[:, None, None]))
    length_BS = jnp.sum(jnp.cumprod(equal_BKS.astype(jnp.int32), axis=1), axis=1)
    # An earlier occurrence ends before the row's last token.
    return jnp.where(end_S[None, :] < last_B[:, None], length_BS, 0).astype(jnp.int32)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PromptLookup:
    """Draft by n-gram lookup in the row's own tokens (prompt and everything generated).

    min_ngram_size defaults to 2: a single repeated token (" the", ",") predicts little, and
    verifying its continuation costs more than it returns. Measured on SmolLM2 chat
    prompts (greedy, batch 1, K = 4): min 1 runs at 0.88x plain decoding, min 2 at 1.00x
    (the rows without a bigram match take one-token steps), while rewrite prompts keep
    1.27x (1.29x with min 1). A pytree with no leaves: both settings are static.
    """

    max_ngram_size: int = dataclasses.field(default=3, metadata={"static": True})
    min_ngram_size: int = dataclasses.field(default=2, metadata={"static": True})

    def __post_init__(self):
        for name in ("max_ngram_size", "min_ngram_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.min_ngram_size > self.max_ngram_size:
            raise ValueError(f"min_ngram_size ({self.min_ngram_size}) exceeds max_ngram_size "
                             f"({self.max_ngram_size})")

    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        """Any target works: drafts are token ids copied from the row itself."""

    def forwards_per_step(self, num_draft_tokens: int) -> int:
        return 0

    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array, capacity: int) -> Array:
        return jnp.zeros((prompt_tokens_BP.shape[0],), jnp.int32)  # no state to keep

    def commit(self, state: Array, commit: Commit) -> Array:
        return state

    def lookup(self, sequence_BS: Array, lengths_B: Array, num_draft_tokens: int):
        """`(tokens int32 [B, K], ngram_size int32 [B])`: the drafts, and the n-gram size
        that matched (0 where nothing did)."""
        slots = sequence_BS.shape[1]
        match_BS = suffix_match_lengths(sequence_BS, lengths_B, self.max_ngram_size)
        # The longest n (at most max_ngram_size, at least min) wins; its latest end.
        best_size_B = jnp.max(match_BS, axis=1)
        best_size_B = jnp.where(best_size_B >= self.min_ngram_size, best_size_B, 0)
        end_S = jnp.arange(slots, dtype=jnp.int32)
        best_end_B = jnp.max(jnp.where((match_BS >= best_size_B[:, None])
                                       & (best_size_B[:, None] > 0), end_S[None, :], -1),
                             axis=1)
        last_B = lengths_B - 1
        start_B = best_end_B + 1
        period_B = jnp.maximum(lengths_B - start_B, 1)
        offsets_K = jnp.arange(num_draft_tokens, dtype=jnp.int32)
        source_BK = start_B[:, None] + offsets_K[None, :] % period_B[:, None]
        drafts_BK = jnp.take_along_axis(sequence_BS, jnp.clip(source_BK, 0, slots - 1), axis=1)
        fallback_BK = jnp.broadcast_to(
            jnp.take_along_axis(sequence_BS, last_B[:, None], axis=1), drafts_BK.shape)
        drafts_BK = jnp.where((best_size_B > 0)[:, None], drafts_BK, fallback_BK)
        return drafts_BK.astype(jnp.int32), best_size_B

    def propose(self, state: Array, context: DraftContext, key: Array, *,
                num_draft_tokens: int, sampling: SamplingParams,
                vocab_size: int) -> tuple[Array, Proposal]:
        drafts_BK, ngram_size_B = self.lookup(context.sequence, context.lengths,
                                              num_draft_tokens)
        drafts_BK = jnp.minimum(drafts_BK, vocab_size - 1)
        q_BKV = jax.nn.one_hot(drafts_BK, vocab_size, dtype=jnp.float32)
        num_real_B = jnp.where(ngram_size_B > 0, num_draft_tokens, 0).astype(jnp.int32)
        return state, Proposal(tokens=drafts_BK, q=q_BKV, num_real=num_real_B)
