"""specjax_models.feed_forward: the mixture-of-experts layer. Its router against a numpy
transcription of each published rule, its dispatches (tiled, gathered, grouped) against
every expert on every token, and the refusals of configurations it cannot compute."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specjax_models.config import TransformerConfig
from specjax_models.feed_forward import (
    MLP,
    MoE,
    dense_reference,
    expert_tile,
    route,
    routed_experts,
)

BASE = dict(vocab_size=40, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, d_ff=48,
            max_seq_len=64)


def moe_config(**fields) -> TransformerConfig:
    return TransformerConfig(**(BASE | dict(num_experts=8, experts_per_token=2,
                                            expert_d_ff=24) | fields))


def numpy_route(logits, scoring="softmax", groups=1, kept_groups=1, group_score="max",
                bias=None, normalize=False, scaling=1.0, k=2):
    """The routers of transformers' Mixtral / Qwen-MoE / OLMoE (softmax, top-k, optional
    renormalisation), DeepSeek-V2 (group_limited_greedy: groups scored by their best)
    and DeepSeek-V3 (sigmoid, correction bias for the choice, groups scored by their best
    two), row by row in float64."""
    weights, chosen = [], []
    for row in np.asarray(logits, np.float64):
        if scoring == "softmax":
            scores = np.exp(row - row.max())
            scores /= scores.sum()
        else:
            scores = 1.0 / (1.0 + np.exp(-row))
        choice = scores + (0.0 if bias is None else np.asarray(bias, np.float64))
        if groups > 1:
            by_group = choice.reshape(groups, -1)
            group_scores = by_group.max(-1) if group_score == "max" else \
                np.sort(by_group, -1)[:, -2:].sum(-1)
            best = np.argsort(-group_scores, kind="stable")[:kept_groups]
            allowed = np.zeros(groups, bool)
            allowed[best] = True
            choice = np.where(np.repeat(allowed, len(row) // groups), choice, -np.inf)
        top = np.argsort(-choice, kind="stable")[:k]
        w = scores[top]
        if normalize:
            w = w / (w.sum() + 1e-20)
        weights.append(w * scaling)
        chosen.append(top)
    return np.array(weights), np.array(chosen)


RULES = {
    "mixtral": dict(router_normalize=True),
    "qwen-unnormalised": dict(),
    "deepseek-v2 groups": dict(router_groups=4, router_topk_groups=2, routed_scaling=16.0,
                               experts_per_token=3),
    "deepseek-v3": dict(router_scoring="sigmoid", router_groups=4, router_topk_groups=2,
                        router_group_score="top2_sum", router_bias=True,
                        router_normalize=True, routed_scaling=2.5, experts_per_token=3),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_router_follows_each_published_rule(rule):
    config = moe_config(**RULES[rule])
    logits = np.random.default_rng(1).normal(size=(64, 8)).astype(np.float32) * 2
    bias = np.random.default_rng(2).normal(size=8).astype(np.float32) * 0.5 \
        if config.router_bias else None
    weights, experts = jax.jit(lambda x, b: route(x, config, b))(logits, bias)
    want_w, want_e = numpy_route(
        logits, config.router_scoring, config.router_groups, config.router_topk_groups,
        config.router_group_score, bias, config.router_normalize, config.routed_scaling,
        config.experts_per_token)
    # The same experts (as sets: top-k order is not part of the rule) and weights.
    order, want_order = np.argsort(experts, -1), np.argsort(want_e, -1)
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(experts), order, -1),
                                  np.take_along_axis(want_e, want_order, -1))
    np.testing.assert_allclose(np.take_along_axis(np.asarray(weights), order, -1),
                               np.take_along_axis(want_w, want_order, -1), rtol=2e-6)
    if config.router_groups > 1:  # the rule mattered: some plain top-k picks were excluded
        plain_w, plain_e = numpy_route(logits, config.router_scoring, k=config.experts_per_token,
                                       bias=bias)
        assert (np.sort(plain_e, -1) != np.sort(want_e, -1)).any()


@pytest.mark.parametrize("tokens", [1, 3, 40])  # 2 and 6 pairs < 8 experts, then 80
@pytest.mark.parametrize("shared", [False, True])
def test_the_layer_equals_every_expert_on_every_token(tokens, shared):
    extra = dict(shared_d_ff=16, shared_expert_gate=True) if shared else {}
    config = moe_config(**extra)
    moe = MoE(config, rngs=nnx.Rngs(3))
    x = jax.random.normal(jax.random.key(tokens), (2, tokens, 32))
    graphdef, state = nnx.split(moe)
    run = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    reference = jax.jit(lambda s, x: dense_reference(nnx.merge(graphdef, s), x))
    out, want = run(state, x), reference(state, x)
    assert out.shape == x.shape
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-6, rtol=1e-5)
    # Each token's output is its experts' own: changing one token changes no other row.
    changed = x.at[0, 0].set(-x[0, 0])
    moved = run(state, changed)
    np.testing.assert_allclose(np.asarray(moved)[1], np.asarray(out)[1], atol=1e-6)
    np.testing.assert_allclose(np.asarray(moved)[0, 1:], np.asarray(out)[0, 1:], atol=1e-6)


def _routed_reference(x, experts, kernels):
    """`[N, k, D]` pair by pair in numpy float64: token n through expert experts[n, j]."""
    gate, up, down = (np.asarray(kernel, np.float64) for kernel in kernels)
    x = np.asarray(x, np.float64)
    out = np.zeros(experts.shape + (x.shape[1],))
    for n, j in np.ndindex(*experts.shape):
        e = experts[n, j]
        h = x[n] @ gate[e]
        out[n, j] = (h / (1 + np.exp(-h)) * (x[n] @ up[e])) @ down[e]
    return out


@pytest.mark.parametrize("dispatch", ["tiled", "gathered", "grouped"])
@pytest.mark.parametrize("routing", ["spread", "one expert", "two experts"])
def test_each_dispatch_computes_every_pair_with_its_own_expert(dispatch, routing):
    """Each dispatch by name (the layer picks one per platform) against the pairs computed
    one by one, with routings that fill tiles unevenly: 37 tokens spread over 8 experts,
    all on one expert (one run of 74 pairs: several tiles), and on two."""
    rng = np.random.default_rng(0)
    tokens, k, d_model, d_ff, num_experts = 37, 2, 16, 8, 8
    kernels = [jnp.asarray(rng.normal(0, 0.3, shape), jnp.float32) for shape in
               ((num_experts, d_model, d_ff),) * 2 + ((num_experts, d_ff, d_model),)]
    x = jnp.asarray(rng.normal(size=(tokens, d_model)), jnp.float32)
    experts = {"spread": rng.integers(0, num_experts, (tokens, k)),
               "one expert": np.full((tokens, k), 5),
               "two experts": np.stack([np.full(tokens, 7), np.full(tokens, 2)], 1)}[routing]
    run = jax.jit(lambda x, e, ks: routed_experts(x, e, ks, jax.nn.silu, jnp.float32,
                                                  dispatch))
    out = run(x, jnp.asarray(experts, jnp.int32), kernels)
    np.testing.assert_allclose(np.asarray(out), _routed_reference(x, experts, kernels),
                               atol=1e-5, rtol=1e-5)


def test_the_tiled_dispatch_is_differentiable_like_the_dense_reference():
    """Its loop has a static length (the iterations past the tiles skipped): reverse-mode
    gradients flow through it, and equal the dense reference's."""
    moe = MoE(moe_config(), rngs=nnx.Rngs(5))
    graphdef, state = nnx.split(moe)
    x = jax.random.normal(jax.random.key(2), (1, 9, 32))

    def loss(state, forward):
        return jnp.sum(jnp.sin(forward(nnx.merge(graphdef, state), x)))

    got = jax.grad(loss)(state, lambda m, x: m(x))
    want = jax.grad(loss)(state, dense_reference)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-4)


