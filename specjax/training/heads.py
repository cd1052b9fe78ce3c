"""Training feature drafters (Medusa, EAGLE-1, EAGLE-3, MTP) by self-distillation.

Data: continuations that the target itself generates from corpus prompts
(`self_distillation_data`), as the Medusa and EAGLE recipes do. The frozen target runs
inside each training step (its features and next-token distributions are recomputed, so
nothing is cached to disk: the bundled target costs less than the head's backward pass).
Losses, float32, averaged over valid positions:

- medusa: head m at position t against the target's distribution at t + m + 1 (the token
  m + 2 ahead of t), cross-entropy with the target's distribution as the label, weighted
  `decay ** m` (Medusa-1 uses the generated token as a hard label; the distribution it was
  drawn from is the same label with less noise).
- eagle (EAGLE-1): smooth-L1 regression of the head's output onto the target's feature at
  t, plus `classification_weight` (0.1) times the soft cross-entropy of its logits against
  the target's distribution at t. Teacher-forced (unroll 1).
- eagle3 (EAGLE-3): soft cross-entropy over `unroll` steps of training-time test: step j
  feeds the head its own outputs of step j - 1, and position t then plays the j-th draft
  after the prefix ending at t - j (it attends to the teacher pairs up to t - j and to its
  own chain), weighted `decay ** j`.
- mtp: the same unrolled recursion with a hard cross-entropy on the generated tokens.
- kangaroo (an `EarlyExit` adapter): soft cross-entropy of the adapter over the stream
  leaving the target's first n blocks at t against the target's distribution at t,
  teacher-forced: at inference the adapter reads the target's own streams of the drafted
  tokens too, never its own outputs, so there is nothing to unroll.

Cached target outputs (`train_head_cached`, EAGLE-3): for a target too costly to run in
every step (SmolLM2 on CPU), `cache_target_outputs` runs it once over the data and keeps
what the head needs: the fused layers' residual streams (float16) and the target's top-k
next-token probabilities (the soft label, truncated to its k most likely ids; the loss and
the acceptance estimate then cover that mass only, a lower bound of the full figures).

Held-out acceptance: for the heads, the expected acceptance of the target sampling at
temperature 1 from the head's distribution at each draft depth, sum_x min(p(x), q(x)),
reported during training (`acceptance@d`).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding.autoregressive import generate
from specjax.decoding.sampling import SamplingConfig
from specjax.drafters.eagle import Eagle
from specjax.drafters.early_exit import EarlyExit
from specjax.drafters.feature_head import (
    attention_weights,
    finish_block,
    first_pair_visibility,
    fuse_features,
    head_inputs,
    head_logits,
    project_qkv,
)
from specjax.drafters.medusa import Medusa, medusa_logits
from specjax.lm.causal_lm import CausalLM
from specjax.training.cached import masked_mean, soft_label_terms
from specjax.training.config import TrainConfig
from specjax.training.loop import TrainResult, _run, epoch_batches

HEAD_METHODS = ("medusa", "eagle", "eagle3", "mtp", "kangaroo")
DEFAULT_UNROLL = {"medusa": 1, "eagle": 1, "eagle3": 4, "mtp": 4, "kangaroo": 1}


@dataclasses.dataclass(frozen=True, kw_only=True)
class HeadTrainConfig:
    """method: one of HEAD_METHODS. unroll: training-time-test steps (eagle3, mtp; 1 for
    the others). decay: loss weight ratio between successive depths (heads for Medusa).
    classification_weight: EAGLE-1's weight of the cross-entropy next to the regression."""

    method: str
    unroll: int | None = None
    decay: float = 0.8
    classification_weight: float = 0.1

    def __post_init__(self):
        if self.method not in HEAD_METHODS:
            raise ValueError(f"method must be one of {HEAD_METHODS}, got {self.method!r}")
        if self.unroll is None:
            object.__setattr__(self, "unroll", DEFAULT_UNROLL[self.method])
        if self.unroll < 1:
            raise ValueError(f"unroll must be >= 1, got {self.unroll}")
        if self.method in ("medusa", "eagle", "kangaroo") and self.unroll != 1:
            raise ValueError(f"{self.method} trains teacher-forced (unroll=1); training-time "
                             "test is for eagle3 and mtp")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {self.decay}")


