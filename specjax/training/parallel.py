"""Adapting a draft model into a parallel draft (PARD, An et al., ICLR 2026, arXiv
2504.18583), on target outputs cached once.

A parallel draft reads the committed text and then K - 1 mask tokens, and predicts the
next K tokens at once (`specjax.drafters.ParallelDraft`). PARD trains all K offsets in
one forward per sequence: the sequence (copy 0, the ordinary next-token task) is followed
by K - 1 copies made of mask tokens. Copy c at position j stands for "the text up to j - c,
then c masks": it attends to the real tokens up to j - c and to the masks of copies 1..c
at positions j - c + 1 .. j (its own chain), takes position id j, and predicts token
j + 1. With the target's outputs cached, its label is the target's distribution after
the real tokens up to j: drawn from the target, the tokens in between make that an
unbiased label of what the draft must predict from fewer tokens.

Conditional drop tokens (COD, PARD's): copy c keeps only int(T max(r^c, r_min)) of its
positions, chosen at random per batch among those whose predecessor (copy c - 1 at
position j - 1) is kept, so every kept mask still has its whole chain. The forward shrinks
from K T tokens to T (1 + r + r^2 + ...), the sampled offsets stay unbiased.

Target-aligned weighting (an option; PARD-2, arXiv 2605.08632, weights offsets by the
acceptance length they buy): offset c's loss at a position is weighted by the draft's own
expected acceptance of the c offsets before it on the same chain (sum_k min(p_k, q_k) over
the cached top-k, held constant in the gradient): the chance that draft c is reached at
all. Our reading of the method; off by default.

The loss is the soft cross-entropy against the cached top-k (`soft_label_terms`, as the
draft model's cached distillation), and the held-out metrics are the expected acceptance
at each offset (`acceptance@c`, c = 1..K) and the expected accepted length of a K-draft
step under the token rule (`expected_accepted`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specjax.lm.causal_lm import CausalLM
from specjax.training.cached import (
    DISTILL_KEYS,
    check_cached_training,
    masked_mean,
    train_on_cached,
)
from specjax.training.config import TrainConfig
from specjax.training.loop import TrainResult, epoch_batches


@dataclasses.dataclass(frozen=True)
class ParallelTrainConfig:
    """mask_id: the mask token (an id the draft reads; the text never holds it).
    positions: K, the drafts predicted at once (copies of the sequence, >= 1). keep_ratio,
    min_keep: COD, copy c keeps int(T max(keep_ratio^c, min_keep)) positions (1.0: all).
    aligned: weight each offset by the chance it is reached (module docstring)."""

    mask_id: int
    positions: int = 4
    keep_ratio: float = 0.5
    min_keep: float = 0.1
    aligned: bool = False

    def __post_init__(self):
        if isinstance(self.mask_id, bool) or not isinstance(self.mask_id, int) or \
                self.mask_id < 0:
            raise ValueError(f"mask_id must be a token id >= 0, got {self.mask_id!r}")
        if isinstance(self.positions, bool) or not isinstance(self.positions, int) or \
                not 1 <= self.positions <= 64:
            raise ValueError(f"positions (K) must be an int in [1, 64], got {self.positions!r}")
        for name in ("keep_ratio", "min_keep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")

    def kept(self, length: int) -> list[int]:
        """Positions each copy keeps, for sequences of `length` tokens (copy 0: all)."""
        counts = [length]
        for copy in range(1, self.positions):
            want = int(length * max(self.keep_ratio ** copy, self.min_keep))
            counts.append(max(0, min(want, counts[-1] - 1, length - copy)))
        return counts


def parallel_layout(length: int, config: ParallelTrainConfig,
                    rng: np.random.Generator) -> dict:
    """One batch's packed layout (the same for every row): per kept slot its `copy`,
    `position` and `chain` (the slot of its predecessor, copy - 1 at position - 1; -1 for
    copy 0), all int32 [S], and `mask` bool [S, S] (who attends to whom)."""
    copies = [np.zeros(length, np.int32)]
    positions = [np.arange(length, dtype=np.int32)]
    chain = [np.full(length, -1, np.int32)]
    slot_of = {(0, j): j for j in range(length)}
    previous = np.arange(length)
    for copy, count in enumerate(config.kept(length)[1:], start=1):
        candidates = previous[previous + 1 < length] + 1
        chosen = np.sort(rng.choice(candidates, size=count, replace=False)) if count else \
            np.zeros(0, np.int64)
        first = len(slot_of)
        for offset, j in enumerate(chosen):
            slot_of[(copy, int(j))] = first + offset
        copies.append(np.full(count, copy, np.int32))
        positions.append(chosen.astype(np.int32))
        chain.append(np.asarray([slot_of[(copy - 1, int(j) - 1)] for j in chosen], np.int32))
        previous = chosen
    copy_S, position_S = np.concatenate(copies), np.concatenate(positions)
    # Slot s = (c, j) sees real tokens j' <= j - c, and the masks (c', j - c + c'), c' <= c.
    base_S = position_S - copy_S  # the last real position each slot reads
    real_t = copy_S == 0
    sees_real = real_t[None, :] & (position_S[None, :] <= base_S[:, None])
    sees_chain = (~real_t[None, :] & (copy_S[None, :] <= copy_S[:, None])
                  & (base_S[None, :] == base_S[:, None]))
    return {"copy": copy_S, "position": position_S, "chain": np.concatenate(chain),
            "mask": sees_real | sees_chain}


def parallel_logits(draft: CausalLM, tokens_BT: Array, layout: Mapping,
                    mask_id: int) -> Array:
    """float32 [B, S, V']: the draft's logits at every slot of the packed layout (one
    forward, no cache carried over)."""
    batch = tokens_BT.shape[0]
    copy_S, position_S = layout["copy"], layout["position"]
    slots = copy_S.shape[0]
    real_tokens_BS = jnp.take_along_axis(tokens_BT, jnp.broadcast_to(position_S, (batch, slots)),
                                         axis=1)
    tokens_BS = jnp.where(copy_S[None] == 0, real_tokens_BS, mask_id)
    positions_BS = jnp.broadcast_to(position_S, (batch, slots))
    mask_BSS = jnp.broadcast_to(layout["mask"], (batch, slots, slots))
    cache = draft.init_cache(batch, slots)
    logits, _, _ = draft.apply(tokens_BS, positions_BS, cache, jnp.zeros((batch,), jnp.int32),
                               mask_BSS)
    return logits.astype(jnp.float32)


def slot_terms(draft: CausalLM, batch: Mapping, config: ParallelTrainConfig) -> dict:
    """Per slot of the packed layout, float32 [B, S]: `cross_entropy` against the cached
    top-k, `acceptance` (sum_k min(p_k, q_k)), `reached` (the draft's own chance that every
    earlier offset on the slot's chain is accepted, 1 for copy 0; a constant of the
    gradient) and `valid` (bool: the label is in the loss mask and the slot reads at least
    one real token)."""
    copy_S, position_S, chain_S = batch["copy"], batch["position"], batch["chain"]
    log_q_BSV = jax.nn.log_softmax(parallel_logits(draft, batch["tokens"], batch,
                                                   config.mask_id), axis=-1)
    label_index_BSK = jnp.take_along_axis(batch["label_index"], position_S[None, :, None],
                                          axis=1)
    label_probs_BSK = jnp.take_along_axis(batch["label_probs"], position_S[None, :, None],
                                          axis=1).astype(jnp.float32)
    valid_BS = jnp.take_along_axis(batch["loss_mask"].astype(bool), position_S[None], axis=1)
    valid_BS &= (position_S >= copy_S)[None]
    reachable_BSK = label_index_BSK >= 0
    log_q_BSK = jnp.take_along_axis(log_q_BSV, jnp.maximum(label_index_BSK, 0), axis=-1)
    cross_entropy_BS = -jnp.sum(jnp.where(reachable_BSK, label_probs_BSK * log_q_BSK, 0.0), -1)
    accept_BS = jnp.sum(jnp.where(reachable_BSK,
                                  jnp.minimum(label_probs_BSK, jnp.exp(log_q_BSK)), 0.0), -1)
    return {"cross_entropy": cross_entropy_BS, "acceptance": accept_BS,
            "reached": chain_reached(accept_BS, chain_S, config.positions),
            "valid": valid_BS}


def chain_reached(acceptance_BS: Array, chain_S: Array, positions: int) -> Array:
    """float32 [B, S]: per slot of a packed layout, the product of the acceptances of the
    slots before it on its chain (1 for copy 0), held constant in the gradient: the
    chance that its offset is reached at all."""
    held_BS = jax.lax.stop_gradient(acceptance_BS)
    reached_BS = jnp.ones_like(held_BS)
    for _ in range(positions - 1):  # static: one link of the chain per pass
        link_BS = jnp.take_along_axis(held_BS * reached_BS, jnp.maximum(chain_S, 0)[None],
                                      axis=1)
        reached_BS = jnp.where((chain_S >= 0)[None], link_BS, 1.0)
    return reached_BS


def parallel_terms(draft: CausalLM, batch: Mapping, config: ParallelTrainConfig
                   ) -> tuple[Array, dict]:
    """(loss, metrics) of one batch (`batch`: DISTILL_KEYS and a layout)."""
    return layout_loss_and_metrics(slot_terms(draft, batch, config), batch["copy"], config)


def layout_loss_and_metrics(terms: Mapping, copy_S: Array, config: ParallelTrainConfig
                            ) -> tuple[Array, dict]:
    """(loss, metrics) from per-slot `terms` (cross_entropy, acceptance, reached, valid,
    each [B, S]): the mean cross-entropy over valid slots, weighted by `reached` when
    `config.aligned`; `acceptance@c` per offset and `expected_accepted`."""
    valid_BS = terms["valid"]
    weight_BS = terms["reached"] if config.aligned else jnp.ones_like(terms["reached"])
    weight_BS = weight_BS * valid_BS.astype(jnp.float32)
    loss = jnp.sum(terms["cross_entropy"] * weight_BS) / jnp.maximum(jnp.sum(weight_BS), 1e-6)
    metrics = {}
    expected = 0.0
    chained_BS = jax.lax.stop_gradient(terms["acceptance"]) * terms["reached"]
    for copy in range(config.positions):  # static
        in_copy_BS = valid_BS & (copy_S == copy)[None]
        metrics[f"acceptance@{copy + 1}"] = masked_mean(terms["acceptance"], in_copy_BS)
        # A K-draft step under the token rule accepts draft c + 1 when it and every draft
        # before it are accepted: the chain's product, averaged over the kept positions.
        expected = expected + masked_mean(chained_BS, in_copy_BS)
    metrics["expected_accepted"] = expected
    return loss, metrics


def cached_labels(target: CausalLM, sequences: np.ndarray, *, prompt_len: int,
                  top_k: int = 16, batch_size: int = 64) -> dict:
    """DISTILL_KEYS arrays from whole sequences int32 [N, T] (prompt then the target's own
    continuation): the target's top-k next-token probabilities at every position (one
    forward per batch of rows, cached once) and a loss mask over the positions whose next
    token is a continuation token (from prompt_len - 1 on)."""
    from specjax.training.heads import cache_target_outputs

    sequences = np.asarray(sequences, np.int32)
    if sequences.ndim != 2 or not 1 <= prompt_len < sequences.shape[1]:
        raise ValueError(f"sequences must be int [N, T] with 1 <= prompt_len < T, got shape "
                         f"{sequences.shape} and prompt_len {prompt_len}")
    outputs = jax.jit(cache_target_outputs, static_argnums=(2, 3))
    ids, probs = [], []
    for start in range(0, len(sequences), batch_size):
        out = outputs(target, jnp.asarray(sequences[start:start + batch_size]), (), top_k)
        ids.append(np.asarray(out["top_ids"]))
        probs.append(np.asarray(out["top_probs"]))
    loss_mask = np.zeros(sequences.shape, bool)
    loss_mask[:, prompt_len - 1:-1] = True  # the last position's label lies past the text
    return {"tokens": sequences, "label_index": np.concatenate(ids).astype(np.int32),
            "label_probs": np.concatenate(probs), "loss_mask": loss_mask}


def train_parallel(draft: CausalLM, data: Mapping, config: TrainConfig,
                   parallel: ParallelTrainConfig, *, frozen: Sequence[str] = (),
                   batch_size: int = 16, checkpoint_dir: str | Path | None = None,
                   heldout: Sequence[Mapping] = (), seed: int = 0, progress: bool = True,
                   max_seconds: float | None = None,
                   input_vocab_size: int | None = None) -> TrainResult:
    """Adapt `draft` into a parallel draft on cached target outputs (`data` and each
    `heldout` batch: DISTILL_KEYS arrays, as `specjax.training.distill_cached` takes).
    Each step packs its batch with a fresh COD layout, a pure function of (seed, step);
    held-out batches use fixed layouts. The packed forward must attend in one block
    (`sum(parallel.kept(T))` slots; for a specjax_models draft,
    `specjax_models.with_attention_blocks(draft, block_size=S, query_block=S)`): a loop
    over key blocks cannot be differentiated. Same loop, checkpoints and exact resume as
    `distill_cached`; the history records `acceptance@c` per offset and
    `expected_accepted` at each evaluation. `input_vocab_size`: the ids the draft reads,
    where they are more than the ids it scores (a reduced draft vocabulary, whose
    `label_index` are columns of its head); default `draft.vocab_size`."""
    check_cached_training(draft, data, heldout, frozen, "train_parallel")
    readable = draft.vocab_size if input_vocab_size is None else input_vocab_size
    if parallel.mask_id >= readable:
        raise ValueError(f"mask_id {parallel.mask_id} is not an id of the draft's "
                         f"vocabulary [0, {readable})")
    length = int(np.shape(data["tokens"])[1])
    if parallel.positions > length:
        raise ValueError(f"positions={parallel.positions} exceeds the sequences' {length} "
                         "tokens")
    rows = epoch_batches({key: data[key] for key in DISTILL_KEYS}, batch_size, seed)

    def batches(step):
        layout = parallel_layout(length, parallel, np.random.default_rng([seed, step, 7]))
        return {**rows(step), **layout}

    held = [{**{key: b[key] for key in DISTILL_KEYS},
             **parallel_layout(length, parallel, np.random.default_rng([seed, 10_000 + i]))}
            for i, b in enumerate(heldout)]
    return train_on_cached(
        draft, lambda lm, batch: parallel_terms(lm, batch, parallel)[0],
        lambda lm, batch: parallel_terms(lm, batch, parallel)[1], batches, held, config,
        frozen=frozen, checkpoint_dir=checkpoint_dir, progress=progress,
        max_seconds=max_seconds)
