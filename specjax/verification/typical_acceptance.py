"""Typical acceptance (Medusa-2, Cai et al. 2024; vLLM's typical acceptance sampler): NOT
EXACT. It trades the target's distribution for acceptance, and is never a default.

A draft x at a position whose warped target distribution is p is accepted when

  p(x) > min(epsilon, delta * exp(-H(p))),      H(p) = -sum_v p(v) log p(v),

whatever the drafter's q: a confident target (low entropy) accepts only what it rates
highly, an unsure one accepts any plausible token. A chain keeps its longest accepted
prefix; a tree its deepest path of accepted nodes (the first such in the tree's order).
The next token is drawn from p where the path ends (its bonus or correction, with no
residual). At temperature 0, p is one-hot: only the argmax passes (epsilon and delta
below 1 are required), so greedy rows are greedy decoding exactly. How far the output is
from the target is measured, not tested: benchmarks/typical_acceptance_tv.py.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from jax import Array
from jaxtyping import Bool, Float, Int, Key

from specjax.decoding.sampling import row_keys, sample_from_probs
from specjax.trees.shapes import ancestor_mask, tree_depths
from specjax.verification.rejection import Acceptance, _leading_true, _within_limit
from specjax.verification.tree_acceptance import TreeAcceptance


@dataclasses.dataclass(frozen=True)
class TypicalAcceptance:
    """The lossy rule's two parameters (Medusa's posterior_threshold and posterior_alpha,
    whose published defaults these are): `epsilon`, the hard threshold, and `delta`, the
    entropy-scaled one, both in (0, 1). Pass as `verification=TypicalAcceptance(...)`."""

    epsilon: float = 0.09
    delta: float = 0.3

    name = "typical (not exact)"  # the rule's name; `label` adds its settings

    @property
    def label(self) -> str:
        """How stats and the command line name it: the rule and its settings."""
        return f"typical (not exact; epsilon={self.epsilon:g}, delta={self.delta:g})"

    def __post_init__(self):
        for field in ("epsilon", "delta"):
            value = getattr(self, field)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or not 0.0 < value < 1.0):
                raise ValueError(f"TypicalAcceptance({field}={value!r}): {field} must be a "
                                 "number in (0, 1) (Medusa's published setting: "
                                 "epsilon=0.09, delta=0.3)")
            object.__setattr__(self, field, float(value))


def typical_thresholds(p_BNV: Float[Array, "B N V"], rule: TypicalAcceptance
                       ) -> Float[Array, "B N"]:
    """min(epsilon, delta * exp(-H(p))) at every position, float32."""
    p_BNV = p_BNV.astype(jnp.float32)
    entropy_BN = -jnp.sum(jnp.where(p_BNV > 0, p_BNV * jnp.log(jnp.where(p_BNV > 0, p_BNV,
                                                                           1.0)), 0.0),
                          axis=-1)
    return jnp.minimum(rule.epsilon, rule.delta * jnp.exp(-entropy_BN))


def accept_typical_chain(key_resample: Key[Array, ""], draft_tokens_BK: Int[Array, "B K"],
                         p_BK1V: Float[Array, "B K+1 V"], rule: TypicalAcceptance,
                         limit_B: Int[Array, " B"] | None = None) -> Acceptance:
    """The longest prefix of drafts that each pass the threshold (within `limit_B`), then
    the next token from p at its end."""
    batch, num_draft = draft_tokens_BK.shape
    p_BK1V = p_BK1V.astype(jnp.float32)
    p_of_draft_BK = jnp.take_along_axis(p_BK1V[:, :num_draft], draft_tokens_BK[..., None],
                                        axis=-1)[..., 0]
    passes_BK = p_of_draft_BK > typical_thresholds(p_BK1V[:, :num_draft], rule)
    num_accepted_B = _leading_true(_within_limit(passes_BK, limit_B))
    rows_B = jnp.arange(batch)
    next_token_B = sample_from_probs(row_keys(key_resample, batch),
                                     p_BK1V[rows_B, num_accepted_B])
    return Acceptance(num_accepted_B, jnp.arange(num_draft)[None, :] < num_accepted_B[:, None],
                      next_token_B)


def accept_typical_tree(key_resample: Key[Array, ""], tokens_BN: Int[Array, "B N"],
                        parents_BN: Int[Array, "B N"], p_BN1V: Float[Array, "B N+1 V"],
                        rule: TypicalAcceptance, *, max_depth: int,
                        never_accept_BN: Bool[Array, "B N"] | None = None) -> TreeAcceptance:
    """The deepest node whose path from the root passes the threshold at every node
    (nodes marked never-accept never pass), the first in the tree's order among equals;
    then the next token from p at that node (at the root, when no child passes)."""
    batch, num_nodes = tokens_BN.shape
    p_BN1V = p_BN1V.astype(jnp.float32)
    rows_B = jnp.arange(batch)[:, None]
    at_parent_BNV = p_BN1V[rows_B, parents_BN + 1]  # the distribution each node answers
    p_of_node_BN = jnp.take_along_axis(at_parent_BNV, tokens_BN[..., None], axis=-1)[..., 0]
    passes_BN = p_of_node_BN > typical_thresholds(at_parent_BNV, rule)
    if never_accept_BN is not None:
        passes_BN &= ~never_accept_BN
    on_path_BNN = ancestor_mask(parents_BN)[:, 1:, 1:]  # [b, n, m]: m is n or its ancestor
    path_passes_BN = ~jnp.any(on_path_BNN & ~passes_BN[:, None, :], axis=-1)
    depths_BN = tree_depths(parents_BN)
    # The deepest passing node, the first in order among equals; 0 (the root) when none.
    score_BN = jnp.where(path_passes_BN, depths_BN * (num_nodes + 1) + (num_nodes - jnp.arange(
        num_nodes))[None], 0)
    best_B = jnp.argmax(score_BN, axis=1)
    found_B = jnp.max(score_BN, axis=1) > 0
    path_nodes_BN = on_path_BNN[jnp.arange(batch), best_B] & found_B[:, None]
    depth_index_D = jnp.arange(1, max_depth + 1)[None, :, None]
    at_depth_BDN = path_nodes_BN[:, None, :] & (depths_BN[:, None, :] == depth_index_D)
    path_BD = jnp.where(jnp.any(at_depth_BDN, axis=-1),
                        jnp.argmax(at_depth_BDN, axis=-1), -1).astype(jnp.int32)
    num_accepted_B = jnp.sum(path_BD >= 0, axis=1).astype(jnp.int32)
    next_index_B = jnp.where(found_B, best_B + 1, 0)
    next_token_B = sample_from_probs(row_keys(key_resample, batch),
                                     p_BN1V[jnp.arange(batch), next_index_B])
    return TreeAcceptance(path_BD, num_accepted_B, next_token_B)
