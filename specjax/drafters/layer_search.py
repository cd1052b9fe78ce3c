"""Which blocks should a self-speculating target skip? (`specjax.drafters.LayerSkip`)

Draft & Verify (Zhang et al. 2023) searches the skipped set by Bayesian optimisation of
measured speed; SWIFT (Xia et al. 2024) picks it on the fly. The skipped set is data here
(`LayerSkip` carries it as a mask; the target runs or passes each block at run time), so
every candidate shares one compiled decoder; timing each still costs decoding runs, so
this search measures a short family:

1. `layer_influence`: one forward over the calibration prompts records the residual
   stream entering every block; a block whose output stream is nearly parallel to its
   input (ShortGPT's block influence, 1 - cos(x_in, x_out)) changes the least.
2. The candidates skip the n least influential blocks, for n over a grid of fractions of
   the model; each is run as speculative decoding on the calibration prompts and timed
   (compilation kept apart, medians of repetitions), and the fastest measured tokens per
   second wins. Plain decoding is timed beside them, so the result says whether skipping
   pays at all on this machine.

The last block is never a candidate: its output is the head's input after the final
norm, which the exposed streams do not show unnormalised, so its influence is not
measured.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding.autoregressive import generate
from specjax.decoding.inputs import pack_prompts
from specjax.decoding.sampling import GREEDY, SamplingConfig
from specjax.decoding.speculative_loop import speculative_generate
from specjax.drafters.layer_skip import LayerSkip
from specjax.lm.causal_lm import CausalLM
from specjax.runtime.timing import wall_seconds

DEFAULT_FRACTIONS = (0.125, 0.25, 0.375, 0.5, 0.625)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One measured skipped set: tokens per second (median), tokens per target forward
    and the acceptance rate of its drafts."""

    skip: tuple[int, ...]
    tokens_per_second: float
    tokens_per_forward: float
    acceptance_rate: float


@dataclasses.dataclass(frozen=True)
class SkipSearch:
    """The search's outcome: `skip` (the fastest candidate's set, or None when none beat
    plain decoding), every candidate measured, plain decoding's tokens per second, and
    the influence of each block (float [L]; the last block's is NaN: not measured)."""

    skip: tuple[int, ...] | None
    candidates: tuple[Candidate, ...]
    plain_tokens_per_second: float
    influence: np.ndarray

    @property
    def best(self) -> Candidate:
        return max(self.candidates, key=lambda c: c.tokens_per_second)

    def drafter(self, **settings) -> LayerSkip:
        """`LayerSkip` with the chosen set (the fastest candidate's, even if it did not beat
        plain decoding)."""
        return LayerSkip(skip=self.best.skip, **settings)


def layer_influence(target: CausalLM, prompts) -> np.ndarray:
    """float64 [L]: 1 - the mean cosine similarity between the residual stream entering
    block l and the one entering block l + 1, over every prompt token (NaN for the last
    block, whose output stream is not exposed)."""
    _check_target(target)
    batch = pack_prompts(prompts, None, target.vocab_size)
    tokens_BP, lengths_B = batch.tokens, batch.lengths
    layers = tuple(range(target.num_layers))
    streams = _streams(target, jnp.asarray(tokens_BP), layers)  # [B, P, L + 1, D]
    valid_BP = np.arange(tokens_BP.shape[1])[None] < np.asarray(lengths_B)[:, None]
    x = np.asarray(streams, np.float64)[valid_BP]  # [tokens, L + 1, D]
    inputs, outputs = x[:, :-2], x[:, 1:-1]  # block l's input and output, l < L - 1
    cosine = np.sum(inputs * outputs, -1) / np.maximum(
        np.linalg.norm(inputs, axis=-1) * np.linalg.norm(outputs, axis=-1), 1e-30)
    return np.append(1.0 - cosine.mean(axis=0), np.nan)


@functools.partial(jax.jit, static_argnames=("layers",))
def _streams(target: CausalLM, tokens_BP, layers):
    positions_BP = jnp.broadcast_to(jnp.arange(tokens_BP.shape[1]), tokens_BP.shape)
    cache = target.init_cache(tokens_BP.shape[0], tokens_BP.shape[1])
    _, hidden, _ = target.apply(tokens_BP, positions_BP, cache,
                                jnp.zeros((tokens_BP.shape[0],), jnp.int32),
                                feature_layers=layers)
    return hidden.astype(jnp.float32)


def search_skip_layers(target: CausalLM, prompts, *, num_draft_tokens: int = 4,
                       max_new_tokens: int = 32, fractions=DEFAULT_FRACTIONS,
                       sampling: SamplingConfig = GREEDY, reps: int = 3,
                       key: jax.Array | None = None) -> SkipSearch:
    """Measure LayerSkip with the n least influential blocks skipped, n = round(f L) for
    each fraction f (at least 1, at most L - 1, distinct), on `prompts` (token id lists,
    one batch), and return them all with the fastest (`SkipSearch`). The candidates share
    one compiled decoder (the first compiles it, kept apart from its timing, the median
    of `reps` runs); plain decoding is timed the same way."""
    _check_target(target)
    num_layers = target.num_layers
    if num_layers < 2:
        raise ValueError("a one-block target has no block to skip but its last")
    fractions = tuple(fractions)
    if not fractions or any(not 0.0 < f < 1.0 for f in fractions):
        raise ValueError(f"fractions must be in (0, 1), got {fractions}")
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps must be an int >= 1, got {reps!r}")
    influence = layer_influence(target, prompts)
    order = [int(i) for i in np.argsort(influence[:-1], kind="stable")]
    counts = sorted({min(max(round(f * num_layers), 1), num_layers - 1) for f in fractions})
    run = dict(max_new_tokens=max_new_tokens, sampling=sampling, key=key)

    def median_speed(call):
        out, _ = wall_seconds(call)  # compiles
        seconds = statistics.median(wall_seconds(call)[1] for _ in range(reps))
        generated = int(np.sum(np.asarray(out.lengths)))
        return out, generated / seconds

    _, plain_speed = median_speed(lambda: generate(target, prompts, **run))
    candidates = []
    for count in counts:
        drafter = LayerSkip(skip=tuple(sorted(order[:count])))
        out, speed = median_speed(lambda drafter=drafter: speculative_generate(
            target, drafter, prompts, num_draft_tokens=num_draft_tokens, **run))
        candidates.append(Candidate(drafter.skip, speed, out.stats.mean_accepted_length,
                                    out.stats.acceptance_rate))
    best = max(candidates, key=lambda c: c.tokens_per_second)
    return SkipSearch(best.skip if best.tokens_per_second > plain_speed else None,
                      tuple(candidates), plain_speed, influence)


def _check_target(target: CausalLM) -> None:
    if not isinstance(target, CausalLM) or target.num_layers is None:
        raise ValueError("the layer search needs a CausalLM that runs subsets of its layers "
                         "(CausalLM.from_nnx of a specjax_models.Transformer)")