def test_a_tile_is_a_power_of_two_near_one_and_a_half_mean_loads():
    assert [expert_tile(pairs, 16) for pairs in (2, 8, 16, 66, 512)] == [1, 1, 2, 8, 64]
    assert expert_tile(3, 2) == 3  # never more than the pairs
    assert expert_tile(1 << 20, 8) == 512
    with pytest.raises(ValueError, match="dispatch must be one of"):
        routed_experts(jnp.zeros((1, 4)), jnp.zeros((1, 1), jnp.int32),
                       [jnp.zeros((2, 4, 4))] * 3, jax.nn.silu, jnp.float32, "sorted")


def test_a_routed_expert_is_what_the_output_depends_on():
    """Zeroing an expert no token chose changes nothing; zeroing a chosen one changes
    the tokens that chose it (and only those)."""
    config = moe_config()
    moe = MoE(config, rngs=nnx.Rngs(4))
    x = jax.random.normal(jax.random.key(9), (1, 5, 32))
    out = np.asarray(moe(x))
    _, experts = moe.route(x.reshape(-1, 32))
    experts = np.asarray(experts)
    for expert in range(8):
        down = moe.down_kernel[...]
        moe.down_kernel[...] = down.at[expert].set(0.0)
        changed = np.any(np.abs(np.asarray(moe(x)) - out) > 1e-7, axis=-1)[0]
        moe.down_kernel[...] = down
        np.testing.assert_array_equal(changed, (experts == expert).any(-1))


