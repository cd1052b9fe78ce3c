"""Training a P-EAGLE head: an EAGLE head that drafts K positions in one forward
(`specjax.drafters.ParallelEagle`).

At inference the head reads the committed pairs (the target's fused feature before each
token, the token) and then K - 1 placeholder pairs (the learned feature `mask_hidden`, the
token `mask_id`); its output at the last committed pair predicts draft 1 and its output at
the j-th placeholder draft j + 1. Training packs every offset into one forward per
sequence with PARD's layout (`specjax.training.parallel.parallel_layout`): copy 0 is the
sequence of teacher pairs (the ordinary next-token task), and copy c at position j is a
placeholder pair that reads the teacher pairs up to j - c and its own chain of c
placeholders, takes position id j and predicts token j + 1. Its label is the target's
distribution after the real tokens up to j: drawn from the target, the tokens in between
make that an unbiased label of what the head must predict from fewer tokens (PARD's
argument; the head is a draft model whose inputs include the target's features). COD
thins the placeholder copies as it does for a parallel draft, and target-aligned weighting
weights each offset by the head's own chance of reaching it.

The frozen target runs inside each step (as `train_head` runs it): the features and the
full next-token distributions at temperature 1, so the soft cross-entropy and the held-out
acceptance `acceptance@c` (sum_x min(p, q) at offset c) and `expected_accepted` (a K-draft
step under the token rule) cover the whole vocabulary. Only the head's parameters train
(`mask_hidden` with them); the embedding and LM head are the target's, frozen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.drafters.eagle import Eagle
from specjax.drafters.feature_head import head_block, head_inputs, init_mask_hidden
from specjax.lm.causal_lm import CausalLM
from specjax.training.config import TrainConfig
from specjax.training.heads import target_outputs
from specjax.training.loop import TrainResult, _run, epoch_batches
from specjax.training.parallel import (
    ParallelTrainConfig,
    chain_reached,
    layout_loss_and_metrics,
    parallel_layout,
)

LAYOUT_KEYS = ("copy", "position", "chain", "mask")


def parallel_head_outputs(head: Eagle, tokens_BT: Array, fused_BTD: Array,
                          layout: Mapping) -> Array:
    """float32 [B, S, D]: the head's outputs at every slot of a packed layout, in one
    forward with no cache. `fused_BTD`: the target's fused features (`head._features`) at
    every position; slot (0, j) reads the pair (feature at j - 1, token j), slot (c > 0,
    j) the placeholder pair (mask_hidden, mask_id) at position j."""
    batch = tokens_BT.shape[0]
    copy_S, position_S = layout["copy"], layout["position"]
    slots = copy_S.shape[0]
    real_BS = copy_S[None] == 0
    positions_BS = jnp.broadcast_to(position_S, (batch, slots))
    tokens_BS = jnp.where(real_BS, jnp.take_along_axis(tokens_BT, positions_BS, axis=1),
                          head.config.mask_id)
    previous_BTD = jnp.concatenate([jnp.zeros_like(fused_BTD[:, :1]), fused_BTD[:, :-1]],
                                   axis=1)
    teacher_BSD = jnp.take_along_axis(previous_BTD, positions_BS[..., None], axis=1)
    features_BSD = jnp.where(real_BS[..., None], teacher_BSD,
                             head.params["mask_hidden"].astype(jnp.float32))
    inputs = head_inputs(head.params, head.config, head.embedding, tokens_BS, features_BSD,
                         positions_BS)
    # Copy 0 comes first in the layout, so slot 0 is the pair at position 0 (the slot a
    # head with first_pair=False hides from the others).
    out_BSD, _ = head_block(head.params, head.config, inputs, positions_BS, None, None,
                            jnp.broadcast_to(layout["mask"], (batch, slots, slots)))
    return out_BSD


def _slot_terms(head: Eagle, target: CausalLM, batch: Mapping,
                config: ParallelTrainConfig) -> dict:
    """Per slot, float32 [B, S]: soft cross-entropy against the target's distribution at
    the slot's position, acceptance sum_x min(p, q), `reached` and `valid`."""
    tokens_BT = batch["tokens"]
    p_BTV, hidden = target_outputs(target, tokens_BT, head.feature_layers)
    out_BSD = parallel_head_outputs(head, tokens_BT, head._features(hidden), batch)
    log_q_BSV = jax.nn.log_softmax(head._logits(out_BSD), axis=-1)  # -inf off a reduced vocab
    p_BSV = jnp.take_along_axis(p_BTV, batch["position"][None, :, None], axis=1)
    cross_entropy_BS = -jnp.sum(jnp.where(jnp.isfinite(log_q_BSV), p_BSV * log_q_BSV, 0.0),
                                axis=-1)
    accept_BS = jnp.sum(jnp.minimum(p_BSV, jnp.exp(log_q_BSV)), axis=-1)
    return {"cross_entropy": cross_entropy_BS, "acceptance": accept_BS,
            "reached": chain_reached(accept_BS, batch["chain"], config.positions),
            "valid": jnp.ones(accept_BS.shape, bool)}


