"""Training a CausalLM with optax: next-token pre-training and draft distillation.

Both work on any `specjax.CausalLM` (gradients flow through its pure forward), so this
module needs no model code. Runs are reproducible and resumable: the batch of step s is
a pure function of (seed, s), and orbax checkpoints hold the parameters, the optimizer
state and the step, so an interrupted run restarts from its latest checkpoint and
continues exactly as if it had not stopped.

Distillation follows DistillSpec (Zhou et al. 2023, arXiv 2310.08461): the draft is
trained to match the target's token distributions, under the forward KL divergence
KL(p || q) or the total variation distance TV(p, q) = 1/2 sum |p - q| (1 - TV is the
acceptance probability of speculative sampling, so TV is the loss that acceptance
directly rewards), on corpus text or, on-policy, on text the draft itself generates.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax import Array

from specjax.causal_lm import CausalLM, full_logits
from specjax.generate import generate
from specjax.sampling import SamplingConfig

BatchFn = Callable[[int], np.ndarray]  # step -> int32 [B, T] token windows
DIVERGENCES = ("fkl", "tvd")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Optimisation settings. AdamW with linear warmup then cosine decay to
    `final_lr_fraction * learning_rate`, gradients clipped to `grad_clip` global norm."""

    steps: int
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    checkpoint_every: int = 500
    eval_every: int = 500
    log_every: int = 10

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.warmup_steps < 0 or self.checkpoint_every < 1 or self.eval_every < 1:
            raise ValueError("warmup_steps must be >= 0; checkpoint_every and eval_every >= 1")

    def optimizer(self) -> optax.GradientTransformation:
        schedule = optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=self.learning_rate,
            warmup_steps=min(self.warmup_steps, self.steps - 1),
            decay_steps=self.steps, end_value=self.learning_rate * self.final_lr_fraction)
        return optax.chain(optax.clip_by_global_norm(self.grad_clip),
                           optax.adamw(schedule, b1=0.9, b2=0.95,
                                       weight_decay=self.weight_decay))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """divergence: "fkl" (forward KL(p || q)) or "tvd" (total variation).
    temperature: both distributions are compared at this temperature.
    on_policy_fraction: share of steps whose batch is text sampled from the current draft
    (continuing the first `prompt_len` tokens of a corpus window); the rest is corpus text.
    """

    divergence: str = "fkl"
    temperature: float = 1.0
    on_policy_fraction: float = 0.0
    prompt_len: int = 32

    def __post_init__(self):
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"divergence must be one of {DIVERGENCES}, got {self.divergence!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 <= self.on_policy_fraction <= 1.0:
            raise ValueError(f"on_policy_fraction must be in [0, 1], got "
                             f"{self.on_policy_fraction}")


def next_token_loss(lm: CausalLM, tokens_BT: Array, pad_id: int | None) -> Array:
    """Mean float32 cross-entropy of tokens[:, 1:] given tokens[:, :-1] (pad targets
    ignored)."""
    logits_BTV = full_logits(lm, tokens_BT[:, :-1])
    targets_BT = tokens_BT[:, 1:]
    logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    nll_BT = -jnp.take_along_axis(logp_BTV, targets_BT[..., None], axis=-1)[..., 0]
    mask_BT = jnp.ones_like(nll_BT) if pad_id is None else (targets_BT != pad_id)
    mask_BT = mask_BT.astype(jnp.float32)
    return jnp.sum(nll_BT * mask_BT) / jnp.maximum(jnp.sum(mask_BT), 1.0)


def distill_loss(draft: CausalLM, target: CausalLM, tokens_BT: Array, config: DistillConfig,
                 pad_id: int | None) -> Array:
    """Mean divergence between the target's and the draft's next-token distributions at
    every position of `tokens` (the target is not differentiated)."""
    p_logits = jax.lax.stop_gradient(full_logits(target, tokens_BT)).astype(jnp.float32)
    q_logits = full_logits(draft, tokens_BT).astype(jnp.float32)
    vocab = min(p_logits.shape[-1], q_logits.shape[-1])
    logp = jax.nn.log_softmax(p_logits[..., :vocab] / config.temperature, axis=-1)
    logq = jax.nn.log_softmax(q_logits[..., :vocab] / config.temperature, axis=-1)
    if config.divergence == "fkl":
        per_position = jnp.sum(jnp.exp(logp) * (logp - logq), axis=-1)
    else:
        per_position = 0.5 * jnp.sum(jnp.abs(jnp.exp(logp) - jnp.exp(logq)), axis=-1)
    mask = jnp.ones_like(per_position) if pad_id is None else (tokens_BT != pad_id)
    mask = mask.astype(jnp.float32)
    return jnp.sum(per_position * mask) / jnp.maximum(jnp.sum(mask), 1.0)