def test_a_dense_mlp_takes_its_own_width():
    config = moe_config()
    mlp = MLP(config, rngs=nnx.Rngs(0), d_ff=12)
    assert mlp.up_proj.kernel[...].shape == (32, 12)
    assert MLP(config, rngs=nnx.Rngs(0)).up_proj.kernel[...].shape == (32, 48)


@pytest.mark.parametrize("fields, message", [
    (dict(num_experts=-1), "num_experts must be an int >= 0"),
    (dict(num_experts=0, experts_per_token=2), "experts_per_token=2 needs num_experts > 0"),
    (dict(experts_per_token=9), r"experts_per_token must be an int in \[1, num_experts=8\]"),
    (dict(experts_per_token=0), "experts_per_token must be"),
    (dict(router_scoring="relu"), "router_scoring must be 'softmax' or 'sigmoid'"),
    (dict(router_groups=3), "router_groups must be a positive int dividing num_experts"),
    (dict(router_groups=4, router_topk_groups=5), "router_topk_groups must be an int in"),
    (dict(router_groups=8, router_topk_groups=1), "hold fewer than experts_per_token"),
    (dict(router_groups=8, router_topk_groups=4, router_group_score="top2_sum"),
     "needs at least 2 experts per group"),
    (dict(router_group_score="mean"), "router_group_score must be"),
    (dict(routed_scaling=0.0), "routed_scaling must be a positive number"),
    (dict(shared_expert_gate=True), "shared_expert_gate needs shared experts"),
    (dict(dense_layers=(2,)), r"dense_layers must be distinct layer indices in \[0, 2\)"),
    (dict(dense_layers=(0, 0)), "dense_layers must be distinct"),
    (dict(gated_mlp=False), "experts are gated MLPs"),
    (dict(dense_layers=(0,), scan_layers=True), "load with scan_layers=False"),
    (dict(qk_norm_scope="row"), "qk_norm_scope must be 'head' or 'projection'"),
    (dict(clip_qkv=-1.0), "clip_qkv must be a positive number or None"),
])
def test_configurations_the_layer_cannot_compute_are_refused_by_field(fields, message):
    with pytest.raises(ValueError, match=message):
        moe_config(**fields)


def test_dense_layers_keep_the_dense_mlp_and_a_layer_subset_keeps_each_layers_kind():
    from specjax_models.transformer import Transformer, select_layers

    config = moe_config(num_layers=3, dense_layers=(0,))
    model = Transformer(config, rngs=nnx.Rngs(0))
    assert isinstance(model.layers[0].mlp, MLP) and isinstance(model.layers[1].mlp, MoE)
    assert config.uniform_layers is False
    draft = select_layers(model, (0, 2))
    assert draft.config.dense_layers == (0,)
    assert isinstance(draft.layers[0].mlp, MLP) and isinstance(draft.layers[1].mlp, MoE)
    np.testing.assert_array_equal(np.asarray(draft.layers[1].mlp.gate_kernel[...]),
                                  np.asarray(model.layers[2].mlp.gate_kernel[...]))
    assert select_layers(model, (1, 2)).config.dense_layers == ()
    assert dataclasses.replace(config, dense_layers=()).uniform_layers


def test_bfloat16_experts_route_in_float32():
    config = moe_config(dtype="bfloat16", param_dtype="bfloat16")
    moe = MoE(config, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(0), (1, 3, 32)).astype(jnp.bfloat16)
    weights, _ = moe.route(x.reshape(-1, 32))
    assert weights.dtype == jnp.float32 and moe(x).dtype == jnp.bfloat16
    total = np.asarray(weights).sum(-1)  # two of eight softmax scores: in (0, 1]
    assert (total > 0).all() and (total <= 1 + 1e-6).all()
