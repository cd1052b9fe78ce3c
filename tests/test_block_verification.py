"""Block verification: its output distribution, enumerated exactly, is the target's; it
accepts at least what the token rule accepts; greedy rows are unchanged."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.verification import block_verification, rejection

# Jitted, as a decoder runs them: called eagerly, each of their operations would compile
# a program of its own (hundreds per module, most of its time).
accept_block = jax.jit(block_verification.accept_block)
block_residual = jax.jit(block_verification.block_residual)
chain_distributions = jax.jit(block_verification.chain_distributions)
keep_probabilities = jax.jit(block_verification.keep_probabilities)
accept_sampled = jax.jit(rejection.accept_sampled)
residual_distribution = jax.jit(rejection.residual_distribution)

VOCAB = 3


def random_model(seed: int, sharpness: float, one_hot: bool = False):
    """A distribution over VOCAB ids for every prefix (a dict filled on demand)."""
    rng = np.random.default_rng(seed)
    table = {}

    def distribution(prefix: tuple) -> np.ndarray:
        if prefix not in table:
            if one_hot:
                table[prefix] = np.eye(VOCAB)[rng.integers(VOCAB)]
            else:
                logits = sharpness * rng.normal(size=VOCAB)
                table[prefix] = np.exp(logits) / np.exp(logits).sum()
        return table[prefix]

    return distribution


def verifier_distributions(target, draft, chains: list, limit: int | None, residual):
    """For every drafted chain at once (one row each): (probability that the step accepts
    tau drafts, tau = 0..K, [B, K+1]; the next token's distribution at each tau,
    [B, K+1, V]), from the rule's own functions."""
    num_draft = len(chains[0])
    q_BKV = jnp.asarray([[draft(c[:j]) for j in range(num_draft)] for c in chains],
                        jnp.float32)
    p_BK1V = jnp.asarray([[target(c[:j]) for j in range(num_draft + 1)] for c in chains],
                         jnp.float32)
    limit_B = None if limit is None else jnp.full((len(chains),), limit)
    p_BK1V, q_BK1V, weights_BK1 = chain_distributions(jnp.asarray(chains), q_BKV, p_BK1V,
                                                      limit_B)
    keep_BK = np.array(keep_probabilities(p_BK1V, q_BK1V, weights_BK1))
    keep_BK[:, num_draft if limit is None else limit:] = 0.0
    # tau is the longest kept prefix: kept at tau (tau = 0: always), none kept after it.
    kept_at_BK1 = np.concatenate([np.ones((len(chains), 1)), keep_BK], axis=1)
    none_after_BK1 = np.concatenate([np.cumprod((1.0 - keep_BK)[:, ::-1], axis=1)[:, ::-1],
                                     np.ones((len(chains), 1))], axis=1)
    stop_BK1 = kept_at_BK1 * none_after_BK1
    nexts_BK1V = np.stack([np.asarray(residual(weights_BK1[:, tau], p_BK1V[:, tau],
                                               q_BK1V[:, tau]))
                           for tau in range(num_draft + 1)], axis=1)
    return stop_BK1, nexts_BK1V


def output_distribution(target, draft, num_draft: int, limit: int | None, residual,
                        length: int) -> dict:
    """P(the first `length` tokens after one step, continued by sampling the target)."""
    chains = list(itertools.product(range(VOCAB), repeat=num_draft))
    stop_BK1, nexts_BK1V = verifier_distributions(target, draft, chains, limit, residual)
    out = {}
    for drafts, stop, nexts in zip(chains, stop_BK1, nexts_BK1V, strict=True):
        q_of_chain = np.prod([draft(drafts[:j])[drafts[j]] for j in range(num_draft)])
        if q_of_chain == 0.0:
            continue
        for tau in range(num_draft + 1):
            for token in range(VOCAB):
                weight = q_of_chain * stop[tau] * nexts[tau][token]
                if weight == 0.0:
                    continue
                add_continued(out, target, drafts[:tau] + (token,), weight, length)
    return out


def add_continued(out: dict, target, emitted: tuple, weight: float, length: int) -> None:
    """Add `weight` times the target's continuations of `emitted` to `length` tokens."""
    for rest in itertools.product(range(VOCAB), repeat=length - len(emitted)):
        sequence = emitted + rest
        continued = np.prod([target(sequence[:j])[sequence[j]]
                             for j in range(len(emitted), length)])
        out[sequence] = out.get(sequence, 0.0) + weight * continued


def target_distribution(target, length: int) -> dict:
    return {s: np.prod([target(s[:j])[s[j]] for j in range(length)])
            for s in itertools.product(range(VOCAB), repeat=length)}


def the_rule(weight_B, p_BV, q_BV):
    return block_residual(weight_B, p_BV, q_BV)


def token_rules_residual(weight_B, p_BV, q_BV):
    """vllm-ascend's bug: block acceptance with the token rule's residual (p - q)+."""
    del weight_B
    return residual_distribution(p_BV, q_BV)


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


@pytest.mark.parametrize("num_draft,limit,one_hot_draft,seed", [
    (1, None, False, 0), (2, None, False, 1), (3, None, False, 2), (3, 2, False, 3),
    (3, 0, False, 4), (3, None, True, 5), (2, 1, True, 6)])
def test_the_output_distribution_is_exactly_the_targets(num_draft, limit, one_hot_draft,
                                                        seed):
    """Every chain the draft can draw, every tau and every next token, weighted exactly
    (no sampling): the first K + 1 tokens follow the target to float32 rounding, for
    sampled and one-hot (deterministic) drafts and rows that offer fewer than K."""
    target = random_model(seed, 1.5)
    draft = random_model(seed + 100, 1.5, one_hot=one_hot_draft)
    length = num_draft + 1
    got = output_distribution(target, draft, num_draft, limit, the_rule, length)
    assert total_variation(got, target_distribution(target, length)) < 1e-5


