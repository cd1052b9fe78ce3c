"""Mixture-of-experts families of Hugging Face checkpoints (Mixtral, Qwen2-MoE, Qwen3-MoE,
OLMoE): their config fields and tensor names, for `specjax_models.hf`.

Published checkpoints store each expert's projections as its own tensors
(`...experts.{e}.gate_proj.weight` [F, D], Mixtral's `w1` / `w3` / `w2`), which is also
what transformers' `save_pretrained` writes; transformers' in-memory layout fuses them
(`...experts.gate_up_proj` [E, 2F, D], `...experts.down_proj` [E, D, F]), and a
checkpoint written that way loads too. Both become our stacked kernels
`mlp.gate_kernel` / `mlp.up_kernel` [E, D, F] and `mlp.down_kernel` [E, F, D].
"""

from __future__ import annotations

import numpy as np

from specjax_models.config import TransformerConfig
from specjax_models.params import TensorShapeError

# model_type -> the dense family whose attention and norms it shares.
MOE_MODEL_TYPES = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3",
                   "olmoe": "olmoe"}
_ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                  "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}


def config_int(hf: dict, *names: str, default=None) -> int:
    """The first of `names` the config sets (not null), as an int >= 0; `default` when
    none is set (None: a ValueError naming them)."""
    for name in names:
        value = hf.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"the config's {name} is {value!r}, expected an int >= 0")
            return value
    if default is None:
        raise ValueError(f"the config has no {' / '.join(names)}")
    return default


def moe_fields(hf: dict) -> dict:
    """TransformerConfig fields of a mixture-of-experts config.json (model_type in
    MOE_MODEL_TYPES): the experts, the router's rule and which layers stay dense."""
    model_type = hf["model_type"]
    num_layers = hf["num_hidden_layers"]
    experts = config_int(hf, "num_local_experts" if model_type == "mixtral" else "num_experts",
                         "num_local_experts", "num_experts")
    fields = dict(num_experts=experts,
                  experts_per_token=config_int(hf, "num_experts_per_tok"))
    if model_type == "mixtral":
        return fields | dict(router_normalize=True)
    fields["router_normalize"] = bool(hf.get("norm_topk_prob", False))
    if model_type == "olmoe":
        return fields
    fields["expert_d_ff"] = config_int(hf, "moe_intermediate_size")
    step = config_int(hf, "decoder_sparse_step", default=1)
    if step < 1:
        raise ValueError(f"the config's decoder_sparse_step is {step}, expected >= 1")
    only_mlp = hf.get("mlp_only_layers") or []
    if not isinstance(only_mlp, list) or any(
            isinstance(i, bool) or not isinstance(i, int) for i in only_mlp):
        raise ValueError(f"the config's mlp_only_layers is {only_mlp!r}, expected layer "
                         "indices")
    fields["dense_layers"] = tuple(i for i in range(num_layers)
                                   if i in only_mlp or (i + 1) % step)
    if model_type == "qwen2_moe":
        fields.update(shared_d_ff=config_int(hf, "shared_expert_intermediate_size"),
                      shared_expert_gate=True)
    return fields


def moe_model_type(config: TransformerConfig) -> str:
    """The transformers model_type that computes what a mixture-of-experts `config` does,
    or a ValueError naming what no supported family has."""
    if config.router_scoring != "softmax" or config.router_groups > 1 or config.router_bias \
            or config.routed_scaling != 1.0:
        raise ValueError("a sigmoid, group-limited, biased or scaled router is DeepSeek's; "
                         "transformers' Mixtral, Qwen-MoE and OLMoE have none of them")
    if config.qk_norm and config.qk_norm_scope == "projection":
        family = "olmoe"
    elif config.qk_norm:
        family = "qwen3_moe"
    elif config.shared_d_ff:
        family = "qwen2_moe"
    else:
        family = "mixtral"
    if family != "qwen2_moe" and config.shared_d_ff:
        raise ValueError(f"shared experts with {family}'s attention are no transformers model")
    if family == "qwen2_moe" and not config.shared_expert_gate:
        raise ValueError("Qwen2-MoE's shared expert has a sigmoid gate (shared_expert_gate)")
    if family in ("mixtral", "olmoe") and config.dense_layers:
        raise ValueError(f"{family} has no dense layers (dense_layers "
                         f"{config.dense_layers})")
    if family == "mixtral" and not config.router_normalize:
        raise ValueError("Mixtral renormalises its top-k weights (router_normalize=True)")
    return family


