"""Exact acceptance of a linear block of K draft tokens (Leviathan et al. / Chen et al.).

For each row, with the target distributions p_1..p_{K+1} from ONE verify forward and the
distributions q_1..q_K the draft tokens x_1..x_K were actually drawn from:

  accept x_j with probability min(1, p_j(x_j) / q_j(x_j)), left to right, one uniform per
  position; at the first rejection j sample the correction from (p_j - q_j)+ / Z;
  if all K are accepted, sample the bonus token from p_{K+1}.

Writing q_{K+1} = 0 makes the bonus the same formula as the correction, so every row
draws its next token from `normalise((p_{n+1} - q_{n+1})+)` at its own n. All maths is
float32. Each row keeps its own n: nothing is shared across the batch.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax import Array

from specjax.decoding.sampling import row_keys, sample_from_probs


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Acceptance:
    """num_accepted int32 [B] (leading accepted drafts); accepted bool [B, K] (position j
    accepted, i.e. j < num_accepted); next_token int32 [B] (correction or bonus)."""

    num_accepted: Array
    accepted: Array
    next_token: Array


def _leading_true(mask_BK: Array) -> Array:
    """Length of the all-True prefix of each row."""
    return jnp.sum(jnp.cumprod(mask_BK.astype(jnp.int32), axis=-1), axis=-1).astype(jnp.int32)


def _within_limit(accepted_BK: Array, limit_B: Array | None) -> Array:
    """Acceptances of the drafts each row offers (all K when `limit_B` is None)."""
    if limit_B is None:
        return accepted_BK
    return accepted_BK & (jnp.arange(accepted_BK.shape[1])[None] < limit_B[:, None])


def residual_distribution(p_BV: Array, q_BV: Array, weight_B: Array | None = None) -> Array:
    """normalise((w p - q)+) in float32 (w = 1 unless `weight_B` is given: block
    verification's running weight). When float rounding leaves no positive mass (p and
    q equal up to rounding, where a rejection has probability ~0) it falls back to p."""
    scaled_BV = p_BV.astype(jnp.float32)
    if weight_B is not None:
        scaled_BV = weight_B[:, None] * scaled_BV
    residual = jnp.maximum(scaled_BV - q_BV.astype(jnp.float32), 0.0)
    mass = jnp.sum(residual, axis=-1, keepdims=True)
    return jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p_BV)


def accept_sampled(key_accept: Array, key_resample: Array, draft_tokens_BK: Array,
                   q_BKV: Array, p_BK1V: Array, limit_B: Array | None = None) -> Acceptance:
    """Speculative sampling acceptance for every row and position at once.

    Args:
      key_accept, key_resample: step keys; row b uses `fold_in(key, b)`.
      draft_tokens_BK: the K drafted tokens per row.
      q_BKV: float32 distributions the drafts were drawn from (one-hot for deterministic
        drafts: accept with probability p(x), residual = p without x).
      p_BK1V: float32 warped target distributions at the K+1 verified positions.
      limit_B: optional int32 [B], the drafts row b offers (<= K, decided before the
        verification): its chain is cut there, so accepting all of them draws the bonus
        from p at that position (q there counts as 0). Exact as a chain of that length.
    """
    batch, num_draft = draft_tokens_BK.shape
    p_BK1V = p_BK1V.astype(jnp.float32)
    q_BKV = q_BKV.astype(jnp.float32)
    p_of_draft_BK = jnp.take_along_axis(p_BK1V[:, :num_draft], draft_tokens_BK[..., None],
                                        axis=-1)[..., 0]
    q_of_draft_BK = jnp.take_along_axis(q_BKV, draft_tokens_BK[..., None], axis=-1)[..., 0]
    uniform_BK = jax.vmap(lambda k: jax.random.uniform(k, (num_draft,)))(
        row_keys(key_accept, batch))
    # u < p/q without a division; q(x) > 0 because x was drawn from q.
    accepted_BK = _within_limit(uniform_BK * q_of_draft_BK < p_of_draft_BK, limit_B)
    num_accepted_B = _leading_true(accepted_BK)
    q_padded_BK1V = jnp.concatenate([q_BKV, jnp.zeros_like(q_BKV[:, :1])], axis=1)
    at_B11 = num_accepted_B[:, None, None]
    p_next_BV = jnp.take_along_axis(p_BK1V, at_B11, axis=1)[:, 0]
    q_next_BV = jnp.take_along_axis(q_padded_BK1V, at_B11, axis=1)[:, 0]
    if limit_B is not None:  # a row that accepted all it offered draws its bonus from p
        q_next_BV = jnp.where((num_accepted_B >= limit_B)[:, None], 0.0, q_next_BV)
    next_token_B = sample_from_probs(row_keys(key_resample, batch),
                                     residual_distribution(p_next_BV, q_next_BV))
    return Acceptance(num_accepted_B, jnp.arange(num_draft)[None, :] < num_accepted_B[:, None],
                      next_token_B)


def accept_greedy(draft_tokens_BK: Array, target_logits_BK1V: Array,
                  limit_B: Array | None = None) -> Acceptance:
    """Greedy target (temperature 0): accept while the draft equals the target argmax;
    the next token is the target argmax at the first mismatch (or the bonus position).
    This is the sampled rule with one-hot p, decided at trace time with no draws.
    `limit_B`: as in `accept_sampled`."""
    num_draft = draft_tokens_BK.shape[1]
    argmax_BK1 = jnp.argmax(target_logits_BK1V, axis=-1).astype(jnp.int32)
    num_accepted_B = _leading_true(_within_limit(draft_tokens_BK == argmax_BK1[:, :num_draft],
                                                 limit_B))
    next_token_B = jnp.take_along_axis(argmax_BK1, num_accepted_B[:, None], axis=1)[:, 0]
    return Acceptance(num_accepted_B, jnp.arange(num_draft)[None, :] < num_accepted_B[:, None],
                      next_token_B)
