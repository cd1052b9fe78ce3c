"""Random-weight drafter checkpoints written in the published layouts `load_drafter` reads.

For tests and benchmarks (no hub here): each writer follows the key names, shapes
([out, in], as PyTorch's nn.Linear stores them) and config fields of the authors' code,
cited per layout, so that a loader that reads these reads the downloads too.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from specjax.drafters import eagle3_feature_layers


@dataclasses.dataclass(frozen=True, kw_only=True)
class SyntheticShape:
    """The target's shape (width, vocabulary, depth) and the drafter's own block."""

    d_model: int
    vocab_size: int
    num_layers: int
    num_heads: int = 2
    num_kv_heads: int = 1
    d_ff: int | None = None
    draft_vocab_size: int | None = None  # EAGLE-3: None = the target's vocabulary
    medusa_heads: int = 3
    medusa_layers: int = 1
    rope_theta: float = 10_000.0


def write_synthetic_drafter(directory: str | Path, layout: str, shape: SyntheticShape, *,
                            seed: int = 0, scale: float = 0.02, dtype=np.float32,
                            norm_before_residual: bool = False, norm_before_fc: bool = False,
                            fc_norm: bool = False, norm_output: bool = False) -> Path:
    """Write config.json and model.safetensors of `layout` ("eagle3", "eagle3-speculators",
    "eagle1", "medusa1" or "mimo-mtp") with weights drawn N(0, scale) (norms near 1)
    into `directory`; returns it. The speculators layout's switches (`norm_before_residual`,
    `norm_before_fc`, `fc_norm`, `norm_output`) are written as asked."""
    from safetensors.numpy import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    d, v = shape.d_model, shape.vocab_size
    hd = d // shape.num_heads
    d_ff = shape.d_ff or 2 * d

    def dense(out, inp):
        return (scale * rng.standard_normal((out, inp))).astype(dtype)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)

    def layer(prefix: str, width_in: int, input_norm: bool, bias: bool = False) -> dict:
        # Llama decoder layer names (transformers' LlamaDecoderLayer, as the EAGLE code and
        # speculators reuse them).
        tensors = {
            f"{prefix}self_attn.q_proj.weight": dense(shape.num_heads * hd, width_in),
            f"{prefix}self_attn.k_proj.weight": dense(shape.num_kv_heads * hd, width_in),
            f"{prefix}self_attn.v_proj.weight": dense(shape.num_kv_heads * hd, width_in),
            f"{prefix}self_attn.o_proj.weight": dense(d, shape.num_heads * hd),
            f"{prefix}mlp.gate_proj.weight": dense(d_ff, d),
            f"{prefix}mlp.up_proj.weight": dense(d_ff, d),
            f"{prefix}mlp.down_proj.weight": dense(d, d_ff),
            f"{prefix}post_attention_layernorm.weight": norm(),
        }
        if input_norm:
            tensors[f"{prefix}input_layernorm.weight"] = norm()
        if bias:  # Qwen2 blocks: q/k/v biases
            for name in ("q", "k", "v"):
                out = tensors[f"{prefix}self_attn.{name}_proj.weight"].shape[0]
                tensors[f"{prefix}self_attn.{name}_proj.bias"] = \
                    (scale * rng.standard_normal(out)).astype(dtype)
        return tensors

    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": d,
             "num_attention_heads": shape.num_heads, "num_key_value_heads": shape.num_kv_heads,
             "intermediate_size": d_ff, "num_hidden_layers": 1, "rms_norm_eps": 1e-5,
             "rope_theta": shape.rope_theta, "vocab_size": v, "hidden_act": "silu",
             "torch_dtype": np.dtype(dtype).name}
    if layout in ("eagle3", "eagle3-speculators"):
        # SafeAILab/EAGLE eagle/model/cnets.py: Model.fc (3D -> D, no bias), midlayer
        # (LlamaDecoderLayeremb: hidden_norm, input_layernorm over the embedding, q/k/v
        # over 2D), norm, lm_head over draft_vocab_size, buffers d2t and t2d.
        # vllm-project/speculators models/eagle3/core.py keeps the names with the layer
        # at layers.0 (convert/eagle/eagle3_converter.py: "midlayer." -> "layers.0.").
        prefix = "midlayer." if layout == "eagle3" else "layers.0."
        size = shape.draft_vocab_size or v
        tensors = layer(prefix, 2 * d, input_norm=True)
        tensors[prefix + "hidden_norm.weight"] = norm()
        fused = len(eagle3_feature_layers(shape.num_layers))
        tensors["fc.weight"] = dense(d, fused * d)
        tensors["norm.weight"] = norm()
        tensors["lm_head.weight"] = dense(size, d)
        ids = np.sort(rng.choice(v, size, replace=False))
        tensors["d2t"] = (ids - np.arange(size)).astype(np.int64)
        t2d = np.zeros(v, bool)
        t2d[ids] = True
        tensors["t2d"] = t2d
        if layout == "eagle3":
            config = {**llama, "architectures": ["LlamaForCausalLMEagle3"],
                      "draft_vocab_size": size}
        else:
            tensors["verifier_norm.weight"] = norm()  # speculators' frozen training copy
            # speculators models/eagle3/core.py: input_norm (norm_before_fc) over the
            # concatenated layers, or fc_norm.{i} per layer.
            if norm_before_fc:
                tensors["input_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(
                    fused * d)).astype(dtype)
            if fc_norm:
                for i in range(fused):
                    tensors[f"fc_norm.{i}.weight"] = norm()
            config = {"speculators_model_type": "eagle3",
                      "architectures": ["Eagle3Speculator"],
                      "transformer_layer_config": llama, "draft_vocab_size": size,
                      "norm_before_residual": norm_before_residual,
                      "norm_before_fc": norm_before_fc, "fc_norm": fc_norm,
                      "norm_output": norm_output,
                      "eagle_aux_hidden_state_layer_ids":
                          list(eagle3_feature_layers(shape.num_layers)),
                      "speculators_config": {"algorithm": "eagle3",
                                             "default_proposal_method": "greedy"}}
    elif layout == "eagle1":
        # SafeAILab/EAGLE eagle/model/cnets1.py: fc (2D -> D, bias=True) over
        # cat(embedding, feature), layers.0 without input_layernorm (index 0).
        tensors = layer("layers.0.", d, input_norm=False)
        tensors["fc.weight"] = dense(d, 2 * d)
        tensors["fc.bias"] = (scale * rng.standard_normal(d)).astype(dtype)
        config = llama
    elif layout == "medusa1":
        # FasterDecoding/Medusa medusa/model/medusa_model.py: medusa_head[i] =
        # Sequential(*[ResBlock] * medusa_num_layers, Linear(D, V, bias=False)); one
        # ResBlock object repeated, so each index holds the same weights.
        tensors = {}
        for i in range(shape.medusa_heads):
            weight, bias = dense(d, d), (scale * rng.standard_normal(d)).astype(dtype)
            for j in range(shape.medusa_layers):
                tensors[f"medusa_head.{i}.{j}.linear.weight"] = weight
                tensors[f"medusa_head.{i}.{j}.linear.bias"] = bias
            tensors[f"medusa_head.{i}.{shape.medusa_layers}.weight"] = dense(v, d)
        config = {"medusa_num_heads": shape.medusa_heads,
                  "medusa_num_layers": shape.medusa_layers,
                  "base_model_name_or_path": "synthetic"}
    elif layout == "mimo-mtp":
        # Xiaomi's MiMo-7B: model.mtp_layers.{i}.* inside the target checkpoint (vLLM
        # mimo_mtp.py: token_layernorm, hidden_layernorm, input_proj (2D -> D, no bias)
        # over cat(hidden, embedding), a Qwen2DecoderLayer, final_layernorm). Only the
        # MTP module is written here; a test adds it to a whole target checkpoint.
        prefix = "model.mtp_layers.0."
        tensors = layer(prefix, d, input_norm=True, bias=True)
        for name in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
            tensors[f"{prefix}{name}.weight"] = norm()
        tensors[prefix + "input_proj.weight"] = dense(d, 2 * d)
        config = {**llama, "model_type": "mimo", "architectures": ["MiMoForCausalLM"],
                  "num_hidden_layers": shape.num_layers, "num_nextn_predict_layers": 1}
    else:
        raise ValueError(f"layout must be eagle3, eagle3-speculators, eagle1, medusa1 or "
                         f"mimo-mtp, got {layout!r}")
    save_file({name: np.ascontiguousarray(value) for name, value in tensors.items()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def add_deepseek_mtp_module(directory: str | Path, *, seed: int = 0, scale: float = 0.02,
                            own_copies: bool = True) -> Path:
    """Add a random first MTP module to the DeepSeek-V3-layout checkpoint in `directory`
    (config.json and safetensors, as transformers or DeepSeek write them): the tensors
    `model.layers.{L}.*` (L = num_hidden_layers) of the published checkpoints (DeepSeek-V3's
    model.safetensors.index.json; vLLM deepseek_mtp.py reads them): enorm, hnorm, eh_proj
    [D, 2D], shared_head.norm, with `own_copies` embed_tokens and shared_head.head (the
    module's copies of the target's, here random like the rest), and a decoder layer with
    the names and shapes of the checkpoint's last layer (latent attention and experts).
    Sets num_nextn_predict_layers = 1. Weights N(0, scale), norms near 1, a routing
    correction bias N(0, 0.3). Returns `directory`."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    layers, d, v = config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    files = sorted(set(index["weight_map"].values())) if index else ["model.safetensors"]
    template = f"model.layers.{layers - 1}."
    rng = np.random.default_rng(seed)
    tensors = {}
    for name in files:
        with safe_open(directory / name, framework="numpy") as handle:
            for key in handle.keys():
                if not key.startswith(template):
                    continue
                like = handle.get_tensor(key)
                new = f"model.layers.{layers}." + key[len(template):]
                if key.endswith("norm.weight"):
                    value = 1.0 + 0.1 * rng.standard_normal(like.shape)
                elif key.endswith("e_score_correction_bias"):
                    value = 0.3 * rng.standard_normal(like.shape)
                else:
                    value = scale * rng.standard_normal(like.shape)
                tensors[new] = value.astype(like.dtype)
    if not tensors:
        raise ValueError(f"{directory}: no {template}* tensors to take the block's layout from")
    dtype = next(iter(tensors.values())).dtype
    prefix = f"model.layers.{layers}."
    for name in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"{prefix}{name}.weight"] = (1.0 + 0.1 * rng.standard_normal(d)).astype(dtype)
    tensors[prefix + "eh_proj.weight"] = (scale * rng.standard_normal((d, 2 * d))).astype(dtype)
    if own_copies:
        for name in ("embed_tokens.weight", "shared_head.head.weight"):
            tensors[prefix + name] = (scale * rng.standard_normal((v, d))).astype(dtype)
    if index is None:
        save_file({**load_file(str(directory / "model.safetensors")), **tensors},
                  str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:  # a shard of its own, named in the index
        save_file(tensors, str(directory / "model-mtp.safetensors"), metadata={"format": "pt"})
        index["weight_map"].update({name: "model-mtp.safetensors" for name in tensors})
        index_path.write_text(json.dumps(index, indent=1))
    config["num_nextn_predict_layers"] = 1
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory
