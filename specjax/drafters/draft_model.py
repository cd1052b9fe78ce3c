"""An independent draft model (Leviathan et al. 2022, Chen et al. 2023) with its own cache.

Cache bookkeeping. Like the target, the draft cache holds committed tokens and the last
committed token is fed at the next step. After a step that accepted all K drafts plus the
bonus, the draft never saw the K-th draft (it only fed the last token and drafts
1..K-1), so it lags by one token. Rather than a data-dependent branch, the first draft
forward of every step takes TWO tokens per row: either the missing token and the last
one (lag 1), or the last one and a scratch token whose output is ignored and whose slot
the next draft overwrites (lag 0). Static shapes, no `lax.cond`, one code path.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.decoding.sampling import (
    SamplingConfig,
    SamplingParams,
    draw_with_q,
    probabilities,
    row_keys,
    sample_from_probs,
    sampling_params,
    tree_scores,
)
from specjax.drafters.base import (
    Commit,
    DraftContext,
    Proposal,
    confidence_leaf,
    confident_drafts,
    draft_chain,
    draft_vocab_ids,
    scatter_to_vocab,
    token_confidence,
)
from specjax.lm.causal_lm import CausalLM, prefill
from specjax.runtime.sharding import place_like_target
from specjax.trees.dynamic_trees import ExpandedNodes, frontier, grow_dynamic_tree
from specjax.trees.shapes import DynamicTree, TreeShape, ancestor_mask

DRAFT_METHODS = ("sample", "greedy")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DraftModelState:
    """cache: the draft's cache. cache_lengths: int32 [B], committed tokens in it (one or
    two short of the committed length, see the module docstring)."""

    cache: Any
    cache_lengths: Array


def fit_vocab(logits_BV: Array, vocab_size: int) -> Array:
    """Draft logits over the target's vocabulary: extra draft ids are dropped; target ids
    the draft lacks get -inf (zero draft probability)."""
    draft_vocab = logits_BV.shape[-1]
    if draft_vocab > vocab_size:
        return logits_BV[..., :vocab_size]
    if draft_vocab < vocab_size:
        pad = jnp.full(logits_BV.shape[:-1] + (vocab_size - draft_vocab,), -jnp.inf,
                       logits_BV.dtype)
        return jnp.concatenate([logits_BV, pad], axis=-1)
    return logits_BV


def empty_tree_draws(batch: int, num_nodes: int, vocab_size: int, deterministic: bool):
    """A static tree's arrays before any node is drawn: `(tokens [B, N], q [B, N, V] or
    None when drafts are deterministic, never_accept [B, N])`."""
    q_BNV = None if deterministic else jnp.zeros((batch, num_nodes, vocab_size), jnp.float32)
    return jnp.zeros((batch, num_nodes), jnp.int32), q_BNV, jnp.zeros((batch, num_nodes), bool)


def place_children(draws, nodes: list[int], children):
    """`draws` (`empty_tree_draws`' arrays) with `children` (`draw_children`' tokens, q,
    never_accept) written at the tree nodes `nodes`."""
    tokens_BN, q_BNV, never_BN = draws
    toks, qs, never = children
    index = jnp.asarray(nodes)
    return (tokens_BN.at[:, index].set(toks),
            None if q_BNV is None else q_BNV.at[:, index].set(qs),
            never_BN.at[:, index].set(never))


def draw_children(key: Array, logits_BV: Array, ranks: int,
                  sampling: SamplingConfig | SamplingParams, *, deterministic: bool):
    """`ranks` children of one tree node from draft logits over the target's vocabulary:
    `(tokens [B, R], q [B, R, V] or None, never_accept [B, R])`.

    Deterministic (`deterministic`, or every row greedy): the draft's top `ranks` tokens,
    q None. Sampled: drawn without replacement from the warped draft distribution, the
    r-th from it without the first r (that is its q). When the distribution has fewer
    than `ranks` tokens (top-k, top-p), the extra children get token 0 and are marked
    never-accept: the target evaluates them, the walk skips them, so the verification
    stays exact. In a batch that mixes greedy and sampled rows, greedy rows get the
    top `ranks` tokens with one-hot q (a deterministic child, accepted with p(x)).
    """
    logits_BV = logits_BV.astype(jnp.float32)
    batch, vocab_size = logits_BV.shape
    _, top_BR = jax.lax.top_k(logits_BV, ranks)
    top_BR = top_BR.astype(jnp.int32)
    params = sampling_params(sampling, batch)
    if deterministic or params.greedy:
        return top_BR, None, jnp.zeros((batch, ranks), bool)
    tokens_BR, q_BRV, never_BR = _sample_children(key, probabilities(logits_BV, params), ranks)
    greedy_B = params.row_greedy
    if isinstance(greedy_B, np.ndarray) and not greedy_B.any():
        return tokens_BR, q_BRV, never_BR
    greedy_B = jnp.broadcast_to(greedy_B, (batch,))
    return (jnp.where(greedy_B[:, None], top_BR, tokens_BR),
            jnp.where(greedy_B[:, None, None],
                      jax.nn.one_hot(top_BR, vocab_size, dtype=jnp.float32), q_BRV),
            never_BR & ~greedy_B[:, None])


def _sample_children(key: Array, q_BV: Array, ranks: int):
    """`ranks` tokens drawn without replacement from `q_BV` (see `draw_children`)."""
    batch, vocab_size = q_BV.shape
    tokens, qs, never = [], [], []
    for rank_key in jax.random.split(key, ranks):
        mass_B = jnp.sum(q_BV, axis=-1)
        empty_B = mass_B <= 0
        q_r_BV = q_BV / jnp.where(empty_B, 1.0, mass_B)[:, None]
        token_B = jnp.where(empty_B, 0, sample_from_probs(row_keys(rank_key, batch),
                                                          jnp.where(empty_B[:, None],
                                                                    1.0, q_r_BV)))
        tokens.append(token_B)
        qs.append(jnp.where(empty_B[:, None], 0.0, q_r_BV))
        never.append(empty_B)
        q_BV = jnp.where(jnp.arange(vocab_size)[None] == token_B[:, None], 0.0, q_BV)
    return jnp.stack(tokens, axis=1), jnp.stack(qs, axis=1), jnp.stack(never, axis=1)


def check_draft_fields(drafter) -> None:
    """The checks every draft-model drafter (`DraftModel`, `ParallelDraft`) makes of its
    `lm`, `method` and `min_confidence`; a listed `draft_vocab` becomes one int32 leaf."""
    name = type(drafter).__name__
    if not isinstance(drafter.lm, CausalLM):
        raise TypeError(f"{name} needs a specjax.CausalLM, got {type(drafter.lm).__name__}")
    if drafter.method not in DRAFT_METHODS:
        raise ValueError(f"method must be one of {DRAFT_METHODS}, got {drafter.method!r}")
    object.__setattr__(drafter, "min_confidence", confidence_leaf(drafter.min_confidence))
    if isinstance(drafter.draft_vocab, (list, tuple, np.ndarray)):  # one leaf, not many
        object.__setattr__(drafter, "draft_vocab", jnp.asarray(drafter.draft_vocab, jnp.int32))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class DraftModel:
    """Draft with a smaller causal LM that shares the target's tokenizer.

    method="sample": each draft token is drawn from the draft's distribution warped with
      the target's SamplingConfig, and that distribution is q.
    method="greedy": each draft token is the draft's argmax and q is one-hot on it
      (accept with probability p(x); on rejection sample from p with x removed).
    Both are exact. With a greedy target (temperature 0) both draft the argmax.

    Vocabularies may differ by padding (e.g. 151936 vs 152064): ids only the target has get
    zero draft probability, ids only the draft has are never drafted, and target tokens
    the draft lacks are fed to it as its last id (only draft quality changes). A larger
    difference than `max_vocab_padding` means different tokenizers and is refused.

    draft_vocab: optional int32 [V'] target ids (sorted, unique): the draft's LM head
      scores only those ids (`lm.vocab_size == V'`; column j of its logits is target id
      `draft_vocab[j]`), V / V' times cheaper per draft forward for a large vocabulary,
      while it reads every target id as input (its embedding covers the target's
      vocabulary, e.g. `specjax_models.select_layers(target, layers, draft_vocab=ids)`).
      Every other id gets draft probability 0 (q is exactly the distribution drawn
      from, so still exact).
    min_confidence: chains only: offer only the leading drafts whose score reaches this
      (draft j's: the draft's temperature-1 probabilities of drafts 1..j-1 times its top
      probability at j; never draft j's own probability, which would bias what is
      offered; `confident_drafts`), down to a one-token step when the first does not
      (`Proposal.num_real`; every width 0..K is its own compiled verify). Pays where a
      wider verify costs more than a one-token step (CPUs); None (default) offers all K.

    A pytree: the draft's parameters (and draft_vocab) are its leaves, `method` and
    `max_vocab_padding` static.
    """

    lm: CausalLM
    method: str = dataclasses.field(default="sample", metadata={"static": True})
    _: dataclasses.KW_ONLY
    max_vocab_padding: int = dataclasses.field(default=1024, metadata={"static": True})
    draft_vocab: Array | None = None
    min_confidence: float | None = None  # data: a float32 leaf (see confidence_leaf)

    def __post_init__(self):
        check_draft_fields(self)

    def placed_like(self, target: CausalLM) -> DraftModel:
        """This drafter with its draft split over the target's mesh by the target's rules
        (`specjax.sharding.place_like_target`); itself on one device."""
        lm = place_like_target(self.lm, target)
        return self if lm is self.lm else dataclasses.replace(self, lm=lm)

    # -- host-side checks ----------------------------------------------------------------
    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        if self.draft_vocab is not None:
            ids = draft_vocab_ids(self.draft_vocab, target.vocab_size)
            if not np.array_equal(np.asarray(ids), np.asarray(self.draft_vocab)):
                raise ValueError("draft_vocab must be sorted target ids (np.sort them, and "
                                 "order the draft's LM head rows the same way)")
            if ids.size != self.lm.vocab_size:
                raise ValueError(f"draft_vocab lists {ids.size} target ids but the draft's LM "
                                 f"head scores {self.lm.vocab_size}: column j of its logits "
                                 "must be target id draft_vocab[j]")
            return
        diff = abs(self.lm.vocab_size - target.vocab_size)
        if diff > self.max_vocab_padding:
            raise ValueError(
                f"draft vocab_size {self.lm.vocab_size} and target vocab_size "
                f"{target.vocab_size} differ by {diff} ids: draft and target must share a "
                "tokenizer. If one vocabulary really is a padded prefix of the other, pass "
                f"DraftModel(..., max_vocab_padding={diff})")

    @property
    def graded_num_real(self) -> bool:
        """With min_confidence, a chain's step verifies any number of drafts from 0 to K."""
        return self.min_confidence is not None

    # Trees: `propose(..., tree=TreeShape)` drafts every node of a static tree;
    # `tree=DynamicTree` grows an EAGLE-2 tree per row.
    drafts_trees: ClassVar[bool] = True
    drafts_dynamic_trees: ClassVar[bool] = True
    takes_draft_budget: ClassVar[bool] = True  # chains: AdaptiveLength's draft_budget

    def forwards_per_step(self, num_draft_tokens: int,
                          tree: TreeShape | DynamicTree | None = None) -> int:
        return num_draft_tokens if tree is None else tree.max_depth

    # -- traced ----------------------------------------------------------------------------
    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array,
             capacity: int) -> DraftModelState:
        batch = prompt_tokens_BP.shape[0]
        cache = self.lm.init_cache(batch, capacity)
        cache, cache_lengths, _, _ = prefill(self.lm, cache, self._clip(prompt_tokens_BP),
                                          prompt_lengths_B, keep_hidden=False)
        return DraftModelState(cache, cache_lengths.astype(jnp.int32))

    def _clip(self, tokens: Array) -> Array:
        if self.draft_vocab is not None:  # the draft embeds every target id
            return tokens
        return jnp.minimum(tokens, self.lm.vocab_size - 1)

    def target_logits(self, logits_BV: Array, vocab_size: int) -> Array:
        """The draft's float32 logits over the target's vocabulary."""
        if self.draft_vocab is not None:
            return scatter_to_vocab(logits_BV, self.draft_vocab, vocab_size)
        return fit_vocab(logits_BV.astype(jnp.float32), vocab_size)

    def _draw(self, key: Array, logits_BV: Array, sampling: SamplingParams,
              vocab_size: int) -> tuple[Array, Array]:
        return draw_with_q(key, self.target_logits(logits_BV, vocab_size), sampling,
                           deterministic=self.method == "greedy")

    def propose(self, state: DraftModelState, context: DraftContext, key: Array, *,
                num_draft_tokens: int, sampling: SamplingParams, vocab_size: int,
                tree: TreeShape | DynamicTree | None = None, draft_budget: Array | None = None
                ) -> tuple[DraftModelState, Proposal]:
        """K drafts per row (a chain; only the first `draft_budget` drafted when given,
        `AdaptiveLength`), or the nodes of `tree`."""
        if isinstance(tree, DynamicTree):
            return self._propose_dynamic_tree(state, context, tree, sampling, vocab_size)
        if tree is not None:
            return self._propose_tree(state, context, key, tree, sampling, vocab_size)
        lengths_B = context.lengths
        lag_B = (lengths_B - 1) - state.cache_lengths  # 0 or 1
        start_B = state.cache_lengths
        offsets_2 = jnp.arange(2, dtype=jnp.int32)
        first_tokens_B2 = jnp.take_along_axis(context.sequence,
                                              start_B[:, None] + offsets_2[None, :], axis=1)
        logits_B2V, _, cache = self.lm.apply(self._clip(first_tokens_B2),
                                             start_B[:, None] + offsets_2[None, :],
                                             state.cache, start_B)
        step_keys = jax.random.split(key, num_draft_tokens)
        first_logits_BV = jnp.take_along_axis(logits_B2V, lag_B[:, None, None], axis=1)[:, 0]
        token_B, q_BV = self._draw(step_keys[0], first_logits_BV, sampling, vocab_size)

        def draft_one(carry, step_key):
            cache, token_B, position_B = carry
            logits_B1V, _, cache = self.lm.apply(self._clip(token_B)[:, None],
                                                 position_B[:, None], cache, position_B)
            next_B, q_BV = self._draw(step_key, logits_B1V[:, 0], sampling, vocab_size)
            confidence = () if self.min_confidence is None else (
                self._confidence(logits_B1V[:, 0], next_B, vocab_size),)
            return (cache, next_B, position_B + 1), (next_B, q_BV, *confidence)

        (cache, _, _), (rest_KB, rest_q_KBV, *rest_confidence) = draft_chain(
            draft_one, (cache, token_B, lengths_B), step_keys[1:],
            None if draft_budget is None else draft_budget - 1)
        tokens_BK = jnp.concatenate([token_B[:, None], rest_KB.T], axis=1)
        q_BKV = jnp.concatenate([q_BV[:, None], jnp.transpose(rest_q_KBV, (1, 0, 2))], axis=1)
        num_real_B = None
        if self.min_confidence is not None:  # static
            confidence_BK = jnp.concatenate(
                [self._confidence(first_logits_BV, token_B, vocab_size)[:, None],
                 jnp.swapaxes(rest_confidence[0], 0, 1)], axis=1)
            num_real_B = confident_drafts(confidence_BK, self.min_confidence)
        # The draft fed the last committed token and drafts 1..K-1 (1..budget-1).
        fed = num_draft_tokens if draft_budget is None else jnp.clip(draft_budget, 1,
                                                                     num_draft_tokens)
        new_state = DraftModelState(cache, lengths_B - 1 + fed)
        return new_state, Proposal(tokens=tokens_BK, q=q_BKV, num_real=num_real_B)

    def _confidence(self, logits_BV: Array, token_B: Array, vocab_size: int) -> Array:
        """The draft's temperature-1 probability of each drafted (target) id and its top
        probability (`token_confidence`)."""
        return token_confidence(self.target_logits(logits_BV, vocab_size), token_B)

    def _children(self, key: Array, logits_BV: Array, ranks: int, sampling: SamplingParams,
                  vocab_size: int):
        """`ranks` children of one node (see `draw_children`)."""
        return draw_children(key, self.target_logits(logits_BV, vocab_size), ranks,
                             sampling, deterministic=self.method == "greedy")

    def _catch_up(self, state: DraftModelState, context: DraftContext,
                  depth: int) -> tuple[Any, Array]:
        """The first forward of a tree step: feed the D + 1 slots from the draft's cache
        length on (every committed token it has not seen, the last one, the root,
        included; the rest is scratch). Returns the cache and the logits at the root."""
        lengths_B, start_B = context.lengths, state.cache_lengths
        offsets_D1 = jnp.arange(depth + 1, dtype=jnp.int32)
        catch_up_BD1 = jnp.take_along_axis(
            context.sequence, jnp.minimum(start_B[:, None] + offsets_D1[None],
                                          context.sequence.shape[1] - 1), axis=1)
        logits_BD1V, _, cache = self.lm.apply(self._clip(catch_up_BD1),
                                              start_B[:, None] + offsets_D1[None],
                                              state.cache, start_B)
        root_logits_BV = jnp.take_along_axis(
            logits_BD1V, (lengths_B - 1 - start_B)[:, None, None], axis=1)[:, 0]
        return cache, root_logits_BV

    def _log_probs(self, logits_BV: Array, sampling: SamplingParams,
                   vocab_size: int) -> Array:
        """Scores for a dynamic tree over the target's vocabulary (`tree_scores`)."""
        return tree_scores(self.target_logits(logits_BV, vocab_size), sampling)

    def _propose_dynamic_tree(self, state: DraftModelState, context: DraftContext,
                              tree: DynamicTree, sampling: SamplingParams,
                              vocab_size: int) -> tuple[DraftModelState, Proposal]:
        """Grow an EAGLE-2 tree per row (`specjax.trees.dynamic_trees`) in `tree.max_depth` draft
        forwards: the catch-up forward gives the root's children; each later forward feeds
        every expanded node after the committed tokens (each attending to its ancestors)
        and gives the children of the newest frontier. As with static trees, the nodes'
        entries lie beyond the cache length: scratch, no compaction needed. The children
        are the draft's top-k whatever `method` says (see `DynamicTree`)."""
        lengths_B = context.lengths
        cache, root_logits_BV = self._catch_up(state, context, tree.max_depth)

        def expand(cache, nodes: ExpandedNodes, depth):
            mask_BFF = ancestor_mask(nodes.parents)[:, 1:, 1:]
            positions_BF = (lengths_B - 1)[:, None] + nodes.depths
            logits_BFV, _, cache = self.lm.apply(self._clip(nodes.tokens), positions_BF, cache,
                                                 lengths_B, mask_BFF)
            frontier_BkV = frontier(logits_BFV, depth, tree.top_k)
            return cache, self._log_probs(frontier_BkV, sampling, vocab_size)

        cache, tokens_BN, parents_BN = grow_dynamic_tree(
            tree, self._log_probs(root_logits_BV, sampling, vocab_size), expand, cache)
        return (DraftModelState(cache, lengths_B),
                Proposal(tokens=tokens_BN, q=None, parents=parents_BN))

    def _propose_tree(self, state: DraftModelState, context: DraftContext, key: Array,
                      tree: TreeShape, sampling: SamplingParams,
                      vocab_size: int) -> tuple[DraftModelState, Proposal]:
        """Draft every node of a static tree in `tree.max_depth` draft forwards.

        The first forward catches the cache up: it feeds the D + 1 slots from the draft's
        cache length on (every committed token it has not seen, the last one, the root,
        included; the rest is scratch), and its output at the root gives the root's
        children. Each later forward feeds the tree's nodes up to depth d after the
        committed tokens, each attending to its ancestors only (the tree mask), and gives
        the children of the depth-d nodes. The cache then holds every committed token; the
        tree's entries lie beyond its length, scratch that the next step overwrites, so no
        compaction is needed.
        """
        lengths_B = context.lengths
        batch, depth = lengths_B.shape[0], tree.max_depth
        cache, root_logits_BV = self._catch_up(state, context, depth)

        num_nodes = tree.num_nodes
        children_of = {}
        for node, parent in enumerate(tree.parents):
            children_of.setdefault(parent, []).append(node)
        node_keys = jax.random.split(key, num_nodes + 1)
        tokens_BN, q_BNV, never_BN = empty_tree_draws(
            batch, num_nodes, vocab_size, self.method == "greedy" or sampling.greedy)

        def add_children(parent, logits_BV, tokens_BN, q_BNV, never_BN):
            nodes = children_of.get(parent, [])
            if not nodes:
                return tokens_BN, q_BNV, never_BN
            return place_children((tokens_BN, q_BNV, never_BN), nodes, self._children(
                node_keys[parent + 1], logits_BV, len(nodes), sampling, vocab_size))

        tokens_BN, q_BNV, never_BN = add_children(-1, root_logits_BV, tokens_BN, q_BNV,
                                                   never_BN)
        depths = tree.depths
        node_mask_NN = ancestor_mask(tree.parents_array(1))[0, 1:, 1:]
        positions_BN = (lengths_B - 1)[:, None] + jnp.asarray(depths, jnp.int32)[None]
        for level in range(1, depth):  # static
            width = 1 + max(i for i, d in enumerate(depths) if d <= level)
            mask_BTT = jnp.broadcast_to(node_mask_NN[:width, :width], (batch, width, width))
            logits_BTV, _, cache = self.lm.apply(self._clip(tokens_BN[:, :width]),
                                                 positions_BN[:, :width], cache, lengths_B,
                                                 mask_BTT)
            for node in range(width):
                if depths[node] == level:
                    tokens_BN, q_BNV, never_BN = add_children(
                        node, logits_BTV[:, node], tokens_BN, q_BNV, never_BN)
        return (DraftModelState(cache, lengths_B),
                Proposal(tokens=tokens_BN, q=q_BNV, never_accept=never_BN))

    def commit(self, state: DraftModelState, commit: Commit) -> DraftModelState:
        # Committed tokens the draft has seen: all but the new last one, at most what it fed.
        return DraftModelState(state.cache,
                               jnp.minimum(commit.new_lengths - 1, state.cache_lengths))
