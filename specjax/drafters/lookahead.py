"""Lookahead decoding (Fu et al. 2024): Jacobi iteration makes n-grams, verified for free.

No draft model. Every step's ONE target forward carries two branches under one mask:

- the lookahead branch, a window of W columns and N - 1 levels of guessed tokens. Level 0
  is a chain after the last committed token (column j at depth j + 1); level l of column j
  hangs under level l - 1 of column j (depth j + l + 1). So token (l, j) sees the window's
  first j + 1 level-0 tokens, then its own column above it: one consistent guess of the
  text, and the target's output there is the Jacobi update of the guess one position on.
  These nodes are verified but never accepted (`Proposal.never_accept`).
- the verification branch: the n-grams of the pool that start with the row's last token
  (up to G, the most recent first), merged into a trie (`specjax.trees.tries`).

After the forward (`commit`, which reads the target's argmax at every node,
`Commit.target_tokens`), column j with the target's token after its last level is an
n-gram of N tokens; the W new n-grams join the pool, the window moves up one level and
the new last level is those target tokens. The n-grams of newly committed text and of the
prompt join the pool too, so the pool also copies from the prompt as prompt lookup does.

The pool is fixed-size arrays in the drafter state: H buckets (by first token modulo H),
each G slots of (first token, the N - 1 that followed), the oldest replaced. Candidates
are deterministic (q = None), so a sampled step accepts x with probability p(x) and the
output is exact at every temperature; the walk never enters the window.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Int

from specjax.decoding.sampling import SamplingConfig, SamplingParams
from specjax.drafters.base import Commit, DraftContext, Proposal, check_own_tree
from specjax.lm.causal_lm import CausalLM
from specjax.trees.shapes import TreeBudget
from specjax.trees.tries import merge_into_trie


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LookaheadState:
    """window int32 [B, N-1, W] (levels by columns); the n-gram pool: pool_keys int32
    [B, H, G] (first tokens, -1 empty), pool_ngrams int32 [B, H, G, N-1] (what followed),
    pool_next int32 [B, H] (the slot written next in each bucket: the oldest)."""

    window: Int[Array, "B N1 W"]
    pool_keys: Int[Array, "B H G"]
    pool_ngrams: Int[Array, "B H G N1"]
    pool_next: Int[Array, "B H"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Lookahead:
    """Lookahead decoding with a W x (N - 1) Jacobi window and up to G candidate n-grams.

    window: W, columns of the Jacobi window. ngram: N, the n-gram size (N - 1 tokens
    drafted after the last one). guesses: G, pool n-grams per first token (and the most
    the verification branch holds). buckets: H, the pool's buckets (first token modulo H;
    a collision only shares a bucket's G slots). Each step verifies
    (W + G) * (N - 1) nodes. A pytree with no leaves: every setting is static.
    """

    window: int = dataclasses.field(default=5, metadata={"static": True})
    ngram: int = dataclasses.field(default=4, metadata={"static": True})
    guesses: int = dataclasses.field(default=5, metadata={"static": True})
    buckets: int = dataclasses.field(default=4096, metadata={"static": True})

    drafts_trees = True
    reads_target_tokens = True  # the Jacobi update: `Commit.target_tokens`

    def __post_init__(self):
        minimum = {"window": 1, "ngram": 2, "guesses": 1, "buckets": 1}
        for name, least in minimum.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"Lookahead({name}=...) must be an int >= {least}, got "
                                 f"{value!r}")

    @property
    def drafted(self) -> int:
        """N - 1: tokens per n-gram after its first (the window's levels)."""
        return self.ngram - 1

    @property
    def num_candidate_nodes(self) -> int:
        return self.guesses * self.drafted

    @property
    def proposal_tree(self) -> TreeBudget:
        """The step's tree: G (N - 1) candidate trie slots, then the W (N - 1) window."""
        return TreeBudget(num_nodes=(self.guesses + self.window) * self.drafted,
                          max_depth=self.drafted, max_branching=self.guesses + 1)

    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        """Any target works: candidates are token ids the target itself produced."""

    def forwards_per_step(self, num_draft_tokens: int, **_) -> int:
        return 0

    # -- the pool ---------------------------------------------------------------------

    def insert(self, state: LookaheadState, keys_B: Array, ngrams_BL: Array,
               valid_B: Array) -> LookaheadState:
        """Add one n-gram per row where `valid_B` (first token, then N - 1 tokens) unless
        its bucket already holds it; it replaces the bucket's oldest entry."""
        rows_B = jnp.arange(keys_B.shape[0])
        bucket_B = jnp.maximum(keys_B, 0) % self.buckets
        keys_BG = state.pool_keys[rows_B, bucket_B]
        held_B = jnp.any((keys_BG == keys_B[:, None]) & jnp.all(
            state.pool_ngrams[rows_B, bucket_B] == ngrams_BL[:, None, :], axis=2), axis=1)
        write_B = valid_B & ~held_B
        slot_B = state.pool_next[rows_B, bucket_B]
        old_key_B = keys_BG[rows_B, slot_B]
        old_ngram_BL = state.pool_ngrams[rows_B, bucket_B, slot_B]
        return dataclasses.replace(
            state,
            pool_keys=state.pool_keys.at[rows_B, bucket_B, slot_B].set(
                jnp.where(write_B, keys_B, old_key_B)),
            pool_ngrams=state.pool_ngrams.at[rows_B, bucket_B, slot_B].set(
                jnp.where(write_B[:, None], ngrams_BL, old_ngram_BL)),
            pool_next=state.pool_next.at[rows_B, bucket_B].set(
                jnp.where(write_B, (slot_B + 1) % self.guesses, slot_B)))

    def insert_text(self, state: LookaheadState, sequence_BS: Array, ends_B: Array,
                    valid_B: Array) -> LookaheadState:
        """Add the n-gram of `sequence` that ends at slot `ends_B` (where it fits)."""
        offsets_N = jnp.arange(self.ngram, dtype=jnp.int32) - self.drafted
        slots_BN = ends_B[:, None] + offsets_N[None, :]
        ngram_BN = jnp.take_along_axis(sequence_BS, jnp.maximum(slots_BN, 0), axis=1)
        return self.insert(state, ngram_BN[:, 0], ngram_BN[:, 1:],
                           valid_B & (slots_BN[:, 0] >= 0))

    def candidates(self, state: LookaheadState, last_B: Array):
        """`(sequences int32 [B, G, N-1], lengths int32 [B, G])`: the pool's n-grams after
        each row's last token, the most recent first (length 0: an empty slot)."""
        rows_B = jnp.arange(last_B.shape[0])
        bucket_B = last_B % self.buckets
        recent_BG = (state.pool_next[rows_B, bucket_B][:, None] - 1
                     - jnp.arange(self.guesses)[None, :]) % self.guesses
        keys_BG = jnp.take_along_axis(state.pool_keys[rows_B, bucket_B], recent_BG, axis=1)
        ngrams_BGL = jnp.take_along_axis(state.pool_ngrams[rows_B, bucket_B],
                                         recent_BG[:, :, None], axis=1)
        lengths_BG = jnp.where(keys_BG == last_B[:, None], self.drafted, 0)
        return ngrams_BGL, lengths_BG.astype(jnp.int32)

    # -- the window -------------------------------------------------------------------

    def window_parents(self) -> Array:
        """int32 [W (N-1)]: each window node's parent (node (l, j) is slot
        G (N-1) + j (N-1) + l): level 0 is a chain under the root, level l hangs under
        level l - 1 of its column."""
        base, levels = self.num_candidate_nodes, self.drafted
        parents = []
        for column in range(self.window):
            for level in range(levels):
                if level > 0:
                    parents.append(base + column * levels + level - 1)
                else:
                    parents.append(-1 if column == 0 else base + (column - 1) * levels)
        return jnp.asarray(parents, jnp.int32)

    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array,
             capacity: int) -> LookaheadState:
        batch, width = prompt_tokens_BP.shape
        levels = self.drafted
        # The first guesses: prompt tokens spread over the prompt (lade starts from prompt
        # tokens too); the window needs N - 1 steps to fill with Jacobi updates.
        index_LW = (jnp.arange(levels)[:, None] * self.window
                    + jnp.arange(self.window)[None, :]) * 7
        index_BLW = index_LW[None] % prompt_lengths_B[:, None, None]
        window = jnp.take_along_axis(prompt_tokens_BP[:, None, :].repeat(levels, axis=1),
                                     index_BLW, axis=2)
        state = LookaheadState(
            window=window.astype(jnp.int32),
            pool_keys=jnp.full((batch, self.buckets, self.guesses), -1, jnp.int32),
            pool_ngrams=jnp.zeros((batch, self.buckets, self.guesses, levels), jnp.int32),
            pool_next=jnp.zeros((batch, self.buckets), jnp.int32))

        def add_prompt_ngram(end, state):
            end_B = jnp.full((batch,), end, jnp.int32)
            return self.insert_text(state, prompt_tokens_BP, end_B, end_B < prompt_lengths_B)

        if width >= self.ngram:
            state = jax.lax.fori_loop(levels, width, add_prompt_ngram, state)
        return state

    def propose(self, state: LookaheadState, context: DraftContext, key: Array, *,
                num_draft_tokens: int, sampling: SamplingParams, vocab_size: int,
                tree: TreeBudget | None = None) -> tuple[LookaheadState, Proposal]:
        check_own_tree(self, tree)
        batch = context.lengths.shape[0]
        last_B = jnp.take_along_axis(context.sequence, context.lengths[:, None] - 1,
                                     axis=1)[:, 0]
        trie = merge_into_trie(*self.candidates(state, last_B), self.num_candidate_nodes)
        # Window nodes in column order: (l, j) at j (N - 1) + l.
        window_BF = jnp.swapaxes(state.window, 1, 2).reshape(batch, -1)
        window_parents_BF = jnp.broadcast_to(self.window_parents(), window_BF.shape)
        tokens = jnp.concatenate([trie.tokens, window_BF], axis=1)
        return state, Proposal(
            tokens=jnp.minimum(tokens, vocab_size - 1), q=None,
            never_accept=jnp.concatenate([~trie.real, jnp.ones(window_BF.shape, bool)],
                                         axis=1),
            parents=jnp.concatenate([trie.parents, window_parents_BF], axis=1))

    def commit(self, state: LookaheadState, commit: Commit) -> LookaheadState:
        levels, base = self.drafted, self.num_candidate_nodes
        # The target's token after each column's last level (input index = node + 1).
        last_level_W = base + jnp.arange(self.window) * levels + levels - 1
        update_BW = commit.target_tokens[:, last_level_W + 1]
        update_BW = jnp.where(update_BW >= 0, update_BW, state.window[:, -1])
        # Column j with its update is an n-gram: window[0, j], then the rest.
        tails_BWL = jnp.concatenate([jnp.swapaxes(state.window[:, 1:], 1, 2),
                                     update_BW[:, :, None]], axis=2)
        for column in range(self.window):  # static: W insertions
            state = self.insert(state, state.window[:, 0, column], tails_BWL[:, column],
                                commit.active)
        # The n-grams that end in the newly committed tokens (at most N - 1 + 1 of them).
        for offset in range(levels + 1):
            end_B = commit.old_lengths + offset
            state = self.insert_text(state, commit.sequence, end_B,
                                     commit.active & (end_B < commit.new_lengths))
        moved = jnp.concatenate([state.window[:, 1:], update_BW[:, None, :]], axis=1)
        window = jnp.where(commit.active[:, None, None], moved, state.window)
        return dataclasses.replace(state, window=window)
