"""Optimisation and distillation settings (frozen, validated at construction)."""

from __future__ import annotations

import dataclasses

import optax

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