def parallel_head_terms(head: Eagle, target: CausalLM, batch: Mapping,
                        config: ParallelTrainConfig) -> tuple[Array, dict]:
    """(loss, metrics) of one batch: `tokens` int32 [B, T] and a layout
    (`parallel_layout`). Metrics: `acceptance@c` per offset, `expected_accepted`."""
    return layout_loss_and_metrics(_slot_terms(head, target, batch, config), batch["copy"],
                                   config)


def check_parallel_head(head: Eagle, config: ParallelTrainConfig, length: int) -> None:
    """Refuse a head or settings this training cannot use, naming the fix."""
    if not isinstance(head, Eagle):
        raise TypeError(f"train_parallel_head trains a specjax.drafters.Eagle, got "
                        f"{type(head).__name__}")
    if head.config.kind not in ("eagle1", "eagle3"):
        raise ValueError(f"a parallel head is an EAGLE-1 or EAGLE-3 head; this one is "
                         f"{head.config.kind!r}")
    if head.config.mask_id is None or "mask_hidden" not in head.params:
        raise ValueError("the head has no placeholder: build it with "
                         "FeatureHeadConfig(mask_id=...), or adapt a trained head with "
                         "specjax.training.with_placeholder(head, mask_id)")
    if head.config.mask_id != config.mask_id:
        raise ValueError(f"the head's mask_id ({head.config.mask_id}) differs from the "
                         f"training's ({config.mask_id})")
    if config.mask_id >= head.embedding.shape[0]:
        raise ValueError(f"mask_id {config.mask_id} is not a row of the head's embedding "
                         f"({head.embedding.shape[0]} rows)")
    if config.positions > length:
        raise ValueError(f"positions={config.positions} exceeds the sequences' {length} "
                         "tokens")


def with_placeholder(head: Eagle, mask_id: int, key: Array | None = None) -> Eagle:
    """`head` (e.g. a trained autoregressive EAGLE-3 head) made ready for parallel
    training: its config takes `mask_id`, its parameters a `mask_hidden` feature,
    initialised as a new head's is (`init_mask_hidden`; `key` seeds it, None: key 0).
    The head's other parameters are kept."""
    config = dataclasses.replace(head.config, mask_id=mask_id)
    mask_hidden = init_mask_hidden(config.d_model, jax.random.key(0) if key is None else key)
    return dataclasses.replace(head, config=config,
                               params={**head.params, "mask_hidden": mask_hidden})


def train_parallel_head(head: Eagle, target: CausalLM, data: np.ndarray,
                        config: TrainConfig, parallel: ParallelTrainConfig, *,
                        batch_size: int = 32, checkpoint_dir: str | Path | None = None,
                        heldout: list[np.ndarray] = (), seed: int = 0,
                        progress: bool = True,
                        max_seconds: float | None = None) -> TrainResult:
    """Train a P-EAGLE head on `data` int32 [N, T] (e.g. the target's own continuations,
    `self_distillation_data`) with the target frozen and run in each step. `head`: an
    `Eagle` with a placeholder (`FeatureHeadConfig(mask_id=...)`, or `with_placeholder`
    on a trained head to adapt it). Each step packs its batch with a fresh COD layout, a
    pure function of (seed, step); held-out batches use fixed layouts. Same loop,
    checkpoints and exact resume as `train_head`; the history records held-out
    `acceptance@c` per offset and `expected_accepted`."""
    data = np.asarray(data, np.int32)
    if data.ndim != 2:
        raise ValueError(f"data must be int [N, T], got shape {data.shape}")
    length = data.shape[1]
    check_parallel_head(head, parallel, length)
    for rows in heldout:
        if np.ndim(rows) != 2 or np.shape(rows)[1] != length:
            raise ValueError(f"held-out batches must be int [n, {length}] like the data, got "
                             f"shape {np.shape(rows)}")
    rows_of = epoch_batches(data, batch_size, seed)
    loss_of = lambda model, batch, aux: parallel_head_terms(model, aux, batch, parallel)[0]
    metrics_of = lambda model, batch, aux: parallel_head_terms(model, aux, batch, parallel)[1]

    def batches(step, params):
        layout = parallel_layout(length, parallel, np.random.default_rng([seed, step, 7]))
        return {"tokens": rows_of(step), **{key: layout[key] for key in LAYOUT_KEYS}}

    held = []
    for i, rows in enumerate(heldout):
        layout = parallel_layout(length, parallel, np.random.default_rng([seed, 10_000 + i]))
        held.append({"tokens": np.asarray(rows, np.int32),
                     **{key: layout[key] for key in LAYOUT_KEYS}})
    return _run(head, loss_of, batches, config, checkpoint_dir and Path(checkpoint_dir),
                held, "train-drafter", progress, max_seconds, aux=target,
                metrics_of=metrics_of)
