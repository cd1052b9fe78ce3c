"""Losses of any CausalLM, in float32: next-token cross-entropy, and the DistillSpec
divergences between a target's and a draft's next-token distributions (forward KL, or
total variation, whose complement is speculative sampling's acceptance probability)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array

from specjax.lm.causal_lm import CausalLM, full_logits
from specjax.training.config import DistillConfig


def next_token_loss(lm: CausalLM, tokens_BT: Array, pad_id: int | None) -> Array:
    """Mean float32 cross-entropy of tokens[:, 1:] given tokens[:, :-1] (pad targets
    ignored)."""
    logits_BTV = full_logits(lm, tokens_BT[:, :-1])
    targets_BT = tokens_BT[:, 1:]
    logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    nll_BT = -jnp.take_along_axis(logp_BTV, targets_BT[..., None], axis=-1)[..., 0]
    mask_BT = jnp.ones_like(nll_BT) if pad_id is None else (targets_BT != pad_id)
    mask_BT = mask_BT.astype(jnp.float32)
    return jnp.sum(nll_BT * mask_BT) / jnp.maximum(jnp.sum(mask_BT), 1.0)


def distill_loss(draft: CausalLM, target: CausalLM, tokens_BT: Array, config: DistillConfig,
                 pad_id: int | None) -> Array:
    """Mean divergence between the target's and the draft's next-token distributions at
    every position of `tokens` (the target is not differentiated)."""
    p_logits = jax.lax.stop_gradient(full_logits(target, tokens_BT)).astype(jnp.float32)
    q_logits = full_logits(draft, tokens_BT).astype(jnp.float32)
    vocab = min(p_logits.shape[-1], q_logits.shape[-1])
    logp = jax.nn.log_softmax(p_logits[..., :vocab] / config.temperature, axis=-1)
    logq = jax.nn.log_softmax(q_logits[..., :vocab] / config.temperature, axis=-1)
    per_position = divergence_per_position(logp, logq, config.divergence)
    mask = jnp.ones_like(per_position) if pad_id is None else (tokens_BT != pad_id)
    mask = mask.astype(jnp.float32)
    return jnp.sum(per_position * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def divergence_per_position(log_p: Array, log_q: Array, divergence: str) -> Array:
    """float32 [...]: forward KL(p || q) ("fkl") or total variation ("tvd") between the
    distributions whose log-probabilities are the last axis of `log_p` and `log_q`."""
    log_p, log_q = log_p.astype(jnp.float32), log_q.astype(jnp.float32)
    if divergence == "fkl":
        return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)
    return 0.5 * jnp.sum(jnp.abs(jnp.exp(log_p) - jnp.exp(log_q)), axis=-1)
