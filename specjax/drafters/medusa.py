"""Medusa heads (Cai et al. 2024): M extra heads on the target's last hidden state.

Head m reads the target's final hidden state h at the position whose distribution gave
the last committed token, and predicts the token m + 1 places after that one (m + 2
after h's own position): `logits_m = (h + SiLU(h W_m + b_m)) @ lm_head.T`, the target's
LM head shared (a residual block per head, initialised at zero so an untrained head starts
as the target's own next-token head). The heads do not see the drafts before them, so one
evaluation per step gives every depth: a chain takes each head's top-1 (or a sample from
it), a tree takes head d's top-k as the children of every depth-d node (a static tree,
or an EAGLE-2 dynamic tree scored by the heads' log-probabilities).

Exact at every temperature: sampled drafts carry the head's warped distribution as q,
argmax drafts a one-hot q, tree children are deterministic (accepted with probability
p(x)). Medusa's lossy "typical acceptance" is not offered: it changes the output
distribution.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.decoding.sampling import (
    SamplingConfig,
    SamplingParams,
    probabilities,
    row_keys,
    sample_from_probs,
    tree_scores,
)
from specjax.drafters.base import Commit, DraftContext, Proposal
from specjax.drafters.draft_model import DRAFT_METHODS
from specjax.drafters.eagle import accepted_feature_index
from specjax.drafters.head_files import (
    HEAD_LOADERS,
    HEAD_REMEDY,
    load_head,
    save_head,
)
from specjax.lm.causal_lm import CausalLM
from specjax.runtime.files import check_arrays, damaged
from specjax.trees.dynamic_trees import grow_from_depth_scores
from specjax.trees.shapes import DynamicTree, TreeShape


def init_medusa_params(num_heads: int, d_model: int) -> dict:
    """Zero residual blocks: every head starts as the target's LM head."""
    return {"w": jnp.zeros((num_heads, d_model, d_model), jnp.float32),
            "b": jnp.zeros((num_heads, d_model), jnp.float32)}


