"""Speculative decoding metrics (DESIGN.md section 7), read from a finished state."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class SpeculativeStats:
    """Metrics of DESIGN.md section 7, per row (numpy arrays [B]) and overall (floats).

    acceptance_rate: accepted drafts / proposed drafts (DESIGN.md's alpha).
    position_acceptance_rate: accepted drafts / checked drafts, where a step checks its
      drafts up to and including the first rejection. This estimates the per-position
      acceptance probability beta that the i.i.d. model uses: E[tau] = (1 - beta^(K+1)) /
      (1 - beta). The two differ: with i.i.d. beta, acceptance_rate = sum_j beta^j / K.
    mean_accepted_length: emitted tokens / target forwards (includes the bonus or
      correction token; plain AR = 1.0).
    accepted_per_position [K]: fraction of verify steps whose draft j was accepted.
    target_forwards / draft_forwards: per row, while the row was running (prefill
    excluded); num_steps: batched verify forwards run.
    """

    acceptance_rate: float
    position_acceptance_rate: float
    mean_accepted_length: float
    accepted_per_position: np.ndarray
    target_forwards: np.ndarray
    draft_forwards: np.ndarray
    emitted: np.ndarray
    proposed: np.ndarray
    accepted: np.ndarray
    row_acceptance_rate: np.ndarray
    row_mean_accepted_length: np.ndarray
    row_accepted_per_position: np.ndarray
    num_steps: int

    @classmethod
    def from_state(cls, state) -> SpeculativeStats:
        host = jax.device_get
        proposed = np.asarray(host(state.proposed))
        accepted = np.asarray(host(state.accepted))
        forwards = np.asarray(host(state.target_forwards))
        emitted = np.asarray(host(state.lengths - state.prompt_lengths))
        per_pos = np.asarray(host(state.accepted_per_position))
        safe = lambda n: np.maximum(n, 1)
        return cls(
            acceptance_rate=float(accepted.sum() / max(proposed.sum(), 1)),
            position_acceptance_rate=float(accepted.sum()
                                           / max(np.asarray(host(state.checked)).sum(), 1)),
            mean_accepted_length=float(emitted.sum() / max(forwards.sum(), 1)),
            accepted_per_position=per_pos.sum(0) / max(forwards.sum(), 1),
            target_forwards=forwards, draft_forwards=np.asarray(host(state.draft_forwards)),
            emitted=emitted, proposed=proposed, accepted=accepted,
            row_acceptance_rate=accepted / safe(proposed),
            row_mean_accepted_length=emitted / safe(forwards),
            row_accepted_per_position=per_pos / safe(forwards)[:, None],
            num_steps=int(host(state.num_steps)))

    def as_dict(self) -> dict:
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            out[field.name] = value.tolist() if isinstance(value, np.ndarray) else value
        return out