class Progress:
    """A one-line progress bar with live metrics (a plain line per update when not a tty)."""

    def __init__(self, total: int, start: int, label: str, stream=sys.stderr, enabled=True):
        self.total, self.label, self.stream, self.enabled = total, label, stream, enabled
        self.start_step, self.start_time = start, time.perf_counter()
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def note(self, text: str) -> None:
        """A phase line (compiling, resuming, ...), on its own line."""
        if self.enabled:
            self.stream.write(f"{self.label}: {text}\n")
            self.stream.flush()

    def update(self, step: int, **metrics) -> None:
        if not self.enabled:
            return
        done = step / self.total
        rate = (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)
        bar = "#" * int(24 * done) + "." * (24 - int(24 * done))
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        line = f"{self.label} [{bar}] {step}/{self.total} {shown} {rate:.2f} step/s"
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """The trained model, the metrics history (one dict per log/eval point) and the last
    held-out loss (nats per token) and bits per token (bits per byte for byte models)."""

    lm: CausalLM
    history: list
    heldout_loss: float | None
    heldout_bits_per_token: float | None


def _checkpoint_manager(directory: Path, keep: int = 2) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(Path(directory).absolute(),
                                 options=ocp.CheckpointManagerOptions(max_to_keep=keep,
                                                                      create=True))


def _run(lm: CausalLM, loss_of: Callable, batches: Callable, config: TrainConfig,
         checkpoint_dir: Path | None, heldout: list[np.ndarray], label: str,
         progress: bool, max_seconds: float | None = None, aux=None) -> TrainResult:
    """The loop shared by training and distillation. `loss_of(model, tokens, aux)`; `aux`
    (e.g. the distillation target) is passed to the compiled step as an argument, so its
    arrays are not baked into the program as constants."""
    optimizer = config.optimizer()
    # A copy: the step donates its buffers, and the caller's model must stay usable.
    params = jax.tree.map(jnp.copy, lm.params)
    opt_state, start = optimizer.init(params), 0
    history: list = []
    manager = None
    bar = Progress(config.steps, 0, label, enabled=progress)
    if checkpoint_dir is not None:
        manager = _checkpoint_manager(checkpoint_dir)
        latest = manager.latest_step()
        if latest is not None:
            abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                    {"params": params, "opt_state": opt_state})
            restored = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
            params, opt_state, start = restored["params"], restored["opt_state"], latest
            history_file = Path(checkpoint_dir) / "history.jsonl"
            if history_file.exists():
                entries = map(json.loads, history_file.read_text().splitlines())
                history = [entry for entry in entries if entry["step"] <= latest]
            bar.note(f"resuming from step {latest} of {config.steps} (checkpoints in "
                     f"{checkpoint_dir})")

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step_fn(params, opt_state, tokens, aux):
        loss, grads = jax.value_and_grad(
            lambda p: loss_of(lm.with_params(p), tokens, aux))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, optax.tree.norm(grads)

    eval_fn = jax.jit(lambda params, tokens, aux: loss_of(lm.with_params(params), tokens, aux))

    def evaluate(params) -> float | None:
        if not heldout:
            return None
        return float(np.mean([float(eval_fn(params, jnp.asarray(b), aux)) for b in heldout]))

    def record(entry):
        history.append(entry)
        if checkpoint_dir is not None:
            with open(Path(checkpoint_dir) / "history.jsonl", "a") as f:
                f.write(json.dumps(entry) + "\n")

    bar.start_step = start
    heldout_loss = None
    started = time.perf_counter()
    if start < config.steps:
        bar.note("compiling the training step (the first step includes it)...")
    # Units: the loss is in nats per token; held-out figures are bits per token (bits
    # per byte for the byte-level models).
    loss_unit = "loss (nats/token)" if label == "train" else "divergence"
    for step in range(start, config.steps):
        # `batches(step, params)`: on-policy distillation samples with the current params.
        params, opt_state, loss, grad_norm = step_fn(params, opt_state,
                                                     jnp.asarray(batches(step, params)), aux)
        done = step + 1
        if done == start + 1:
            bar.note(f"first step done after {time.perf_counter() - started:.1f} s")
        if done % config.log_every == 0 or done == config.steps or done == start + 1:
            entry = {"step": done, "loss": float(loss), "grad_norm": float(grad_norm)}
            if done % config.eval_every == 0 or done == config.steps:
                heldout_loss = evaluate(params)
                if heldout_loss is not None:
                    entry["heldout_loss"] = heldout_loss
            record(entry)
            shown = {loss_unit: entry["loss"]}
            if "heldout_loss" in entry:
                held = entry["heldout_loss"]
                shown["held-out " + ("bits/token" if label == "train" else "divergence")] = (
                    held / math.log(2) if label == "train" else held)
            bar.update(done, **shown)
        out_of_time = max_seconds is not None and time.perf_counter() - started > max_seconds
        if manager is not None and (done % config.checkpoint_every == 0 or done == config.steps
                                    or out_of_time):
            manager.save(done, args=ocp.args.StandardSave({"params": params,
                                                           "opt_state": opt_state}))
        if out_of_time:  # resumable: the next run continues from this checkpoint
            record({"step": done, "loss": float(loss), "stopped": "max_seconds"})
            break
    bar.close()
    if manager is not None:
        manager.wait_until_finished()
        manager.close()
    if heldout_loss is None:
        heldout_loss = evaluate(params)
    bits = None if heldout_loss is None else heldout_loss / math.log(2)
    return TrainResult(lm.with_params(params), history, heldout_loss, bits)


