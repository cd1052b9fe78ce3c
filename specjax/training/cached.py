"""Distilling a draft model from target outputs cached once.

For a target too costly to run in every training step (a real checkpoint on a CPU), the
target runs once over each training sequence and its top-k next-token probabilities are
kept (`cache_target_outputs`); the draft is then trained against them alone. The loss
is the soft cross-entropy -sum_k p_k log q(id_k) over the cached top-k mass, which is the
forward KL(p || q) of DistillSpec up to the target's entropy (a constant) and the mass
outside the top k. It is scored over the draft's own vocabulary (a reduced one, see
`specjax.DraftModel(..., draft_vocab=ids)`, is never scattered to the target's).
`soft_label_terms` is shared with the EAGLE-3 heads' cached training (`heads.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.lm.causal_lm import CausalLM, full_logits
from specjax.training.config import TrainConfig
from specjax.training.loop import TrainResult, _run, epoch_batches

DISTILL_KEYS = ("tokens", "label_index", "label_probs", "loss_mask")


def masked_mean(values: Array, mask: Array) -> Array:
    """Mean of `values` over the positions where `mask` holds (0 when none does)."""
    mask = mask.astype(jnp.float32)
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def soft_label_terms(log_q_BTV: Array, label_index_BTK: Array, label_probs_BTK: Array,
                     valid_BT: Array) -> tuple[Array, Array]:
    """`(soft cross-entropy, expected acceptance)`, float32 scalars averaged over `valid`
    positions. `log_q` [B, T, V'] are the draft's log-probabilities over its vocabulary,
    `label_index` [B, T, k] the columns of the target's top-k ids in it (-1: the draft
    cannot produce the id; it then counts for neither term) and `label_probs` [B, T, k]
    their target probabilities. Acceptance is sum_k min(p_k, q_k), speculative sampling's
    acceptance probability at temperature 1 over the cached mass (a lower bound)."""
    probs_BTK = label_probs_BTK.astype(jnp.float32)
    reachable_BTK = label_index_BTK >= 0
    log_q_BTK = jnp.take_along_axis(log_q_BTV, jnp.maximum(label_index_BTK, 0), axis=-1)
    cross_entropy_BT = -jnp.sum(jnp.where(reachable_BTK, probs_BTK * log_q_BTK, 0.0), -1)
    accept_BT = jnp.sum(jnp.where(reachable_BTK, jnp.minimum(probs_BTK, jnp.exp(log_q_BTK)),
                                  0.0), -1)
    return masked_mean(cross_entropy_BT, valid_BT), masked_mean(accept_BT, valid_BT)


def draft_terms(draft: CausalLM, batch: Mapping) -> tuple[Array, Array]:
    """`soft_label_terms` of `draft` (next-token logits at every position, one no-cache
    forward) on a batch of cached outputs, over its `loss_mask` positions."""
    log_q_BTV = jax.nn.log_softmax(full_logits(draft, batch["tokens"]), axis=-1)
    return soft_label_terms(log_q_BTV, batch["label_index"], batch["label_probs"],
                            batch["loss_mask"].astype(bool))


@dataclasses.dataclass(frozen=True)
class _Trained:
    """What the loop optimises: the draft's parameter groups that are not frozen."""

    params: dict

    def with_params(self, params: dict) -> _Trained:
        return _Trained(params)


def _check_data(draft: CausalLM, data: Mapping, name: str) -> None:
    missing = [key for key in DISTILL_KEYS if key not in data]
    if missing:
        raise ValueError(f"{name} lacks {missing}; it needs {DISTILL_KEYS} (tokens int32 "
                         "[N, T], label_index int32 [N, T, k], label_probs [N, T, k], "
                         "loss_mask bool [N, T])")
    rows_length = tuple(np.shape(data["tokens"]))
    if len(rows_length) != 2 or tuple(np.shape(data["loss_mask"])) != rows_length:
        raise ValueError(f"{name}: tokens and loss_mask must both be [N, T], got "
                         f"{rows_length} and {tuple(np.shape(data['loss_mask']))}")
    labels = tuple(np.shape(data["label_index"]))
    if labels != tuple(np.shape(data["label_probs"])) or labels[:2] != rows_length \
            or len(labels) != 3:
        raise ValueError(f"{name}: label_index and label_probs must both be [N, T, k] with "
                         f"[N, T] = {rows_length}, got {labels} and "
                         f"{tuple(np.shape(data['label_probs']))}")
    if np.max(data["label_index"]) >= draft.vocab_size:
        raise ValueError(f"{name}: label_index holds columns beyond the draft's "
                         f"{draft.vocab_size} outputs; build it with "
                         "specjax.training.draft_label_index(top_ids, draft_vocab, V)")