def medusa_logits(params: dict, lm_head_VD: Array | None, hidden_BD: Array) -> Array:
    """Float32 logits [B, M, V] of every head at hidden states [B, D] (any leading axes).

    params["w"] / ["b"]: [M, D, D] / [M, D] (one residual block per head), or
    [M, L, D, D] / [M, L, D] (L blocks per head, Medusa-1's `medusa_num_layers`);
    params["lm_heads"] [M, V, D], when present, is each head's own LM head (Medusa-1's
    published heads) in place of the target's `lm_head`."""
    w, b = params["w"], params["b"]
    if w.ndim == 3:
        w, b = w[:, None], b[:, None]
    heads = w.shape[0]
    h = hidden_BD.astype(jnp.float32)[..., None, :]
    h = jnp.broadcast_to(h, h.shape[:-2] + (heads, h.shape[-1]))
    for layer in range(w.shape[1]):  # static: the residual blocks in order
        bias = b[:, layer].reshape((1,) * (h.ndim - 2) + b[:, layer].shape)
        h = h + jax.nn.silu(jnp.einsum("...MD,MDE->...ME", h, w[:, layer]) + bias)
    if "lm_heads" in params:
        return jnp.einsum("...MD,MVD->...MV", h, params["lm_heads"].astype(jnp.float32))
    return jnp.einsum("...MD,VD->...MV", h, lm_head_VD.astype(jnp.float32))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MedusaState:
    """hidden float32 [B, D]: the target's final hidden state at the position whose
    distribution gave the last committed token."""

    hidden: Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class Medusa:
    """Medusa heads on a target. params: {"w": [M, D, D], "b": [M, D]} (or L blocks per
    head and own `lm_heads`, see `medusa_logits`); lm_head: the target's LM head [V, D]
    (`specjax_models.embedding_and_head(target)[1]`), or None when params hold every
    head's own `lm_heads` (Medusa-1's published heads). method:
    "greedy" (each head's argmax, one-hot q; the paper's choice) or "sample" (a draw from
    each head's warped distribution with that q). Chains of K <= M drafts; trees of depth
    <= M."""

    params: dict
    lm_head: Array | None
    method: str = dataclasses.field(default="greedy", metadata={"static": True})

    reads_target_features: ClassVar[bool] = True
    feature_layers: ClassVar[tuple] = ()
    drafts_trees: ClassVar[bool] = True
    drafts_dynamic_trees: ClassVar[bool] = True

    def __post_init__(self):
        if self.method not in DRAFT_METHODS:
            raise ValueError(f"method must be one of {DRAFT_METHODS}, got {self.method!r}")
        w = getattr(self.params.get("w"), "shape", None) if isinstance(self.params, dict) \
            else None
        if w is not None and (len(w) not in (3, 4) or w[-1] != w[-2]):
            raise ValueError(f"Medusa params['w'] must be [num_heads, D, D] or [num_heads, "
                             f"num_layers, D, D], got {w}")
        own = getattr(self.params.get("lm_heads"), "shape", None) \
            if isinstance(self.params, dict) else None
        if w is not None and own is not None and (len(own) != 3 or own[0] != w[0]
                                                  or own[2] != w[-1]):
            raise ValueError(f"Medusa params['lm_heads'] must be [num_heads={w[0]}, vocab, "
                             f"D={w[-1]}], got {own}")
        if self.lm_head is None and w is not None and own is None:
            raise ValueError("Medusa needs lm_head (the target's LM head) unless params "
                             "hold each head's own lm_heads")

    @classmethod
    def create(cls, num_heads: int, lm_head: Array, method: str = "greedy") -> Medusa:
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be a positive int, got {num_heads!r}")
        lm_head = jnp.asarray(lm_head)
        return cls(init_medusa_params(num_heads, lm_head.shape[1]), lm_head, method)

    @property
    def num_heads(self) -> int:
        return self.params["w"].shape[0]

    def with_params(self, params: dict) -> Medusa:
        return dataclasses.replace(self, params=params)

    def with_method(self, method: str) -> Medusa:
        return dataclasses.replace(self, method=method)

    @property
    def num_layers(self) -> int | None:
        """Residual blocks per head when params["w"] is [M, L, D, D]; None for [M, D, D]."""
        return self.params["w"].shape[1] if self.params["w"].ndim == 4 else None

    def save(self, directory: str | Path) -> None:
        fields = {"num_heads": self.num_heads, "d_model": int(self.params["w"].shape[-1])}
        if self.num_layers is not None:
            fields["num_layers"] = int(self.num_layers)
        if "lm_heads" in self.params:
            fields["vocab_size"] = int(self.params["lm_heads"].shape[1])
        save_head(directory, "medusa", fields, self.params)

    @classmethod
    def load(cls, directory: str | Path, lm_head: Array, method: str = "greedy") -> Medusa:
        kind, fields, params = load_head(directory)
        if kind != "medusa":
            raise ValueError(f"{directory} holds a {kind} head, not Medusa heads; load it "
                             f"with specjax.drafters.{HEAD_LOADERS.get(kind, kind)}.load")
        heads, d_model = fields.get("num_heads"), fields.get("d_model")
        if not all(isinstance(v, int) and v >= 1 for v in (heads, d_model)):
            raise damaged(Path(directory) / "head.json", f"gives num_heads {heads!r} and "
                          f"d_model {d_model!r}, expected positive integers", HEAD_REMEDY)
        layers, vocab = fields.get("num_layers"), fields.get("vocab_size")
        lead = (heads,) if layers is None else (heads, layers)
        expected = {"w": lead + (d_model, d_model), "b": lead + (d_model,)}
        if vocab is not None:
            expected["lm_heads"] = (heads, vocab, d_model)
        check_arrays(Path(directory) / "head.npz", params, expected, HEAD_REMEDY)
        if lm_head.shape[1] != d_model:
            raise ValueError(f"the Medusa heads in {directory} were trained on a target of "
                             f"width {d_model}; this target's LM head is "
                             f"{tuple(lm_head.shape)}: load them onto their target")
        return cls({name: jnp.asarray(value) for name, value in params.items()},
                   jnp.asarray(lm_head), method)

    # -- host-side checks --------------------------------------------------------------------
    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        own = self.params.get("lm_heads")
        if own is not None and own.shape[1] != target.vocab_size:
            raise ValueError(f"the Medusa heads' own LM heads have {own.shape[1]} rows but "
                             f"the target's vocab_size is {target.vocab_size}: the heads run "
                             "on the target they were trained for")
        if self.lm_head is not None and self.lm_head.shape[0] != target.vocab_size:
            raise ValueError(f"Medusa's lm_head has {self.lm_head.shape[0]} rows but the "
                             f"target's vocab_size is {target.vocab_size}: the heads run on "
                             "the target they were trained for")

    def _check_depth(self, depth: int, what: str) -> None:
        if depth > self.num_heads:
            raise ValueError(f"{what} needs {depth} Medusa heads but there are "
                             f"{self.num_heads}: head m drafts depth m + 1; lower it to "
                             f"<= {self.num_heads} or train more heads")

    def forwards_per_step(self, num_draft_tokens: int,
                          tree: TreeShape | DynamicTree | None = None) -> int:
        return 1  # every head at once

    # -- traced ------------------------------------------------------------------------------
    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array, capacity: int, *,
             features: Array) -> MedusaState:
        # The hidden state that gave the last prompt token: position length - 2 (none for a
        # one-token prompt: zeros, a poor but harmless guess).
        index_B = jnp.maximum(prompt_lengths_B - 2, 0)
        hidden_BD = jnp.take_along_axis(features, index_B[:, None, None], axis=1)[:, 0]
        hidden_BD = jnp.where((prompt_lengths_B >= 2)[:, None], hidden_BD, 0.0)
        return MedusaState(hidden_BD.astype(jnp.float32))

    def commit(self, state: MedusaState, commit: Commit) -> MedusaState:
        count_B = commit.new_lengths - commit.old_lengths
        feature_index_BW = accepted_feature_index(commit)
        last_B = jnp.take_along_axis(feature_index_BW, jnp.maximum(count_B - 1, 0)[:, None],
                                     axis=1)[:, 0]
        hidden_BD = jnp.take_along_axis(commit.target_hidden, last_B[:, None, None],
                                        axis=1)[:, 0].astype(jnp.float32)
        return MedusaState(jnp.where((count_B > 0)[:, None], hidden_BD, state.hidden))

    def propose(self, state: MedusaState, context: DraftContext, key: Array, *,
                num_draft_tokens: int, sampling: SamplingParams, vocab_size: int,
                tree: TreeShape | DynamicTree | None = None) -> tuple[MedusaState, Proposal]:
        logits_BMV = medusa_logits(self.params, self.lm_head, state.hidden)
        if isinstance(tree, DynamicTree):
            return state, self._dynamic_tree(logits_BMV, tree, sampling)
        if tree is not None:
            return state, self._static_tree(logits_BMV, tree)
        self._check_depth(num_draft_tokens, f"a chain of {num_draft_tokens} drafts")
        logits_BKV = logits_BMV[:, :num_draft_tokens]
        if self.method == "greedy" or sampling.greedy:
            tokens_BK = jnp.argmax(logits_BKV, axis=-1).astype(jnp.int32)
            return state, Proposal(tokens=tokens_BK, q=jax.nn.one_hot(
                tokens_BK, vocab_size, dtype=jnp.float32))
        q_BKV = probabilities(logits_BKV, sampling)
        batch = q_BKV.shape[0]
        depth_keys = jax.random.split(key, num_draft_tokens)
        tokens_BK = jnp.stack([sample_from_probs(row_keys(k, batch), q_BKV[:, d])
                               for d, k in enumerate(depth_keys)], axis=1)
        return state, Proposal(tokens=tokens_BK, q=q_BKV)

    def _static_tree(self, logits_BMV: Array, tree: TreeShape) -> Proposal:
        """Node at depth d and sibling rank r: head d - 1's r-th most probable token."""
        self._check_depth(tree.max_depth, f"a tree of depth {tree.max_depth}")
        rank_of, seen = [], {}
        for parent in tree.parents:
            rank_of.append(seen.get(parent, 0))
            seen[parent] = seen.get(parent, 0) + 1
        _, top_BMR = jax.lax.top_k(logits_BMV[:, :tree.max_depth], tree.max_branching)
        depth_N = np.asarray(tree.depths) - 1
        tokens_BN = top_BMR[:, depth_N, np.asarray(rank_of)].astype(jnp.int32)
        return Proposal(tokens=tokens_BN, q=None,
                        never_accept=jnp.zeros(tokens_BN.shape, bool))

    def _dynamic_tree(self, logits_BMV: Array, tree: DynamicTree,
                      sampling: SamplingParams) -> Proposal:
        """Every frontier node's children come from the head of the next depth."""
        self._check_depth(tree.max_depth, f"a dynamic tree of depth {tree.max_depth}")
        tokens_BN, parents_BN = grow_from_depth_scores(tree, tree_scores(logits_BMV, sampling))
        return Proposal(tokens=tokens_BN, q=None, parents=parents_BN)
