"""Hugging Face checkpoints: load Llama, Mistral, Qwen2/Qwen3, Gemma 1/2, GPT-2, the
mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE, and DeepSeek-V2/V3 into
`specjax_models.Transformer`, export our models back, and load their tokenizers (the
config translation is `specjax_models.hf_config`).

Colab path (the download needs network; nothing here does):

    from huggingface_hub import snapshot_download
    import jax, specjax, specjax_models
    target = specjax_models.from_pretrained(snapshot_download("Qwen/Qwen2.5-1.5B-Instruct"))
    draft = specjax_models.from_pretrained(snapshot_download("Qwen/Qwen2.5-0.5B-Instruct"))
    tok = specjax_models.load_tokenizer(snapshot_download("Qwen/Qwen2.5-0.5B-Instruct"))
    ids = tok.apply_chat_template([{"role": "user", "content": "Write a haiku."}])
    out = specjax.speculative_generate(target, draft, [ids], max_new_tokens=128,
                                       num_draft_tokens=4, sampling=specjax.GREEDY,
                                       eos_id=tok.eos_id)
    print(tok.decode(out.tokens[0, : out.lengths[0]].tolist()))

Weights are read through safetensors' numpy interface (memory-mapped) one tensor at a
time and converted straight into the model's parameters, so loading holds at most one
extra tensor besides the result, and needs no PyTorch. bfloat16 checkpoints stay
bfloat16 unless `dtype` says otherwise. A model type or option we do not implement is an
error that names it, never a silently different model.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

import specjax
from specjax.runtime.files import read_json
from specjax_models.hf_config import (  # noqa: F401  (re-exported)
    SUPPORTED_MODEL_TYPES,
    config_from_hf,
    config_to_hf,
    model_type_of,
    rope_from_hf,
)
from specjax_models.hf_deepseek import attention_weight_map, interleaved_rope, rope_columns_to_ours
from specjax_models.hf_moe import expert_weight_map, experts_to_hf, experts_to_ours
from specjax_models.model_cache import cached_model
from specjax_models.params import TensorShapeError
from specjax_models.safetensors_layout import checkpoint_files
from specjax_models.sharded import loading_placement, shard
from specjax_models.transformer import (
    ParamFiller,
    Transformer,
    TransformerConfig,
    abstract_transformer,
    dtype_name,
    per_layer_params,
)

# A MiMo checkpoint's multi-token-prediction modules: its drafter, read by
# specjax_models.load_drafter, not part of the target.
MTP_PREFIX = "model.mtp_layers."
# Buffers, not weights: GPT-2's causal-mask buffers (`h.N.attn.bias`), old rotary caches.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


# ---------------------------------------------------------------- weight names

def _weight_map(config: TransformerConfig, hf_names: set[str],
                hf_config: dict | None = None) -> dict[str, tuple]:
    """Our flat parameter name -> (HF tensor name, transform). Transforms: "T" (HF Linear
    [out, in] -> our kernel [in, out]), "id", or ("part", i, n): the i-th of n equal
    column blocks of a fused GPT-2 c_attn; an expert stack maps to a tuple of names
    ("experts") or one fused tensor (("fused_experts", i, n), `specjax_models.hf_moe`)."""
    mapping = {}
    if model_type_of(config) == "gpt2":
        prefix = "transformer." if any(n.startswith("transformer.") for n in hf_names) else ""
        mapping["embed.embedding"] = (prefix + "wte.weight", "id")
        mapping["position_embed.embedding"] = (prefix + "wpe.weight", "id")
        mapping["final_norm.weight"] = (prefix + "ln_f.weight", "id")
        mapping["final_norm.bias"] = (prefix + "ln_f.bias", "id")
        for i in range(config.num_layers):
            h, o = f"{prefix}h.{i}.", f"layers.{i}."
            for ours, theirs in (("input_norm", "ln_1"), ("post_attention_norm", "ln_2")):
                mapping[o + ours + ".weight"] = (h + theirs + ".weight", "id")
                mapping[o + ours + ".bias"] = (h + theirs + ".bias", "id")
            for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
                mapping[o + f"attention.{name}.kernel"] = (h + "attn.c_attn.weight",
                                                           ("part", j, 3))
                mapping[o + f"attention.{name}.bias"] = (h + "attn.c_attn.bias", ("part", j, 3))
            mapping[o + "attention.o_proj.kernel"] = (h + "attn.c_proj.weight", "id")
            mapping[o + "attention.o_proj.bias"] = (h + "attn.c_proj.bias", "id")
            mapping[o + "mlp.up_proj.kernel"] = (h + "mlp.c_fc.weight", "id")
            mapping[o + "mlp.up_proj.bias"] = (h + "mlp.c_fc.bias", "id")
            mapping[o + "mlp.down_proj.kernel"] = (h + "mlp.c_proj.weight", "id")
            mapping[o + "mlp.down_proj.bias"] = (h + "mlp.c_proj.bias", "id")
        if not config.tie_embeddings:
            mapping["lm_head.kernel"] = ("lm_head.weight", "T")
        return mapping
    mapping["embed.embedding"] = ("model.embed_tokens.weight", "id")
    mapping["final_norm.weight"] = ("model.norm.weight", "id")
    if not config.tie_embeddings:
        mapping["lm_head.kernel"] = ("lm_head.weight", "T")
    for i in range(config.num_layers):
        mapping.update(layer_weight_map(config, i, hf_names, hf_config))
    return mapping


def layer_weight_map(config: TransformerConfig, layer: int, hf_names: set[str],
                     hf_config: dict | None = None) -> dict[str, tuple]:
    """`_weight_map`'s entries of decoder layer `layer` (`layers.{layer}.*` ->
    `model.layers.{layer}.*`) of a Llama-layout family; `layer` may lie past the model's
    layers (DeepSeek's MTP block, `specjax_models.mtp`)."""
    norms = {"input_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm"}
    if config.sandwich_norm:
        norms = {"input_norm": "input_layernorm", "attn_out_norm": "post_attention_layernorm",
                 "post_attention_norm": "pre_feedforward_layernorm",
                 "mlp_out_norm": "post_feedforward_layernorm"}
    mapping = {}
    h, o = f"model.layers.{layer}.", f"layers.{layer}."
    for ours, theirs in norms.items():
        mapping[o + ours + ".weight"] = (h + theirs + ".weight", "id")
    if config.kv_lora_rank:
        mapping.update(attention_weight_map(config, layer, interleaved_rope(hf_config or {})))
    for name in () if config.kv_lora_rank else ("q_proj", "k_proj", "v_proj", "o_proj"):
        mapping[o + f"attention.{name}.kernel"] = (h + f"self_attn.{name}.weight", "T")
        mapping[o + f"attention.{name}.bias"] = (h + f"self_attn.{name}.bias", "id")
    for name in ("q_norm", "k_norm"):
        mapping[o + f"attention.{name}.weight"] = (h + f"self_attn.{name}.weight", "id")
    if config.layer_is_moe(layer):
        mapping.update(expert_weight_map(config, layer, hf_names))
        return mapping
    for name in ("gate_proj", "up_proj", "down_proj"):
        mapping[o + f"mlp.{name}.kernel"] = (h + f"mlp.{name}.weight", "T")
        mapping[o + f"mlp.{name}.bias"] = (h + f"mlp.{name}.bias", "id")
    return mapping


def to_ours(read, hf_names: tuple[str, ...], transform, shape: tuple | None = None
            ) -> np.ndarray:
    """Our parameter from its HF tensors (`read(name)` reads one), by `_weight_map`'s
    transform; `shape`: ours, which a stack of experts is checked against tensor by
    tensor (`ExpertShapeError` names the one that differs, in the file's layout)."""
    if transform == "experts" or transform[0] == "fused_experts":
        return experts_to_ours(read, hf_names, transform, shape)
    array = read(hf_names[0])
    if shape is not None and transform in ("T", "id"):  # checked in the file's layout
        expected = tuple(shape)[::-1] if transform == "T" else tuple(shape)
        if tuple(array.shape) != expected:
            raise TensorShapeError(hf_names[0], tuple(array.shape), expected)
    if transform == "T":
        return array.T
    if transform == "id":
        return array
    if transform[0] in ("rope_columns", "rope_bias"):
        return rope_columns_to_ours(array, transform)
    _, index, parts = transform
    width = array.shape[-1] // parts
    return array[..., index * width:(index + 1) * width]


# ---------------------------------------------------------------- loading

def has_mtp_module(path: Path) -> bool:
    """Does the checkpoint in `path` carry an MTP module: MiMo's `model.mtp_layers.*`, or
    the `model.layers.{num_hidden_layers}.*` its config.json declares
    (`num_nextn_predict_layers`, DeepSeek-V3)?"""
    names = checkpoint_files(path)
    hf_config = read_json(path / "config.json", "download it again") \
        if (path / "config.json").exists() else {}
    prefixes = [MTP_PREFIX]
    if hf_config.get("num_nextn_predict_layers") and \
            isinstance(hf_config.get("num_hidden_layers"), int):
        prefixes.append(f"model.layers.{hf_config['num_hidden_layers']}.")
    return any(name.startswith(tuple(prefixes)) for name in names)


def from_pretrained(path: str | Path, dtype=None, scan_layers: bool = False, *,
                    cache: bool | None = None, mtp: bool = False, mesh=None, rules=None):
    """Load a local Hugging Face checkpoint directory as a `specjax.CausalLM`; with
    `mtp=True`, `(target, drafter)`: the target and the multi-token-prediction module its
    checkpoint carries (MiMo's `model.mtp_layers`, DeepSeek-V3's `model.layers.{L}`, read
    by `specjax_models.load_drafter`; see `specjax_models.mtp`).

    Args:
      path: a directory with config.json and model.safetensors (or sharded safetensors
        with model.safetensors.index.json), e.g. from `huggingface_hub.snapshot_download`.
      dtype: "float32", "bfloat16" or "float16" (or jnp.float32, jnp.bfloat16, ...) for
        parameters and compute; default: the
        checkpoint's own dtype (bfloat16 stays bfloat16).
      scan_layers: scan over stacked layers (compile time independent of depth; see
        `TransformerConfig.scan_layers` for its cost on CPU).
      cache: keep the converted weights in the per-user model cache
        (`specjax_models.model_cache`). Default: only where loading converts (a sharded
        checkpoint, or a dtype other than the checkpoint's), unless `$SPECJAX_MODEL_CACHE`
        is off; True or False decide for any checkpoint.
      mtp: also return the checkpoint's MTP drafter (refused when it has none).
      mesh, rules: a `jax.sharding.Mesh` to place the target on by `specjax.sharding`
        rules (default: the preset its axis names ask for); each tensor goes straight to
        its shards as it is read (see `specjax_models.shard`). The MTP drafter's own
        weights are not placed (replicated); the embedding it shares with the target keeps
        the target's placement.
    """
    if mtp:  # refused before the target is read, not after
        from specjax_models.published_drafters import load_drafter

        if not has_mtp_module(Path(path)):
            layers = (read_json(Path(path) / "config.json", "download it again").get(
                "num_hidden_layers") if (Path(path) / "config.json").exists() else None)
            deepseek = f"model.layers.{layers if isinstance(layers, int) else 'L'}.*"
            raise ValueError(f"{path} carries no multi-token-prediction module "
                             f"({MTP_PREFIX}* tensors, or DeepSeek's {deepseek} after its "
                             "num_hidden_layers layers); load it without mtp=True")
        target = from_pretrained(path, dtype, scan_layers, cache=cache, mesh=mesh,
                                 rules=rules)
        return target, load_drafter(path, target)
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} has no config.json: pass a Hugging Face model "
                                "directory (e.g. from huggingface_hub.snapshot_download)")
    hf_config = read_json(path / "config.json", "download it again")
    config_from_hf(hf_config, dtype)  # refuses what it cannot build before anything else
    file_of = checkpoint_files(path)  # every file's header checked against its size
    shards = sorted(set(file_of.values()))
    converts = len(shards) > 1 or (dtype is not None and
                                   dtype_name(dtype) != hf_config.get("torch_dtype"))
    if cache is None and not converts:
        cache = False
    options = {"dtype": "default" if dtype is None else dtype_name(dtype)}
    sources = [path / "config.json", *(path / name for name in shards)]
    rules, placement = loading_placement(mesh, rules)
    lm = cached_model("hf", sources, options,
                      lambda layers, where: _convert_pretrained(path, hf_config, file_of,
                                                                dtype, layers, where),
                      scan_layers, cache, placement)
    return lm if mesh is None else shard(lm, mesh, rules)


