"""Online speculative decoding (OSD, Liu et al. 2023): the draft keeps learning from the
target on the traffic it serves.

`OnlineDistiller` keeps the texts the decoder produced (prompt and generated tokens) in a
bounded buffer and, between calls, takes a few optax steps that move the draft's
next-token distributions towards the target's at the generated positions, the positions
where the draft's top token was not the one emitted (the drafts the target rejected, in
the greedy sense) weighted first. The draft changes only between calls, never inside one,
so every call is exact for the draft it was given (the exactness tests alternate updates
and chi-square checks).

    distiller = OnlineDistiller(target, specjax.DraftModel(draft))
    for prompts in stream:
        out = distiller.generate(prompts, max_new_tokens=64, num_draft_tokens=4, ...)

The target's distributions are recomputed by one no-cache forward over each update's
batch (teacher forcing on the emitted text: the same distributions the verify forwards
saw, without keeping [K, V] logits per step inside the decoder).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import deque
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import Array

from specjax.decoding.inputs import pack_prompts
from specjax.decoding.speculative_loop import SpeculativeOutput, speculative_generate
from specjax.drafters.draft_model import DraftModel
from specjax.lm.causal_lm import CausalLM, full_logits
from specjax.runtime.sharding import commit_beside_weights
from specjax.training.config import DIVERGENCES
from specjax.training.losses import divergence_per_position


@dataclasses.dataclass(frozen=True, kw_only=True)
class OnlineConfig:
    """learning_rate: Adam's step (the optimizer state persists across updates).
    steps_per_update: optax steps after each call. batch_size: texts per step, drawn from
    the buffer (the newest first). window: tokens per text (the last `window` of a longer
    one; shorter ones are padded and masked); one compiled update. buffer_size: texts
    kept. agreed_weight: the weight of a position whose next token was the draft's top
    token (1 for the others). prompt_weight: the weight of the prompts' positions against
    the generated ones (the prompts are the traffic too; 0: generated tokens only, as OSD
    keeps). divergence: "tvd" (total variation, whose
    complement is the acceptance probability; works with a reduced draft vocabulary) or
    "fkl" (forward KL; the draft must score the whole vocabulary). frozen: top-level
    parameter groups left as they are (e.g. ("embed", "lm_head") for a layer draft that
    shares them with its target)."""

    learning_rate: float = 1e-3
    steps_per_update: int = 2
    batch_size: int = 8
    window: int = 256
    buffer_size: int = 256
    agreed_weight: float = 0.1
    prompt_weight: float = 1.0
    divergence: str = "tvd"
    frozen: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("steps_per_update", "batch_size", "window", "buffer_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.window < 2:
            raise ValueError(f"window must be >= 2 tokens, got {self.window}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        for name in ("agreed_weight", "prompt_weight"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"divergence must be one of {DIVERGENCES}, got "
                             f"{self.divergence!r}")
        # One group may be given by its name: "embed", not the letters of "embed".
        frozen = (self.frozen,) if isinstance(self.frozen, str) else tuple(self.frozen)
        if not all(isinstance(name, str) for name in frozen):
            raise ValueError(f"frozen must be parameter group names (strings), got "
                             f"{self.frozen!r}")
        object.__setattr__(self, "frozen", frozen)


class OnlineDistiller:
    """A draft model that adapts to the texts it helps decode (see the module docstring).

    `draft`: a `specjax.DraftModel` (its method and reduced vocabulary are kept) or a
    CausalLM sharing the target's tokenizer. `drafter` is the current draft; `generate`
    decodes a batch with it, keeps the texts and updates the draft; `observe` and `update`
    do the two halves for callers that decode themselves (a stream, `specjax chat
    --adapt`). Updates are deterministic for a seed and the same texts.
    """

    def __init__(self, target: CausalLM, draft: DraftModel | CausalLM,
                 config: OnlineConfig = OnlineConfig(), *, seed: int = 0):
        if not isinstance(draft, DraftModel):
            draft = DraftModel(draft)
        if config.divergence == "fkl" and (draft.draft_vocab is not None
                                           or draft.lm.vocab_size < target.vocab_size):
            raise ValueError("divergence='fkl' needs a draft that scores every target id "
                             "(KL(p || q) is infinite where q is 0); use 'tvd'")
        draft.check(target, None)
        params = draft.lm.params
        missing = [name for name in config.frozen if name not in params]
        if missing:
            raise ValueError(f"frozen names groups the draft does not have: {missing} (its "
                             f"groups: {sorted(params)})")
        self.target, self.config = target, config
        self._draft = draft
        # Committed where they are, as the update's outputs are: else a loaded draft's
        # weights beside optimizer.init's fresh arrays give the first update a program of
        # its own, and the second compiles the update again.
        trainable, self._frozen = _split(params, config.frozen)
        self._optimizer = optax.adam(config.learning_rate)
        self._trainable, self._opt_state = commit_beside_weights(
            (trainable, self._optimizer.init(trainable)))
        self._texts: deque[tuple[np.ndarray, int]] = deque(maxlen=config.buffer_size)
        self._rng = np.random.default_rng(seed)
        self.losses: list[float] = []

    @property
    def drafter(self) -> DraftModel:
        """The draft as it is now (its parameters change only in `update`)."""
        params = type(self._draft.lm.params)({**self._frozen, **self._trainable})
        return dataclasses.replace(self._draft, lm=self._draft.lm.with_params(params))

    def observe(self, prompts: Sequence[Sequence[int]], generated: Sequence[Sequence[int]]):
        """Keep each prompt with its generated tokens (ragged token id lists)."""
        if len(prompts) != len(generated):
            raise ValueError(f"{len(prompts)} prompts but {len(generated)} generated texts")
        vocab_size = self.target.vocab_size
        texts = []
        for row, (prompt, new) in enumerate(zip(prompts, generated, strict=True)):
            text = np.asarray(list(prompt) + list(new))
            if text.size and (text.ndim != 1 or not np.issubdtype(text.dtype, np.integer)):
                raise ValueError(f"row {row}: prompts and generated texts must be flat "
                                 "sequences of integer token ids")
            if text.size and (text.min() < 0 or text.max() >= vocab_size):
                bad = text[(text < 0) | (text >= vocab_size)][0]
                raise ValueError(f"row {row} holds token id {bad}, outside the target's "
                                 f"vocabulary [0, {vocab_size}); the draft would train on it")
            texts.append((text.astype(np.int32), len(prompt), len(new)))
        for text, prompt_length, new_length in texts:  # all checked before any is kept
            if new_length and len(text) >= 2:
                self._texts.append((text, prompt_length))

    def observe_output(self, prompts, out: SpeculativeOutput) -> None:
        """`observe` with a decoder's output (`tokens`, `lengths`)."""
        tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        self.observe(prompts, [tokens[b, :int(lengths[b])].tolist() for b in range(len(prompts))])

    def update(self) -> float | None:
        """`steps_per_update` optax steps on batches of kept texts; the mean loss (None
        when nothing was observed yet)."""
        if not self._texts:
            return None
        losses = []
        for _ in range(self.config.steps_per_update):
            tokens, weights = self._batch()
            self._trainable, self._opt_state, loss = _update_step(
                self._trainable, self._opt_state, self._frozen, self.target,
                self._draft, jnp.asarray(tokens), jnp.asarray(weights),
                jnp.float32(self.config.agreed_weight), self._optimizer,
                self.config.divergence)
            losses.append(float(loss))
        self.losses.append(float(np.mean(losses)))
        return self.losses[-1]

    def generate(self, prompts, **kwargs) -> SpeculativeOutput:
        """`speculative_generate(target, drafter, prompts, **kwargs)`, then `observe` its
        texts and `update`: the next call drafts with the updated draft."""
        out = speculative_generate(self.target, self.drafter, prompts, **kwargs)
        # Each row's own prompt: an array of prompts is right-padded to its widest row.
        batch = pack_prompts(prompts, kwargs.get("prompt_lengths"), self.target.vocab_size)
        self.observe_output([batch.tokens[b, :batch.lengths[b]] for b in range(batch.batch)],
                            out)
        self.update()
        return out

    def _batch(self) -> tuple[np.ndarray, np.ndarray]:
        """tokens int32 [N, W] (newest texts more likely) and, per position t, the weight
        of predicting token t + 1 (float32 [N, W - 1]: 1 where it was generated,
        `prompt_weight` inside the prompt, 0 for padding)."""
        config, count = self.config, len(self._texts)
        recency = np.arange(1, count + 1, dtype=np.float64)
        picks = self._rng.choice(count, size=config.batch_size, p=recency / recency.sum())
        tokens = np.zeros((config.batch_size, config.window), np.int32)
        generated = np.zeros((config.batch_size, config.window - 1), np.float32)
        for row, index in enumerate(picks):
            text, prompt_length = self._texts[index]
            cut = max(len(text) - config.window, 0)
            kept = text[cut:]
            tokens[row, :len(kept)] = kept
            first = max(prompt_length - cut, 1)  # the first generated token's index in kept
            generated[row, :first - 1] = config.prompt_weight
            generated[row, first - 1:len(kept) - 1] = 1.0
        return tokens, generated