def test_the_token_rules_residual_with_block_acceptance_is_not_exact():
    """The power of the enumeration: vllm-ascend's bug (issue #7807) is far off."""
    target, draft = random_model(7, 1.5), random_model(107, 1.5)
    got = output_distribution(target, draft, 3, None, token_rules_residual, 4)
    assert total_variation(got, target_distribution(target, 4)) > 0.01


def test_a_block_of_one_is_the_token_rule():
    """K = 1: the same keys give the same verdicts and tokens as the token rule."""
    key = jax.random.key(0)
    q_BKV = jax.nn.softmax(2.0 * jax.random.normal(jax.random.key(1), (512, 1, 5)))
    p_BK1V = jax.nn.softmax(2.0 * jax.random.normal(jax.random.key(2), (512, 2, 5)))
    tokens_BK = jax.random.categorical(jax.random.key(3), jnp.log(q_BKV))
    keys = jax.random.split(key)
    block = accept_block(*keys, tokens_BK, q_BKV, p_BK1V)
    token = accept_sampled(*keys, tokens_BK, q_BKV, p_BK1V)
    np.testing.assert_array_equal(block.num_accepted, token.num_accepted)
    np.testing.assert_array_equal(block.next_token, token.next_token)


def test_it_accepts_at_least_what_the_token_rule_accepts_on_average():
    """The expected accepted length, exactly from the rule's own probabilities, is never
    below the token rule's prod-of-min formula, and above it for these chains."""
    gains = []
    chains = list(itertools.product(range(VOCAB), repeat=3))
    for seed in range(6):
        target, draft = random_model(seed, 1.5), random_model(seed + 50, 1.0)
        stop_BK1, _ = verifier_distributions(target, draft, chains, None, the_rule)
        expected_block = expected_token = 0.0
        for drafts, stop in zip(chains, stop_BK1, strict=True):
            q_of_chain = np.prod([draft(drafts[:j])[drafts[j]] for j in range(3)])
            expected_block += q_of_chain * float(np.dot(stop, np.arange(4)))
            ratios = [min(1.0, target(drafts[:j])[drafts[j]] / draft(drafts[:j])[drafts[j]])
                      for j in range(3)]
            expected_token += q_of_chain * sum(np.prod(ratios[:n]) for n in range(1, 4))
        assert expected_block >= expected_token - 1e-6
        gains.append(expected_block - expected_token)
    assert max(gains) > 0.01


def test_greedy_rows_accept_exactly_the_argmax_matches():
    """One-hot p (a greedy row in a mixed batch), any q: accepted = leading argmax
    matches (within the row's limit), next = the argmax there."""
    rng = np.random.default_rng(0)
    batch, num_draft, vocab = 256, 4, 6
    argmax_BK1 = rng.integers(vocab, size=(batch, num_draft + 1))
    p_BK1V = jax.nn.one_hot(argmax_BK1, vocab)
    tokens_BK = np.where(rng.random((batch, num_draft)) < 0.7, argmax_BK1[:, :num_draft],
                         rng.integers(vocab, size=(batch, num_draft)))
    q_BKV = jax.nn.softmax(jax.random.normal(jax.random.key(4), (batch, num_draft, vocab)))
    q_BKV = q_BKV.at[:, 0].set(jax.nn.one_hot(tokens_BK[:, 0], vocab))  # some one-hot q
    limit_B = jnp.asarray(rng.integers(0, num_draft + 1, size=batch))
    verdict = accept_block(*jax.random.split(jax.random.key(5)), jnp.asarray(tokens_BK),
                           q_BKV, p_BK1V, limit_B)
    matches_BK = (tokens_BK == argmax_BK1[:, :num_draft]) & (
        np.arange(num_draft)[None] < np.asarray(limit_B)[:, None])
    expected_B = np.cumprod(matches_BK, axis=1).sum(axis=1)
    np.testing.assert_array_equal(verdict.num_accepted, expected_B)
    np.testing.assert_array_equal(verdict.next_token, argmax_BK1[np.arange(batch), expected_B])


@pytest.mark.slow
def test_the_exactness_harness_catches_the_token_rules_residual(micro_lm, monkeypatch):
    """End to end, through the registry's harness: block acceptance with (p - q)+ as the
    residual (vllm-ascend's bug) fails the chi-square test that the rule passes (an
    unrelated draft, accepted about 40% of the time: many partly kept blocks)."""
    from conftest import build_lm

    from specjax import DraftModel, SamplingConfig
    from specjax.testing import speculative_joint_pvalue

    unrelated = build_lm(11, vocab_size=8, num_layers=1, d_model=16, num_heads=2,
                         num_kv_heads=1, d_ff=32, max_seq_len=64)

    def pvalue_of_block_verification():
        pvalue, out = speculative_joint_pvalue(
            micro_lm, DraftModel(unrelated, "sample"), [1, 5, 2],
            SamplingConfig(temperature=1.0), num_draft_tokens=3, rows=40_000, seed=202)
        assert out.stats.verification == "block"
        return pvalue

    assert pvalue_of_block_verification() > 1e-3
    monkeypatch.setattr("specjax.verification.block_verification.block_residual",
                        token_rules_residual)
    jax.clear_caches()  # the decoder is traced again, with the wrong residual
    try:
        assert pvalue_of_block_verification() < 1e-9
    finally:
        jax.clear_caches()  # no later test may be handed the wrong program
