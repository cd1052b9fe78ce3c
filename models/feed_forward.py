"""Feed-forward layers: the dense MLP, and the mixture of experts (Mixtral, Qwen2/3-MoE,
OLMoE, DeepSeek-V2/V3).

A mixture-of-experts layer routes each token to `experts_per_token` of `num_experts`
gated MLPs and sums their outputs weighted by the router; shared experts (DeepSeek,
Qwen2-MoE) see every token. The routing rules of the published families are one router
with switches (`TransformerConfig`): softmax or sigmoid scores, group-limited choice with
a correction bias, renormalised top-k weights and a routed scaling factor.

Dispatch follows the tokens routed, never every expert on every token:
- few assignments (fewer token-expert pairs than experts: decoding, verifying a few
  drafts): each pair gathers its expert's weights and multiplies only those, so a
  decode step reads `tokens x experts_per_token` experts' weights;
- more (prefills, wide trees, big batches): the pairs sorted by expert and multiplied as
  groups with `jax.lax.ragged_dot` (a grouped matmul on GPU and TPU; XLA's CPU backend
  lowers it to a masked product over every expert, so on CPU a wide call costs about as
  much as a dense one).
Both compute each pair exactly as the dense reference does (`dense_reference`), in the
compute dtype, and sum the weighted pairs in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax import Array

from specjax_models.config import ACTIVATIONS, TransformerConfig


def _dense(config: TransformerConfig, n_in: int, n_out: int, bias: bool, rngs: nnx.Rngs):
    return nnx.Linear(n_in, n_out, use_bias=bias, dtype=config.compute_dtype,
                      param_dtype=config.storage_dtype, rngs=rngs)


class MLP(nnx.Module):
    """Gated (SwiGLU / GeGLU: down(act(gate(x)) * up(x))) or plain (down(act(up(x))));
    `d_ff` overrides the config's width (an MoE model's shared experts)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, d_ff: int | None = None):
        d_ff = d_ff or config.d_ff
        self.gated = config.gated_mlp
        self.activation = ACTIVATIONS[config.activation]
        if config.gated_mlp:
            self.gate_proj = _dense(config, config.d_model, d_ff, config.mlp_bias, rngs)
        self.up_proj = _dense(config, config.d_model, d_ff, config.mlp_bias, rngs)
        self.down_proj = _dense(config, d_ff, config.d_model, config.mlp_bias, rngs)

    def __call__(self, x: Array) -> Array:
        if self.gated:
            return self.down_proj(self.activation(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(self.activation(self.up_proj(x)))


def route(logits_NE: Array, config: TransformerConfig,
          correction_bias_E: Array | None = None) -> tuple[Array, Array]:
    """`(weights f32[N, k], experts int32[N, k])`: the experts each token goes to and
    the weights of their outputs, from float32 router logits, by the config's rule:

    scores: softmax (Mixtral, Qwen, OLMoE, DeepSeek-V2) or sigmoid (DeepSeek-V3) of the
      logits; the choice reads scores + `correction_bias` (DeepSeek-V3's
      e_score_correction_bias; the weights stay the plain scores);
    groups: with `router_groups` > 1 only the `router_topk_groups` best groups of
      consecutive experts compete, a group scored by its best expert ("max", V2's
      group_limited_greedy) or its two best ("top2_sum", V3);
    weights: the chosen scores, renormalised to sum 1 (`router_normalize`), times
      `routed_scaling`.
    Ties go to the lower expert index (as `lax.top_k`)."""
    k, num_experts = config.experts_per_token, config.num_experts
    logits_NE = logits_NE.astype(jnp.float32)
    if config.router_scoring == "softmax":
        scores_NE = jax.nn.softmax(logits_NE, axis=-1)
    else:
        scores_NE = jax.nn.sigmoid(logits_NE)
    choice_NE = scores_NE if correction_bias_E is None else \
        scores_NE + correction_bias_E.astype(jnp.float32)[None, :]
    if config.router_groups > 1:
        groups = config.router_groups
        grouped_NGE = choice_NE.reshape(-1, groups, num_experts // groups)
        if config.router_group_score == "max":
            group_NG = jnp.max(grouped_NGE, axis=-1)
        else:
            group_NG = jnp.sum(jax.lax.top_k(grouped_NGE, 2)[0], axis=-1)
        _, best_NG = jax.lax.top_k(group_NG, config.router_topk_groups)
        kept_NG = jnp.zeros(group_NG.shape, bool).at[
            jnp.arange(group_NG.shape[0])[:, None], best_NG].set(True)
        kept_NE = jnp.repeat(kept_NG, num_experts // groups, axis=-1)
        choice_NE = jnp.where(kept_NE, choice_NE, -jnp.inf)
    _, experts_NK = jax.lax.top_k(choice_NE, k)
    weights_NK = jnp.take_along_axis(scores_NE, experts_NK, axis=-1)
    if config.router_normalize:
        weights_NK = weights_NK / (jnp.sum(weights_NK, axis=-1, keepdims=True) + 1e-20)
    return weights_NK * config.routed_scaling, experts_NK.astype(jnp.int32)


class MoE(nnx.Module):
    """A mixture-of-experts feed-forward layer. Parameters: `router` ([D, E] kernel),
    `router_bias` ([E], the choice's correction bias, when `router_bias`), the experts'
    stacked kernels `gate_kernel` / `up_kernel` [E, D, F] and `down_kernel` [E, F, D],
    and `shared` (an MLP of width `shared_d_ff`, with `shared_gate` [D, 1] scaling its
    output by a sigmoid for Qwen2-MoE)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        d_model, experts, d_ff = config.d_model, config.num_experts, config.resolved_expert_d_ff
        self.activation = ACTIVATIONS[config.activation]
        self.router = nnx.Linear(d_model, experts, use_bias=False, dtype=jnp.float32,
                                 param_dtype=config.storage_dtype, rngs=rngs)
        if config.router_bias:
            self.router_bias = nnx.Param(jnp.zeros((experts,), jnp.float32))
        init = nnx.initializers.lecun_normal(in_axis=1, out_axis=2, batch_axis=(0,))
        store = config.storage_dtype
        self.gate_kernel = nnx.Param(init(rngs.params(), (experts, d_model, d_ff), store))
        self.up_kernel = nnx.Param(init(rngs.params(), (experts, d_model, d_ff), store))
        self.down_kernel = nnx.Param(init(rngs.params(), (experts, d_ff, d_model), store))
        if config.shared_d_ff:
            self.shared = MLP(config, rngs=rngs, d_ff=config.shared_d_ff)
            if config.shared_expert_gate:
                self.shared_gate = _dense(config, d_model, 1, False, rngs)

    def __call__(self, x_BTD: Array) -> Array:
        cfg = self.config
        batch, num_new, d_model = x_BTD.shape
        x_ND = x_BTD.reshape(-1, d_model)
        weights_NK, experts_NK = self.route(x_ND)
        kernels = (self.gate_kernel[...], self.up_kernel[...], self.down_kernel[...])
        if experts_NK.size < cfg.num_experts:
            out_NKD = _gathered_experts(x_ND, experts_NK, kernels, self.activation,
                                        cfg.compute_dtype)
        else:
            out_NKD = _grouped_experts(x_ND, experts_NK, kernels, self.activation,
                                       cfg.compute_dtype)
        return self.combine(x_ND, weights_NK, out_NKD).reshape(batch, num_new, d_model)

    def combine(self, x_ND: Array, weights_NK: Array, out_NKD: Array) -> Array:
        """`[N, D]` in the compute dtype: the routed outputs weighted by the router (in
        float32), plus the shared experts' (sigmoid-gated for Qwen2-MoE)."""
        cfg = self.config
        out_ND = jnp.einsum("NK,NKD->ND", weights_NK, out_NKD.astype(jnp.float32))
        if cfg.shared_d_ff:
            shared_ND = self.shared(x_ND).astype(jnp.float32)
            if cfg.shared_expert_gate:
                shared_ND = jax.nn.sigmoid(self.shared_gate(x_ND).astype(jnp.float32)) \
                    * shared_ND
            out_ND = out_ND + shared_ND
        return out_ND.astype(cfg.compute_dtype)

    def route(self, x_ND: Array) -> tuple[Array, Array]:
        """`(weights f32[N, k], experts int32[N, k])` of tokens `x [N, D]` (see `route`)."""
        logits_NE = jnp.einsum("ND,DE->NE", x_ND.astype(jnp.float32),
                               self.router.kernel[...].astype(jnp.float32))
        bias = self.router_bias[...] if self.config.router_bias else None
        return route(logits_NE, self.config, bias)


def _expert_mlp(x, gate, up, down, activation, dtype, spec: str):
    """One gated expert MLP per pair, written with the einsum `spec` of its operands."""
    first, second = spec.split("|")
    hidden = activation(jnp.einsum(first, x, gate.astype(dtype))) \
        * jnp.einsum(first, x, up.astype(dtype))
    return jnp.einsum(second, hidden, down.astype(dtype))


def _gathered_experts(x_ND: Array, experts_NK: Array, kernels, activation, dtype) -> Array:
    """`[N, k, D]`: each token-expert pair multiplies only its own expert's weights
    (gathered: N k experts read, the cost of a decode step)."""
    picked = [jnp.take(kernel, experts_NK, axis=0) for kernel in kernels]  # [N, k, ...]
    return _expert_mlp(x_ND.astype(dtype), *picked, activation, dtype,
                       "ND,NKDF->NKF|NKF,NKFD->NKD")


def _grouped_experts(x_ND: Array, experts_NK: Array, kernels, activation, dtype) -> Array:
    """`[N, k, D]`: the pairs sorted by expert, each expert's run multiplied by its weights
    in one grouped matmul (`jax.lax.ragged_dot`)."""
    gate_EDF, up_EDF, down_EFD = kernels
    num_tokens, k = experts_NK.shape
    flat_M = experts_NK.reshape(-1)
    order_M = jnp.argsort(flat_M, stable=True)
    sizes_E = jnp.bincount(flat_M, length=gate_EDF.shape[0]).astype(jnp.int32)
    x_MD = jnp.take(x_ND.astype(dtype), order_M // k, axis=0)
    ragged = lambda lhs, rhs: jax.lax.ragged_dot(lhs, rhs.astype(dtype), sizes_E)
    hidden_MF = activation(ragged(x_MD, gate_EDF)) * ragged(x_MD, up_EDF)
    sorted_MD = ragged(hidden_MF, down_EFD)
    out_MD = jnp.zeros_like(sorted_MD).at[order_M].set(sorted_MD, unique_indices=True)
    return out_MD.reshape(num_tokens, k, -1)


def dense_reference(moe: MoE, x_BTD: Array) -> Array:
    """The layer computed the plain way, every expert on every token and the routed ones
    kept: the exactness reference of the dispatches above (tests), never fast."""
    cfg = moe.config
    x_ND = x_BTD.reshape(-1, x_BTD.shape[-1]).astype(cfg.compute_dtype)
    weights_NK, experts_NK = moe.route(x_ND)
    every_NED = _expert_mlp(x_ND, moe.gate_kernel[...], moe.up_kernel[...],
                            moe.down_kernel[...], moe.activation, cfg.compute_dtype,
                            "ND,EDF->NEF|NEF,EFD->NED")
    routed_NKD = jnp.take_along_axis(every_NED, experts_NK[:, :, None], axis=1)
    return moe.combine(x_ND, weights_NK, routed_NKD).reshape(x_BTD.shape)
