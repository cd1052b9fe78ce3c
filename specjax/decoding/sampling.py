"""Sampling settings and the ONE logits warper shared by every sampler and verifier.

The target distribution of every specjax decoder is the distribution that plain
autoregressive sampling with the same settings draws from: `warp_logits` applies
temperature -> top-k -> top-p in float32, in that fixed order, and `probabilities` turns
the result into the distribution (one-hot argmax when greedy). The AR sampler, the drafts
and the speculative verifier all call these two functions, so they cannot disagree.

Settings are data, not compile-time constants. A user describes them with the frozen
`SamplingConfig` (one for the batch, or one per row); the decoders turn that into
`SamplingParams`, per-row float32/int32 arrays that enter the compiled loop as traced
arguments, so a new temperature, top-k or top-p compiles nothing. One bit stays static:
`SamplingParams.greedy`, true when EVERY row is greedy, the trace-time fast path (argmax
acceptance, no draws, no warping). A batch that mixes greedy and sampled rows takes the
sampled path, where a greedy row's distribution is the one-hot argmax (per-row `where`,
never a `lax.cond` on a traced float), which makes its output exactly greedy.
"""

from __future__ import annotations

import dataclasses
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import Bool, Float, Int

NEG_INF = -jnp.inf
MIN_TEMPERATURE = float(np.finfo(np.float32).tiny)


def _real(name: str, value) -> float:
    """A Python float from an int, float or numpy scalar (bools and arrays refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How a token is drawn from logits (frozen, hashable, validated on the host).

    The decoders pass its values to the compiled loop as data (`SamplingParams`): a new
    temperature, top-k or top-p reuses the compiled decoder. Give one per row (a list of
    B configs) to mix settings, greedy rows included, in one batch.

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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling settings as traced data, one value per row (or one scalar for all rows).

    temperature float32 [B] (0: the row is greedy); top_k int32 [B] (0: off); top_p
    float32 [B] (1: off). `greedy` (static) is True when every row is greedy: decoders
    then compile the argmax fast path. Build it with `sampling_params`, which validates.
    New values of the arrays never recompile; only `greedy` and the batch size do.
    """

    temperature: Float[Array, " B"]
    top_k: Int[Array, " B"]
    top_p: Float[Array, " B"]
    greedy: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def row_greedy(self) -> Bool[Array, " B"]:
        """Which rows are greedy (temperature 0)."""
        return self.temperature == 0


def _config_sequence(sampling) -> tuple[SamplingConfig, ...]:
    """`sampling` as a tuple of configs (one config is a tuple of one), types checked."""
    if isinstance(sampling, SamplingConfig):
        return (sampling,)
    if isinstance(sampling, (str, bytes, dict)) or not hasattr(sampling, "__len__"):
        raise TypeError("sampling must be a specjax.SamplingConfig, or a list with one "
                        f"SamplingConfig per row; got {type(sampling).__name__}")
    configs = tuple(sampling)
    # Each object checked once: a batch of thousands of rows repeats a few settings.
    if not all(isinstance(config, SamplingConfig) for config in _by_identity(configs)):
        row, config = next((row, config) for row, config in enumerate(configs)
                           if not isinstance(config, SamplingConfig))
        raise TypeError(f"sampling[{row}] must be a specjax.SamplingConfig, got "
                        f"{type(config).__name__}")
    if not configs:
        raise ValueError("sampling is an empty list: pass one SamplingConfig for the whole "
                         "batch, or one per row")
    return configs


def _by_identity(configs: tuple) -> list:
    """The different objects of `configs` (by identity, not equality: no hashing), in
    first-seen order."""
    return list({id(config): config for config in configs}.values())


def row_configs(sampling, batch: int) -> tuple[SamplingConfig, ...]:
    """The B per-row configs of `sampling`: one `SamplingConfig` for every row, or a
    sequence of exactly B of them (refused otherwise, naming the fix)."""
    if isinstance(sampling, SamplingConfig):
        return (sampling,) * batch
    configs = _config_sequence(sampling)
    if len(configs) != batch:
        raise ValueError(f"sampling lists {len(configs)} settings but the batch has {batch} "
                         "rows: pass one SamplingConfig for the whole batch, or one per row")
    return configs


