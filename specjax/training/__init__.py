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

The package is split by concept: `config` (TrainConfig, DistillConfig), `losses`
(next-token cross-entropy, DistillSpec divergences), `checkpoints` (orbax manager and the
metrics history file, which together make a run resumable), `progress` (the live line)
and `loop` (the shared optimisation loop, `train` and `distill`), `heads` (feature
drafters: Medusa, EAGLE-1, EAGLE-3 and MTP heads, by self-distillation, `train_head`;
`train_head_cached` on target outputs cached once, for targets too costly per step),
`cached` (`distill_cached`: a draft model distilled from those cached outputs, over a
reduced vocabulary if it has one, with frozen parameter groups such as a shared
embedding), `online` (`OnlineDistiller`: online speculative decoding, the draft learning
from the traffic it serves, between calls), `parallel` (`train_parallel`: a draft adapted
into a parallel draft, PARD, with conditional drop tokens), `parallel_heads`
(`train_parallel_head`: a P-EAGLE head, K drafts per head forward, in PARD's layout).
"""

from specjax.training.cached import DISTILL_KEYS, distill_cached, soft_label_terms
from specjax.training.config import DIVERGENCES, DistillConfig, TrainConfig
from specjax.training.heads import (
    HEAD_METHODS,
    HeadTrainConfig,
    cache_target_outputs,
    draft_label_index,
    head_acceptance,
    head_loss,
    self_distillation_data,
    train_head,
    train_head_cached,
)
from specjax.training.loop import BatchFn, TrainResult, distill, train
from specjax.training.losses import distill_loss, next_token_loss
from specjax.training.online import OnlineConfig, OnlineDistiller
from specjax.training.parallel import ParallelTrainConfig, train_parallel
from specjax.training.parallel_heads import train_parallel_head, with_placeholder
from specjax.training.progress import Progress

__all__ = ["DISTILL_KEYS", "DIVERGENCES", "HEAD_METHODS", "BatchFn", "DistillConfig",
           "HeadTrainConfig", "OnlineConfig", "OnlineDistiller", "ParallelTrainConfig",
           "Progress", "TrainConfig",
           "TrainResult", "cache_target_outputs", "distill", "distill_cached", "distill_loss",
           "draft_label_index", "head_acceptance", "head_loss", "next_token_loss",
           "self_distillation_data", "soft_label_terms", "train", "train_head",
           "train_head_cached", "train_parallel", "train_parallel_head", "with_placeholder"]
