"""EAGLE-1, EAGLE-3 and MTP heads: a one-layer decoder over the target's own features with
its own KV cache (`specjax.drafters.feature_head` has the maths).

Cache bookkeeping. The head's cache slot t holds the pair (feature of position t - 1,
token t) (the feature before position 0 is zero). After every commit the cache holds the
pairs of every committed token, and `root_hidden` is the head's output at the last one
(its logits predict the next token). The commit learns the target's features of the
verified positions (`Commit.target_hidden`): the last committed token's, then those of
the accepted nodes, which are exactly the features the new pairs need, so one head forward
over the accepted tokens (width = the path's depth + 1) brings the cache up to date; that
is the first of the step's draft forwards. Drafted pairs are written past the committed
length (scratch, overwritten by the next commit), so a rejected draft never leaves stale
entries behind: the peers' most common bug (a draft cache still holding drafted pairs
after verification) cannot happen, and `tests/test_eagle.py` checks the cache against one
built from scratch.

Proposals: chains (drafts sampled from the head's warped distribution with that q, or its
argmax with a one-hot q), static trees (children sampled without replacement, or top-k),
and EAGLE-2 dynamic trees (top-k, grown by `specjax.trees.dynamic_trees`). All are exact.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.decoding.sampling import (
    SamplingConfig,
    SamplingParams,
    draw_with_q,
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
from specjax.drafters.draft_model import (
    DRAFT_METHODS,
    draw_children,
    empty_tree_draws,
    place_children,
)
from specjax.drafters.feature_head import (
    FeatureHeadConfig,
    fuse_features,
    head_block,
    head_inputs,
    head_logits,
    init_head_cache,
    init_head_params,
)
from specjax.drafters.head_files import (
    DRAFT_VOCAB_KEY,
    HEAD_LOADERS,
    HEAD_REMEDY,
    OWN_EMBEDDING_KEY,
    OWN_LM_HEAD_KEY,
    check_head_arrays,
    head_config_from,
    load_head,
    restrict_lm_head,
    save_head,
)
from specjax.drafters.model_block import ModelBlock
from specjax.lm.causal_lm import CausalLM
from specjax.runtime.files import damaged
from specjax.trees.dynamic_trees import ExpandedNodes, frontier, grow_dynamic_tree
from specjax.trees.shapes import DynamicTree, TreeShape, ancestor_mask

# Slots past the target's capacity in the head's cache: a dynamic tree re-feeds every
# expanded node (top_k * (max_depth - 1)), which may exceed the step's N + 1 scratch slots.
HEAD_SCRATCH_SLOTS = 64


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EagleState:
    """cache: the head's KV cache, `(keys, values)` each [B, S, H_kv, hd] for specjax's own
    block, or the model block's cache (`Eagle.block`); cache_lengths int32 [B]: pairs
    committed in it (the committed length); root_hidden float32 [B, D]: the head's output
    at the last committed token."""

    cache: Any
    cache_lengths: Array
    root_hidden: Array

    @property
    def keys(self) -> Array:
        """The own block's keys [B, S, H_kv, hd]."""
        return self.cache[0]

    @property
    def values(self) -> Array:
        """The own block's values [B, S, H_kv, hd]."""
        return self.cache[1]