def target_outputs(target: CausalLM, tokens_BT, feature_layers: tuple[int, ...]):
    """The frozen target over whole sequences: `(p [B, T, V] float32 at temperature 1,
    hidden)`, hidden as `CausalLM.apply` returns it with `feature_layers`."""
    batch, length = tokens_BT.shape
    positions_BT = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    logits_BTV, hidden, _ = target.apply(tokens_BT, positions_BT,
                                         target.init_cache(batch, length),
                                         jnp.zeros((batch,), jnp.int32),
                                         feature_layers=feature_layers)
    p_BTV = jax.nn.softmax(logits_BTV.astype(jnp.float32), axis=-1)
    return jax.lax.stop_gradient(p_BTV), jax.lax.stop_gradient(hidden)


def _soft_cross_entropy(p_BTV, logits_BTV):
    """-sum_x p(x) log q(x) over the ids the draft can produce (a reduced draft vocabulary
    gives the others logit -inf; their target mass is what the draft gives up)."""
    log_q = jax.nn.log_softmax(logits_BTV, axis=-1)
    return -jnp.sum(jnp.where(jnp.isfinite(log_q), p_BTV * log_q, 0.0), axis=-1)


def _acceptance(p_BTV, logits_BTV):
    return jnp.sum(jnp.minimum(p_BTV, jax.nn.softmax(logits_BTV, axis=-1)), axis=-1)


def _shift_right(x_BT, steps: int):
    """x[:, t - steps] at t (zeros before the start)."""
    if steps == 0:
        return x_BT
    pad = jnp.zeros_like(x_BT[:, :steps])
    return jnp.concatenate([pad, x_BT[:, :-steps]], axis=1)


def unrolled_head(drafter: Eagle, tokens_BT, features_BTD, steps: int) -> list:
    """The head's outputs [B, T, D] at each training-time-test step (see the module
    docstring): step 0 is teacher-forced on the target's features; step j feeds the head
    its own step j - 1 outputs, each position attending to the teacher pairs up to t - j
    and to its own chain of j pairs."""
    params, config = drafter.params, drafter.config
    batch, length = tokens_BT.shape
    positions_BT = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    index_T = jnp.arange(length)
    keys, values, outputs = [], [], []
    feature_BTD = _shift_right(features_BTD, 1)
    for step in range(steps):  # static
        x_BTD, attention_input = head_inputs(params, config, drafter.embedding, tokens_BT,
                                             feature_BTD, positions_BT)
        q, k, v = project_qkv(params, config, attention_input, positions_BT)
        keys.append(k)
        values.append(v)
        # Teacher pairs up to t - step (step 0: causal).
        visible_BTS = jnp.broadcast_to(index_T[None, :] <= index_T[:, None] - step,
                                       (batch, length, length))
        first = first_pair_visibility(config, jnp.broadcast_to(index_T, (batch, length)),
                                      index_T)
        visible_BTS = visible_BTS if first is None else visible_BTS & first
        extra, extra_values = None, []
        if step > 0:
            groups = config.num_heads // config.num_kv_heads
            q_BTKGH = q.reshape(batch, length, config.num_kv_heads, groups, -1)
            columns = []
            for i in range(1, step + 1):
                lag = step - i  # own pair i of the chain sits at t - lag
                k_i, v_i = _shift_right(keys[i], lag), _shift_right(values[i], lag)
                score_BKGT = jnp.einsum("BTKGH,BTKH->BKGT", q_BTKGH, k_i) / math.sqrt(
                    q.shape[-1])
                valid_T = index_T >= lag
                columns.append(jnp.where(valid_T[None, None, None], score_BKGT, -jnp.inf))
                extra_values.append(v_i)
            extra = jnp.stack(columns, axis=-1)
        weights, _ = attention_weights(config, q, keys[0], visible_BTS, extra)
        attended = jnp.einsum("BKGTS,BSKH->BTKGH", weights[..., :length], values[0])
        for i, v_i in enumerate(extra_values):
            attended = attended + jnp.einsum("BKGT,BTKH->BTKGH", weights[..., length + i], v_i)
        out_BTD = finish_block(params, config, x_BTD, attended)
        outputs.append(out_BTD)
        feature_BTD = _shift_right(out_BTD, 1)
    return outputs


