"""DeepSeek-V2/V3 checkpoints (and those built on their architecture: Moonlight, Kimi K2):
multi-head latent attention, a dense first `first_k_dense_replace` layers, then experts
with shared experts and DeepSeek's router. Their config fields and tensor names, for
`specjax_models.hf`.

The rotary dimensions of q and of the shared rotary key are stored interleaved (pairs
(x0, x1), (x2, x3), ... rotated together: DeepSeek-V2's complex multiplication, V3's
`rope_interleave`). Attention scores do not change when q and k permute their dimensions
alike, so the loader reorders those projection columns to the rotate-half layout (evens,
then odds) and the model rotates as every other family does.
"""

from __future__ import annotations

import numpy as np

from specjax.lm.rope import yarn_mscale
from specjax_models.config import TransformerConfig
from specjax_models.hf_moe import config_int

DEEPSEEK_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")


def deepseek_fields(hf: dict) -> dict:
    """TransformerConfig fields of a DeepSeek-V2/V3 config.json beyond the Llama ones:
    latent attention, experts and the router's rule."""
    model_type = hf["model_type"]
    heads = hf["num_attention_heads"]
    nope, rope = config_int(hf, "qk_nope_head_dim"), config_int(hf, "qk_rope_head_dim")
    fields = dict(num_kv_heads=heads, head_dim=rope, query_scale=_softmax_scale(hf, nope + rope),
                  kv_lora_rank=config_int(hf, "kv_lora_rank"),
                  q_lora_rank=config_int(hf, "q_lora_rank", default=0),
                  qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                  v_head_dim=config_int(hf, "v_head_dim"))
    experts = config_int(hf, "n_routed_experts", default=0)
    if not experts:
        return fields
    if hf.get("moe_layer_freq", 1) != 1:
        raise ValueError(f"moe_layer_freq={hf['moe_layer_freq']} (experts every few layers) "
                         "is not supported; every layer after first_k_dense_replace has them")
    v3 = model_type != "deepseek_v2"
    scoring = hf.get("scoring_func", "sigmoid" if v3 else "softmax")
    method = hf.get("topk_method", "noaux_tc" if v3 else "greedy")
    if method not in ("greedy", "group_limited_greedy", "noaux_tc"):
        raise ValueError(f"topk_method {method!r} is not supported (greedy, "
                         "group_limited_greedy, noaux_tc)")
    grouped = method != "greedy"
    shared = hf.get("n_shared_experts") or 0
    expert_d_ff = config_int(hf, "moe_intermediate_size")
    return fields | dict(
        num_experts=experts, experts_per_token=config_int(hf, "num_experts_per_tok"),
        expert_d_ff=expert_d_ff, dense_layers=tuple(range(
            min(config_int(hf, "first_k_dense_replace", default=0), hf["num_hidden_layers"]))),
        router_scoring=scoring, router_bias=method == "noaux_tc",
        router_groups=config_int(hf, "n_group", default=1) if grouped else 1,
        router_topk_groups=config_int(hf, "topk_group", default=1) if grouped else 1,
        router_group_score="top2_sum" if method == "noaux_tc" else "max",
        router_normalize=bool(hf.get("norm_topk_prob", False)),
        routed_scaling=float(hf.get("routed_scaling_factor", 1.0)),
        shared_d_ff=expert_d_ff * shared)


def _softmax_scale(hf: dict, key_dim: int) -> float:
    """key_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2 when the rope is
    stretched (DeepSeek scales every dimension's scores, not only the rotary ones)."""
    spec = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    scale = key_dim ** -0.5
    if spec.get("rope_type", spec.get("type", "default")) not in ("default", None) \
            and spec.get("mscale_all_dim"):
        scale *= yarn_mscale(float(spec["factor"]), float(spec["mscale_all_dim"])) ** 2
    return scale


def interleaved_rope(hf: dict) -> bool:
    """Are the rotary dimensions stored interleaved (see the module docstring)?"""
    return hf.get("model_type") == "deepseek_v2" or bool(hf.get("rope_interleave", True))


def attention_weight_map(config: TransformerConfig, layer: int, interleaved: bool) -> dict:
    """Our flat names of layer `layer`'s latent attention -> (HF tensor name, transform)."""
    ours, theirs = f"layers.{layer}.attention.", f"model.layers.{layer}.self_attn."
    heads, nope, rope = config.num_heads, config.qk_nope_head_dim, config.qk_rope_head_dim
    query = ("rope_columns", heads, nope, rope) if interleaved else "T"
    latent = ("rope_columns", 1, config.kv_lora_rank, rope) if interleaved else "T"
    mapping = {ours + "kv_a_proj.kernel": (theirs + "kv_a_proj_with_mqa.weight", latent),
               ours + "kv_a_norm.weight": (theirs + "kv_a_layernorm.weight", "id"),
               ours + "kv_b_proj.kernel": (theirs + "kv_b_proj.weight", "T"),
               ours + "o_proj.kernel": (theirs + "o_proj.weight", "T"),
               ours + "o_proj.bias": (theirs + "o_proj.bias", "id")}
    if config.q_lora_rank:
        mapping.update({ours + "q_a_proj.kernel": (theirs + "q_a_proj.weight", "T"),
                        ours + "q_a_proj.bias": (theirs + "q_a_proj.bias", "id"),
                        ours + "q_a_norm.weight": (theirs + "q_a_layernorm.weight", "id"),
                        ours + "q_b_proj.kernel": (theirs + "q_b_proj.weight", query)})
    else:
        mapping[ours + "q_proj.kernel"] = (theirs + "q_proj.weight", query)
    if config.qkv_bias:
        bias = ("rope_bias", 1, config.kv_lora_rank, rope) if interleaved else "id"
        mapping[ours + "kv_a_proj.bias"] = (theirs + "kv_a_proj_with_mqa.bias", bias)
    return mapping


def rope_columns_to_ours(array: np.ndarray, transform) -> np.ndarray:
    """A HF Linear weight [out, in] (("rope_columns", ...)) or bias [out] (("rope_bias",
    ...)) whose output holds `groups` blocks of `offset` plain then `rope` interleaved
    rotary features, as our kernel [in, out] (or bias) with each block's rotary features
    in the rotate-half order (evens, then odds)."""
    kind, groups, offset, rope = transform
    block = offset + rope
    order = np.concatenate([np.arange(offset), offset + np.arange(0, rope, 2),
                            offset + np.arange(1, rope, 2)])
    columns = (np.arange(groups)[:, None] * block + order[None]).reshape(-1)
    return np.ascontiguousarray(array[columns] if kind == "rope_bias" else array[columns].T)
