"""Speculative decoding metrics (DESIGN.md section 7), read from a finished state."""

from __future__ import annotations

import dataclasses

import numpy as np

from specjax.runtime.distributed import fetch


@dataclasses.dataclass(frozen=True)
class SpeculativeStats:
    """Metrics of DESIGN.md section 7, per row (numpy arrays [B]) and overall (floats).

    acceptance_rate: accepted drafts / proposed drafts (DESIGN.md's alpha).
    position_acceptance_rate: accepted drafts / checked drafts, where a step checks its
      drafts up to and including the first rejection. This estimates the per-position
      acceptance probability beta that the i.i.d. model uses: E[tau] = (1 - beta^(K+1)) /
      (1 - beta) (under the token rule; block verification keeps more than that model
      says: `specjax.analysis.block_acceptance_by_position`). The two differ: with
      i.i.d. beta, acceptance_rate = sum_j beta^j / K.
    mean_accepted_length: emitted tokens / target forwards (includes the bonus or
      correction token; plain AR = 1.0).
    accepted_per_position [N]: fraction of verify steps whose accepted path contains node
      j (for a chain: draft j was accepted).
    accepted_length_distribution [N+1]: fraction of verify steps that accepted d nodes,
      d = 0..N (for a tree, the accepted depth; entries past the tree's depth are 0).
    nodes_per_step: nodes (drafts) the target verified per forward, besides the last
      committed token (N; a row's count stops when it finishes), of a chain only those
      that could become output (`proposed` / `target_forwards`).
    target_forwards / draft_forwards: per row, while the row was running (prefill
    excluded); emitted / proposed / accepted / checked: per-row counts; num_steps:
    batched verify forwards run.
    verification: the rule the steps ran (`specjax.verification.rule_that_ran`): "block",
      "traversal", "token", "greedy" (every row at temperature 0: the argmax matches,
      whatever rule was asked for), "typical (not exact; epsilon=..., delta=...)"; or None
      when unknown (stats built from counts, or merged from runs under different rules).
    A draft counts as proposed and accepted only where it could become output: drafts
    past a row's max_new_tokens (and past the EOS that ends it) are neither, so alpha and
    tau agree on short requests. The per-position figures (accepted_per_position,
    accepted_length_distribution) count what verification accepted, uncut: unbiased
    per-offset estimates whatever the limit (so acceptance_rate is their mean only where
    no step was cut).
    """

    acceptance_rate: float
    position_acceptance_rate: float
    mean_accepted_length: float
    accepted_per_position: np.ndarray
    accepted_length_distribution: np.ndarray
    nodes_per_step: float
    target_forwards: np.ndarray
    draft_forwards: np.ndarray
    emitted: np.ndarray
    proposed: np.ndarray
    accepted: np.ndarray
    checked: np.ndarray
    row_acceptance_rate: np.ndarray
    row_mean_accepted_length: np.ndarray
    row_accepted_per_position: np.ndarray
    row_accepted_length_counts: np.ndarray
    num_steps: int
    verification: str | None = None

    @classmethod
    def from_counts(cls, *, proposed, accepted, checked, emitted, target_forwards,
                    draft_forwards, accepted_per_position, accepted_length_counts,
                    num_steps: int, verification: str | None = None) -> SpeculativeStats:
        """Stats from per-row counts (numpy [B]; accepted_per_position [B, K];
        accepted_length_counts [B, K+1])."""
        proposed, accepted, checked, emitted, forwards, per_pos, length_counts = (
            np.asarray(x) for x in (proposed, accepted, checked, emitted, target_forwards,
                                    accepted_per_position, accepted_length_counts))
        safe = lambda n: np.maximum(n, 1)
        return cls(
            acceptance_rate=float(accepted.sum() / max(proposed.sum(), 1)),
            position_acceptance_rate=float(accepted.sum() / max(checked.sum(), 1)),
            mean_accepted_length=float(emitted.sum() / max(forwards.sum(), 1)),
            accepted_per_position=per_pos.sum(0) / max(forwards.sum(), 1),
            accepted_length_distribution=length_counts.sum(0) / max(forwards.sum(), 1),
            nodes_per_step=float(proposed.sum() / max(forwards.sum(), 1)),
            target_forwards=forwards, draft_forwards=np.asarray(draft_forwards),
            emitted=emitted, proposed=proposed, accepted=accepted, checked=checked,
            row_acceptance_rate=accepted / safe(proposed),
            row_mean_accepted_length=emitted / safe(forwards),
            row_accepted_per_position=per_pos / safe(forwards)[:, None],
            row_accepted_length_counts=length_counts,
            num_steps=int(num_steps), verification=verification)

    @classmethod
    def from_state(cls, state, rows: int | None = None,
                   verification: str | None = None) -> SpeculativeStats:
        """The stats of a (finished) `SpeculativeState`: of its first `rows` rows (the
        caller's, without a mesh's padding rows), or of all; `verification` names the rule
        its steps ran."""
        host = fetch(
            (state.proposed, state.accepted, state.checked, state.lengths - state.prompt_lengths,
             state.target_forwards, state.draft_forwards, state.accepted_per_position,
             state.accepted_length_counts, state.num_steps))
        host = tuple(x[:rows] if x.ndim else x for x in host)
        names = ("proposed", "accepted", "checked", "emitted", "target_forwards",
                 "draft_forwards", "accepted_per_position", "accepted_length_counts",
                 "num_steps")
        return cls.from_counts(**dict(zip(names, host, strict=True)), verification=verification)

    @classmethod
    def merge(cls, parts: list[SpeculativeStats]) -> SpeculativeStats:
        """The stats of several runs together (their rows side by side), e.g. one prompt
        per run at batch 1. The runs must share K."""
        if not parts:
            raise ValueError("merge needs at least one SpeculativeStats")
        widths = {p.row_accepted_per_position.shape[1] for p in parts}
        if len(widths) != 1:
            raise ValueError(f"cannot merge stats of different K: {sorted(widths)}")
        join = lambda name: np.concatenate([getattr(p, name) for p in parts])
        per_pos = np.concatenate([p.row_accepted_per_position * p.target_forwards[:, None]
                                  for p in parts])
        return cls.from_counts(
            proposed=join("proposed"), accepted=join("accepted"), checked=join("checked"),
            emitted=join("emitted"), target_forwards=join("target_forwards"),
            draft_forwards=join("draft_forwards"),
            accepted_per_position=np.rint(per_pos).astype(np.int64),
            accepted_length_counts=join("row_accepted_length_counts"),
            num_steps=sum(p.num_steps for p in parts),
            verification=parts[0].verification
            if len({p.verification for p in parts}) == 1 else None)

    def as_dict(self) -> dict:
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            out[field.name] = value.tolist() if isinstance(value, np.ndarray) else value
        return out