def train(lm: CausalLM, batches: BatchFn, config: TrainConfig, *,
          checkpoint_dir: str | Path | None = None, heldout: list[np.ndarray] = (),
          pad_id: int | None = None, progress: bool = True,
          max_seconds: float | None = None) -> TrainResult:
    """Next-token training of `lm` on `batches(step) -> int32 [B, T]`.

    With `checkpoint_dir`, orbax checkpoints are written every `checkpoint_every` steps and
    at the end, and a run finding checkpoints there resumes from the latest one.
    `heldout` batches are scored every `eval_every` steps. `max_seconds` stops the run
    early (after checkpointing, so a later call resumes it).
    """
    loss_of = lambda model, tokens, aux: next_token_loss(model, tokens, pad_id)
    return _run(lm, loss_of, lambda step, params: batches(step), config,
                checkpoint_dir and Path(checkpoint_dir), list(heldout), "train", progress,
                max_seconds)


def distill(draft: CausalLM, target: CausalLM, batches: BatchFn, config: TrainConfig,
            distill_config: DistillConfig = DistillConfig(), *,
            checkpoint_dir: str | Path | None = None, heldout: list[np.ndarray] = (),
            pad_id: int | None = None, seed: int = 0, progress: bool = True,
            max_seconds: float | None = None) -> TrainResult:
    """Train `draft` to match `target` (DistillSpec); same checkpointing as `train`.

    On-policy steps (a `on_policy_fraction` share, chosen by a pure function of (seed,
    step)) replace the corpus batch with the draft's own samples: the first `prompt_len`
    tokens of each window continued by the current draft at `temperature`.
    """
    if draft.vocab_size != target.vocab_size:
        raise ValueError(f"distillation needs equal vocabularies; draft has "
                         f"{draft.vocab_size}, target {target.vocab_size}")
    loss_of = lambda model, tokens, teacher: distill_loss(model, teacher, tokens,
                                                          distill_config, pad_id)
    sampling = SamplingConfig(temperature=distill_config.temperature)

    def mixed_batches(step: int, params) -> np.ndarray:
        tokens = batches(step)
        rng = np.random.default_rng([seed, step, 7])
        if rng.random() >= distill_config.on_policy_fraction:
            return tokens
        if tokens.shape[1] <= distill_config.prompt_len:
            raise ValueError(f"on-policy distillation continues the first prompt_len="
                             f"{distill_config.prompt_len} tokens of each window, but the "
                             f"windows have {tokens.shape[1]}; use longer windows or a "
                             "smaller prompt_len")
        prompt = tokens[:, : distill_config.prompt_len]
        continuation = generate(draft.with_params(params), prompt,
                                max_new_tokens=tokens.shape[1] - distill_config.prompt_len,
                                sampling=sampling, key=jax.random.key(int(rng.integers(2**31))))
        return np.concatenate([prompt, np.asarray(continuation.tokens)], axis=1)

    return _run(draft, loss_of, mixed_batches, config, checkpoint_dir and Path(checkpoint_dir),
                list(heldout), "distill", progress, max_seconds, aux=target)
