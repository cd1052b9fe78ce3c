"""`CausalLM`: the functional view of a model that every specjax algorithm consumes.

A CausalLM is a pytree whose only leaves are the parameters; the pure apply function,
the cache factory and the sizes are static auxiliary data. It can therefore be passed
straight into `jax.jit`: parameters are traced, and two CausalLMs with equal static parts
(for NNX: equal graph definitions) share one compiled function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from specjax.runtime.compilation_cache import repair_damaged_entries

# Every decoder runs a CausalLM: a damaged persistent-cache entry heals wherever the cache
# was turned on (the command line's environment, jax.config in a notebook).
repair_damaged_entries()

ApplyFn = Callable[..., tuple[Array, Array, Any]]

# Prompt tokens per prefill forward (`CausalLM.prefill_chunk`), chosen by
# `benchmarks/decoding/long_prompts.py` on CPU (benchmarks/results/long_prompts_cpu.md).
DEFAULT_PREFILL_CHUNK = 512


@dataclasses.dataclass(frozen=True)
class _NnxApply:
    """Pure apply of an NNX module: merge the params into the graph inside the trace."""

    graphdef: Any

    def __call__(self, params, tokens, positions, cache, cache_lengths, new_mask=None,
                 feature_layers=(), layers=None, head=True, layer_mask=None):
        module = nnx.merge(self.graphdef, params)
        extra = {} if layers is None else {"layers": layers}
        if layer_mask is not None:
            extra["layer_mask"] = layer_mask
        if not head:
            extra["head"] = False
        if feature_layers:
            extra["feature_layers"] = feature_layers
        return module(tokens, positions, cache, cache_lengths, new_mask, **extra)


@dataclasses.dataclass(frozen=True)
class _NnxInitCache:
    graphdef: Any

    def __call__(self, params, batch: int, max_len: int):
        return nnx.merge(self.graphdef, params).init_cache(batch, max_len)


@dataclasses.dataclass(frozen=True)
class _NnxCompact:
    graphdef: Any

    def __call__(self, params, cache, start_B, sources_BD):
        return nnx.merge(self.graphdef, params).compact_cache(cache, start_B, sources_BD)


@dataclasses.dataclass(frozen=True)
class _NnxFullForward:
    """No-cache forward of an NNX module (`cache=None`): an independent code path."""

    graphdef: Any

    def __call__(self, params, tokens_BT):
        positions_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]), tokens_BT.shape)
        logits, _, _ = nnx.merge(self.graphdef, params)(tokens_BT, positions_BT)
        return logits


def check_layer_mask(layer_mask, num_layers: int, layers, feature_layers) -> None:
    """The run-time block mask's contract (`CausalLM.apply`, and the models that take it):
    bool [num_layers], and neither a static subset nor feature layers beside it."""
    if layers is not None or feature_layers:
        raise ValueError("layer_mask chooses the blocks at run time: pass it without "
                         "layers= and feature_layers=")
    if tuple(jnp.shape(layer_mask)) != (num_layers,):
        raise ValueError(f"layer_mask must be bool [{num_layers}] (one flag per block), got "
                         f"shape {tuple(jnp.shape(layer_mask))}")


def _static(**kwargs):
    return dataclasses.field(metadata={"static": True}, **kwargs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class CausalLM:
    """A causal language model as params + pure functions (DESIGN.md section 3).

    Args:
      params: pytree of arrays (the only pytree leaves of a CausalLM).
      apply_fn: `apply_fn(params, tokens[B,T], positions[B,T], cache, cache_lengths[B],
        new_mask[B,T,T] | None) -> (logits f32[B,T,V], hidden[B,T,D], cache)`. It writes the
        new tokens' keys/values at slots `cache_lengths[b] + t` and attends to slots below
        `cache_lengths[b]` plus the new tokens allowed by `new_mask` (causal when None).
      init_cache_fn: `init_cache_fn(params, batch, max_len) -> cache` (any pytree).
      vocab_size: size of the output distribution.
      max_seq_len: the longest sequence (prompt + generated) the model supports, or None.
      full_forward_fn: optional `(params, tokens[B,T]) -> logits f32[B,T,V]` without a
        cache; by default `logits` runs `apply_fn` on a fresh cache.
      compact_fn: optional `(params, cache, start[B], sources[B, D]) -> cache` copying
        slot `sources[b, d]` to slot `start[b] + d` (sources >= destinations): token trees
        need it to move the accepted path into contiguous slots. Only the model knows its
        cache layout; chains never call it.
      prefill_chunk: prompts wider than this are prefilled in chunks of this many tokens
        (bounded memory, one compiled forward; see `prefill`); None: one forward. Change
        it with `lm.with_prefill_chunk(n)`.
      num_layers: the model's number of blocks when `apply_fn` takes `layers=` (a static
        tuple of block indices to run, the others skipped: an early exit) and
        `layer_mask=` (the same as a bool [num_layers] array chosen at run time:
        self-speculation, see `specjax.drafters.LayerSkip`); None when it does not
        (`from_nnx` sets it).

    The functions are static (jit's cache key): they must be hashable and compare equal
    when they compute the same thing (module-level functions or frozen dataclasses), so
    that two CausalLMs with equal static parts share one compilation.
    """

    params: Any
    apply_fn: ApplyFn = _static()
    init_cache_fn: Callable = _static()
    _: dataclasses.KW_ONLY
    vocab_size: int = _static()
    max_seq_len: int | None = _static(default=None)
    full_forward_fn: Callable | None = _static(default=None)
    compact_fn: Callable | None = _static(default=None)
    prefill_chunk: int | None = _static(default=DEFAULT_PREFILL_CHUNK)
    num_layers: int | None = _static(default=None)

    def __post_init__(self):
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int) \
                or self.vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {self.vocab_size!r}")
        if self.prefill_chunk is not None and (isinstance(self.prefill_chunk, bool) or not
                                               isinstance(self.prefill_chunk, int)
                                               or self.prefill_chunk < 1):
            raise ValueError(f"prefill_chunk must be a positive int or None (one forward "
                             f"for the whole prompt), got {self.prefill_chunk!r}")
        if self.num_layers is not None and (isinstance(self.num_layers, bool) or not
                                            isinstance(self.num_layers, int)
                                            or self.num_layers < 1):
            raise ValueError(f"num_layers must be a positive int or None, got "
                             f"{self.num_layers!r}")

    @classmethod
    def from_nnx(cls, module: nnx.Module) -> CausalLM:
        """Functional view of an NNX decoder (split once here, merged inside each trace).

        The module must be called as `module(tokens, positions, cache, cache_lengths,
        new_mask)` returning `(logits, hidden, cache)`, accept `cache=None` for a full
        forward, define `init_cache(batch, max_len)`, and have a `config` with
        `vocab_size` and `max_seq_len` (as `specjax_models.Transformer` does).
        """
        if not isinstance(module, nnx.Module):
            raise TypeError(f"CausalLM.from_nnx expects a flax.nnx.Module, got {type(module)}")
        config = getattr(module, "config", None)
        if config is None or not hasattr(config, "vocab_size"):
            raise TypeError("CausalLM.from_nnx needs module.config with vocab_size and "
                            "max_seq_len (as specjax_models.Transformer has)")
        if not hasattr(module, "init_cache"):
            raise TypeError("CausalLM.from_nnx needs module.init_cache(batch, max_len)")
        graphdef, params, other = nnx.split(module, nnx.Param, ...)
        if jax.tree.leaves(other):
            raise ValueError("CausalLM.from_nnx supports modules whose state is only nnx.Param; "
                             f"this one also holds {nnx.to_pure_dict(other)!r}")
        compact = _NnxCompact(graphdef) if hasattr(module, "compact_cache") else None
        return cls(params, _NnxApply(graphdef), _NnxInitCache(graphdef),
                   vocab_size=config.vocab_size, max_seq_len=getattr(config, "max_seq_len", None),
                   full_forward_fn=_NnxFullForward(graphdef), compact_fn=compact,
                   num_layers=getattr(config, "num_layers", None))

    def apply(self, tokens_BT: Array, positions_BT: Array, cache, cache_lengths_B: Array,
              new_mask_BTT: Array | None = None, feature_layers: tuple[int, ...] = (),
              layers: tuple[int, ...] | None = None, head: bool = True,
              layer_mask: Array | None = None):
        """`(logits f32[B,T,V], hidden[B,T,D], cache)` for T new tokens per row.

        `feature_layers` (static): hidden becomes `[B, T, F + 1, D]`, the residual stream
        entering each listed layer then the final hidden state, from the same forward;
        `apply_fn` must then take a `feature_layers=` keyword (`from_nnx` models do).
        `layers` (static increasing block indices, None: all): run only those blocks
        (see `num_layers`); the cache entries of the others are left as they were.
        `layer_mask` (bool [num_layers], data): the blocks to run, chosen at run time, so
        one compiled program serves every subset (`specjax.drafters.LayerSkip`'s set);
        `apply_fn` must take a `layer_mask=` keyword (`from_nnx` models do).
        `head=False` (with `layers` or `layer_mask`): stop after those blocks and return
        `(None, residual stream [B, T, D], cache)`, the stream before the final norm (an
        early exit, `specjax.drafters.EarlyExit`); the LM head is not computed.
        """
        if not head and ((layers is None and layer_mask is None) or feature_layers):
            raise ValueError("head=False is an early exit after a subset of the layers: pass "
                             "layers= or layer_mask=, and no feature_layers (the stream is "
                             "the output)")
        if (layers is not None or layer_mask is not None) and self.num_layers is None:
            raise ValueError("this CausalLM cannot run a subset of its layers: its "
                             "apply_fn takes no layers= (give num_layers=, or build it "
                             "with CausalLM.from_nnx from a specjax_models.Transformer)")
        if layer_mask is not None:
            check_layer_mask(layer_mask, self.num_layers, layers, feature_layers)
            early_exit = {} if head else {"head": False}
            return self.apply_fn(self.params, tokens_BT, positions_BT, cache, cache_lengths_B,
                                 new_mask_BTT, layer_mask=layer_mask, **early_exit)
        if layers is not None:
            early_exit = {} if head else {"head": False}
            return self.apply_fn(self.params, tokens_BT, positions_BT, cache, cache_lengths_B,
                                 new_mask_BTT, feature_layers=tuple(feature_layers),
                                 layers=tuple(layers), **early_exit)
        if feature_layers:
            return self.apply_fn(self.params, tokens_BT, positions_BT, cache, cache_lengths_B,
                                 new_mask_BTT, feature_layers=tuple(feature_layers))
        return self.apply_fn(self.params, tokens_BT, positions_BT, cache, cache_lengths_B,
                             new_mask_BTT)

    def init_cache(self, batch: int, max_len: int):
        """A fresh fixed-size cache for `batch` rows of at most `max_len` tokens."""
        return self.init_cache_fn(self.params, batch, max_len)

    def compact_cache(self, cache, start_B: Array, sources_BD: Array):
        """Copy slot `sources[b, d]` to slot `start[b] + d` (see `compact_fn`)."""
        if self.compact_fn is None:
            raise ValueError("this CausalLM has no compact_fn, which token trees need to "
                             "move the accepted path's cache entries; pass "
                             "compact_fn=... (or use a chain of drafts)")
        return self.compact_fn(self.params, cache, start_B, sources_BD)

    def logits(self, tokens_BT) -> Array:
        """No-cache full forward: float32 `[B, T, V]`, `logits[:, t]` predicts token t+1."""
        return _full_logits(self, jnp.asarray(tokens_BT, jnp.int32))

    def with_prefill_chunk(self, chunk: int | None) -> CausalLM:
        """The same model prefilling prompts in chunks of `chunk` tokens (None: whole)."""
        return dataclasses.replace(self, prefill_chunk=chunk)

    def with_params(self, params) -> CausalLM:
        """The same model with other parameters (e.g. cast to another dtype)."""
        return dataclasses.replace(self, params=params)

    def __repr__(self):
        num = sum(getattr(x, "size", 0) for x in jax.tree.leaves(self.params))
        return (f"CausalLM(vocab_size={self.vocab_size}, max_seq_len={self.max_seq_len}, "
                f"params={num:,})")


def full_logits(lm: CausalLM, tokens_BT: Array) -> Array:
    """No-cache forward (traceable, differentiable): float32 logits `[B, T, V]`."""
    if lm.full_forward_fn is not None:
        return lm.full_forward_fn(lm.params, tokens_BT).astype(jnp.float32)
    batch, length = tokens_BT.shape
    positions_BT = jnp.broadcast_to(jnp.arange(length), (batch, length))
    cache = lm.init_cache(batch, length)
    logits, _, _ = lm.apply(tokens_BT, positions_BT, cache, jnp.zeros((batch,), jnp.int32))
    return logits.astype(jnp.float32)


_full_logits = jax.jit(full_logits)


def prefill(lm: CausalLM, cache, prompt_tokens_BP: Array, prompt_lengths_B: Array, *,
            feature_layers: tuple[int, ...] = (), keep_hidden: bool = True):
    """Write the padded prompts into `cache`.

    Returns `(cache, cache_lengths, last_token, hidden)` under the decode invariant: the
    cache holds each prompt but its last token, which is returned to be fed next. Pad slots
    past a row's length are written too but stay masked, and are overwritten later.
    `hidden` is the prompts' hidden states (with `feature_layers`, their features; see
    `CausalLM.apply`), which feature drafters read at their first step; None unless
    `keep_hidden`.

    A prompt wider than `lm.prefill_chunk` is written in chunks of that many tokens, one
    compiled forward in a `lax.scan`: activations and scores are bounded by the chunk, not
    the prompt. The last chunk ends at the prompt's end (it may start inside the previous
    one, whose slots it rewrites with the same tokens), so the cache needs no room past
    the prompt.
    """
    batch, width = prompt_tokens_BP.shape
    last_token_B = jnp.take_along_axis(prompt_tokens_BP, prompt_lengths_B[:, None] - 1,
                                       axis=1)[:, 0]
    chunk = lm.prefill_chunk
    if chunk is None or width <= chunk:
        positions_BP = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch, width))
        _, hidden, cache = lm.apply(prompt_tokens_BP, positions_BP, cache,
                                    jnp.zeros((batch,), jnp.int32),
                                    feature_layers=feature_layers)
        return cache, prompt_lengths_B - 1, last_token_B, hidden if keep_hidden else None

    def forward(cache, start):
        tokens_BC = jax.lax.dynamic_slice_in_dim(prompt_tokens_BP, start, chunk, axis=1)
        positions_BC = jnp.broadcast_to(start + jnp.arange(chunk, dtype=jnp.int32),
                                        (batch, chunk))
        _, hidden, cache = lm.apply(tokens_BC, positions_BC, cache,
                                    jnp.full((batch,), start, jnp.int32),
                                    feature_layers=feature_layers)
        return cache, hidden

    starts = np.minimum(np.arange(-(-width // chunk)) * chunk, width - chunk).astype(np.int32)
    if not keep_hidden:
        cache, _ = jax.lax.scan(lambda cache, start: (forward(cache, start)[0], None), cache,
                                starts)
        return cache, prompt_lengths_B - 1, last_token_B, None
    chunk_hidden = jax.eval_shape(forward, cache, jnp.int32(0))[1]
    hidden = jnp.zeros((batch, width) + chunk_hidden.shape[2:], chunk_hidden.dtype)

    def forward_keeping_hidden(carry, start):
        cache, hidden = carry
        cache, chunk_hidden = forward(cache, start)
        return (cache, jax.lax.dynamic_update_slice_in_dim(hidden, chunk_hidden, start,
                                                           axis=1)), None

    (cache, hidden), _ = jax.lax.scan(forward_keeping_hidden, (cache, hidden), starts)
    return cache, prompt_lengths_B - 1, last_token_B, hidden