def _eagle_terms(drafter: Eagle, target: CausalLM, tokens_BT, config: HeadTrainConfig):
    """Per unroll step: (loss, expected acceptance) averaged over valid positions."""
    p_BTV, hidden = target_outputs(target, tokens_BT, drafter.feature_layers)
    features_BTD = fuse_features(drafter.params, drafter.config, hidden)
    outputs = unrolled_head(drafter, tokens_BT, features_BTD, config.unroll)
    length = tokens_BT.shape[1]
    index_T = jnp.arange(length)
    terms = []
    for step, out_BTD in enumerate(outputs):
        logits_BTV = drafter._logits(out_BTD)  # -inf outside a reduced draft vocabulary
        valid_BT = jnp.broadcast_to(index_T >= step, tokens_BT.shape)
        accept = masked_mean(_acceptance(p_BTV, logits_BTV), valid_BT)
        if config.method == "mtp":
            hard_BT = -jnp.take_along_axis(jax.nn.log_softmax(logits_BTV[:, :-1], axis=-1),
                                           tokens_BT[:, 1:, None], axis=-1)[..., 0]
            # Tokens a reduced draft vocabulary cannot produce carry no loss.
            reachable_BT = jnp.isfinite(hard_BT)
            loss = masked_mean(jnp.where(reachable_BT, hard_BT, 0.0),
                                valid_BT[:, :-1] & reachable_BT)
        else:
            loss = masked_mean(_soft_cross_entropy(p_BTV, logits_BTV), valid_BT)
            if config.method == "eagle":
                final_BTD = hidden[..., -1, :] if hidden.ndim == 4 else hidden
                diff = out_BTD - final_BTD.astype(jnp.float32)
                smooth_l1 = jnp.where(jnp.abs(diff) < 1.0, 0.5 * diff * diff,
                                      jnp.abs(diff) - 0.5)
                loss = config.classification_weight * loss + masked_mean(
                    jnp.mean(smooth_l1, axis=-1), valid_BT)
        terms.append((loss, accept))
    return terms


def _medusa_terms(drafter: Medusa, target: CausalLM, tokens_BT, config: HeadTrainConfig):
    p_BTV, hidden_BTD = target_outputs(target, tokens_BT, ())
    logits_BTMV = medusa_logits(drafter.params, drafter.lm_head, hidden_BTD)
    length = tokens_BT.shape[1]
    terms = []
    for head in range(drafter.num_heads):
        ahead = head + 1  # the label: the target's distribution at t + head + 1
        if ahead >= length:
            break
        logits_BTV = logits_BTMV[:, : length - ahead, head]
        label_BTV = p_BTV[:, ahead:]
        loss = jnp.mean(_soft_cross_entropy(label_BTV, logits_BTV))
        terms.append((loss, jnp.mean(_acceptance(label_BTV, logits_BTV))))
    return terms


def adapter_outputs(drafter: EarlyExit, hidden) -> jax.Array:
    """A Kangaroo adapter's outputs [B, T, D] over the streams in the target's features
    (`[B, T, 2, D]`: its exit layer's, then the final), causal and teacher-forced."""
    stream_BTD = fuse_features(drafter.params, drafter.config, hidden)
    batch, length = stream_BTD.shape[:2]
    positions_BT = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    return drafter.adapter(stream_BTD, positions_BT)[0]


