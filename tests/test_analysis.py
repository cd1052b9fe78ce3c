"""specjax.analysis: the speed model, and its agreement with measured acceptance."""

import jax
import numpy as np
import pytest

import specjax
from specjax import DraftModel, SamplingConfig, analysis, speculative_generate
from specjax.testing import unigram_lm


def test_expected_tokens_formula_and_limits():
    assert analysis.expected_tokens_per_forward(0.0, 4) == 1.0
    assert analysis.expected_tokens_per_forward(1.0, 4) == 5.0
    assert analysis.expected_tokens_per_forward(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    grid = analysis.expected_tokens_per_forward(np.array([0.2, 0.9]), np.array([3, 3]))
    np.testing.assert_allclose(grid, [(1 - 0.2**4) / 0.8, (1 - 0.9**4) / 0.1])


def test_ideal_speedup_and_best_k():
    assert analysis.ideal_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    assert analysis.ideal_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / 0.2 / 1.4)
    k, speedup = analysis.best_num_draft_tokens(0.8, 0.05)
    ks = range(1, 33)
    assert speedup == pytest.approx(max(analysis.ideal_speedup(0.8, j, 0.05) for j in ks))
    assert analysis.ideal_speedup(0.8, k, 0.05) == pytest.approx(speedup)
    assert analysis.best_num_draft_tokens(0.3, 0.5)[0] == 1  # a poor, costly draft: K=1


def test_parallel_speedup_is_the_chain_model_with_a_block_cost():
    """Equal per-offset rates and a block costing K c: the autoregressive formula; a
    block costing one forward's c instead: K times less drafting in the denominator."""
    alphas = [0.8] * 6
    assert analysis.expected_tokens_by_position(alphas) == pytest.approx(
        analysis.expected_tokens_per_forward(0.8, 6))
    assert analysis.parallel_ideal_speedup(alphas, 6 * 0.1, 1.0) == pytest.approx(
        analysis.ideal_speedup(0.8, 6, 0.1))
    assert analysis.parallel_ideal_speedup(alphas, 0.12, 1.0) == pytest.approx(
        analysis.expected_tokens_per_forward(0.8, 6) / 1.12)
    assert analysis.expected_tokens_by_position([0.9, 0.5, 0.0, 1.0]) == pytest.approx(
        1 + 0.9 + 0.45)


@pytest.mark.parametrize("call", [
    lambda: analysis.expected_tokens_by_position([0.5, 1.5]),
    lambda: analysis.expected_tokens_by_position([]),
    lambda: analysis.parallel_ideal_speedup([0.5], -0.1),
    lambda: analysis.parallel_ideal_speedup([0.5], 0.1, 0.0),
    lambda: analysis.expected_tokens_per_forward(1.2, 3),
    lambda: analysis.expected_tokens_per_forward(0.5, 0),
    lambda: analysis.ideal_speedup(0.5, 3, -1.0),
    lambda: analysis.expected_acceptance_rate([0.5, 0.5], [1.0]),
])
def test_bad_arguments_are_refused(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize("method", ["sample", "greedy"])
@pytest.mark.parametrize("verification", ["token", "block"])
def test_formula_matches_measured_acceptance_for_iid_drafts(method, verification):
    """Context-free target and draft make acceptance i.i.d.: under the token rule with a
    known alpha (sum min(p, q) for sampled drafts, p(argmax q) for greedy drafts: the
    per-position rates are alpha^j), under block verification with the rates of
    `block_acceptance_by_position` (q one-hot at the argmax for greedy drafts). The
    measured per-position rates and tokens per forward match the model."""
    p_logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    q_logits = np.log(np.array([0.25, 0.25, 0.25, 0.25]))
    p, q = np.exp(p_logits), np.exp(q_logits)
    k = 4
    out = speculative_generate(unigram_lm(p_logits), DraftModel(unigram_lm(q_logits), method),
                               [[0]] * 4000, max_new_tokens=40, num_draft_tokens=k,
                               sampling=SamplingConfig(temperature=1.0), key=jax.random.key(0),
                               verification=verification)
    alpha = analysis.expected_acceptance_rate(p, q) if method == "sample" else p[0]
    drawn_from = q if method == "sample" else np.eye(4)[0]
    if verification == "token":
        expected_positions = alpha ** np.arange(1, k + 1)
        expected_tau = analysis.expected_tokens_per_forward(alpha, k)
    else:
        expected_positions = analysis.block_acceptance_by_position(p, drawn_from, k)
        expected_tau = 1 + expected_positions.sum()
    positions = out.stats.accepted_per_position
    np.testing.assert_allclose(positions, expected_positions, atol=0.01)
    # The uncut estimate of tokens per forward: accepted per step (the per-position
    # counts, which the token limit does not cut) + the correction/bonus.
    measured_tau = positions.sum() + 1
    assert measured_tau == pytest.approx(expected_tau, abs=0.03)
    # The acceptance rate (drafts that could become output) is the mean of the
    # per-position rates but for the few steps the 40-token limit cut.
    assert out.stats.acceptance_rate == pytest.approx(positions.mean(), abs=0.01)
    if verification == "token":  # the checked-position rate estimates alpha itself
        assert out.stats.position_acceptance_rate == pytest.approx(alpha, abs=0.01)


def test_block_verification_keeps_more_than_the_token_rule_in_the_iid_model():
    """Per position, exactly: never below alpha^j, above it for a sampled draft; equal
    to 1 for a draft that is the target."""
    p, q = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])
    alpha = analysis.expected_acceptance_rate(p, q)
    block = analysis.block_acceptance_by_position(p, q, 6)
    assert np.all(block >= alpha ** np.arange(1, 7) - 1e-12)
    assert block[-1] > 1.5 * alpha ** 6
    np.testing.assert_allclose(analysis.block_acceptance_by_position(p, p, 5), np.ones(5))
    np.testing.assert_allclose(analysis.block_acceptance_by_position(p, q, 1), [alpha])