def distill_cached(draft: CausalLM, data: Mapping, config: TrainConfig, *,
                   frozen: Sequence[str] = (), batch_size: int = 16,
                   checkpoint_dir: str | Path | None = None, heldout: Sequence[Mapping] = (),
                   seed: int = 0, progress: bool = True,
                   max_seconds: float | None = None) -> TrainResult:
    """Train `draft` on cached target outputs: `data` (and each `heldout` batch) a dict of
    DISTILL_KEYS arrays: tokens int32 [N, T], label_index int32 [N, T, k] (the columns of
    the target's top-k ids in the draft's logits, `draft_label_index`), label_probs
    [N, T, k] (their target probabilities, `cache_target_outputs`), loss_mask bool [N, T]
    (the positions whose next token the draft will propose).

    frozen: top-level parameter groups kept as they are (e.g. `("embed", "lm_head")`, a
      draft sharing its target's embedding and head rows): passed to the compiled step as
      arguments, neither updated nor checkpointed.
    Same loop, orbax checkpoints and exact resume as `specjax.training.train`;
    `TrainResult.lm` is the trained draft and the history records held-out
    `acceptance@1` at each evaluation."""
    check_cached_training(draft, data, heldout, frozen, "distill_cached")
    rows = epoch_batches(dict(data), batch_size, seed)
    return train_on_cached(
        draft, lambda lm, batch: draft_terms(lm, batch)[0],
        lambda lm, batch: {"acceptance@1": draft_terms(lm, batch)[1]},
        lambda step: rows(step), [dict(b) for b in heldout], config, frozen=frozen,
        checkpoint_dir=checkpoint_dir, progress=progress, max_seconds=max_seconds)


def check_cached_training(draft, data: Mapping, heldout: Sequence[Mapping],
                          frozen: Sequence[str], name: str) -> None:
    """What every cached-output trainer refuses first: a draft that is not a CausalLM
    with grouped parameters, frozen names it lacks, nothing left to train, and data or
    held-out batches without DISTILL_KEYS of matching shapes."""
    if not isinstance(draft, CausalLM):
        raise TypeError(f"{name} trains a specjax.CausalLM, got {type(draft).__name__}")
    if not isinstance(draft.params, Mapping):
        raise TypeError(f"{name} needs the draft's params as a mapping of parameter "
                        "groups (as CausalLM.from_nnx gives)")
    unknown = [group for group in frozen if group not in draft.params]
    if unknown:
        raise ValueError(f"frozen names {unknown} are not parameter groups of the draft "
                         f"({sorted(draft.params)})")
    if all(group in frozen for group in draft.params):
        raise ValueError("every parameter group is frozen: nothing to train")
    _check_data(draft, data, "data")
    for batch in heldout:
        _check_data(draft, batch, "a heldout batch")


def train_on_cached(draft: CausalLM, loss_of, metrics_of, batches, heldout: list,
                    config: TrainConfig, *, frozen: Sequence[str] = (),
                    checkpoint_dir: str | Path | None = None, progress: bool = True,
                    max_seconds: float | None = None) -> TrainResult:
    """The loop shared by the cached-output trainers (`distill_cached`,
    `specjax.training.parallel.train_parallel`; their inputs checked first by
    `check_cached_training`): `draft`'s parameter groups but `frozen` trained on
    `loss_of(lm, batch)`, `metrics_of(lm, batch)` recorded on `heldout` at each
    evaluation, `batches(step)` a pure function of the step; the frozen groups are passed
    to the compiled step as arguments, neither updated nor checkpointed."""
    groups = type(draft.params)
    trained = {group: value for group, value in draft.params.items() if group not in frozen}
    kept = {group: draft.params[group] for group in frozen}

    def full(model: _Trained, kept_groups: dict) -> CausalLM:
        return draft.with_params(groups({**model.params, **kept_groups}))

    result = _run(_Trained(trained),
                  lambda model, batch, kept_groups: loss_of(full(model, kept_groups), batch),
                  lambda step, params: batches(step), config,
                  checkpoint_dir and Path(checkpoint_dir), heldout, "distill", progress,
                  max_seconds, aux=kept,
                  metrics_of=lambda model, batch, kept_groups: metrics_of(
                      full(model, kept_groups), batch))
    return dataclasses.replace(result, lm=full(result.lm, kept))