def _kangaroo_terms(drafter: EarlyExit, target: CausalLM, tokens_BT):
    p_BTV, hidden = target_outputs(target, tokens_BT, drafter.feature_layers)
    logits_BTV = drafter._logits(adapter_outputs(drafter, hidden), p_BTV.shape[-1])
    return [(jnp.mean(_soft_cross_entropy(p_BTV, logits_BTV)),
             jnp.mean(_acceptance(p_BTV, logits_BTV)))]


def head_terms(drafter, target: CausalLM, tokens_BT, config: HeadTrainConfig):
    if config.method == "kangaroo" or isinstance(drafter, EarlyExit):
        if config.method != "kangaroo" or not isinstance(drafter, EarlyExit):
            raise TypeError("method 'kangaroo' trains a specjax.drafters.EarlyExit, and an "
                            "EarlyExit trains with method 'kangaroo'")
        return _kangaroo_terms(drafter, target, tokens_BT)
    if config.method == "medusa":
        if not isinstance(drafter, Medusa):
            raise TypeError("method 'medusa' trains a specjax.drafters.Medusa")
        return _medusa_terms(drafter, target, tokens_BT, config)
    if not isinstance(drafter, Eagle):
        raise TypeError(f"method {config.method!r} trains a specjax.drafters.Eagle")
    expected = {"eagle": "eagle1", "eagle3": "eagle3", "mtp": "mtp"}[config.method]
    if drafter.config.kind != expected:
        raise ValueError(f"method {config.method!r} trains a head of kind {expected!r}, but "
                         f"this head is {drafter.config.kind!r}")
    if drafter.block is not None:
        raise ValueError("this MTP head's block is model code (DeepSeek's MTP module, "
                         "Eagle.block): train_head trains specjax's own heads; fine-tune "
                         "the checkpoint where it was trained, or train a kind 'mtp' head "
                         "(FeatureHeadConfig) here")
    return _eagle_terms(drafter, target, tokens_BT, config)


def head_loss(drafter, target: CausalLM, tokens_BT, config: HeadTrainConfig):
    """The weighted training loss (scalar float32)."""
    terms = head_terms(drafter, target, tokens_BT, config)
    weights = [config.decay ** i for i in range(len(terms))]
    return sum(w * loss for w, (loss, _) in zip(weights, terms, strict=True)) / sum(weights)


def head_acceptance(drafter, target: CausalLM, tokens_BT, config: HeadTrainConfig) -> dict:
    """Expected acceptance at temperature 1 per draft depth: {"acceptance@1": ..., ...}."""
    terms = head_terms(drafter, target, tokens_BT, config)
    return {f"acceptance@{i + 1}": accept for i, (_, accept) in enumerate(terms)}


def self_distillation_data(target: CausalLM, prompts: np.ndarray, new_tokens: int, *,
                           key, batch_size: int = 64, temperature: float = 1.0,
                           progress=None) -> np.ndarray:
    """int32 [N, P + new_tokens]: each prompt row (int [N, P], equal lengths) followed by
    the target's own sampled continuation (cut at nothing: no EOS)."""
    prompts = np.asarray(prompts, np.int32)
    if prompts.ndim != 2:
        raise ValueError(f"prompts must be int [N, P], got shape {prompts.shape}")
    sampling = SamplingConfig(temperature=temperature)
    rows = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        out = generate(target, chunk, max_new_tokens=new_tokens, sampling=sampling,
                       key=jax.random.fold_in(key, start))
        rows.append(np.concatenate([chunk, np.asarray(out.tokens)[:, :new_tokens]], axis=1))
        if progress is not None:
            progress(min(start + batch_size, len(prompts)), len(prompts))
    return np.concatenate(rows, axis=0).astype(np.int32)