def moe_config_to_hf(config: TransformerConfig, family: str, hf: dict) -> dict:
    """`hf` (the dense family's config.json fields) completed for the MoE `family`."""
    hf = dict(hf, model_type=family, architectures=[_ARCHITECTURES[family]])
    hf["num_experts_per_tok"] = config.experts_per_token
    if family == "mixtral":
        if config.resolved_expert_d_ff != config.d_ff:
            raise ValueError("Mixtral's experts have the width of intermediate_size "
                             f"(expert_d_ff {config.expert_d_ff} != d_ff {config.d_ff})")
        return hf | {"num_local_experts": config.num_experts}
    hf.update(num_experts=config.num_experts, norm_topk_prob=config.router_normalize)
    if family == "olmoe":
        if config.resolved_expert_d_ff != config.d_ff:
            raise ValueError("OLMoE's experts have the width of intermediate_size "
                             f"(expert_d_ff {config.expert_d_ff} != d_ff {config.d_ff})")
        return hf | {"clip_qkv": config.clip_qkv}
    hf.update(moe_intermediate_size=config.resolved_expert_d_ff, decoder_sparse_step=1,
              mlp_only_layers=list(config.dense_layers))
    if family == "qwen3_moe":
        hf["num_local_experts"] = config.num_experts
    if family == "qwen2_moe":
        hf.update(shared_expert_intermediate_size=config.shared_d_ff, qkv_bias=True)
    return hf


def expert_weight_map(config: TransformerConfig, layer: int, hf_names: set[str]) -> dict:
    """Our flat names of layer `layer`'s MoE parameters -> (HF tensor name or names,
    transform), in the layout `hf_names` holds (per expert, or fused); with no names (an
    export), in the layout of the family `config` is."""
    ours, theirs = f"layers.{layer}.mlp.", f"model.layers.{layer}."
    mixtral = any(".block_sparse_moe." in name for name in hf_names) if hf_names \
        else moe_model_type(config) == "mixtral"
    block = theirs + ("block_sparse_moe." if mixtral else "mlp.")
    mapping = {ours + "router.kernel": (block + "gate.weight", "T")}
    fused = block + "experts.gate_up_proj"
    if fused in hf_names:
        mapping[ours + "gate_kernel"] = (fused, ("fused_experts", 0, 2))
        mapping[ours + "up_kernel"] = (fused, ("fused_experts", 1, 2))
        mapping[ours + "down_kernel"] = (block + "experts.down_proj", ("fused_experts", 0, 1))
    else:
        names = {"gate_kernel": "w1", "up_kernel": "w3", "down_kernel": "w2"} if mixtral \
            else {"gate_kernel": "gate_proj", "up_kernel": "up_proj",
                  "down_kernel": "down_proj"}
        for kernel, name in names.items():
            mapping[ours + kernel] = (tuple(f"{block}experts.{e}.{name}.weight"
                                            for e in range(config.num_experts)), "experts")
    if config.router_bias:  # DeepSeek-V3's correction bias, a buffer of the gate
        mapping[ours + "router_bias"] = (block + "gate.e_score_correction_bias", "id")
    if config.shared_d_ff:
        # Qwen2-MoE's one gated shared expert, DeepSeek's shared experts as one MLP.
        shared = "shared_expert" if config.shared_expert_gate else "shared_experts"
        for name in ("gate_proj", "up_proj", "down_proj"):
            mapping[ours + f"shared.{name}.kernel"] = (block + f"{shared}.{name}.weight", "T")
        if config.shared_expert_gate:
            mapping[ours + "shared_gate.kernel"] = (block + "shared_expert_gate.weight", "T")
    return mapping


def experts_to_ours(read, names: tuple[str, ...], transform, shape_EIO: tuple | None = None
                    ) -> np.ndarray:
    """Our stacked kernel [E, in, out] from per-expert HF Linear weights [out, in]
    ("experts"), or from one fused [E, parts x out, in] tensor (("fused_experts", i, n)):
    its i-th block of rows. `read(name)` reads a tensor; with our shape `shape_EIO` each
    is checked, in the file's layout, before it is used (`TensorShapeError`)."""
    if transform == "experts":
        expected = None if shape_EIO is None else (shape_EIO[2], shape_EIO[1])
        arrays = []
        for name in names:
            array = np.asarray(read(name))
            if expected is not None and tuple(array.shape) != expected:
                raise TensorShapeError(name, tuple(array.shape), expected)
            arrays.append(array.T)
        return np.stack(arrays)
    _, index, parts = transform
    (name,) = names
    fused = read(name)
    if shape_EIO is not None:
        experts, inputs, outputs = shape_EIO
        expected = (experts, parts * outputs, inputs)
        if tuple(fused.shape) != expected:
            raise TensorShapeError(name, tuple(fused.shape), expected)
    rows = fused.shape[1] // parts
    return np.ascontiguousarray(np.swapaxes(fused[:, index * rows:(index + 1) * rows], 1, 2))


def experts_to_hf(kernel_EIO: np.ndarray, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The per-expert HF tensors [out, in] of our stacked kernel [E, in, out]."""
    return {name: np.ascontiguousarray(kernel_EIO[e].T) for e, name in enumerate(names)}
