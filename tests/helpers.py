"""Test helpers: exact enumeration of a model's warped distribution and chi-square tests."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

import specjax


def enumerate_joint(lm: specjax.CausalLM, prompt: list[int], num_tokens: int,
                    sampling: specjax.SamplingConfig) -> np.ndarray:
    """Exact joint distribution `[V] * num_tokens` of the next tokens after `prompt`.

    Built from no-cache full forwards (`lm.logits`), an independent path from the
    incremental decoders under test, and the library's `probabilities` warper.
    """
    vocab = lm.vocab_size
    joint = np.ones((1,), np.float64)
    for depth in range(num_tokens):
        prefixes = list(itertools.product(range(vocab), repeat=depth))
        sequences = jnp.asarray([list(prompt) + list(p) for p in prefixes], jnp.int32)
        logits = lm.logits(sequences)[:, -1]
        cond = np.asarray(specjax.probabilities(logits, sampling), np.float64)
        cond /= cond.sum(-1, keepdims=True)
        joint = (joint[:, None] * cond).reshape(-1)
    return joint.reshape((vocab,) * num_tokens)


def chi_square_pvalue(samples_NL: np.ndarray, expected_joint: np.ndarray,
                      min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of sampled token tuples against an exact joint.

    Cells with expected count below `min_expected` are pooled into one cell (so the
    asymptotic chi-square law holds). A sample in a zero-probability cell returns 0.0.
    """
    samples_NL = np.asarray(samples_NL)
    num, length = samples_NL.shape
    vocab = expected_joint.shape[0]
    flat_index = np.ravel_multi_index(tuple(samples_NL.T), (vocab,) * length)
    observed = np.bincount(flat_index, minlength=vocab**length).astype(np.float64)
    probs = expected_joint.reshape(-1)
    if np.any(observed[probs == 0] > 0):
        return 0.0
    expected = probs * num
    big = expected >= min_expected
    obs = np.concatenate([observed[big], [observed[~big].sum()]])
    exp = np.concatenate([expected[big], [expected[~big].sum()]])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp).pvalue)


@dataclasses.dataclass(frozen=True)
class PlusOneApply:
    """Toy model whose next token is always `(current + 1) % vocab`, with certainty."""

    vocab: int

    def __call__(self, params, tokens, positions, cache, cache_lengths, new_mask=None):
        logits = 20.0 * jax.nn.one_hot((tokens + 1) % self.vocab, self.vocab)
        hidden = tokens[..., None].astype(jnp.float32) + 0.0 * params["unused"][0]
        return logits.astype(jnp.float32), hidden, cache


@dataclasses.dataclass(frozen=True)
class TokenCache:
    """A 'cache' that records the fed tokens at their slots, to check slot bookkeeping."""

    def __call__(self, params, batch, max_len):
        return jnp.full((batch, max_len), -1, jnp.int32)


def plus_one_lm(vocab: int = 16, max_seq_len: int | None = 256) -> specjax.CausalLM:
    return specjax.CausalLM({"unused": jnp.zeros((1,), jnp.float32)}, PlusOneApply(vocab),
                            TokenCache(), vocab_size=vocab, max_seq_len=max_seq_len)


@dataclasses.dataclass(frozen=True)
class TableApply:
    """Bigram model: the next-token logits are `params["table"][current token]`.

    A unigram model is a table with identical rows. Exactly enumerable, context-free
    enough to give i.i.d. acceptance, and able to put zero mass (-inf) anywhere.
    """

    def __call__(self, params, tokens, positions, cache, cache_lengths, new_mask=None):
        logits = jnp.take(params["table"], tokens, axis=0).astype(jnp.float32)
        return logits, logits, cache


def table_lm(table) -> specjax.CausalLM:
    table = jnp.asarray(table, jnp.float32)
    return specjax.CausalLM({"table": table}, TableApply(), TokenCache(),
                            vocab_size=int(table.shape[1]), max_seq_len=None)


def unigram_lm(logits, vocab_rows: int | None = None) -> specjax.CausalLM:
    """Context-free model; `vocab_rows` is the input vocabulary (default: the output's)."""
    logits = np.asarray(logits, np.float32)
    rows = vocab_rows or logits.shape[0]
    return table_lm(np.tile(logits[None], (rows, 1)))


def perturbed(lm: specjax.CausalLM, scale: float, seed: int) -> specjax.CausalLM:
    """The same architecture with every weight nudged by relative Gaussian noise."""
    leaves, treedef = jax.tree.flatten(lm.params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [x * (1 + scale * jax.random.normal(k, x.shape, x.dtype))
             for x, k in zip(leaves, keys, strict=True)]
    return lm.with_params(jax.tree.unflatten(treedef, noisy))
