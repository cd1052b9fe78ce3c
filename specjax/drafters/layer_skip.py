"""Self-speculation by layer skipping (Draft & Verify, Zhang et al. 2023; SWIFT, Xia et al.
2024): the target drafts for itself with some of its layers skipped.

No second model and no copy of any weight: the drafter holds no parameters, the step hands
it the target (`drafts_with_target`), and each draft forward runs the target's own blocks
minus the skipped ones (`CausalLM.apply(..., layer_mask=kept)`). For committed positions the
layers it runs read the keys and values the full model wrote in the target's cache; the
drafted positions' keys and values go to the cache slots from the last committed token on,
which the verify forward rewrites with the full model's before anything reads them (the
verify writes slots `lengths - 1 .. lengths - 1 + K`, the drafts used `lengths - 1 ..
lengths + K - 2`), so the drafter needs no cache of its own and no scratch memory.

Which layers to skip: given, or searched on calibration prompts by
`specjax.layer_search.search_skip_layers` (measured tokens per second). The set is data,
not a setting of the program: the drafter carries it as a mask (a fixed-size leaf), and
the target runs or passes each block at run time, so every set shares one compiled
decoder (the search measures all its candidates with one compile).
"""

from __future__ import annotations

import dataclasses
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
    confidence_leaf,
    confident_drafts,
    draft_chain,
    token_confidence,
)
from specjax.drafters.draft_model import DRAFT_METHODS
from specjax.lm.causal_lm import CausalLM

# The skipped set travels as a mask of this many flags, whatever the target's depth: one
# pytree structure for every set and every target (a deeper target is refused by name).
MAX_LAYERS = 512