def train_head(drafter, target: CausalLM, data: np.ndarray, config: TrainConfig,
               head_config: HeadTrainConfig, *, batch_size: int = 32,
               checkpoint_dir: str | Path | None = None, heldout: list[np.ndarray] = (),
               seed: int = 0, progress: bool = True,
               max_seconds: float | None = None) -> TrainResult:
    """Train `drafter` (a `Medusa` or `Eagle`; its target embedding and LM head frozen, only
    `drafter.params` trained) on `data` int32 [N, T] with the target frozen. Resumable
    exactly from `checkpoint_dir` as `specjax.training.train`; `TrainResult.lm` is the
    trained drafter and the history records held-out `acceptance@d` at each evaluation."""
    head_terms(drafter, target, jnp.asarray(np.asarray(data)[:1, :8]), head_config)  # checks
    loss_of = lambda model, tokens, aux: head_loss(model, aux, tokens, head_config)
    metrics_of = lambda model, tokens, aux: head_acceptance(model, aux, tokens, head_config)
    batches = epoch_batches(np.asarray(data, np.int32), batch_size, seed)
    return _run(drafter, loss_of, lambda step, params: batches(step), config,
                checkpoint_dir and Path(checkpoint_dir), list(heldout), "train-drafter",
                progress, max_seconds, aux=target, metrics_of=metrics_of)


CACHED_KEYS = ("tokens", "hidden", "label_index", "label_probs", "loss_mask")


def cache_target_outputs(target: CausalLM, tokens_BT, feature_layers: tuple[int, ...],
                         top_k: int) -> dict:
    """What a head's training needs from the frozen target over whole sequences int32
    [B, T]: {"hidden": float16 [B, T, F + 1, D] (the residual streams entering
    `feature_layers`, then the final hidden state; [B, T, D] without feature layers),
    "top_ids": int32 [B, T, k], "top_probs": float16 [B, T, k]} (the target's k most
    likely next tokens at temperature 1). Jit it; the float16 hidden states are checked
    finite by the caller (`np.isfinite`), since a residual stream may exceed float16."""
    p_BTV, hidden = target_outputs(target, tokens_BT, feature_layers)
    top_probs, top_ids = jax.lax.top_k(p_BTV, top_k)
    return {"hidden": hidden.astype(jnp.float16), "top_ids": top_ids.astype(jnp.int32),
            "top_probs": top_probs.astype(jnp.float16)}


def draft_label_index(top_ids: np.ndarray, draft_vocab, vocab_size: int) -> np.ndarray:
    """The position of each target id in a head's draft vocabulary (the column of its
    logits), -1 for ids it cannot produce; the ids themselves for a full-vocabulary head."""
    top_ids = np.asarray(top_ids)
    if draft_vocab is None:
        return top_ids.astype(np.int32)
    column = np.full(vocab_size, -1, np.int32)
    ids = np.asarray(draft_vocab)
    column[ids] = np.arange(ids.size, dtype=np.int32)
    return column[top_ids]


def _cached_terms(drafter: Eagle, batch: dict, config: HeadTrainConfig):
    """EAGLE-3 training-time test on cached target outputs: per unroll step, (soft
    cross-entropy against the target's top-k, expected acceptance over that mass), averaged
    over positions whose chain starts inside the loss mask."""
    tokens_BT = batch["tokens"]
    mask_BT = batch["loss_mask"].astype(bool)
    if isinstance(drafter, EarlyExit):
        log_q_BTV = jax.nn.log_softmax(head_logits(
            drafter.params, drafter.config, drafter.lm_head,
            adapter_outputs(drafter, batch["hidden"])), axis=-1)
        return [soft_label_terms(log_q_BTV, batch["label_index"], batch["label_probs"],
                                 mask_BT)]
    features_BTD = fuse_features(drafter.params, drafter.config, batch["hidden"])
    outputs = unrolled_head(drafter, tokens_BT, features_BTD, config.unroll)
    terms = []
    for step, out_BTD in enumerate(outputs):
        # Scored over the head's own (possibly reduced) vocabulary: no scatter to V.
        log_q_BTV = jax.nn.log_softmax(
            head_logits(drafter.params, drafter.config, drafter.lm_head, out_BTD), axis=-1)
        terms.append(soft_label_terms(log_q_BTV, batch["label_index"], batch["label_probs"],
                                      mask_BT & _shift_right(mask_BT, step)))
    return terms


