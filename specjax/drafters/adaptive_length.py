"""A per-row draft length that follows acceptance (transformers' "heuristic" schedule for
assisted generation): each row offers L drafts; after a step that accepted all L, the
next offers L + `grow`, after a rejection L - `shrink`, always within [`min_length`, K].

It wraps any chain drafter. Shapes stay static: the drafter still drafts K per row, the
row's length goes out as `Proposal.num_real` (the smaller of the drafter's own count and
the schedule's), the step verifies the widest running row's offer (`graded_num_real`:
every width 0..K is a compiled verify) and each row accepts only among the drafts it
offered (a chain of its own length: exact). The schedule changes only from accepted
counts, so greedy output and the sampled distribution are the target's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Int

from specjax.drafters.base import Commit, DraftContext


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AdaptiveLengthState:
    """drafter: the wrapped drafter's state. length: int32 [B], the drafts each row offers
    at its next step (before clipping to [min_length, K]). offered: int32 [B], what each
    row offered at the last proposal (the commit judges the schedule by it)."""

    drafter: Any
    length: Int[Array, " B"]
    offered: Int[Array, " B"]


def _static(**kwargs):
    return dataclasses.field(metadata={"static": True}, **kwargs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AdaptiveLength:
    """`drafter` (any chain drafter) with a per-row draft length.

    start: the first step's length (None: K, the step's num_draft_tokens).
    grow / shrink: added after a step that accepted every offered draft / subtracted after
      one that rejected a draft (transformers: 2 and 1).
    min_length: the shortest offer (>= 1).
    """

    drafter: Any
    _: dataclasses.KW_ONLY
    start: int | None = _static(default=None)
    grow: int = _static(default=2)
    shrink: int = _static(default=1)
    min_length: int = _static(default=1)

    graded_num_real: ClassVar[bool] = True

    def __post_init__(self):
        for name in ("grow", "shrink", "min_length") + (("start",) if self.start is not None
                                                         else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (
                    1 if name in ("min_length", "start") else 0):
                raise ValueError(f"AdaptiveLength {name} must be an int >= "
                                 f"{1 if name in ('min_length', 'start') else 0}, got "
                                 f"{value!r}")
        if not hasattr(self.drafter, "propose") or not hasattr(self.drafter, "commit"):
            raise TypeError(f"AdaptiveLength wraps a drafter (init, propose, commit), got "
                            f"{type(self.drafter).__name__}")
        if hasattr(self.drafter, "proposal_tree"):
            raise ValueError(f"{type(self.drafter).__name__} builds its own token tree; "
                             "AdaptiveLength schedules the length of a chain")

    # What the step reads about a drafter is the wrapped one's.
    @property
    def reads_target_features(self) -> bool:
        return getattr(self.drafter, "reads_target_features", False)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return tuple(getattr(self.drafter, "feature_layers", ()))

    @property
    def reads_target_tokens(self) -> bool:
        return getattr(self.drafter, "reads_target_tokens", False)

    @property
    def drafts_with_target(self) -> bool:
        return getattr(self.drafter, "drafts_with_target", False)

    def check(self, target, sampling) -> None:
        self.drafter.check(target, sampling)

    def forwards_per_step(self, num_draft_tokens: int) -> int:
        return self.drafter.forwards_per_step(num_draft_tokens)

    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array, capacity: int,
             **kwargs) -> AdaptiveLengthState:
        batch = prompt_tokens_BP.shape[0]
        start = jnp.iinfo(jnp.int32).max if self.start is None else self.start
        return AdaptiveLengthState(
            self.drafter.init(prompt_tokens_BP, prompt_lengths_B, capacity, **kwargs),
            jnp.full((batch,), start, jnp.int32), jnp.zeros((batch,), jnp.int32))

    def propose(self, state: AdaptiveLengthState, context: DraftContext, key: Array, *,
                num_draft_tokens: int, **kwargs):
        length_B = jnp.clip(state.length, min(self.min_length, num_draft_tokens),
                            num_draft_tokens).astype(jnp.int32)
        if getattr(self.drafter, "takes_draft_budget", False):
            # A drafter that drafts in a loop stops after the longest row's offer.
            kwargs["draft_budget"] = jnp.max(length_B)
        out = self.drafter.propose(state.drafter, context, key,
                                   num_draft_tokens=num_draft_tokens, **kwargs)
        inner_state, proposal = out[0], out[1]
        offered_B = length_B if proposal.num_real is None else jnp.minimum(
            length_B, jnp.clip(proposal.num_real, 0, num_draft_tokens).astype(jnp.int32))
        new_state = AdaptiveLengthState(inner_state, length_B, offered_B)
        return (new_state, dataclasses.replace(proposal, num_real=offered_B), *out[2:])

    def commit(self, state: AdaptiveLengthState, commit: Commit) -> AdaptiveLengthState:
        all_accepted_B = commit.num_accepted >= state.offered
        judged_B = commit.active & (state.offered > 0)
        grown_B = jnp.where(all_accepted_B, state.length + self.grow,
                            jnp.maximum(state.length - self.shrink, self.min_length))
        return AdaptiveLengthState(self.drafter.commit(state.drafter, commit),
                                   jnp.where(judged_B, grown_B, state.length), state.offered)
