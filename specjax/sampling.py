"""Sampling settings and the ONE logits warper shared by every sampler and verifier.

The target distribution of every specjax decoder is the distribution that plain
autoregressive sampling with the same `SamplingConfig` draws from: `warp_logits` applies
temperature -> top-k -> top-p in float32, in that fixed order, and `probabilities` turns
the result into the distribution (one-hot argmax when greedy). The AR sampler, the drafts
and the speculative verifier all call these two functions, so they cannot disagree.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

NEG_INF = -jnp.inf
MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)


def _real(name: str, value) -> float:
    """A Python float from an int, float or numpy scalar (bools and arrays refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How a token is drawn from logits (frozen, hashable: a static jit argument).

    temperature: 0 means greedy (argmax), decided at trace time; otherwise logits / t.
    top_k: keep the k most probable tokens (ties at the k-th value are kept, as in
      transformers' TopKLogitsWarper); 0 is off.
    top_p: keep every token whose strictly more probable tokens hold less than top_p of
      the mass: the smallest most-probable set whose mass reaches top_p, the token that
      crosses the threshold included; 1.0 is off. This is transformers' TopPLogitsWarper
      except at ties with the crossing token: transformers keeps the tied tokens that its
      ascending stable sort puts past the 1 - top_p mark (the higher token ids) and drops
      the others; we keep every tied token, so ties share one fate and the kept set does
      not depend on token ids (tested against a port of transformers' rule).

    Numbers may be Python or numpy scalars. Temperatures below float32's smallest normal
    number (MIN_TEMPERATURE, 1.2e-38) are refused: use 0 for greedy.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        temperature = _real("temperature", self.temperature)
        if not temperature >= 0.0:  # also refuses NaN
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
        if 0.0 < temperature < MIN_TEMPERATURE:
            # logits / t would leave float32's normal range: subnormal temperatures are
            # flushed to zero on some backends and the warped logits become NaN.
            raise ValueError(f"temperature {temperature!r} is below {MIN_TEMPERATURE} "
                             "(float32's smallest normal number); use temperature=0 for "
                             "greedy decoding, the limit of tiny temperatures")
        top_k = self.top_k
        if isinstance(top_k, (bool, np.bool_)) or not isinstance(top_k, numbers.Integral) \
                or top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 turns it off), got {top_k!r}")
        top_p = _real("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1.0 turns it off), got {top_p!r}")
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_k", int(top_k))
        object.__setattr__(self, "top_p", top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def check_vocab(self, vocab_size: int) -> None:
        """Refuse a top_k larger than the vocabulary (it would silently mean 'off')."""
        if self.top_k > vocab_size:
            raise ValueError(f"top_k={self.top_k} exceeds the vocabulary size {vocab_size}; "
                             f"use top_k <= {vocab_size} or 0 to turn it off")


GREEDY = SamplingConfig(temperature=0.0)


def warp_logits(logits_BV: Array, sampling: SamplingConfig) -> Array:
    """Float32 logits after temperature -> top-k -> top-p; removed tokens are -inf.

    Greedy (temperature 0) returns the float32 logits unscaled: the distribution is the
    argmax one-hot, see `probabilities`.
    """
    logits = logits_BV.astype(jnp.float32)
    if sampling.greedy:
        return logits
    if sampling.temperature != 1.0:
        # Shift by the row maximum first: logits / t overflows to inf (and softmax to NaN)
        # for small t, while (logits - max) / t is <= 0 with the maximum exactly 0, so
        # tiny temperatures approach the greedy limit (ties share the mass) instead.
        top_BV = jnp.max(logits, axis=-1, keepdims=True)
        shift_BV = jnp.where(jnp.isfinite(top_BV), top_BV, 0.0)
        logits = (logits - shift_BV) / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        keys = _order_keys(logits)
        # The k-th largest value: the largest t with at least k tokens >= t.
        kth_key = _bisect_largest(
            lambda t: jnp.sum(keys >= t, axis=-1, keepdims=True) >= sampling.top_k,
            jnp.min(keys, axis=-1, keepdims=True), jnp.max(keys, axis=-1, keepdims=True) + 1)
        logits = jnp.where(keys >= kth_key, logits, NEG_INF)
    if sampling.top_p < 1.0:
        probs = jax.nn.softmax(logits, axis=-1)
        keys = _order_keys(probs)
        # Token i is kept iff the mass of tokens strictly more probable than it is below
        # top_p: the token that crosses the threshold is kept, the most probable token
        # always is, and tied tokens share one fate. Find the largest t whose strictly
        # greater mass still reaches top_p; keep everything above it.
        mass_above = lambda t: jnp.sum(jnp.where(keys > t, probs, 0.0), axis=-1, keepdims=True)
        cut_key = _bisect_largest(lambda t: mass_above(t) >= sampling.top_p,
                                  jnp.full(keys.shape[:-1] + (1,), -1, jnp.int32),
                                  jnp.max(keys, axis=-1, keepdims=True))
        logits = jnp.where(keys > cut_key, logits, NEG_INF)
    return logits


def _order_keys(x: Array) -> Array:
    """int32 keys ordered exactly as the float32 values (a bijection on non-NaN floats)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    return jnp.where(bits >= 0, bits, bits ^ jnp.int32(0x7FFFFFFF))


def _bisect_largest(predicate, lo: Array, hi: Array) -> Array:
    """Largest int32 t in [lo, hi) with predicate(t) true, per row.

    Needs predicate(lo) true, predicate(hi) false, and predicate monotone (true, then
    false). 32 halvings cover the whole int32 range, so the answer is exact. This finds
    top-k and top-p cut-offs in O(32 V) without a sort, which XLA runs slowly on CPU.
    """
    def halve(_, bounds):
        lo, hi = bounds
        mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # floor((lo + hi) / 2) without overflow
        ok = predicate(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    return lo


def probabilities(logits_BV: Array, sampling: SamplingConfig) -> Array:
    """Float32 distribution `[..., V]` that a token is drawn from under `sampling`."""
    if sampling.greedy:
        logits = logits_BV.astype(jnp.float32)
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    return jax.nn.softmax(warp_logits(logits_BV, sampling), axis=-1)


def row_keys(key: Array, batch: int) -> Array:
    """One key per row (fold in the row index): a row's draws ignore its batch mates."""
    return jax.vmap(lambda row: jax.random.fold_in(key, row))(jnp.arange(batch))


def sample_from_probs(keys_B: Array, probs_BV: Array) -> Array:
    """Draw one int32 token per row from explicit float32 probabilities."""
    logp = jnp.where(probs_BV > 0, jnp.log(jnp.maximum(probs_BV, 1e-38)), NEG_INF)
    draw = lambda key, row_logp: jax.random.categorical(key, row_logp)
    return jax.vmap(draw)(keys_B, logp).astype(jnp.int32)


def sample_tokens(key: Array, logits_BV: Array, sampling: SamplingConfig) -> Array:
    """Draw `[B]` int32 tokens from logits under `sampling` (argmax when greedy).

    Row b uses `fold_in(key, b)`, so its draw does not depend on the other rows.
    """
    if sampling.greedy:
        return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    warped = warp_logits(logits_BV, sampling)
    keys_B = row_keys(key, logits_BV.shape[0])
    return jax.vmap(jax.random.categorical)(keys_B, warped).astype(jnp.int32)