def _split(params, frozen: tuple[str, ...]) -> tuple[dict, dict]:
    items = dict(params)
    return ({k: v for k, v in items.items() if k not in frozen},
            {k: v for k, v in items.items() if k in frozen})


@functools.partial(jax.jit, static_argnames=("optimizer", "divergence"))
def _update_step(trainable, opt_state, frozen, target: CausalLM, draft: DraftModel,
                 tokens_NW: Array, generated_NW1: Array, agreed_weight: Array, optimizer,
                 divergence: str):
    log_p_NW1V = jax.nn.log_softmax(jax.lax.stop_gradient(
        full_logits(target, tokens_NW[:, :-1])), axis=-1)
    emitted_NW1 = tokens_NW[:, 1:]

    def loss_of(trainable):
        params = type(draft.lm.params)({**frozen, **trainable})
        logits = full_logits(draft.lm.with_params(params), tokens_NW[:, :-1])
        log_q = jax.nn.log_softmax(draft.target_logits(logits, target.vocab_size), axis=-1)
        per_position = divergence_per_position(log_p_NW1V, log_q, divergence)
        # The positions whose emitted token was not the draft's top one come first.
        missed = (jnp.argmax(log_q, axis=-1) != emitted_NW1).astype(jnp.float32)
        weights = generated_NW1 * (missed + agreed_weight * (1.0 - missed))
        return jnp.sum(per_position * weights) / jnp.maximum(jnp.sum(weights), 1e-6)

    loss, grads = jax.value_and_grad(loss_of)(trainable)
    updates, opt_state = optimizer.update(grads, opt_state, trainable)
    return optax.apply_updates(trainable, updates), opt_state, loss