def distinct_configs(sampling) -> tuple[SamplingConfig, ...]:
    """The different `SamplingConfig`s in `sampling` (one config or a per-row sequence,
    types checked), in first-seen order: what host-side checks look at."""
    return tuple(dict.fromkeys(_by_identity(_config_sequence(sampling))))


def sampling_params(sampling, batch: int) -> SamplingParams:
    """Host-side: `SamplingParams` ([B] numpy arrays) from one `SamplingConfig` for the
    batch, a sequence of B of them (one per row), or `SamplingParams` (checked for B)."""
    if isinstance(sampling, SamplingParams):
        for name in ("temperature", "top_k", "top_p"):
            shape = tuple(np.shape(getattr(sampling, name)))
            if shape not in ((), (batch,)):
                raise ValueError(f"SamplingParams.{name} has shape {shape}; a batch of "
                                 f"{batch} rows needs ({batch},) or ()")
        return sampling
    if isinstance(sampling, SamplingConfig):
        return SamplingParams(np.full((batch,), sampling.temperature, np.float32),
                              np.full((batch,), sampling.top_k, np.int32),
                              np.full((batch,), sampling.top_p, np.float32),
                              greedy=sampling.greedy)
    configs = row_configs(sampling, batch)
    distinct = _by_identity(configs)
    index = {id(config): i for i, config in enumerate(distinct)}
    row_index = np.fromiter((index[id(config)] for config in configs), np.int64, len(configs))
    return SamplingParams(np.asarray([c.temperature for c in distinct], np.float32)[row_index],
                          np.asarray([c.top_k for c in distinct], np.int32)[row_index],
                          np.asarray([c.top_p for c in distinct], np.float32)[row_index],
                          greedy=all(c.greedy for c in distinct))


def _as_params(sampling) -> SamplingParams:
    """A `SamplingConfig` as scalar constants (folded at trace time), or `SamplingParams`
    as they are."""
    if isinstance(sampling, SamplingParams):
        return sampling
    if isinstance(sampling, SamplingConfig):
        return SamplingParams(np.float32(sampling.temperature), np.int32(sampling.top_k),
                              np.float32(sampling.top_p), greedy=sampling.greedy)
    raise TypeError("sampling must be a specjax.SamplingConfig or SamplingParams, got "
                    f"{type(sampling).__name__}")


def _known(x) -> bool:
    """True for host values (a `SamplingConfig`'s constants): decided at trace time."""
    return isinstance(x, (np.ndarray, np.generic))


def _per_row(x, logits) -> Array:
    """A per-row setting `[B]` (or a scalar) shaped to broadcast over `logits [B, ..., V]`."""
    shape = np.shape(x)
    if shape not in ((), logits.shape[:1]):
        raise ValueError(f"sampling settings of shape {shape} do not match logits of shape "
                         f"{tuple(logits.shape)}: per-row settings need the batch as the "
                         "logits' leading axis")
    full = shape + (1,) * (logits.ndim - len(shape))
    return np.reshape(x, full) if _known(x) else jnp.reshape(x, full)


def _run_if_any(active, apply, logits: Array) -> Array:
    """`apply(logits)` when any row needs it: a Python decision for host constants, a
    `lax.cond` on traced settings (it skips a cut-off search that no row uses)."""
    if _known(active):
        return apply(logits) if np.any(active) else logits
    return jax.lax.cond(jnp.any(active), apply, lambda x: x, logits)