def _check_cached(drafter, data: dict, head_config: HeadTrainConfig) -> None:
    eagle3 = head_config.method == "eagle3" and isinstance(drafter, Eagle) \
        and drafter.config.kind == "eagle3"
    kangaroo = head_config.method == "kangaroo" and isinstance(drafter, EarlyExit)
    if not (eagle3 or kangaroo):
        raise ValueError("training on cached target outputs is for EAGLE-3 heads (method "
                         "'eagle3' and an Eagle of kind 'eagle3') and Kangaroo adapters "
                         "(method 'kangaroo' and an EarlyExit); train the others with "
                         "train_head, which runs the target in every step")
    missing = [key for key in CACHED_KEYS if key not in data]
    if missing:
        raise ValueError(f"cached data lacks {missing}; it needs {CACHED_KEYS}")
    rows, length = np.shape(data["tokens"])
    layers = len(drafter.config.feature_layers) + 1
    expected = {"hidden": (rows, length, layers, drafter.config.d_model),
                "loss_mask": (rows, length)}
    for key, shape in expected.items():
        if tuple(np.shape(data[key])) != shape:
            raise ValueError(f"cached {key} must have shape {shape} for this head, got "
                             f"{tuple(np.shape(data[key]))}")
    if np.shape(data["label_index"]) != np.shape(data["label_probs"]) or \
            np.shape(data["label_index"])[:2] != (rows, length):
        raise ValueError("cached label_index and label_probs must both be [N, T, k]")
    if np.max(data["label_index"]) >= drafter.lm_head.shape[0]:
        raise ValueError("cached label_index holds columns beyond the head's vocabulary; "
                         "build it with draft_label_index(top_ids, head.draft_vocab, V)")


def train_head_cached(drafter: Eagle, data: dict, config: TrainConfig,
                      head_config: HeadTrainConfig, *, batch_size: int = 16,
                      checkpoint_dir: str | Path | None = None, heldout: list[dict] = (),
                      seed: int = 0, progress: bool = True,
                      max_seconds: float | None = None) -> TrainResult:
    """Train an EAGLE-3 `drafter` (or a Kangaroo `EarlyExit` adapter) on cached target
    outputs: `data` (and each `heldout` batch) a dict of arrays with CACHED_KEYS: tokens
    int32 [N, T], hidden [N, T, F + 1, D] (from `cache_target_outputs` with the head's
    feature layers; an adapter's F = 1, its exit layer), label_index int32 [N, T, k]
    (`draft_label_index`), label_probs [N, T, k], loss_mask bool [N, T] (positions whose
    next token is drafted at inference: the answer, not the prompt). Same loop,
    checkpoints and exact resume as `train_head`; the target is not needed."""
    _check_cached(drafter, data, head_config)
    for batch in heldout:
        _check_cached(drafter, batch, head_config)

    def with_shared(model, shared):
        # The frozen embedding and head come in as arguments, not as program constants.
        if isinstance(model, EarlyExit):
            return dataclasses.replace(model, lm_head=shared[1])
        return dataclasses.replace(model, embedding=shared[0], lm_head=shared[1])

    def loss_of(model, batch, shared):
        terms = _cached_terms(with_shared(model, shared), batch, head_config)
        weights = [head_config.decay ** i for i in range(len(terms))]
        return sum(w * loss for w, (loss, _) in zip(weights, terms, strict=True)) / sum(weights)

    def metrics_of(model, batch, shared):
        terms = _cached_terms(with_shared(model, shared), batch, head_config)
        return {f"acceptance@{i + 1}": accept for i, (_, accept) in enumerate(terms)}

    batches = epoch_batches(data, batch_size, seed)
    return _run(drafter, loss_of, lambda step, params: batches(step), config,
                checkpoint_dir and Path(checkpoint_dir), list(heldout), "train-drafter",
                progress, max_seconds,
                aux=(getattr(drafter, "embedding", None), drafter.lm_head),
                metrics_of=metrics_of)
