"""Test harness for exactness, public so that users' own drafters can be checked the way
specjax checks its own.

- Toy models (`plus_one_lm`, `table_lm`, `unigram_lm`) whose behaviour is known exactly,
  and `perturbed` copies of a model (a draft close to its target).
- `enumerate_joint`: the exact joint distribution of the next few tokens under the warped
  target distribution, from no-cache full forwards (an independent path from the
  incremental decoders under test).
- `chi_square_pvalue`: Pearson's test of sampled token tuples against an exact joint.
- `speculative_joint_pvalue`: both together for a (target, drafter, sampling) triple,
  thousands of rows in one batched, jitted call; `speculative_joint_pvalues` tests
  several settings at once, one row group each in the same batch.
- `count_compilations`: the XLA compilations inside a block (tests of "no recompiles").

    import specjax, specjax.testing as st
    pvalue, out = st.speculative_joint_pvalue(target, MyDrafter(), [1, 2, 3],
                                              specjax.SamplingConfig(temperature=1.0))
    assert pvalue > 1e-3   # and a deliberately wrong drafter fails it

Needs only JAX and numpy: the chi-square tail comes from `jax.scipy.special.gammaincc`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specjax.decoding.sampling import SamplingConfig, probabilities
from specjax.decoding.speculative_loop import SpeculativeOutput, drafters_tree, speculative_generate
from specjax.lm.causal_lm import CausalLM
from specjax.runtime.xla_options import compiler_options

# The event JAX records for every XLA compilation (a persistent-cache load included).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

# ------------------------------------------------------------------------- toy models


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
    """A 'cache' that records nothing but has the contract's shape: `[B, max_len]`."""

    def __call__(self, params, batch, max_len):
        return jnp.full((batch, max_len), -1, jnp.int32)


@dataclasses.dataclass(frozen=True)
class TokenCacheCompact:
    """Compaction of a `[B, S]` token cache: slot sources[b, d] -> slot start[b] + d."""

    def __call__(self, params, cache, start_B, sources_BD):
        moved = jnp.take_along_axis(cache, jnp.clip(sources_BD, 0, cache.shape[1] - 1), axis=1)
        write = lambda row, new, start: jax.lax.dynamic_update_slice(row, new, (start,))
        return jax.vmap(write)(cache, moved, start_B)


def plus_one_lm(vocab: int = 16, max_seq_len: int | None = 256) -> CausalLM:
    """A CausalLM whose greedy continuation of token t is t+1, t+2, ... (mod vocab)."""
    return CausalLM({"unused": jnp.zeros((1,), jnp.float32)}, PlusOneApply(vocab),
                    TokenCache(), vocab_size=vocab, max_seq_len=max_seq_len)


@dataclasses.dataclass(frozen=True)
class TableApply:
    """Bigram model: the next-token logits are `params["table"][current token]`."""

    def __call__(self, params, tokens, positions, cache, cache_lengths, new_mask=None):
        logits = jnp.take(params["table"], tokens, axis=0).astype(jnp.float32)
        return logits, logits, cache


def table_lm(table) -> CausalLM:
    """A bigram CausalLM from a `[V_in, V_out]` logits table (-inf puts zero mass)."""
    table = jnp.asarray(table, jnp.float32)
    return CausalLM({"table": table}, TableApply(), TokenCache(),
                    vocab_size=int(table.shape[1]), max_seq_len=None,
                    compact_fn=TokenCacheCompact())


def unigram_lm(logits, vocab_rows: int | None = None) -> CausalLM:
    """A context-free CausalLM (i.i.d. tokens); `vocab_rows` is the input vocabulary
    (default: the output's)."""
    logits = np.asarray(logits, np.float32)
    rows = vocab_rows or logits.shape[0]
    return table_lm(np.tile(logits[None], (rows, 1)))


