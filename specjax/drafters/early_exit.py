"""Kangaroo (Liu et al. 2024): self-speculation by early exit, with a trained adapter.

The draft is the target's own first n blocks (shared: no copy of any weight, their cache
is the target's), then a small trained adapter (one decoder block with its own KV cache,
`feature_head`'s kind "kangaroo") and the target's LM head. Each draft token costs n
target blocks, one adapter block and the head, instead of a whole forward; drafting stops
at the first draft whose adapter is unsure (its top probability under `stop_below`), and
the loop itself stops when no row drafts on (the early exit that gives the method its
name).

Cache bookkeeping:
- The target's cache: the n shallow blocks read the keys and values the full model wrote
  for committed tokens, and write the drafted tokens' in the slots from the last committed
  token on, which the verify forward rewrites before anything reads them (as
  `LayerSkip`).
- The adapter's cache: slot t holds the adapter's keys and values of position t, computed
  from the stream leaving the n blocks at t. `cache_lengths` counts the committed positions
  it holds: every committed token but the last. A step's first draft forward runs the last
  committed token (its stream was never computed: it is the previous step's bonus), the
  later ones run the drafts; all of them write their slots. After the verify, the slots of
  the last committed token and of the accepted drafts already hold what a fresh forward
  over the committed text would write (same tokens, same positions, the same n blocks), so
  the commit only moves `cache_lengths` on: no adapter forward, no target features needed
  after the prefill (Kangaroo reuses the drafted tokens' shallow states the same way).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.decoding.sampling import SamplingConfig, SamplingParams, draw_with_q
from specjax.drafters.base import (
    Commit,
    DraftContext,
    Proposal,
    draft_chain,
    scatter_to_vocab,
)
from specjax.drafters.draft_model import DRAFT_METHODS
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
    HEAD_REMEDY,
    check_head_arrays,
    head_config_from,
    load_head,
    restrict_lm_head,
    save_head,
)
from specjax.lm.causal_lm import CausalLM
from specjax.runtime.files import damaged

# The saved head's kind (`head.json`), next to "eagle" and "medusa".
EARLY_EXIT_KIND = "early_exit"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EarlyExitState:
    """keys / values: the adapter's cache [B, S, H_kv, hd]; cache_lengths int32 [B]: the
    committed positions it holds (every committed token but the last)."""

    keys: Array
    values: Array
    cache_lengths: Array


def _check_stop_below(value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0.0 < value <= 1.0):
        raise ValueError(f"stop_below must be None (draft all K) or a number in (0, 1], got "
                         f"{value!r}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class EarlyExit:
    """Kangaroo's drafter: the target's first `exit_layer` blocks, a trained adapter and the
    target's LM head (a chain of K drafts).

    params: the adapter's parameters (`feature_head.init_head_params` of a kind
      "kangaroo" config). lm_head: the target's LM head [V, D] (frozen; with `draft_vocab`,
      only those rows are kept). config: the adapter's shape; `config.feature_layers ==
      (exit_layer,)`. method: "sample" (q = the adapter's warped distribution) or
      "greedy" (argmax, one-hot q). draft_vocab: optional int32 target ids the adapter
      scores (others get draft probability 0), as `Eagle`'s.
    stop_below: Kangaroo's early exit: a row offers drafts up to (not including) the first
      whose adapter's top probability (at temperature 1) is under this; None offers all K.
      The test for draft j reads only the adapter's distribution at j, which depends on
      the drafts before j and never on draft j's value, so the offered drafts still follow
      q: exact. The draft loop ends as soon as no row drafts on.

    Build one with `EarlyExit.create(config, lm_head, key)` and train it with
    `specjax.training.train_head` (method "kangaroo") or `train_head_cached`.
    """

    params: dict
    lm_head: Array
    config: FeatureHeadConfig = dataclasses.field(metadata={"static": True})
    method: str = dataclasses.field(default="sample", metadata={"static": True})
    draft_vocab: Array | None = None
    stop_below: float | None = dataclasses.field(default=0.6, metadata={"static": True})

    reads_target_features: ClassVar[bool] = True
    drafts_with_target: ClassVar[bool] = True
    takes_draft_budget: ClassVar[bool] = True

    def __post_init__(self):
        if not isinstance(self.config, FeatureHeadConfig) or self.config.kind != "kangaroo":
            raise TypeError("EarlyExit takes a FeatureHeadConfig of kind 'kangaroo', got "
                            f"{getattr(self.config, 'kind', type(self.config).__name__)!r}")
        if self.method not in DRAFT_METHODS:
            raise ValueError(f"method must be one of {DRAFT_METHODS}, got {self.method!r}")
        _check_stop_below(self.stop_below)
        shape = getattr(self.lm_head, "shape", None)
        if shape is not None and (len(shape) != 2 or shape[1] != self.config.d_model):
            raise ValueError(f"lm_head must be [vocab, d_model={self.config.d_model}], got "
                             f"{tuple(shape)}")

    @classmethod
    def create(cls, config: FeatureHeadConfig, lm_head: Array, key: Array,
               method: str = "sample", draft_vocab=None,
               stop_below: float | None = 0.6) -> EarlyExit:
        """A randomly initialised adapter on the target's LM head [V, D]."""
        lm_head, draft_vocab = restrict_lm_head(jnp.asarray(lm_head), draft_vocab)
        return cls(init_head_params(config, key), lm_head, config, method, draft_vocab,
                   stop_below)

    @property
    def exit_layer(self) -> int:
        """The drafts run the target's blocks [0, exit_layer)."""
        return self.config.feature_layers[0]

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.config.feature_layers

    @property
    def graded_num_real(self) -> bool:
        return self.stop_below is not None

    def with_params(self, params: dict) -> EarlyExit:
        return dataclasses.replace(self, params=params)

    def with_method(self, method: str) -> EarlyExit:
        return dataclasses.replace(self, method=method)

    def with_stop_below(self, stop_below: float | None) -> EarlyExit:
        return dataclasses.replace(self, stop_below=stop_below)

    # -- saving ------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        """`head.json` (kind "early_exit", the adapter's config) and `head.npz`; the target's
        LM head is not saved (the adapter is loaded onto its target)."""
        extra = {} if self.draft_vocab is None else {DRAFT_VOCAB_KEY: self.draft_vocab}
        save_head(directory, EARLY_EXIT_KIND, self.config.to_dict(), {**self.params, **extra})

    @classmethod
    def load(cls, directory: str | Path, lm_head: Array, method: str = "sample",
             stop_below: float | None = 0.6) -> EarlyExit:
        kind, fields, params = load_head(directory)
        if kind != EARLY_EXIT_KIND:
            raise ValueError(f"{directory} holds a {kind} head, not an early-exit adapter")
        directory = Path(directory)
        config = head_config_from(directory, fields)
        if config.kind != "kangaroo":
            raise damaged(directory / "head.json", f"names an early-exit adapter of kind "
                          f"{config.kind!r}, expected 'kangaroo'", HEAD_REMEDY)
        draft_vocab = params.pop(DRAFT_VOCAB_KEY, None)
        check_head_arrays(directory, config, params, draft_vocab)
        if lm_head.shape[1] != config.d_model:
            raise ValueError(f"the adapter in {directory} was trained on a target of width "
                             f"{config.d_model}; this LM head is {tuple(lm_head.shape)}: load "
                             "it onto the target it was trained for")
        lm_head, draft_vocab = restrict_lm_head(jnp.asarray(lm_head), draft_vocab)
        return cls({name: jnp.asarray(value) for name, value in params.items()}, lm_head,
                   config, method, draft_vocab, stop_below)

    # -- host-side checks --------------------------------------------------------------------
    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        if target.num_layers is None:
            raise ValueError("EarlyExit drafts with the target's first blocks: it needs a "
                             "target that can run a subset of its layers (CausalLM.from_nnx "
                             "of a specjax_models.Transformer)")
        if not 0 <= self.exit_layer < target.num_layers:
            raise ValueError(f"the adapter exits at layer {self.exit_layer}, outside this "
                             f"target's [0, {target.num_layers}) blocks: load it onto the "
                             "target it was trained for")
        if self.draft_vocab is not None:
            ids = np.asarray(self.draft_vocab)
            if ids.size and (ids.min() < 0 or ids.max() >= target.vocab_size):
                raise ValueError(f"the adapter's draft_vocab holds ids outside the target's "
                                 f"vocabulary [0, {target.vocab_size})")
        elif self.lm_head.shape[0] != target.vocab_size:
            raise ValueError(f"the adapter's lm_head has {self.lm_head.shape[0]} rows but the "
                             f"target's vocab_size is {target.vocab_size}: take it from that "
                             "target (specjax_models.embedding_and_head)")

    def forwards_per_step(self, num_draft_tokens: int) -> int:
        return num_draft_tokens

    # -- traced ------------------------------------------------------------------------------
    def _logits(self, out: Array, vocab_size: int) -> Array:
        """Float32 logits over the target's `vocab_size` ids (-inf outside a draft
        vocabulary)."""
        logits = head_logits(self.params, self.config, self.lm_head, out)
        if self.draft_vocab is None:
            return logits
        return scatter_to_vocab(logits, self.draft_vocab, vocab_size)

    def adapter(self, features_BTD: Array, positions_BT: Array, keys: Array | None = None,
                values: Array | None = None, cache_lengths_B: Array | None = None):
        """The adapter block over T positions' streams: `(out [B, T, D], keys, values)`,
        the new keys and values written at slots `cache_lengths[b] + t` of its cache; with
        no cache (training), a causal forward over the T positions alone (keys, values
        None)."""
        inputs = head_inputs(self.params, self.config, None, None, features_BTD)
        cache = None if keys is None else (keys, values)
        out_BTD, cache = head_block(self.params, self.config, inputs, positions_BT, cache,
                                    cache_lengths_B)
        return (out_BTD, *(cache or (None, None)))

    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array, capacity: int, *,
             features: Array) -> EarlyExitState:
        batch, width = prompt_tokens_BP.shape
        stream_BPD = fuse_features(self.params, self.config, features)
        # The drafts and the commit write slots below lengths + K, which the target's
        # capacity already holds room for (the step's K + 1 extra slots).
        keys, values = init_head_cache(self.config, batch, capacity)
        positions_BP = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch, width))
        _, keys, values = self.adapter(stream_BPD, positions_BP, keys, values,
                                       jnp.zeros((batch,), jnp.int32))
        return EarlyExitState(keys, values, (prompt_lengths_B - 1).astype(jnp.int32))

    def propose(self, state: EarlyExitState, context: DraftContext, key: Array, *,
                num_draft_tokens: int, sampling: SamplingParams, vocab_size: int,
                target: CausalLM, target_cache: Any, draft_budget: Array | None = None
                ) -> tuple[EarlyExitState, Proposal, Any]:
        """Up to K drafts, each from the last token: its stream through the target's first
        `exit_layer` blocks, the adapter, the LM head. Stops after `draft_budget` drafts
        (`AdaptiveLength`) or when every row has exited."""
        shallow = tuple(range(self.exit_layer))
        lengths_B = context.lengths
        last_B = jnp.take_along_axis(context.sequence, lengths_B[:, None] - 1, axis=1)[:, 0]
        deterministic = self.method == "greedy"

        def draft_one(carry, step_key):
            cache, keys, values, token_B, slot_B, drafting_B = carry
            _, stream_B1D, cache = target.apply(token_B[:, None], slot_B[:, None], cache,
                                                slot_B, layers=shallow, head=False)
            out_B1D, keys, values = self.adapter(stream_B1D, slot_B[:, None], keys, values,
                                                 slot_B)
            logits_BV = self._logits(out_B1D[:, 0], vocab_size)
            next_B, q_BV = draw_with_q(step_key, logits_BV, sampling,
                                       deterministic=deterministic)
            if self.stop_below is not None:  # static
                top_B = jnp.max(jax.nn.softmax(logits_BV, axis=-1), axis=-1)
                drafting_B = drafting_B & (top_B >= self.stop_below)
            return (cache, keys, values, next_B, slot_B + 1, drafting_B), (next_B, q_BV,
                                                                          drafting_B)

        batch = lengths_B.shape[0]
        carry = (target_cache, state.keys, state.values, last_B, lengths_B - 1,
                 jnp.ones((batch,), bool))
        # The first forward (the last committed token's stream) always runs: the commit
        # counts on its adapter slot.
        budget = None if draft_budget is None else jnp.maximum(draft_budget, 1)
        keep_going = None if self.stop_below is None else (lambda c: jnp.any(c[5]))
        (cache, keys, values, _, _, _), (tokens_KB, q_KBV, offered_KB) = draft_chain(
            draft_one, carry, jax.random.split(key, num_draft_tokens), budget, keep_going)
        num_real_B = None if self.stop_below is None else jnp.sum(
            offered_KB.astype(jnp.int32), axis=0)
        proposal = Proposal(tokens=tokens_KB.T, q=jnp.transpose(q_KBV, (1, 0, 2)),
                            num_real=num_real_B)
        return dataclasses.replace(state, keys=keys, values=values), proposal, cache

    def commit(self, state: EarlyExitState, commit: Commit) -> EarlyExitState:
        """The drafts wrote the adapter slots of the last committed token and of every draft
        but the last one run (module docstring); a row that accepted all it was offered
        also needs its last accepted draft's slot: one adapter position per row, from the
        verify's stream at the row's last accepted node (elsewhere it rewrites a slot with
        what it held, or writes scratch)."""
        accepted_B = commit.num_accepted.astype(jnp.int32)
        stream_BND = fuse_features(self.params, self.config, commit.target_hidden)
        index_B = jnp.minimum(accepted_B, stream_BND.shape[1] - 1)
        stream_B1D = jnp.take_along_axis(stream_BND, index_B[:, None, None], axis=1)
        slot_B = commit.old_lengths - 1 + index_B
        _, keys, values = self.adapter(stream_B1D, slot_B[:, None], state.keys, state.values,
                                       slot_B)
        return EarlyExitState(keys, values, (commit.new_lengths - 1).astype(jnp.int32))
