"""The optimisation loop shared by next-token training and draft distillation.

Runs are reproducible and resumable: the batch of step s is a pure function of (seed, s),
and checkpoints hold the parameters, the optimizer state and the step, so an interrupted
run restarts from its latest checkpoint and continues exactly as if it had not stopped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from specjax.decoding.autoregressive import generate
from specjax.decoding.sampling import SamplingConfig
from specjax.lm.causal_lm import CausalLM
from specjax.runtime.sharding import commit_beside_weights
from specjax.training import checkpoints
from specjax.training.config import DistillConfig, TrainConfig
from specjax.training.losses import distill_loss, next_token_loss
from specjax.training.progress import Progress

BatchFn = Callable[[int], np.ndarray]  # step -> int32 [B, T] token windows


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """The trained model, the metrics history (one dict per log/eval point) and the last
    held-out loss (nats per token) and bits per token (bits per byte for byte models)."""

    lm: CausalLM
    history: list
    heldout_loss: float | None
    heldout_bits_per_token: float | None


def _run(lm: CausalLM, loss_of: Callable, batches: Callable, config: TrainConfig,
         checkpoint_dir: Path | None, heldout: list[np.ndarray], label: str,
         progress: bool, max_seconds: float | None = None, aux=None,
         metrics_of: Callable | None = None) -> TrainResult:
    """The loop shared by training and distillation. `loss_of(model, tokens, aux)`; `aux`
    (e.g. the distillation target) is passed to the compiled step as an argument, so its
    arrays are not baked into the program as constants. `metrics_of(model, tokens, aux)
    -> {name: scalar}`: extra held-out figures recorded at each evaluation. `lm` is any
    model with `params` and `with_params` (a CausalLM, or a drafter's heads)."""
    optimizer = config.optimizer()
    # A copy: the step donates its buffers, and the caller's model must stay usable.
    params = jax.tree.map(jnp.copy, lm.params)
    opt_state, start = optimizer.init(params), 0
    history: list = []
    manager = None
    bar = Progress(config.steps, 0, label, enabled=progress)
    if checkpoint_dir is not None:
        manager = checkpoints.checkpoint_manager(checkpoint_dir)
        restored = checkpoints.restore_latest(manager, params, opt_state)
        if restored is None:  # a run killed before its first complete checkpoint
            checkpoints.read_history(checkpoint_dir, 0)  # starts its history afresh
        else:
            params, opt_state, start = restored
            history = checkpoints.read_history(checkpoint_dir, start)
            bar.note(f"resuming from step {start} of {config.steps} (checkpoints in "
                     f"{checkpoint_dir})")
    params, opt_state = commit_beside_weights((params, opt_state))

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step_fn(params, opt_state, tokens, aux):
        loss, grads = jax.value_and_grad(
            lambda p: loss_of(lm.with_params(p), tokens, aux))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, optax.tree.norm(grads)

    eval_fn = jax.jit(lambda params, tokens, aux: loss_of(lm.with_params(params), tokens, aux))

    metrics_fn = None if metrics_of is None else jax.jit(
        lambda params, tokens, aux: metrics_of(lm.with_params(params), tokens, aux))

    def evaluate(params) -> float | None:
        if not heldout:
            return None
        return float(np.mean([float(eval_fn(params, jax.tree.map(jnp.asarray, b), aux))
                              for b in heldout]))

    def evaluate_metrics(params) -> dict:
        if metrics_fn is None or not heldout:
            return {}
        values = [metrics_fn(params, jax.tree.map(jnp.asarray, b), aux) for b in heldout]
        return {name: float(np.mean([float(v[name]) for v in values])) for name in values[0]}

    def record(entry):
        history.append(entry)
        if checkpoint_dir is not None:
            checkpoints.append_history(checkpoint_dir, entry)

    bar.start_step = start
    heldout_loss = None
    started = time.perf_counter()
    if start < config.steps:
        bar.note("compiling the training step (the first step includes it)...")
    # Units: the loss is in nats per token; held-out figures are bits per token (bits
    # per byte for the byte-level models).
    loss_unit = {"train": "loss (nats/token)", "distill": "divergence"}.get(label, "loss")
    for step in range(start, config.steps):
        # `batches(step, params)`: on-policy distillation samples with the current params.
        # A batch is int32 [B, T] tokens, or a dict of arrays (cached target outputs).
        batch = jax.tree.map(jnp.asarray, batches(step, params))
        params, opt_state, loss, grad_norm = step_fn(params, opt_state, batch, aux)
        done = step + 1
        if done == start + 1:
            bar.note(f"first step done after {time.perf_counter() - started:.1f} s")
        if done % config.log_every == 0 or done == config.steps or done == start + 1:
            entry = {"step": done, "loss": float(loss), "grad_norm": float(grad_norm)}
            if done % config.eval_every == 0 or done == config.steps:
                heldout_loss = evaluate(params)
                if heldout_loss is not None:
                    entry["heldout_loss"] = heldout_loss
                entry.update(evaluate_metrics(params))
            record(entry)
            shown = {loss_unit: entry["loss"]}
            if "heldout_loss" in entry:
                held = entry["heldout_loss"]
                held_name = {"train": "bits/token", "distill": "divergence"}.get(label, "loss")
                shown["held-out " + held_name] = (held / math.log(2) if label == "train"
                                                  else held)
            shown.update({k: v for k, v in entry.items() if k.startswith("acceptance@")})
            bar.update(done, **shown)
        out_of_time = max_seconds is not None and time.perf_counter() - started > max_seconds
        if manager is not None and (done % config.checkpoint_every == 0 or done == config.steps
                                    or out_of_time):
            checkpoints.save(manager, done, params, opt_state)
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


def epoch_batches(data, batch_size: int, seed: int):
    """`step -> int32 [batch, T]`: rows of `data` in a fresh permutation every epoch, a
    pure function of (seed, step) so resumed runs see the same batches. `data` may be a
    dict of arrays sharing their first axis (a dict of batches comes back)."""
    rows = len(next(iter(data.values()))) if isinstance(data, dict) else len(data)
    if rows < batch_size:
        raise ValueError(f"{rows} training sequences cannot fill a batch of {batch_size}")
    per_epoch = rows // batch_size

    def batch(step: int) -> np.ndarray:
        epoch, index = divmod(step, per_epoch)
        order = np.random.default_rng([seed, epoch]).permutation(rows)
        chosen = order[index * batch_size:(index + 1) * batch_size]
        if isinstance(data, dict):
            return {key: np.asarray(value[chosen]) for key, value in data.items()}
        return data[chosen]

    return batch


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
