"""A per-row draft length that follows acceptance. Two schedules:

- "heuristic" (transformers' schedule for assisted generation): each row offers L drafts;
  after a step that accepted all L, the next offers L + `grow`, after a rejection
  L - `shrink`, always within [`min_length`, K].
- "expected_speed": each row keeps a running estimate of its per-draft acceptance alpha
  (accepted drafts over accepted drafts plus rejections, older steps weighted by `memory`
  per step, a `prior_acceptance` pseudo-trial) and offers the L in [`min_length`, K] that
  maximises the expected tokens per unit of time, (1 + alpha + ... + alpha^L) /
  (L c + v_L), with c the cost of a draft forward and v_L that of a verify of L drafts,
  both in one-token target forwards (the caller's measurements:
  `specjax.runtime.timing.step_costs`).
  L = 0 (a one-token step) is allowed: where drafting cannot pay, a row stops drafting,
  and its estimate relaxes towards the prior until a probe tells it otherwise.

It wraps any chain drafter. Shapes stay static: the drafter still drafts K per row, the
row's length goes out as `Proposal.num_real` (the smaller of the drafter's own count and
the schedule's), the step verifies the widest running row's offer (`graded_num_real`:
every width 0..K is a compiled verify) and each row accepts only among the drafts it
offered (a chain of its own length: exact). The schedule changes only from accepted
counts, so greedy output and the sampled distribution are the target's.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import Float, Int

from specjax.drafters.base import Commit, DraftContext


def _finite_real(value) -> bool:
    """A finite real number: Python's or NumPy's (np.float32 costs from a measurement), not
    a bool or a string."""
    return (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
            and math.isfinite(value))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AdaptiveLengthState:
    """drafter: the wrapped drafter's state. length: int32 [B], the heuristic's offer at
    each row's next step (before clipping to [min_length, K]; the expected-speed schedule
    records its last choice). offered: int32 [B], what each row offered at the last
    proposal (the commit judges the schedule by it). accepted / trials: float32 [B], each
    row's acceptance evidence for the expected-speed schedule (accepted drafts; accepted
    drafts plus rejections), older steps weighted down by `memory`; zero under the
    heuristic."""

    drafter: Any
    length: Int[Array, " B"]
    offered: Int[Array, " B"]
    accepted: Float[Array, " B"]
    trials: Float[Array, " B"]


def _static(**kwargs):
    return dataclasses.field(metadata={"static": True}, **kwargs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AdaptiveLength:
    """`drafter` (any chain drafter) with a per-row draft length.

    schedule: "heuristic" or "expected_speed" (module docstring).
    start: the heuristic's first length (None: K, the step's num_draft_tokens).
    grow / shrink: the heuristic's step after a step that accepted every offered draft /
      after one that rejected a draft (transformers: 2 and 1).
    min_length: the shortest offer (None: 1 for the heuristic, which learns only from
      offers; 0 for expected_speed, whose rows stop drafting where it cannot pay).
    draft_cost: expected_speed's c, a draft forward in one-token target forwards (0 for a
      drafter with no forward: prompt lookup).
    verify_costs: expected_speed's v_0, v_1, ...: a verify of L drafts (L + 1 tokens) in
      one-token target forwards, at least K + 1 of them (None: 1.0 each, the memory-bound
      accelerator's case).
    memory: expected_speed's weight of a step's evidence one step later (in [0, 1)).
    prior_acceptance: expected_speed's alpha before any evidence (one pseudo-trial), the
      value an idle row's estimate relaxes to.
    """

    drafter: Any
    _: dataclasses.KW_ONLY
    schedule: str = _static(default="heuristic")
    start: int | None = _static(default=None)
    grow: int = _static(default=2)
    shrink: int = _static(default=1)
    min_length: int | None = _static(default=None)
    draft_cost: float = _static(default=0.0)
    verify_costs: tuple[float, ...] | None = _static(default=None)
    memory: float = _static(default=0.9)
    prior_acceptance: float = _static(default=0.9)

    graded_num_real: ClassVar[bool] = True
    SCHEDULES: ClassVar[tuple[str, ...]] = ("heuristic", "expected_speed")

    def __post_init__(self):
        if self.schedule not in self.SCHEDULES:
            raise ValueError(f"AdaptiveLength schedule must be one of {self.SCHEDULES}, got "
                             f"{self.schedule!r}")
        heuristic = self.schedule == "heuristic"
        if self.min_length is None:
            object.__setattr__(self, "min_length", 1 if heuristic else 0)
        lowest = {"grow": 0, "shrink": 0, "min_length": 1 if heuristic else 0, "start": 1}
        for name in ("grow", "shrink", "min_length") + (("start",) if self.start is not None
                                                         else ()):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < lowest[name]:
                raise ValueError(f"AdaptiveLength {name} must be an int >= {lowest[name]}"
                                 + (" (the heuristic learns only from offers)"
                                    if name == "min_length" and heuristic else "")
                                 + f", got {value!r}")
        if not heuristic and self.start is not None:
            raise ValueError("start is the heuristic schedule's; expected_speed starts from "
                             "prior_acceptance")
        self._check_costs()
        if not hasattr(self.drafter, "propose") or not hasattr(self.drafter, "commit"):
            raise TypeError(f"AdaptiveLength wraps a drafter (init, propose, commit), got "
                            f"{type(self.drafter).__name__}")
        if hasattr(self.drafter, "proposal_tree"):
            raise ValueError(f"{type(self.drafter).__name__} builds its own token tree; "
                             "AdaptiveLength schedules the length of a chain")

    def _check_costs(self) -> None:
        cost = self.draft_cost
        if not _finite_real(cost) or cost < 0:
            raise ValueError(f"AdaptiveLength draft_cost must be a finite number >= 0 (a draft "
                             f"forward in one-token target forwards), got {cost!r}")
        cost = float(cost)  # np.float32(0.1) and 0.1 are one setting (and one compile key)
        object.__setattr__(self, "draft_cost", cost)
        if self.verify_costs is not None:
            given = self.verify_costs
            costs = () if isinstance(given, (str, bytes)) or np.ndim(given) != 1 else \
                tuple(np.asarray(given).tolist() if isinstance(given, np.ndarray) else given)
            if not costs or not all(_finite_real(v) and v > 0 for v in costs):
                raise ValueError("AdaptiveLength verify_costs must be finite numbers > 0 (a "
                                 "verify of 0, 1, ... drafts in one-token target forwards), "
                                 f"got {self.verify_costs!r}")
            object.__setattr__(self, "verify_costs", tuple(float(v) for v in costs))
        memory, prior = self.memory, self.prior_acceptance
        if not (_finite_real(memory) and 0.0 <= memory < 1.0):
            raise ValueError(f"AdaptiveLength memory must be a number in [0, 1), got "
                             f"{memory!r}")
        if not (_finite_real(prior) and 0.0 < prior <= 1.0):
            raise ValueError(f"AdaptiveLength prior_acceptance must be a number in (0, 1], "
                             f"got {prior!r}")
        object.__setattr__(self, "memory", float(memory))
        object.__setattr__(self, "prior_acceptance", float(prior))
        if self.schedule == "heuristic" and (cost or self.verify_costs is not None):
            raise ValueError("draft_cost and verify_costs are the expected_speed schedule's; "
                             "pass schedule='expected_speed'")

    def placed_like(self, target) -> AdaptiveLength:
        """The wrapped drafter placed on the target's mesh where it can be (a draft model:
        `DraftModel.placed_like`); the schedule is unchanged."""
        place = getattr(self.drafter, "placed_like", None)
        placed = self.drafter if place is None else place(target)
        return self if placed is self.drafter else dataclasses.replace(self, drafter=placed)

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

    @property
    def init_takes_draft_tokens(self) -> bool:
        return getattr(self.drafter, "init_takes_draft_tokens", False)

    def check(self, target, sampling) -> None:
        self.drafter.check(target, sampling)

    def forwards_per_step(self, num_draft_tokens: int) -> int:
        return self.drafter.forwards_per_step(num_draft_tokens)

    def init(self, prompt_tokens_BP: Array, prompt_lengths_B: Array, capacity: int,
             **kwargs) -> AdaptiveLengthState:
        batch = prompt_tokens_BP.shape[0]
        start = jnp.iinfo(jnp.int32).max if self.start is None else self.start
        zeros_B = jnp.zeros((batch,), jnp.float32)
        return AdaptiveLengthState(
            self.drafter.init(prompt_tokens_BP, prompt_lengths_B, capacity, **kwargs),
            jnp.full((batch,), start, jnp.int32), jnp.zeros((batch,), jnp.int32), zeros_B,
            zeros_B)

    def acceptance_estimate(self, state: AdaptiveLengthState) -> Float[Array, " B"]:
        """Each row's per-draft acceptance alpha: (accepted + prior) / (trials + 1)."""
        return (state.accepted + self.prior_acceptance) / (state.trials + 1.0)

    def expected_speed_length(self, state: AdaptiveLengthState,
                              num_draft_tokens: int) -> Int[Array, " B"]:
        """The L in [min_length, K] with the most expected tokens per unit of time."""
        k = num_draft_tokens
        verify = self.verify_costs or (1.0,) * (k + 1)
        if len(verify) < k + 1:
            raise ValueError(f"AdaptiveLength verify_costs has {len(verify)} entries; "
                             f"num_draft_tokens={k} needs {k + 1} (drafts 0..{k})")
        lengths_L = jnp.arange(k + 1, dtype=jnp.float32)
        cost_L = lengths_L * self.draft_cost + jnp.asarray(verify[:k + 1], jnp.float32)
        alpha_B = self.acceptance_estimate(state)
        # E[tokens | L drafts] = 1 + alpha + ... + alpha^L: the accepted prefix plus one.
        tokens_BL = jnp.cumsum(alpha_B[:, None] ** lengths_L[None, :], axis=-1)
        speed_BL = tokens_BL / cost_L[None, :]
        speed_BL = jnp.where(lengths_L[None, :] >= min(self.min_length, k), speed_BL,
                             -jnp.inf)
        return jnp.argmax(speed_BL, axis=-1).astype(jnp.int32)  # ties: the shorter

    def propose(self, state: AdaptiveLengthState, context: DraftContext, key: Array, *,
                num_draft_tokens: int, **kwargs):
        if self.schedule == "expected_speed":
            length_B = self.expected_speed_length(state, num_draft_tokens)
        else:
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
        new_state = dataclasses.replace(state, drafter=inner_state, length=length_B,
                                        offered=offered_B)
        return (new_state, dataclasses.replace(proposal, num_real=offered_B), *out[2:])

    def commit(self, state: AdaptiveLengthState, commit: Commit) -> AdaptiveLengthState:
        inner = self.drafter.commit(state.drafter, commit)
        accepted_B = jnp.minimum(commit.num_accepted, state.offered)
        all_accepted_B = accepted_B >= state.offered
        judged_B = commit.active & (state.offered > 0)
        if self.schedule == "heuristic":
            grown_B = jnp.where(all_accepted_B, state.length + self.grow,
                                jnp.maximum(state.length - self.shrink, self.min_length))
            return dataclasses.replace(state, drafter=inner,
                                       length=jnp.where(judged_B, grown_B, state.length))
        # Evidence: the accepted drafts, plus one trial for the rejection that ended them.
        # Every running step weighs the old evidence down, so an idle row (L = 0) drifts
        # back to the prior and probes again.
        new_accepted_B = jnp.where(judged_B, accepted_B, 0).astype(jnp.float32)
        new_trials_B = new_accepted_B + (judged_B & ~all_accepted_B).astype(jnp.float32)
        decay_B = jnp.where(commit.active, self.memory, 1.0)
        return dataclasses.replace(state, drafter=inner,
                                   accepted=decay_B * state.accepted + new_accepted_B,
                                   trials=decay_B * state.trials + new_trials_B)