def warp_logits(logits_BV: Array, sampling: SamplingConfig | SamplingParams) -> Array:
    """Float32 logits after temperature -> top-k -> top-p; removed tokens are -inf.

    `logits_BV` is `[..., V]`; with per-row `SamplingParams` its leading axis is the
    batch. Greedy rows (temperature 0) get their float32 logits unscaled and unfiltered:
    their distribution is the argmax one-hot, see `probabilities`.
    """
    params = _as_params(sampling)
    logits = logits_BV.astype(jnp.float32)
    if params.greedy:
        return logits
    temperature = _per_row(params.temperature, logits)
    greedy_row = temperature == 0
    if not (_known(temperature) and np.all((temperature == 1) | greedy_row)):
        # Shift by the row maximum first: logits / t overflows to inf (and softmax to NaN)
        # for small t, while (logits - max) / t is <= 0 with the maximum exactly 0, so
        # tiny temperatures approach the greedy limit (ties share the mass) instead.
        top = jnp.max(logits, axis=-1, keepdims=True)
        shift = jnp.where(jnp.isfinite(top), top, 0.0)
        scaled = (logits - shift) / jnp.where(greedy_row, 1.0, temperature)
        logits = jnp.where((temperature == 1) | greedy_row, logits, scaled)
    vocab = logits.shape[-1]
    top_k = _per_row(params.top_k, logits)
    top_k_on = (top_k > 0) & (top_k < vocab) & ~greedy_row

    def keep_top_k(logits):
        keys = _order_keys(logits)
        # The k-th largest value: the largest t with at least k tokens >= t.
        kth_key = _bisect_largest(
            lambda t: jnp.sum(keys >= t, axis=-1, keepdims=True) >= top_k,
            jnp.min(keys, axis=-1, keepdims=True), jnp.max(keys, axis=-1, keepdims=True) + 1)
        return jnp.where(top_k_on & (keys < kth_key), NEG_INF, logits)

    logits = _run_if_any(top_k_on, keep_top_k, logits)
    top_p = _per_row(params.top_p, logits)
    top_p_on = (top_p < 1.0) & ~greedy_row

    def keep_top_p(logits):
        probs = jax.nn.softmax(logits, axis=-1)
        keys = _order_keys(probs)
        # Token i is kept iff the mass of tokens strictly more probable than it is below
        # top_p: the token that crosses the threshold is kept, the most probable token
        # always is, and tied tokens share one fate. Find the largest t whose strictly
        # greater mass still reaches top_p; keep everything above it.
        mass_above = lambda t: jnp.sum(jnp.where(keys > t, probs, 0.0), axis=-1, keepdims=True)
        cut_key = _bisect_largest(lambda t: mass_above(t) >= top_p,
                                  jnp.full(keys.shape[:-1] + (1,), -1, jnp.int32),
                                  jnp.max(keys, axis=-1, keepdims=True))
        return jnp.where(top_p_on & (keys <= cut_key), NEG_INF, logits)

    return _run_if_any(top_p_on, keep_top_p, logits)


