"""Feed-forward layers: the dense MLP, and the mixture of experts (Mixtral, Qwen2/3-MoE,
OLMoE, DeepSeek-V2/V3).

A mixture-of-experts layer routes each token to `experts_per_token` of `num_experts`
gated MLPs and sums their outputs weighted by the router; shared experts (DeepSeek,
Qwen2-MoE) see every token. The routing rules of the published families are one router
with switches (`TransformerConfig`): softmax or sigmoid scores, group-limited choice with
a correction bias, renormalised top-k weights and a routed scaling factor.

Dispatch follows the tokens routed, never every expert on every token. On CPU
(`tiled`): the token-expert pairs sorted by expert, and a loop over tiles of each
expert's run, each tile one matmul against that expert's weights; a tile is about 1.5x an
expert's mean load, so a touched expert is mostly sliced out and read once whatever the
batch (measured 2-4x faster than either dispatch below on XLA's CPU backend, which copies
every pair's gathered weights and computes `ragged_dot` over every expert). XLA still
copies the slice before its matmul (a [384, 512] matvec: 0.24 ms through a slice of the
stacked array, 0.08 ms on an array of its own), the cost left against a framework that
multiplies views. On GPU and TPU:
- few assignments (fewer token-expert pairs than experts: decoding, verifying a few
  drafts), `gathered`: each pair gathers its expert's weights and multiplies only those;
- more (prefills, wide trees, big batches), `grouped`: the pairs sorted by expert and
  multiplied as groups with `jax.lax.ragged_dot` (a grouped matmul there).
The choice is made when the program is lowered (`jax.lax.platform_dependent`). Every
dispatch computes each pair exactly as the dense reference does (`dense_reference`), in
the compute dtype, and sums the weighted pairs in float32.
"""

from __future__ import annotations