def _convert_pretrained(path: Path, hf_config: dict, file_of: dict, dtype, scan_layers: bool,
                        placement=None):
    """`(CausalLM, TransformerConfig)` read from the checkpoint's safetensors files."""
    config = dataclasses.replace(config_from_hf(hf_config, dtype),
                                 scan_layers=bool(scan_layers))
    available = set(file_of)
    abstract = abstract_transformer(config)
    graphdef, abstract_params = nnx.split(abstract, nnx.Param)
    filler = ParamFiller(abstract_params, config.storage_dtype,
                         placement and placement.for_model(config))
    mapping = _weight_map(config, available, hf_config)
    # Plan first, then read file by file: each shard's memory map is closed as soon as its
    # tensors are converted, so the peak is the parameters plus about one shard. (A stack
    # of experts whose tensors span shards opens the others for the stack's own reads.)
    plan: dict[str, list] = {}
    for name, _ in filler.targets():
        hf_names = mapping.get(name, ((name,), None))[0]
        hf_names = hf_names if isinstance(hf_names, tuple) else (hf_names,)
        lacking = [n for n in hf_names if n not in available]
        if name not in mapping or lacking:
            raise ValueError(f"the checkpoint {path} lacks {lacking[0]!r} (needed for "
                             f"{name}); it does not match its config.json "
                             f"({model_type_of(config)})")
        plan.setdefault(file_of[hf_names[0]], []).append((name, hf_names, mapping[name][1]))
    from safetensors import safe_open

    used = set()
    for file_name, items in sorted(plan.items()):
        with safe_open(path / file_name, framework="numpy") as handle:
            def read(hf_name, handle=handle, file_name=file_name):
                if file_of[hf_name] == file_name:
                    return handle.get_tensor(hf_name)
                with safe_open(path / file_of[hf_name], framework="numpy") as other:
                    return other.get_tensor(hf_name)

            for name, hf_names, transform in items:
                try:
                    array = to_ours(read, hf_names, transform, filler.shape_of(name))
                    filler.set(name, array)
                except TensorShapeError as error:  # names its own tensor (its shard may differ)
                    raise ValueError(f"{path / file_of[error.tensor]}: {error}") from None
                except ValueError as error:
                    raise ValueError(f"{path / file_name}: tensor {hf_names[0]}: "
                                     f"{error}") from None
                used.update(hf_names)
                del array
    mtp_layers = {f"model.layers.{config.num_layers + i}."
                  for i in range(hf_config.get("num_nextn_predict_layers") or 0)}
    unused = sorted(n for n in available - used if not n.endswith(_IGNORED_SUFFIXES)
                    and not n.startswith(MTP_PREFIX)
                    and not any(n.startswith(layer) for layer in mtp_layers)
                    and not (config.tie_embeddings and n == "lm_head.weight"))
    if unused:
        raise ValueError(f"the checkpoint {path} has weights this architecture does not use: "
                         f"{unused[:5]}{' ...' if len(unused) > 5 else ''}; an option of "
                         "its config.json is not supported")
    return specjax.CausalLM.from_nnx(nnx.merge(graphdef, filler.state())), config