@pytest.mark.parametrize("p,q,k,message", [
    ([0.5, 0.5], [1.0], 2, "same size"),
    ([0.5, 0.6], [0.5, 0.5], 2, "probability distribution"),
    ([0.5, 0.5], [0.5, 0.5], 0, "integers >= 1"),
])
def test_block_acceptance_refuses_bad_input(p, q, k, message):
    with pytest.raises(ValueError, match=message):
        analysis.block_acceptance_by_position(p, q, k)


def test_block_acceptance_refuses_a_state_space_it_cannot_hold():
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(64)), rng.dirichlet(np.ones(64))
    with pytest.raises(ValueError, match="distinct weights"):
        analysis.block_acceptance_by_position(p, q, 8, max_states=10_000)


def test_rank_acceptance_of_a_pair(tiny_lm):
    """Deterministic top-k children: the rank-r child is accepted with the target's
    probability of the draft's r-th token (accept x with p(x), else p without x)."""
    same = analysis.measure_rank_acceptance(tiny_lm, tiny_lm, [[1, 2, 3], [7, 7, 1], [30, 2]],
                                            specjax.GREEDY, num_ranks=3, max_new_tokens=12)
    np.testing.assert_allclose(same, [1.0, 0.0, 0.0])  # the top draft is always the target's
    target = unigram_lm(np.log([0.5, 0.3, 0.15, 0.05]))
    draft = unigram_lm(np.log([0.4, 0.35, 0.2, 0.05]))  # the same order of tokens
    measured = analysis.measure_rank_acceptance(target, draft, [[0]] * 2000,
                                                SamplingConfig(temperature=1.0), num_ranks=3,
                                                max_new_tokens=4, key=jax.random.key(0))
    np.testing.assert_allclose(measured, [0.5, 0.3, 0.15], atol=0.02)


def test_moe_experts_touched_is_the_uniform_routings_mean():
    """The closed form against routing simulated the way the model routes: each token's
    k distinct experts, independent across tokens."""
    rng = np.random.default_rng(0)
    for tokens, k, experts in [(1, 2, 8), (5, 2, 8), (9, 8, 64), (33, 8, 64)]:
        picks = np.argsort(rng.random((4_000, tokens, experts)), axis=-1)[..., :k]
        chosen = np.zeros((4_000, experts), bool)
        np.put_along_axis(chosen, picks.reshape(4_000, -1), True, axis=1)
        np.testing.assert_allclose(analysis.moe_experts_touched(tokens, k, experts),
                                   chosen.sum(1).mean(), rtol=0.02)
    assert analysis.moe_experts_touched(1, 2, 8) == pytest.approx(2.0)
    np.testing.assert_allclose(analysis.moe_verify_cost_ratio([1, 2, 1000], 2, 8, 0.6),
                               [1.0, 0.4 + 0.6 * 3.5 / 2, 0.4 + 0.6 * 4.0], rtol=1e-6)
    assert analysis.moe_verify_cost_ratio(17, 2, 8, 0.0) == 1.0  # dense: v stays 1
    assert analysis.moe_routed_fraction(600, 100, 4) == pytest.approx(0.4)


def test_moe_experts_touched_by_a_models_router():
    """A random MoE layer's router on a random model's residual stream: the experts its
    verified windows touch grow with the window as the closed form says (random routers
    spread tokens unevenly, so a little below it)."""
    from flax import nnx

    import specjax_models

    config = specjax_models.TransformerConfig(
        vocab_size=64, num_layers=1, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64,
        max_seq_len=64, num_experts=16, experts_per_token=2)
    moe = specjax_models.Transformer(config, rngs=nnx.Rngs(0)).layers[0].mlp
    stream = jax.random.normal(jax.random.key(1), (4000, 32))
    _, experts = jax.jit(moe.route)(stream)
    experts = np.asarray(experts)
    for window in (1, 3, 5, 9):
        usable = experts[: len(experts) // window * window].reshape(-1, window * 2)
        measured = np.mean([len(np.unique(row)) for row in usable])
        model = analysis.moe_experts_touched(window, 2, 16)
        assert 0.85 * model <= measured <= model + 1e-9, (window, measured, model)
    with pytest.raises(ValueError, match="experts_per_token must be in"):
        analysis.moe_experts_touched(3, 0, 8)
    with pytest.raises(ValueError, match="routed_fraction must be in"):
        analysis.moe_verify_cost_ratio(3, 2, 8, 1.5)