def perturbed(lm: CausalLM, scale: float, seed: int) -> CausalLM:
    """The same architecture with every weight nudged by relative Gaussian noise."""
    leaves, treedef = jax.tree.flatten(lm.params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [x * (1 + scale * jax.random.normal(k, x.shape, x.dtype))
             for x, k in zip(leaves, keys, strict=True)]
    return lm.with_params(jax.tree.unflatten(treedef, noisy))


# ------------------------------------------------------------------ exact distributions


# Exact joints already enumerated, by (weights, prompt, length, setting): a registry of
# drafters tests every drafter against the same target, prompt and settings, and each
# enumeration costs V^(L-1) forwards. The key holds the weight arrays themselves (JAX
# arrays are immutable), so new weights, even in the same CausalLM object, enumerate anew;
# an entry keeps its weights alive, so their ids stay theirs while it is kept.
_JOINTS: dict[tuple, tuple[list, np.ndarray]] = {}
_JOINTS_KEPT = 64
# One compiled program per (shape, setting) instead of XLA op by op: the warper's sort,
# cumsum and masks dispatched eagerly cost more than the forwards they follow.
_jitted_probabilities = jax.jit(probabilities, static_argnums=1)


def enumerate_joint(lm: CausalLM, prompt: list[int], num_tokens: int,
                    sampling: SamplingConfig) -> np.ndarray:
    """Exact joint distribution `[V] * num_tokens` (float64) of the next tokens after
    `prompt` under `sampling`, from no-cache full forwards and the library's warper.
    Costs V^(num_tokens - 1) forwards of the prompt's length: for tiny vocabularies.
    A repeated call with the same weights, prompt and setting returns a copy of the
    first call's result."""
    weights = [lm.apply, *jax.tree.leaves(lm.params)]
    key = (tuple(id(leaf) for leaf in weights), tuple(int(t) for t in prompt),
           int(num_tokens), sampling)
    if key in _JOINTS:
        return _JOINTS[key][1].copy()
    vocab = lm.vocab_size
    joint = np.ones((1,), np.float64)
    for depth in range(num_tokens):
        prefixes = list(itertools.product(range(vocab), repeat=depth))
        sequences = jnp.asarray([list(prompt) + list(p) for p in prefixes], jnp.int32)
        logits = lm.logits(sequences)[:, -1]
        conditional = np.asarray(_jitted_probabilities(logits, sampling), np.float64)
        conditional /= conditional.sum(-1, keepdims=True)
        joint = (joint[:, None] * conditional).reshape(-1)
    joint = joint.reshape((vocab,) * num_tokens)
    if len(_JOINTS) >= _JOINTS_KEPT:
        del _JOINTS[next(iter(_JOINTS))]  # the oldest
    _JOINTS[key] = (weights, joint)
    return joint.copy()


def chi_square_pvalue(samples_NL, expected_joint: np.ndarray,
                      min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of N sampled token tuples `[N, L]` against an exact
    joint `[V] * L`.

    Cells with expected count below `min_expected` are pooled into one cell (so the
    asymptotic chi-square law holds). A sample in a zero-probability cell returns 0.0.
    """
    samples_NL = np.asarray(samples_NL)
    num, length = samples_NL.shape
    vocab = expected_joint.shape[0]
    if expected_joint.shape != (vocab,) * length:
        raise ValueError(f"expected_joint has shape {expected_joint.shape}; samples of "
                         f"length {length} need {(vocab,) * length}")
    flat_index = np.ravel_multi_index(tuple(samples_NL.T), (vocab,) * length)
    observed = np.bincount(flat_index, minlength=vocab**length).astype(np.float64)
    probs = expected_joint.reshape(-1) / expected_joint.sum()
    if np.any(observed[probs == 0] > 0):
        return 0.0
    expected = probs * num
    big = expected >= min_expected
    obs = np.concatenate([observed[big], [observed[~big].sum()]])
    exp = np.concatenate([expected[big], [expected[~big].sum()]])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    statistic = float(np.sum((obs - exp) ** 2 / exp))
    dof = len(obs) - 1
    if dof < 1:
        return 1.0
    # The chi-square survival function: Q(dof / 2, statistic / 2).
    return float(jax.scipy.special.gammaincc(dof / 2.0, statistic / 2.0))


def speculative_joint_pvalue(target: CausalLM, drafter, prompt: list[int],
                             sampling: SamplingConfig, *, num_draft_tokens: int | None = 2,
                             rows: int = 30_000, num_tokens: int = 3, seed: int = 0,
                             tree=None, verification=None
                             ) -> tuple[float, SpeculativeOutput]:
    """Chi-square p-value of the first `num_tokens` tokens that speculative decoding with
    `drafter` (a CausalLM or any drafter; with `tree`, a TreeShape or DynamicTree; under
    the `verification` rule, by default the shape's own) generates after `prompt`, over
    `rows` rows in one batched call, against the target's exactly enumerated joint.
    Returns the p-value and the output (its stats show that speculation happened:
    acceptance in (0, 1))."""
    pvalues, out = speculative_joint_pvalues(
        target, drafter, prompt, [sampling], num_draft_tokens=num_draft_tokens,
        rows_per_setting=rows, num_tokens=num_tokens, seed=seed, tree=tree,
        verification=verification)
    return pvalues[0], out


# The compiler options of the harness's token-tree decoders on CPU: thousands of rows
# drafting a tree and verifying it whole run long enough that XLA's optimisation level 1
# pays back its compile time (the exactness registry's 3 tree entries at 12,000 rows per
# setting, compile and run on 2 cores: 34.9 s at -O0, 22.9 s at level 1; 7 entries with
# trees and chains: 49.2 s at -O0, 35.7 s at 1, 40.8 s at 2, 48.2 s at 3, XLA's default).
# Chains of 2 or 3 drafts run briefly: they keep the process's level (7 chain entries:
# 30.5 s at -O0, 33.3 s at level 1). A test process sets -O0 for its many short programs
# (tests/conftest.py).
HARNESS_CPU_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}

# Rows of a greedy setting's group in `speculative_joint_pvalues`: greedy rows are
# deterministic (the target's argmax continuation, whatever was drafted), so more rows
# would test the same thing again; 256 still see 256 different draws of the drafts.
GREEDY_GROUP_ROWS = 256


def speculative_joint_pvalues(target: CausalLM, drafter, prompt: list[int],
                              samplings: Sequence[SamplingConfig], *,
                              num_draft_tokens: int | None = 2, rows_per_setting: int = 10_000,
                              num_tokens: int = 3, seed: int = 0,
                              tree=None, verification=None
                              ) -> tuple[list[float], SpeculativeOutput]:
    """`speculative_joint_pvalue` for several sampling settings in ONE batched call: the
    rows are split into groups of `rows_per_setting`, group i decoding with
    `samplings[i]` (per-row settings share the batch, and one compiled decoder), and each
    group is tested against its own warped target. A greedy setting's group must follow
    the greedy continuation exactly (p-value 1.0, else 0.0); its rows are deterministic
    whatever the drafts, so it has at most `GREEDY_GROUP_ROWS` of them. On CPU a token tree's
    decoder compiles with `HARNESS_CPU_COMPILER_OPTIONS`. Returns one p-value per setting and the
    output."""
    samplings = list(samplings)
    group_rows = [min(rows_per_setting, GREEDY_GROUP_ROWS) if config.greedy
                  else rows_per_setting for config in samplings]
    per_row = [config for config, rows in zip(samplings, group_rows, strict=True)
               for _ in range(rows)]
    tree = drafters_tree(drafter, tree)
    nodes = tree.num_nodes if tree is not None else num_draft_tokens
    options = (HARNESS_CPU_COMPILER_OPTIONS if tree is not None
               and jax.default_backend() == "cpu" else {})
    with compiler_options(**options):
        out = speculative_generate(target, drafter, [list(prompt)] * len(per_row),
                                   max_new_tokens=num_tokens,
                                   num_draft_tokens=None if tree is not None
                                   else num_draft_tokens,
                                   sampling=per_row if len(samplings) > 1 else samplings[0],
                                   key=jax.random.key(seed), tree=tree,
                                   verification=verification,
                                   # Just the slots the rows use: thousands of rows attend
                                   # over the cache's capacity, not its tokens.
                                   cache_size=len(prompt) + num_tokens + nodes + 1)
    if not np.all(np.asarray(out.lengths) == num_tokens):
        raise ValueError("a row ended early (an EOS?); the joint needs every row to produce "
                         f"{num_tokens} tokens: pass no eos_id")
    groups = np.split(np.asarray(out.tokens), np.cumsum(group_rows)[:-1])
    pvalues = [chi_square_pvalue(group, enumerate_joint(target, prompt, num_tokens, config))
               for group, config in zip(groups, samplings, strict=True)]
    return pvalues, out


# ------------------------------------------------------------------ compilations


@contextlib.contextmanager
def count_compilations() -> Iterator[list[str]]:
    """Within the block, the names of the programs XLA compiled (a list that fills as
    they compile; `len` counts them). A program found in JAX's in-memory cache compiles
    nothing, which is what a test of "no recompiles" asserts:

        with count_compilations() as compiled:
            specjax.generate(lm, prompts, max_new_tokens=8, sampling=new_settings, key=key)
        assert compiled == []
    """
    names: list[str] = []

    def listener(event: str, duration: float, **metadata) -> None:
        if event == BACKEND_COMPILE_EVENT:
            names.append(str(metadata.get("fun_name", "?")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