def _order_keys(x: Array) -> Array:
    """int32 keys ordered exactly as the float32 values (a bijection on non-NaN floats)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    return jnp.where(bits >= 0, bits, bits ^ jnp.int32(0x7FFFFFFF))


def _bisect_largest(predicate, lo: Array, hi: Array) -> Array:
    """Largest int32 t in [lo, hi) with predicate(t) true, per row.

    Needs predicate(lo) true, predicate(hi) false, and predicate monotone (true, then
    false). 32 halvings cover the whole int32 range, so the answer is exact. This finds
    top-k and top-p cut-offs in O(32 V) without a sort, which XLA runs slowly on CPU, and
    with the k or p of each row as data (a sort-based top-k needs k at compile time).
    """
    def halve(_, bounds):
        lo, hi = bounds
        mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # floor((lo + hi) / 2) without overflow
        ok = predicate(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, _ = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    return lo


def _greedy_rows(params: SamplingParams, logits: Array):
    """The greedy-row mask shaped for `logits`, or None when no row is greedy (known on
    the host)."""
    greedy_row = _per_row(params.row_greedy, logits)
    if _known(greedy_row) and not np.any(greedy_row):
        return None
    return greedy_row


def _on_greedy_rows(greedy_row, replacement, values: Array) -> Array:
    """`values` with greedy rows replaced by `replacement()`: skipped when no row is
    greedy (known on the host, or a `lax.cond` on traced settings, which spares a sampled
    batch an argmax and a select over the vocabulary)."""
    if greedy_row is None:
        return values
    if _known(greedy_row):
        return jnp.where(greedy_row, replacement(), values)
    return jax.lax.cond(jnp.any(greedy_row),
                        lambda v: jnp.where(greedy_row, replacement(), v), lambda v: v, values)


def probabilities(logits_BV: Array, sampling: SamplingConfig | SamplingParams) -> Array:
    """Float32 distribution `[..., V]` that a token is drawn from: the warped softmax, the
    argmax one-hot on greedy rows."""
    params = _as_params(sampling)
    logits = logits_BV.astype(jnp.float32)
    one_hot = lambda: jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1],
                                     dtype=jnp.float32)
    if params.greedy:
        return one_hot()
    probs = jax.nn.softmax(warp_logits(logits, params), axis=-1)
    return _on_greedy_rows(_greedy_rows(params, logits), one_hot, probs)


def tree_scores(logits_BV: Array, sampling: SamplingConfig | SamplingParams) -> Array:
    """Log-probabilities that rank a dynamic tree's children: the draft's distribution
    warped as the target's (tokens the target's top-k / top-p cannot produce rank last),
    and on greedy rows the unwarped log-softmax (a one-hot would tie every other token)."""
    params = _as_params(sampling)
    logits = logits_BV.astype(jnp.float32)
    raw = jax.nn.log_softmax(logits, axis=-1)
    if params.greedy:
        return raw
    warped = jnp.log(probabilities(logits, params))
    return _on_greedy_rows(_greedy_rows(params, logits), lambda: raw, warped)


def row_keys(key: Array, batch: int) -> Array:
    """One key per row (fold in the row index): a row's draws ignore its batch mates."""
    return jax.vmap(lambda row: jax.random.fold_in(key, row))(jnp.arange(batch))


def sample_from_probs(keys_B: Array, probs_BV: Array) -> Array:
    """Draw one int32 token per row from explicit float32 probabilities."""
    logp = jnp.where(probs_BV > 0, jnp.log(jnp.maximum(probs_BV, 1e-38)), NEG_INF)
    draw = lambda key, row_logp: jax.random.categorical(key, row_logp)
    return jax.vmap(draw)(keys_B, logp).astype(jnp.int32)


def draw_with_q(key: Array, logits_BV: Array, sampling: SamplingConfig | SamplingParams, *,
                deterministic: bool = False) -> tuple[Array, Array]:
    """A draft token per row and the distribution q it was drawn from, `(int32 [B],
    float32 [B, V])`: the argmax and its one-hot when `deterministic` or every row is
    greedy, else a draw from the warped distribution (one-hot on greedy rows), which is
    q. Row b draws with `fold_in(key, b)`."""
    params = _as_params(sampling)
    if deterministic or params.greedy:
        token_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
        return token_B, jax.nn.one_hot(token_B, logits_BV.shape[-1], dtype=jnp.float32)
    q_BV = probabilities(logits_BV, params)
    return sample_from_probs(row_keys(key, q_BV.shape[0]), q_BV), q_BV


def sample_tokens(key: Array, logits_BV: Array,
                  sampling: SamplingConfig | SamplingParams) -> Array:
    """Draw `[B]` int32 tokens from logits (argmax on greedy rows).

    Row b uses `fold_in(key, b)`, so its draw does not depend on the other rows.
    """
    params = _as_params(sampling)
    argmax_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    if params.greedy:
        return argmax_B
    warped = warp_logits(logits_BV, params)
    keys_B = row_keys(key, logits_BV.shape[0])
    drawn_B = jax.vmap(jax.random.categorical)(keys_B, warped).astype(jnp.int32)
    greedy_row = _greedy_rows(params, argmax_B)
    return drawn_B if greedy_row is None else jnp.where(greedy_row, argmax_B, drawn_B)