@dataclasses.dataclass(frozen=True)
class LayerSkip:
    """Draft with the target minus the blocks in `skip` (a chain of K drafts).

    skip: the target's block indices to skip while drafting (at least one; not all of
      them, or the draft would be the target's embedding and head alone: allowed, but
      `allow_empty=True` must say so).
    method: "sample" draws each draft from the skipped model's warped distribution (that
      is q); "greedy" takes its argmax with a one-hot q. Both exact.
    min_confidence: offer only the leading drafts the skipped model is confident in (Draft &
      Verify's early stop of drafting; the rule is `DraftModel`'s); None: all K.

    A pytree whose one leaf is `skip_mask` (bool [MAX_LAYERS], True where a block is
    skipped): the set is data, so changing it compiles nothing. Inside a jitted program
    `skip` is None (the mask is traced); the weights it runs are the target's, passed by
    the step.
    """

    skip: tuple[int, ...] | None
    method: str = "sample"
    _: dataclasses.KW_ONLY
    min_confidence: float | None = None
    allow_empty: bool = False
    skip_mask: Array = dataclasses.field(init=False, repr=False, compare=False)

    drafts_with_target: ClassVar[bool] = True
    takes_draft_budget: ClassVar[bool] = True

    def __post_init__(self):
        skip = self.skip
        if isinstance(skip, (int, np.integer)) or not all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in skip):
            raise TypeError(f"skip must be a sequence of block indices (ints), got {skip!r}")
        skip = [int(i) for i in skip]
        if len(set(skip)) != len(skip):
            raise ValueError(f"skip repeats a layer: {tuple(skip)}")
        if not skip:
            raise ValueError("skip is empty: a draft with every layer is the target itself "
                             "(K + 1 target forwards per step); name the layers to skip, "
                             "or search them (specjax.layer_search.search_skip_layers)")
        beyond = [i for i in skip if not 0 <= i < MAX_LAYERS]
        if beyond:
            raise ValueError(f"skip names blocks {beyond} outside [0, {MAX_LAYERS}): a block "
                             "index counts from 0 and LayerSkip serves targets of up to "
                             f"{MAX_LAYERS} blocks")
        object.__setattr__(self, "skip", tuple(sorted(skip)))
        mask = np.zeros(MAX_LAYERS, bool)
        mask[list(skip)] = True
        object.__setattr__(self, "skip_mask", mask)
        if self.method not in DRAFT_METHODS:
            raise ValueError(f"method must be one of {DRAFT_METHODS}, got {self.method!r}")
        object.__setattr__(self, "min_confidence", confidence_leaf(self.min_confidence))

    def check(self, target: CausalLM, sampling: SamplingConfig) -> None:
        if target.num_layers is None:
            raise ValueError("LayerSkip needs a target that can run a subset of its layers "
                             "(CausalLM.num_layers set and an apply_fn taking layer_mask=, "
                             "as CausalLM.from_nnx of a specjax_models.Transformer gives)")
        if target.num_layers > MAX_LAYERS:
            raise ValueError(f"LayerSkip serves targets of up to {MAX_LAYERS} blocks; this "
                             f"one has {target.num_layers}")
        if self.skip is None:
            raise ValueError("this LayerSkip's set is traced (it was rebuilt inside a jitted "
                             "program); check the drafter you built, outside jit")
        outside = [i for i in self.skip if not 0 <= i < target.num_layers]
        if outside:
            raise ValueError(f"LayerSkip skips layers {outside}, outside this target's "
                             f"[0, {target.num_layers})")
        if len(self.skip) == target.num_layers and not self.allow_empty:
            raise ValueError(f"LayerSkip skips all {target.num_layers} layers: the draft "
                             "would be the embedding and the head alone; pass "
                             "allow_empty=True if that is meant")

    def kept_layers(self, num_layers: int) -> tuple[int, ...]:
        """The blocks a draft forward runs (outside jit: the set must be concrete)."""
        if self.skip is None:
            raise ValueError("this LayerSkip's set is traced; read kept_mask inside jit")
        return tuple(i for i in range(num_layers) if i not in self.skip)

    def kept_mask(self, num_layers: int) -> Array:
        """bool [num_layers]: the blocks a draft forward runs (traced or concrete)."""
        return jnp.logical_not(jnp.asarray(self.skip_mask)[:num_layers])

    @property
    def graded_num_real(self) -> bool:
        return self.min_confidence is not None

    def forwards_per_step(self, num_draft_tokens: int) -> int:
        return num_draft_tokens

    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array, capacity: int) -> tuple:
        return ()  # nothing of its own: it reads the target's cache

    def propose(self, state: tuple, context: DraftContext, key: Array, *,
                num_draft_tokens: int, sampling: SamplingParams, vocab_size: int,
                target: CausalLM, target_cache: Any, draft_budget: Array | None = None
                ) -> tuple[tuple, Proposal, Any]:
        """K one-token forwards of the kept blocks, from the last committed token (only
        `draft_budget` of them when given: `AdaptiveLength`)."""
        kept_L = self.kept_mask(target.num_layers)
        lengths_B = context.lengths
        last_B = jnp.take_along_axis(context.sequence, lengths_B[:, None] - 1, axis=1)[:, 0]

        def draft_one(carry, step_key):
            cache, token_B, slot_B = carry
            logits_B1V, _, cache = target.apply(token_B[:, None], slot_B[:, None], cache,
                                                slot_B, layer_mask=kept_L)
            logits_BV = logits_B1V[:, 0].astype(jnp.float32)
            next_B, q_BV = draw_with_q(step_key, logits_BV, sampling,
                                       deterministic=self.method == "greedy")
            confidence = () if self.min_confidence is None else (
                token_confidence(logits_BV, next_B),)
            return (cache, next_B, slot_B + 1), (next_B, q_BV, *confidence)

        (cache, _, _), (tokens_KB, q_KBV, *confidence_KB) = draft_chain(
            draft_one, (target_cache, last_B, lengths_B - 1),
            jax.random.split(key, num_draft_tokens), draft_budget)
        num_real_B = None
        if self.min_confidence is not None:  # static
            num_real_B = confident_drafts(jnp.swapaxes(confidence_KB[0], 0, 1),
                                          self.min_confidence)
        return state, Proposal(tokens=tokens_KB.T, q=jnp.transpose(q_KBV, (1, 0, 2)),
                               num_real=num_real_B), cache

    def commit(self, state: tuple, commit: Commit) -> tuple:
        return state


def _concrete_skip(mask) -> tuple[int, ...] | None:
    """The set a concrete mask holds; None for a traced one (or a placeholder jax puts in a
    leaf's place while it rebuilds the tree)."""
    if isinstance(mask, jax.core.Tracer):
        return None
    try:
        flags = np.asarray(mask)
    except Exception:  # noqa: BLE001 - any placeholder: no concrete set
        return None
    if flags.shape != (MAX_LAYERS,) or flags.dtype != bool:
        return None
    return tuple(int(i) for i in np.flatnonzero(flags))


def _flatten(drafter: LayerSkip):
    return ((drafter.skip_mask, drafter.min_confidence),
            (drafter.method, drafter.allow_empty))


def _flatten_with_keys(drafter: LayerSkip):
    children, settings = _flatten(drafter)
    return tuple(zip((jax.tree_util.GetAttrKey("skip_mask"),
                      jax.tree_util.GetAttrKey("min_confidence")), children, strict=True)
                 ), settings


def _unflatten(settings, children) -> LayerSkip:
    drafter = object.__new__(LayerSkip)
    mask, min_confidence = children
    method, allow_empty = settings
    for name, value in (("skip", _concrete_skip(mask)), ("method", method),
                        ("min_confidence", min_confidence), ("allow_empty", allow_empty),
                        ("skip_mask", mask)):
        object.__setattr__(drafter, name, value)
    return drafter


jax.tree_util.register_pytree_with_keys(LayerSkip, _flatten_with_keys, _unflatten, _flatten)