def save_pretrained(model, path: str | Path, dtype=None) -> Path:
    """Write `model` (a specjax_models.Transformer, or a CausalLM from `from_nnx`) as a directory
    transformers loads with `AutoModelForCausalLM.from_pretrained` (config.json +
    model.safetensors)."""
    from safetensors.numpy import save_file

    if isinstance(model, specjax.CausalLM):
        graphdef = getattr(model.apply_fn, "graphdef", None)
        if graphdef is None:
            raise TypeError("save_pretrained needs a CausalLM built by CausalLM.from_nnx")
        model = nnx.merge(graphdef, model.params)
    if not isinstance(model, Transformer):
        raise TypeError(f"save_pretrained expects a specjax_models.Transformer, got {type(model)}")
    config = model.config
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf_config = config_to_hf(config)
    if dtype is not None:
        hf_config["torch_dtype"] = dtype_name(dtype)
    target_dtype = {"float32": np.float32, "float16": np.float16,
                    "bfloat16": jnp.bfloat16}[hf_config["torch_dtype"]]
    params = per_layer_params({".".join(str(p) for p in k): v.get_value() for k, v in
                               nnx.to_flat_state(nnx.state(model, nnx.Param))})
    mapping = _weight_map(config, set())
    tensors: dict[str, np.ndarray] = {}
    fused: dict[str, list] = {}
    for name, (hf_name, transform) in mapping.items():
        if name not in params:
            continue
        array = np.asarray(params[name])
        if transform == "experts":
            tensors.update(experts_to_hf(array, hf_name))
        elif transform == "T":
            tensors[hf_name] = np.ascontiguousarray(array.T)
        elif transform == "id":
            tensors[hf_name] = np.ascontiguousarray(array)
        else:
            fused.setdefault(hf_name, [None] * transform[2])[transform[1]] = array
    for hf_name, parts in fused.items():
        tensors[hf_name] = np.ascontiguousarray(np.concatenate(parts, axis=-1))
    tensors = {k: v.astype(target_dtype) for k, v in tensors.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(hf_config, indent=1) + "\n")
    return path


# The tokenizer lives in its own module; imported here for `specjax_models.hf` users.
from specjax_models.hf_tokenizer import HFTokenizer, load_tokenizer  # noqa: E402, F401