def accepted_feature_index(commit: Commit) -> Array:
    """int32 [B, D + 1]: for the i-th token committed by this step, the verified position
    whose target feature precedes it (0 = the previous last token, then the path's nodes,
    node j at position j + 1)."""
    path_BD = commit.path
    batch = path_BD.shape[0]
    return jnp.concatenate([jnp.zeros((batch, 1), jnp.int32),
                            jnp.maximum(path_BD, 0).astype(jnp.int32) + 1], axis=1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class Eagle:
    """A feature head drafter: EAGLE-1 (`kind="eagle1"`), EAGLE-3 (`"eagle3"`, fusing three
    target layers) or an MTP module reused recursively (`"mtp"`).

    params: the head's trainable parameters (`feature_head.init_head_params`).
    embedding / lm_head: the target's token embedding and LM head, both [V, D] (frozen;
      `specjax_models.embedding_and_head(target)` returns them).
    draft_vocab: optional int32 [V'] target ids (EAGLE-3's reduced draft vocabulary): the
      head then scores only those ids, through the rows `lm_head[draft_vocab]`, which is
      V / V' times cheaper per draft forward for a large vocabulary; every other id gets
      draft probability 0 (q is exactly the distribution drawn from, so still exact).
    config: the head's static shape. method: "sample" (draft from the head's warped
      distribution, q = that distribution) or "greedy" (argmax, one-hot q); trees use
      sampled or top-k children likewise, dynamic trees always top-k.
    min_confidence: chains only: offer only the leading drafts the head is confident in,
      by `DraftModel`'s rule (`confident_drafts`); None (default) offers all K.
    block: None (the head's own block, from `params`), or a `ModelBlock`: the block is
      the model's code (DeepSeek-V3's MTP module: latent attention and experts;
      `specjax_models.load_drafter`). `params` then holds only the MTP input and output
      (embed_norm, feature_norm, proj, final_norm) of a kind "mtp" head. With
      `config.first_pair=False` the slot-0 pair never enters the block's cache (its slot
      s holds head slot s + 1), which hides it from every later position.
    """

    params: dict
    embedding: Array
    lm_head: Array
    config: FeatureHeadConfig = dataclasses.field(metadata={"static": True})
    method: str = dataclasses.field(default="sample", metadata={"static": True})
    draft_vocab: Array | None = None
    min_confidence: float | None = None  # data: a float32 leaf (see confidence_leaf)
    block: ModelBlock | None = None

    reads_target_features: ClassVar[bool] = True
    drafts_trees: ClassVar[bool] = True
    drafts_dynamic_trees: ClassVar[bool] = True
    takes_draft_budget: ClassVar[bool] = True  # chains: AdaptiveLength's draft_budget

    def __post_init__(self):
        if not isinstance(self.config, FeatureHeadConfig):
            raise TypeError(f"config must be a FeatureHeadConfig, got {type(self.config)}")
        if self.method not in DRAFT_METHODS:
            raise ValueError(f"method must be one of {DRAFT_METHODS}, got {self.method!r}")
        object.__setattr__(self, "min_confidence", confidence_leaf(self.min_confidence))
        for name in ("embedding", "lm_head"):
            shape = getattr(getattr(self, name), "shape", None)
            if shape is not None and (len(shape) != 2 or shape[1] != self.config.d_model):
                raise ValueError(f"{name} must be [vocab, d_model={self.config.d_model}], got "
                                 f"{tuple(shape)}")
        if self.block is not None:
            if not isinstance(self.block, ModelBlock):
                raise TypeError(f"block must be a specjax.drafters.ModelBlock (or None), got "
                                f"{type(self.block).__name__}")
            if self.config.kind != "mtp" or self.config.norm_output:
                raise ValueError("a model block serves an MTP head (kind 'mtp', no "
                                 f"norm_output), got kind {self.config.kind!r}")
            if self.block.d_model != self.config.d_model:
                raise ValueError(f"the model block is {self.block.d_model} wide but the head "
                                 f"is {self.config.d_model} wide")

    @classmethod
    def create(cls, config: FeatureHeadConfig, embedding: Array, lm_head: Array, key: Array,
               method: str = "sample", draft_vocab=None) -> Eagle:
        """A randomly initialised head (train it with `specjax.training.train_head`).
        `lm_head` is the target's full [V, D] head; with `draft_vocab` (target ids) the head
        keeps only those rows."""
        lm_head, draft_vocab = restrict_lm_head(jnp.asarray(lm_head), draft_vocab)
        return cls(init_head_params(config, key), jnp.asarray(embedding), lm_head, config,
                   method, draft_vocab)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.config.feature_layers

    @property
    def graded_num_real(self) -> bool:
        """With min_confidence, a chain's step verifies any number of drafts from 0 to K."""
        return self.min_confidence is not None

    def with_params(self, params: dict) -> Eagle:
        return dataclasses.replace(self, params=params)

    def with_method(self, method: str) -> Eagle:
        return dataclasses.replace(self, method=method)

    # -- saving ------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        """Write `head.json` (kind, config) and `head.npz` (float32 parameters, and the draft
        vocabulary if any); the target's embedding and LM head are not saved (the head is
        loaded onto its target), the head's own ones are (`config.own_lm_head`,
        `own_embedding`: a published EAGLE-3 head's LM head). A head whose block is model
        code (`block`) is refused: it loads from its checkpoint."""
        if self.block is not None:
            raise ValueError("this MTP head's block is model code (DeepSeek's MTP module): "
                             "it is not saved as a head file; load it again from its "
                             "checkpoint with specjax_models.load_drafter")
        extra = {} if self.draft_vocab is None else {DRAFT_VOCAB_KEY: self.draft_vocab}
        if self.config.own_lm_head:
            extra[OWN_LM_HEAD_KEY] = self.lm_head
        if self.config.own_embedding:
            extra[OWN_EMBEDDING_KEY] = self.embedding
        save_head(directory, "eagle", self.config.to_dict(), {**self.params, **extra})

    @classmethod
    def load(cls, directory: str | Path, embedding: Array, lm_head: Array,
             method: str = "sample") -> Eagle:
        kind, fields, params = load_head(directory)
        if kind != "eagle":
            loader = HEAD_LOADERS.get(kind, kind)
            raise ValueError(f"{directory} holds a {kind} head, not an EAGLE/MTP head; load "
                             f"it with specjax.drafters.{loader}.load")
        directory = Path(directory)
        config = head_config_from(directory, fields)
        draft_vocab = params.pop(DRAFT_VOCAB_KEY, None)
        own = {key: params.pop(key, None) for key in (OWN_LM_HEAD_KEY, OWN_EMBEDDING_KEY)}
        for key, flag in ((OWN_LM_HEAD_KEY, config.own_lm_head),
                          (OWN_EMBEDDING_KEY, config.own_embedding)):
            if flag and (own[key] is None or own[key].ndim != 2
                         or own[key].shape[1] != config.d_model):
                raise damaged(directory / "head.npz", f"its config names its own {key} but "
                              f"the archive holds {None if own[key] is None else own[key].shape}"
                              f", expected [rows, {config.d_model}]", HEAD_REMEDY)
        check_head_arrays(directory, config, params, draft_vocab)
        if embedding.shape[1] != config.d_model or lm_head.shape[1] != config.d_model:
            raise ValueError(f"the head in {directory} was trained on a target of width "
                             f"{config.d_model}; this target's embedding is "
                             f"{tuple(embedding.shape)}: load it onto the target it was "
                             "trained for")
        params = {name: jnp.asarray(value) for name, value in params.items()}
        if config.own_embedding:
            embedding = own[OWN_EMBEDDING_KEY]
        if config.own_lm_head:  # its rows are the draft vocabulary's already
            lm_head = jnp.asarray(own[OWN_LM_HEAD_KEY])
            rows = lm_head.shape[0]
            if draft_vocab is not None and rows != len(draft_vocab):
                raise damaged(directory / "head.npz", f"its own LM head has {rows} rows for "
                              f"a {len(draft_vocab)}-id draft vocabulary", HEAD_REMEDY)
            draft_vocab = None if draft_vocab is None else jnp.asarray(
                draft_vocab_ids(draft_vocab, embedding.shape[0]))
        else:
            lm_head, draft_vocab = restrict_lm_head(jnp.asarray(lm_head), draft_vocab)
        return cls(params, jnp.asarray(embedding), lm_head, config, method, draft_vocab)

    # -- host-side checks --------------------------------------------------------------------
    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        if self.draft_vocab is not None:
            ids = np.asarray(self.draft_vocab)
            if ids.size and (ids.min() < 0 or ids.max() >= target.vocab_size):
                raise ValueError(f"the head's draft_vocab holds ids outside the target's "
                                 f"vocabulary [0, {target.vocab_size})")
        for name in ("embedding",) if self.draft_vocab is not None else ("embedding",
                                                                          "lm_head"):
            rows = getattr(self, name).shape[0]
            if rows != target.vocab_size:
                raise ValueError(f"the head's {name} has {rows} rows but the target's "
                                 f"vocab_size is {target.vocab_size}: a feature head runs on "
                                 "the target it was built for (take embedding and lm_head "
                                 "from that target)")

    def forwards_per_step(self, num_draft_tokens: int,
                          tree: TreeShape | DynamicTree | None = None) -> int:
        # The commit's forward over the accepted tokens gives the first level.
        return num_draft_tokens if tree is None else tree.max_depth

    # -- traced ------------------------------------------------------------------------------
    def _features(self, hidden: Array) -> Array:
        return fuse_features(self.params, self.config, hidden)

    @property
    def _block_slot_offset(self) -> int:
        """Head slot minus block cache slot: 1 where a model block hides the first pair by
        never storing it (`first_pair=False`), else 0."""
        return 0 if self.block is None or self.config.first_pair else 1

    def _init_cache(self, batch: int, slots: int):
        if self.block is None:
            return init_head_cache(self.config, batch, slots)
        return self.block.init_cache(batch, slots)

    def _block(self, tokens_BT, features_BTD, positions_BT, cache, cache_lengths_B,
               new_mask_BTT=None):
        """`(out float32 [B, T, D], cache)` for the pairs at head slots `cache_lengths[b] + t`
        (`cache=None`: the T pairs alone)."""
        inputs = head_inputs(self.params, self.config, self.embedding, tokens_BT, features_BTD,
                             positions_BT)
        if self.block is None:
            return head_block(self.params, self.config, inputs, positions_BT, cache,
                              cache_lengths_B, new_mask_BTT)
        starts_B = None if cache is None else cache_lengths_B - self._block_slot_offset
        out_BTD, cache = self.block.apply(inputs[0], positions_BT, cache, starts_B,
                                          new_mask_BTT)
        return out_BTD.astype(jnp.float32), cache

    def _logits(self, out: Array) -> Array:
        """Float32 logits over the target's vocabulary (-inf outside a draft vocabulary)."""
        logits = head_logits(self.params, self.config, self.lm_head, out)
        if self.draft_vocab is None:
            return logits
        return scatter_to_vocab(logits, self.draft_vocab, self.embedding.shape[0])

    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array, capacity: int, *,
             features: Array) -> EagleState:
        batch, width = prompt_tokens_BP.shape
        fused_BPD = self._features(features)
        previous_BPD = jnp.concatenate([jnp.zeros_like(fused_BPD[:, :1]), fused_BPD[:, :-1]],
                                       axis=1)
        cache = self._init_cache(batch, capacity + HEAD_SCRATCH_SLOTS)
        positions_BP = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch, width))
        if self._block_slot_offset == 0:
            out_BPD, cache = self._block(prompt_tokens_BP, previous_BPD, positions_BP, cache,
                                         jnp.zeros((batch,), jnp.int32))
        else:
            # The slot-0 pair stays out of the block's cache: its output (the root of a
            # one-token prompt) from a forward of its own, the others written from slot 0.
            out_BPD, _ = self._block(prompt_tokens_BP[:, :1], previous_BPD[:, :1],
                                     positions_BP[:, :1], None, None)
            if width > 1:
                rest_BPD, cache = self._block(prompt_tokens_BP[:, 1:], previous_BPD[:, 1:],
                                              positions_BP[:, 1:], cache,
                                              jnp.ones((batch,), jnp.int32))
                out_BPD = jnp.concatenate([out_BPD, rest_BPD], axis=1)
        root_BD = jnp.take_along_axis(out_BPD, (prompt_lengths_B - 1)[:, None, None],
                                      axis=1)[:, 0]
        return EagleState(cache, prompt_lengths_B.astype(jnp.int32), root_BD)

    def commit(self, state: EagleState, commit: Commit) -> EagleState:
        """One head forward over this step's committed tokens (pairs at positions
        old_length ...), each with the target feature that precedes it."""
        old_B, new_B = commit.old_lengths, commit.new_lengths
        feature_index_BW = accepted_feature_index(commit)
        batch, width = feature_index_BW.shape
        fused_BND = self._features(commit.target_hidden)
        features_BWD = jnp.take_along_axis(fused_BND, feature_index_BW[:, :, None], axis=1)
        positions_BW = old_B[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
        tokens_BW = jnp.take_along_axis(
            commit.sequence, jnp.minimum(positions_BW, commit.sequence.shape[1] - 1), axis=1)
        out_BWD, cache = self._block(tokens_BW, features_BWD, positions_BW, state.cache, old_B)
        count_B = new_B - old_B
        last_BD = jnp.take_along_axis(out_BWD, jnp.maximum(count_B - 1, 0)[:, None, None],
                                      axis=1)[:, 0]
        root_BD = jnp.where((count_B > 0)[:, None], last_BD, state.root_hidden)
        return EagleState(cache, new_B.astype(jnp.int32), root_BD)

    def _draw(self, key, logits_BV, sampling):
        return draw_with_q(key, logits_BV, sampling, deterministic=self.method == "greedy")


    def propose(self, state: EagleState, context: DraftContext, key: Array, *,
                num_draft_tokens: int, sampling: SamplingParams, vocab_size: int,
                tree: TreeShape | DynamicTree | None = None, draft_budget: Array | None = None
                ) -> tuple[EagleState, Proposal]:
        """K drafts (a chain; only the first `draft_budget` when given: `AdaptiveLength`;
        the drafted pairs are scratch past the committed length, so stopping early keeps
        the cache right), or the nodes of `tree`."""
        if isinstance(tree, DynamicTree):
            return self._propose_dynamic_tree(state, tree, sampling)
        if tree is not None:
            return self._propose_tree(state, key, tree, sampling, vocab_size)
        step_keys = jax.random.split(key, num_draft_tokens)
        root_logits_BV = self._logits(state.root_hidden)
        token_B, q_BV = self._draw(step_keys[0], root_logits_BV, sampling)

        def draft_one(carry, step_key):
            cache, token_B, feature_BD, position_B = carry
            out_B1D, cache = self._block(token_B[:, None], feature_BD[:, None],
                                         position_B[:, None], cache, position_B)
            logits_BV = self._logits(out_B1D[:, 0])
            next_B, q_BV = self._draw(step_key, logits_BV, sampling)
            confidence = () if self.min_confidence is None else (
                token_confidence(logits_BV, next_B),)
            return (cache, next_B, out_B1D[:, 0], position_B + 1), (next_B, q_BV, *confidence)

        lengths_B = state.cache_lengths
        (cache, _, _, _), (rest_KB, rest_q_KBV, *rest_confidence) = draft_chain(
            draft_one, (state.cache, token_B, state.root_hidden, lengths_B),
            step_keys[1:], None if draft_budget is None else draft_budget - 1)
        tokens_BK = jnp.concatenate([token_B[:, None], rest_KB.T], axis=1)
        q_BKV = jnp.concatenate([q_BV[:, None], jnp.transpose(rest_q_KBV, (1, 0, 2))], axis=1)
        num_real_B = None
        if self.min_confidence is not None:  # static
            confidence_BK = jnp.concatenate(
                [token_confidence(root_logits_BV, token_B)[:, None],
                 jnp.swapaxes(rest_confidence[0], 0, 1)], axis=1)
            num_real_B = confident_drafts(confidence_BK, self.min_confidence)
        return (dataclasses.replace(state, cache=cache),
                Proposal(tokens=tokens_BK, q=q_BKV, num_real=num_real_B))

    def _propose_tree(self, state: EagleState, key: Array, tree: TreeShape,
                      sampling: SamplingParams, vocab_size: int):
        """Level by level: the root's children from the head's output at the last committed
        token; each later forward feeds the nodes up to depth d (each with its parent's
        output as its feature, attending to its ancestors) and gives the children of the
        depth-d nodes."""
        lengths_B, root_BD = state.cache_lengths, state.root_hidden
        batch, num_nodes = lengths_B.shape[0], tree.num_nodes
        children_of: dict[int, list[int]] = {}
        for node, parent in enumerate(tree.parents):
            children_of.setdefault(parent, []).append(node)
        node_keys = jax.random.split(key, num_nodes + 1)
        deterministic = self.method == "greedy" or sampling.greedy
        tokens_BN, q_BNV, never_BN = empty_tree_draws(batch, num_nodes, vocab_size,
                                                      deterministic)

        def add_children(parent, logits_BV, tokens_BN, q_BNV, never_BN):
            nodes = children_of.get(parent, [])
            if not nodes:
                return tokens_BN, q_BNV, never_BN
            return place_children((tokens_BN, q_BNV, never_BN), nodes, draw_children(
                node_keys[parent + 1], logits_BV, len(nodes), sampling,
                deterministic=deterministic))

        tokens_BN, q_BNV, never_BN = add_children(-1, self._logits(root_BD), tokens_BN, q_BNV,
                                                  never_BN)
        depths = tree.depths
        parents_N = np.asarray(tree.parents)
        node_mask_NN = ancestor_mask(tree.parents_array(1))[0, 1:, 1:]
        positions_BN = (lengths_B - 1)[:, None] + jnp.asarray(depths, jnp.int32)[None]
        outputs_BND = jnp.zeros((batch, num_nodes) + root_BD.shape[1:], jnp.float32)
        cache = state.cache
        for level in range(1, tree.max_depth):  # static
            width = 1 + max(i for i, d in enumerate(depths) if d <= level)
            features_BWD = jnp.concatenate([root_BD[:, None], outputs_BND], axis=1)[
                :, parents_N[:width] + 1]
            mask_BTT = jnp.broadcast_to(node_mask_NN[:width, :width], (batch, width, width))
            out_BWD, cache = self._block(tokens_BN[:, :width], features_BWD,
                                         positions_BN[:, :width], cache, lengths_B, mask_BTT)
            outputs_BND = outputs_BND.at[:, :width].set(out_BWD)
            for node in range(width):
                if depths[node] == level:
                    tokens_BN, q_BNV, never_BN = add_children(
                        node, self._logits(out_BWD[:, node]), tokens_BN, q_BNV, never_BN)
        return (dataclasses.replace(state, cache=cache),
                Proposal(tokens=tokens_BN, q=q_BNV, never_accept=never_BN))

    def _propose_dynamic_tree(self, state: EagleState, tree: DynamicTree,
                              sampling: SamplingParams):
        """EAGLE-2: grow each row's tree from the head's top-k (see
        `specjax.trees.dynamic_trees`); each expansion re-feeds the expanded nodes, each with its
        parent's output as its feature."""
        fed = tree.top_k * (tree.max_depth - 1)
        if fed > tree.num_nodes + 1 + HEAD_SCRATCH_SLOTS:
            raise ValueError(f"a DynamicTree with top_k={tree.top_k} and max_depth="
                             f"{tree.max_depth} feeds {fed} nodes to the head, more than its "
                             f"cache's scratch room ({tree.num_nodes + 1 + HEAD_SCRATCH_SLOTS}"
                             "); lower top_k or max_depth, or raise num_nodes")
        lengths_B, root_BD = state.cache_lengths, state.root_hidden

        def expand(carry, nodes: ExpandedNodes, depth):
            cache, outputs_BFD = carry
            known_BFD = jnp.concatenate([root_BD[:, None], outputs_BFD], axis=1)
            features_BFD = jnp.take_along_axis(known_BFD, (nodes.parents + 1)[:, :, None],
                                               axis=1)
            mask_BFF = ancestor_mask(nodes.parents)[:, 1:, 1:]
            positions_BF = (lengths_B - 1)[:, None] + nodes.depths
            out_BFD, cache = self._block(nodes.tokens, features_BFD, positions_BF, cache,
                                         lengths_B, mask_BFF)
            frontier_BkV = self._logits(frontier(out_BFD, depth, tree.top_k))
            return (cache, out_BFD.astype(outputs_BFD.dtype)), tree_scores(frontier_BkV,
                                                                           sampling)

        # The previous expansion's outputs, one per fed node (none yet: the root's feature
        # is all a first expansion reads).
        outputs_BFD = jnp.zeros((root_BD.shape[0], fed, root_BD.shape[1]), jnp.float32)
        (cache, _), tokens_BN, parents_BN = grow_dynamic_tree(
            tree, tree_scores(self._logits(root_BD), sampling), expand,
            (state.cache, outputs_BFD))
        return (dataclasses.replace(state, cache=cache),
                Proposal(tokens=tokens_BN, q=None, parents=parents_BN))


def most_frequent_tokens(tokens, size: int) -> np.ndarray:
    """The `size` most frequent ids in `tokens` (ties: the smaller id), sorted: EAGLE-3's
    draft vocabulary, chosen from the training data."""
    counts = np.bincount(np.asarray(tokens).reshape(-1))
    order = np.lexsort((np.arange(counts.size), -counts))
    return np.sort(order[:min(size, counts.size)])
