"""Block verification of a chain of K drafts (Sun et al., "Block Verification Accelerates
Speculative Decoding", ICLR 2025, arXiv 2403.10444).

The token rule (specjax.verification.rejection) judges draft j alone and stops at the
first rejection.
Block verification judges the block jointly. With r_j = p_j(x_j) / q_j(x_j), each row
carries a capped running product of the ratios,

  w_0 = 1,   w_j = min(1, w_{j-1} r_j),

and the residual mass it leaves at the next position,

  R_j = sum_x (w_j p_{j+1}(x) - q_{j+1}(x))+        (q_{K+1} = 0, so R_K = w_K).

Prefix j is kept with probability h_j = R_j / (R_j + 1 - w_j) (h_K = w_K), one uniform per
position as in the token rule, and the step accepts the LONGEST kept prefix tau (not the
first rejection: a later position can keep a block whose earlier token the token rule
would have thrown away). The next token is drawn from normalise((w_tau p_{tau+1} -
q_{tau+1})+): the correction, or the bonus from p_{K+1} when tau = K.

The step's output follows the target exactly, it accepts at least as many tokens as the
token rule in expectation, and it is the optimal valid verifier for a block (the paper's
Theorems 1 and 2; docs/exactness.md has the sketch, and tests/test_block_verification.py
enumerates the output distribution exactly). A row that offers n < K drafts (`limit_B`)
is a chain of length n: q counts as 0 from position n + 1 on.

Edge cases, all exact: R_j + 1 - w_j = 0 (w_j = 1 and p_{j+1} = q_{j+1}) makes h_j
0/0; any value is exact there (the block then reaches a later kept position with
certainty), and 1 is taken. A greedy row (one-hot p) has w_j = 1 up to its first
mismatch and 0 after, so it accepts exactly the argmax matches and draws the argmax.

Float32 throughout; the running product is taken in log space, where the cap is a running
maximum: log w_j = S_j - max(0, S_1, ..., S_j) with S_j = sum_{i <= j} log r_i.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Float, Int, Key

from specjax.decoding.sampling import row_keys, sample_from_probs
from specjax.verification.rejection import Acceptance, residual_distribution


def capped_weights(p_of_draft_BK: Float[Array, "B K"],
                   q_of_draft_BK: Float[Array, "B K"]) -> Float[Array, "B K"]:
    """w_j = min(1, w_{j-1} p_j(x_j) / q_j(x_j)), w_0 = 1, for j = 1..K. A draft with
    q = 0 (never drawn: a position past the drafts a row offers) gets weight 0."""
    drawn_BK = q_of_draft_BK > 0
    log_ratio_BK = jnp.where(
        drawn_BK, jnp.log(p_of_draft_BK) - jnp.log(jnp.where(drawn_BK, q_of_draft_BK, 1.0)),
        -jnp.inf)
    log_product_BK = jnp.cumsum(log_ratio_BK, axis=1)
    cap_BK = jax.lax.cummax(jnp.maximum(log_product_BK, 0.0), axis=1)
    return jnp.exp(log_product_BK - cap_BK)


def chain_distributions(draft_tokens_BK: Int[Array, "B K"], q_BKV: Float[Array, "B K V"],
                        p_BK1V: Float[Array, "B K+1 V"], limit_B: Int[Array, " B"] | None
                        ) -> tuple[Array, Array, Array]:
    """(p_BK1V, q_BK1V, weights_BK1): float32 target and draft distributions at the K+1
    positions, q zero from each row's limit on (the bonus position included), and
    w_0..w_K."""
    batch, num_draft = draft_tokens_BK.shape
    p_BK1V = p_BK1V.astype(jnp.float32)
    q_BK1V = jnp.concatenate([q_BKV.astype(jnp.float32),
                              jnp.zeros_like(q_BKV[:, :1], jnp.float32)], axis=1)
    if limit_B is not None:
        offered_BK1 = jnp.arange(num_draft + 1)[None] < limit_B[:, None]
        q_BK1V = jnp.where(offered_BK1[..., None], q_BK1V, 0.0)
    p_of_draft_BK = jnp.take_along_axis(p_BK1V[:, :num_draft], draft_tokens_BK[..., None],
                                        axis=-1)[..., 0]
    q_of_draft_BK = jnp.take_along_axis(q_BK1V[:, :num_draft], draft_tokens_BK[..., None],
                                        axis=-1)[..., 0]
    weights_BK1 = jnp.concatenate([jnp.ones((batch, 1), jnp.float32),
                                   capped_weights(p_of_draft_BK, q_of_draft_BK)], axis=1)
    return p_BK1V, q_BK1V, weights_BK1


def keep_probabilities(p_BK1V: Float[Array, "B K+1 V"], q_BK1V: Float[Array, "B K+1 V"],
                       weights_BK1: Float[Array, "B K+1"]) -> Float[Array, "B K"]:
    """h_j for j = 1..K: the probability that prefix j is kept, R_j / (R_j + 1 - w_j)
    (1 where that is 0/0)."""
    weights_BK = weights_BK1[:, 1:]
    residual_mass_BK = jnp.sum(jnp.maximum(weights_BK[..., None] * p_BK1V[:, 1:]
                                           - q_BK1V[:, 1:], 0.0), axis=-1)
    denominator_BK = residual_mass_BK + (1.0 - weights_BK)
    return jnp.where(denominator_BK > 0,
                     residual_mass_BK / jnp.where(denominator_BK > 0, denominator_BK, 1.0),
                     1.0)


def block_residual(weight_B: Float[Array, " B"], p_BV: Float[Array, "B V"],
                   q_BV: Float[Array, "B V"]) -> Float[Array, "B V"]:
    """normalise((w p - q)+), the token rule's residual with the running weight w
    (`specjax.verification.rejection.residual_distribution`)."""
    return residual_distribution(p_BV, q_BV, weight_B)


def accept_block(key_accept: Key[Array, ""], key_resample: Key[Array, ""],
                 draft_tokens_BK: Int[Array, "B K"], q_BKV: Float[Array, "B K V"],
                 p_BK1V: Float[Array, "B K+1 V"], limit_B: Int[Array, " B"] | None = None
                 ) -> Acceptance:
    """Block verification of every row's chain at once (see the module docstring); the
    arguments are `specjax.verification.rejection.accept_sampled`'s, and so is the result."""
    batch, num_draft = draft_tokens_BK.shape
    p_BK1V, q_BK1V, weights_BK1 = chain_distributions(draft_tokens_BK, q_BKV, p_BK1V, limit_B)
    keep_BK = keep_probabilities(p_BK1V, q_BK1V, weights_BK1)
    uniform_BK = jax.vmap(lambda k: jax.random.uniform(k, (num_draft,)))(
        row_keys(key_accept, batch))
    kept_BK = uniform_BK < keep_BK
    if limit_B is not None:
        kept_BK &= jnp.arange(num_draft)[None] < limit_B[:, None]
    prefix_BK = jnp.arange(1, num_draft + 1, dtype=jnp.int32)[None]
    num_accepted_B = jnp.max(jnp.where(kept_BK, prefix_BK, 0), axis=1).astype(jnp.int32)
    rows_B = jnp.arange(batch)
    next_BV = block_residual(weights_BK1[rows_B, num_accepted_B],
                             p_BK1V[rows_B, num_accepted_B], q_BK1V[rows_B, num_accepted_B])
    next_token_B = sample_from_probs(row_keys(key_resample, batch), next_BV)
    return Acceptance(num_accepted_B, jnp.arange(num_draft)[None, :] < num_accepted_B[:, None],
                      next_token_B)