import math

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
        out_NKD = routed_experts(x_ND, experts_NK, kernels, self.activation,
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


DISPATCHES = ("auto", "tiled", "gathered", "grouped")


def routed_experts(x_ND: Array, experts_NK: Array, kernels, activation, dtype,
                   dispatch: str = "auto") -> Array:
    """`[N, k, D]`: token n's output from each of its k routed experts. `kernels`: the
    stacked `(gate [E, D, F], up [E, D, F], down [E, F, D])`. `dispatch`: "auto" (tiled on
    CPU; on other platforms gathered for fewer pairs than experts, else grouped), or one
    of them by name (tests compare each with the dense reference)."""
    if dispatch not in DISPATCHES:
        raise ValueError(f"dispatch must be one of {DISPATCHES}, got {dispatch!r}")
    args = (x_ND.astype(dtype), experts_NK, *kernels)
    tiled = lambda *a: _tiled_experts(*a, activation=activation, dtype=dtype)
    gathered = lambda *a: _gathered_experts(*a, activation=activation, dtype=dtype)
    grouped = lambda *a: _grouped_experts(*a, activation=activation, dtype=dtype)
    if dispatch != "auto":
        return {"tiled": tiled, "gathered": gathered, "grouped": grouped}[dispatch](*args)
    accelerator = gathered if experts_NK.size < kernels[0].shape[0] else grouped
    return jax.lax.platform_dependent(*args, cpu=tiled, default=accelerator)


def _expert_mlp(x, gate, up, down, activation, dtype, spec: str):
    """One gated expert MLP per pair, written with the einsum `spec` of its operands."""
    first, second = spec.split("|")
    hidden = activation(jnp.einsum(first, x, gate.astype(dtype))) \
        * jnp.einsum(first, x, up.astype(dtype))
    return jnp.einsum(second, hidden, down.astype(dtype))


def _gathered_experts(x_ND, experts_NK, gate_EDF, up_EDF, down_EFD, *, activation, dtype):
    """Each token-expert pair multiplies only its own expert's weights, gathered (N k
    experts read)."""
    picked = [jnp.take(kernel, experts_NK, axis=0) for kernel in (gate_EDF, up_EDF, down_EFD)]
    return _expert_mlp(x_ND, *picked, activation, dtype, "ND,NKDF->NKF|NKF,NKFD->NKD")


def _grouped_experts(x_ND, experts_NK, gate_EDF, up_EDF, down_EFD, *, activation, dtype):
    """The pairs sorted by expert, each expert's run multiplied by its weights in one
    grouped matmul (`jax.lax.ragged_dot`)."""
    order_M, sizes_E, x_MD = _sorted_by_expert(x_ND, experts_NK, gate_EDF.shape[0])
    ragged = lambda lhs, rhs: jax.lax.ragged_dot(lhs, rhs.astype(dtype), sizes_E)
    hidden_MF = activation(ragged(x_MD, gate_EDF)) * ragged(x_MD, up_EDF)
    return _unsorted(ragged(hidden_MF, down_EFD), order_M, experts_NK.shape)


def _sorted_by_expert(x_ND, experts_NK, num_experts: int):
    """`(order [M], sizes [E], x [M, D])`: the M = N k pairs in expert order (stable),
    each expert's run length, and each pair's token row in that order."""
    flat_M = experts_NK.reshape(-1)
    order_M = jnp.argsort(flat_M, stable=True)
    sizes_E = jnp.bincount(flat_M, length=num_experts).astype(jnp.int32)
    return order_M, sizes_E, jnp.take(x_ND, order_M // experts_NK.shape[1], axis=0)


def _unsorted(sorted_MD, order_M, shape_NK) -> Array:
    """`[N, k, D]`: rows in expert order put back in pair order."""
    out_MD = jnp.zeros_like(sorted_MD).at[order_M].set(sorted_MD, unique_indices=True)
    return out_MD.reshape(*shape_NK, -1)


def expert_tile(num_pairs: int, num_experts: int) -> int:
    """Rows of one tile of the tiled dispatch: a power of two about 1.5x an expert's mean
    load (most touched experts take one tile: their weights are read once, and a tile is
    not much longer than the run it covers), at most the pairs and 512."""
    mean_load = 1.5 * num_pairs / num_experts
    tile = 1 << max(0, math.ceil(math.log2(max(mean_load, 1.0))))
    return min(tile, max(num_pairs, 1), 512)  # one row at least (an empty batch)


def _tiled_experts(x_ND, experts_NK, gate_EDF, up_EDF, down_EFD, *, activation, dtype):
    """The pairs sorted by expert; tile t of expert e's run (C rows from the run's start
    + t C) is one gated MLP against e's weights. Tiles run in the
    order of their first row, so the rows a tile covers past its run's end (the next
    experts') are written again by their own tile later. The loop's length is static (an
    upper bound on the tiles: every touched expert one tile plus M // C), the iterations
    past the real count skipped, so the layer stays differentiable."""
    num_experts, d_model = gate_EDF.shape[0], x_ND.shape[1]
    pairs = experts_NK.size
    tile = expert_tile(pairs, num_experts)
    order_M, sizes_E, x_MD = _sorted_by_expert(x_ND, experts_NK, num_experts)
    starts_E = jnp.cumsum(sizes_E) - sizes_E
    tiles_E = (sizes_E + tile - 1) // tile
    tiles_end_E = jnp.cumsum(tiles_E)  # tiles of experts 0..e together
    # Padded by one tile: a tile starting near the end reads and writes whole.
    x_PD = jnp.concatenate([x_MD, jnp.zeros((tile, d_model), x_MD.dtype)])

    def run_tile(index, out_PD):
        expert = jnp.searchsorted(tiles_end_E, index, side="right")
        first_of_expert = tiles_end_E[expert] - tiles_E[expert]
        start = starts_E[expert] + (index - first_of_expert) * tile
        rows_CD = jax.lax.dynamic_slice_in_dim(x_PD, start, tile)
        weights = [jax.lax.dynamic_index_in_dim(kernel, expert, keepdims=False)
                   for kernel in (gate_EDF, up_EDF, down_EFD)]
        out_CD = _expert_mlp(rows_CD, *weights, activation, dtype, "CD,DF->CF|CF,FD->CD")
        return jax.lax.dynamic_update_slice_in_dim(out_PD, out_CD.astype(out_PD.dtype),
                                                   start, 0)

    def step(index, out_PD):
        return jax.lax.cond(index < tiles_end_E[-1], run_tile, lambda _, out: out, index,
                            out_PD)

    max_tiles = min(num_experts, pairs) + pairs // tile
    out_PD = jax.lax.fori_loop(0, max_tiles, step, jnp.zeros_like(x_PD))
    return _unsorted(out_PD[:pairs], order_M, experts_NK.shape)


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
