"""Hugging Face checkpoints: load Llama, Mistral, Qwen2/Qwen3, Gemma 1/2 and GPT-2 into
`specjax_models.Transformer`, export our models back, and load their tokenizers.

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
from specjax.files import read_json
from specjax_models.model_cache import cached_model
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

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gpt2",
                         "mimo")
# A MiMo checkpoint's multi-token-prediction modules: its drafter, read by
# specjax_models.load_drafter, not part of the target.
MTP_PREFIX = "model.mtp_layers."
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
# Buffers, not weights: GPT-2's causal-mask buffers (`h.N.attn.bias`), old rotary caches.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


# ---------------------------------------------------------------- configs

def rope_from_hf(hf: dict) -> tuple[float, tuple | None]:
    """`(rope_theta, rope_scaling tuple or None)` of a Hugging Face config; a missing,
    null or non-numeric rope field is a ValueError that names it."""
    params, scaling = hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}
    for name, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if not isinstance(value, dict):
            raise ValueError(f"the config's {name} is {value!r}, expected an object")
    theta = _rope_number({"rope_theta": hf.get("rope_theta") or params.get("rope_theta")
                          or 10_000.0}, "rope_theta")
    spec = scaling or params
    kind = spec.get("rope_type", spec.get("type", "default")) if spec else "default"
    if kind in ("default", None):
        return theta, None
    if kind == "llama3":
        return theta, ("llama3", _rope_number(spec, "factor"),
                       _rope_number(spec, "low_freq_factor"),
                       _rope_number(spec, "high_freq_factor"),
                       int(_rope_number(spec, "original_max_position_embeddings")))
    if kind == "linear":
        return theta, ("linear", _rope_number(spec, "factor"))
    raise ValueError(f"rope scaling type {kind!r} is not supported (supported: default, "
                     "llama3, linear)")


def _rope_number(spec: dict, name: str) -> float:
    """spec[name] as a float, or a ValueError naming the rope field that is missing or not
    a number."""
    value = spec.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        said = "missing" if value is None else f"{value!r}, not a number"
        raise ValueError(f"the config's rope settings: {name} is {said}")
    return float(value)


def _sliding_layers(hf: dict, num_layers: int) -> str:
    types = hf.get("layer_types")
    if not types:
        return "even" if hf["model_type"] == "gemma2" else "all"
    sliding = [t == "sliding_attention" for t in types]
    if not any(sliding):
        return "none"
    if all(sliding):
        return "all"
    if sliding == [i % 2 == 0 for i in range(num_layers)]:
        return "even"
    raise ValueError(f"layer_types {types} is a sliding-window pattern we do not implement "
                     "(supported: all, none, or every even layer)")


def config_from_hf(hf: dict, dtype=None) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face config.json dict."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    stored = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    dtype = dtype_name(dtype) if dtype is not None else _TORCH_DTYPES.get(stored, "float32")
    if model_type == "gpt2":
        for key, expected in (("scale_attn_weights", True),
                              ("scale_attn_by_inverse_layer_idx", False)):
            if hf.get(key, expected) != expected:
                raise ValueError(f"GPT-2 option {key}={hf[key]} is not supported")
        activation = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                      "gelu": "gelu"}.get(hf.get("activation_function", "gelu_new"))
        if activation is None:
            raise ValueError(f"GPT-2 activation_function {hf['activation_function']!r} is "
                             "not supported")
        d_model = hf["n_embd"]
        return TransformerConfig(
            vocab_size=hf["vocab_size"], num_layers=hf["n_layer"], d_model=d_model,
            num_heads=hf["n_head"], num_kv_heads=hf["n_head"],
            d_ff=hf.get("n_inner") or 4 * d_model, max_seq_len=hf["n_positions"],
            rms_norm_eps=hf.get("layer_norm_epsilon", 1e-5), qkv_bias=True,
            attn_out_bias=True, mlp_bias=True, norm_type="layer", gated_mlp=False,
            activation=activation, position_embedding="learned",
            tie_embeddings=hf.get("tie_word_embeddings", True), dtype=dtype,
            param_dtype=dtype)

    heads = hf["num_attention_heads"]
    act = hf.get("hidden_activation") or hf.get("hidden_act", "silu")
    if model_type in ("gemma", "gemma2"):
        act = hf.get("hidden_activation") or "gelu_pytorch_tanh"
    activation = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_new": "gelu_tanh", "gelu": "gelu"}.get(act)
    if activation is None:
        raise ValueError(f"hidden activation {act!r} is not supported")
    if hf.get("use_sliding_window"):
        raise ValueError(f"{model_type} with use_sliding_window=true is not supported")
    theta, rope_scaling = rope_from_hf(hf)
    attention_bias = bool(hf.get("attention_bias", False))
    fields = dict(
        vocab_size=hf["vocab_size"], num_layers=hf["num_hidden_layers"],
        d_model=hf["hidden_size"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads, d_ff=hf["intermediate_size"],
        max_seq_len=hf.get("max_position_embeddings", 4096), head_dim=hf.get("head_dim"),
        rope_theta=theta, rope_scaling=rope_scaling, rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_embeddings=hf.get("tie_word_embeddings", model_type in ("gemma", "gemma2")),
        activation=activation, mlp_bias=bool(hf.get("mlp_bias", False)), dtype=dtype,
        param_dtype=dtype)
    if model_type in ("llama", "mistral"):
        fields.update(qkv_bias=attention_bias, attn_out_bias=attention_bias)
    if model_type == "mistral" and hf.get("sliding_window"):
        fields.update(sliding_window=int(hf["sliding_window"]), sliding_layers="all")
    if model_type in ("qwen2", "mimo"):  # MiMo: Qwen2 blocks (plus MTP modules)
        fields.update(qkv_bias=True)
    if model_type == "qwen3":
        fields.update(qk_norm=True, qkv_bias=attention_bias, attn_out_bias=attention_bias)
    if model_type in ("gemma", "gemma2"):
        fields.update(norm_weight_offset=True, embed_scale=True)
    if model_type == "gemma2":
        fields.update(
            sandwich_norm=True, query_scale=float(hf.get("query_pre_attn_scalar", 256)) ** -0.5,
            attn_logit_softcap=hf.get("attn_logit_softcapping"),
            final_logit_softcap=hf.get("final_logit_softcapping"),
            sliding_window=hf.get("sliding_window"),
            sliding_layers=_sliding_layers(hf, hf["num_hidden_layers"]))
    return TransformerConfig(**fields)


def model_type_of(config: TransformerConfig) -> str:
    """The transformers model_type that computes exactly what `config` computes."""
    if config.position_embedding == "learned":
        return "gpt2"
    if config.sandwich_norm:
        return "gemma2"
    if config.norm_weight_offset:
        return "gemma"
    if config.qk_norm:
        return "qwen3"
    if config.qkv_bias and not config.attn_out_bias:
        return "qwen2"
    if config.sliding_window is not None and config.sliding_layers == "all":
        return "mistral"
    return "llama"


def config_to_hf(config: TransformerConfig) -> dict:
    """A config.json dict transformers loads into the same architecture."""
    if config.input_vocab_size not in (None, config.vocab_size):
        raise ValueError(f"transformers has no model whose embedding ({config.input_vocab_size} "
                         f"rows) and LM head ({config.vocab_size} rows) differ: a "
                         "reduced-vocabulary draft is saved with save_checkpoint, not as a "
                         "transformers checkpoint")
    model_type = model_type_of(config)
    if model_type == "gpt2":
        return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                "vocab_size": config.vocab_size, "n_layer": config.num_layers,
                "n_embd": config.d_model, "n_head": config.num_heads, "n_inner": config.d_ff,
                "n_positions": config.max_seq_len, "layer_norm_epsilon": config.rms_norm_eps,
                "activation_function": "gelu_new" if config.activation == "gelu_tanh"
                else "gelu", "tie_word_embeddings": config.tie_embeddings,
                "torch_dtype": config.param_dtype}
    architectures = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                     "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                     "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM"}
    hf = {"model_type": model_type, "architectures": [architectures[model_type]],
          "vocab_size": config.vocab_size, "num_hidden_layers": config.num_layers,
          "hidden_size": config.d_model, "num_attention_heads": config.num_heads,
          "num_key_value_heads": config.num_kv_heads, "intermediate_size": config.d_ff,
          "max_position_embeddings": config.max_seq_len,
          "head_dim": config.resolved_head_dim, "rope_theta": config.rope_theta,
          "rms_norm_eps": config.rms_norm_eps, "tie_word_embeddings": config.tie_embeddings,
          "torch_dtype": config.param_dtype, "mlp_bias": config.mlp_bias}
    activation = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}
    hf["hidden_act"] = activation[config.activation]
    if model_type in ("gemma", "gemma2"):
        hf["hidden_activation"] = activation[config.activation]
    if model_type in ("llama", "mistral", "qwen3"):
        hf["attention_bias"] = config.qkv_bias
    if config.rope_scaling is not None:
        if config.rope_scaling[0] == "linear":
            hf["rope_scaling"] = {"rope_type": "linear", "factor": config.rope_scaling[1]}
        else:
            _, factor, low, high, original = config.rope_scaling
            hf["rope_scaling"] = {"rope_type": "llama3", "factor": factor,
                                  "low_freq_factor": low, "high_freq_factor": high,
                                  "original_max_position_embeddings": original}
    if model_type == "mistral":
        hf["sliding_window"] = config.sliding_window
    if model_type == "gemma2":
        scalar = (config.query_scale or config.resolved_head_dim ** -0.5) ** -2
        hf.update(query_pre_attn_scalar=round(scalar) if abs(scalar - round(scalar)) < 1e-6
                  else scalar, attn_logit_softcapping=config.attn_logit_softcap,
                  final_logit_softcapping=config.final_logit_softcap,
                  sliding_window=config.sliding_window or config.max_seq_len,
                  layer_types=["sliding_attention" if config.layer_window(i) is not None
                               else "full_attention" for i in range(config.num_layers)])
    return hf


# ---------------------------------------------------------------- weight names

def _weight_map(config: TransformerConfig, hf_names: set[str]) -> dict[str, tuple]:
    """Our flat parameter name -> (HF tensor name, transform). Transforms: "T" (HF Linear
    [out, in] -> our kernel [in, out]), "id", or ("part", i, n): the i-th of n equal
    column blocks of a fused GPT-2 c_attn."""
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
    norms = {"input_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm"}
    if config.sandwich_norm:
        norms = {"input_norm": "input_layernorm", "attn_out_norm": "post_attention_layernorm",
                 "post_attention_norm": "pre_feedforward_layernorm",
                 "mlp_out_norm": "post_feedforward_layernorm"}
    for i in range(config.num_layers):
        h, o = f"model.layers.{i}.", f"layers.{i}."
        for ours, theirs in norms.items():
            mapping[o + ours + ".weight"] = (h + theirs + ".weight", "id")
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            mapping[o + f"attention.{name}.kernel"] = (h + f"self_attn.{name}.weight", "T")
            mapping[o + f"attention.{name}.bias"] = (h + f"self_attn.{name}.bias", "id")
        for name in ("q_norm", "k_norm"):
            mapping[o + f"attention.{name}.weight"] = (h + f"self_attn.{name}.weight", "id")
        for name in ("gate_proj", "up_proj", "down_proj"):
            mapping[o + f"mlp.{name}.kernel"] = (h + f"mlp.{name}.weight", "T")
            mapping[o + f"mlp.{name}.bias"] = (h + f"mlp.{name}.bias", "id")
    return mapping


def _to_ours(array: np.ndarray, transform) -> np.ndarray:
    if transform == "T":
        return array.T
    if transform == "id":
        return array
    _, index, parts = transform
    width = array.shape[-1] // parts
    return array[..., index * width:(index + 1) * width]


# ---------------------------------------------------------------- loading

def from_pretrained(path: str | Path, dtype=None, scan_layers: bool = False, *,
                    cache: bool | None = None, mtp: bool = False, mesh=None, rules=None):
    """Load a local Hugging Face checkpoint directory as a `specjax.CausalLM`; with
    `mtp=True`, `(target, drafter)`: the target and the multi-token-prediction module its
    checkpoint carries (MiMo's `model.mtp_layers`, read by
    `specjax_models.load_drafter`).

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

        if not any(name.startswith(MTP_PREFIX) for name in checkpoint_files(Path(path))):
            raise ValueError(f"{path} carries no multi-token-prediction module "
                             f"({MTP_PREFIX}* tensors); load it without mtp=True")
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
    mapping = _weight_map(config, available)
    # Plan first, then read file by file: each shard's memory map is closed as soon as its
    # tensors are converted, so the peak is the parameters plus about one shard.
    plan: dict[str, list] = {}
    for name, _ in filler.targets():
        if name not in mapping or mapping[name][0] not in available:
            wanted = mapping.get(name, (name,))[0]
            raise ValueError(f"the checkpoint {path} lacks {wanted!r} (needed for {name}); "
                             f"it does not match its config.json ({model_type_of(config)})")
        hf_name, transform = mapping[name]
        plan.setdefault(file_of[hf_name], []).append((name, hf_name, transform))
    from safetensors import safe_open

    used = set()
    for file_name, items in sorted(plan.items()):
        with safe_open(path / file_name, framework="numpy") as handle:
            for name, hf_name, transform in items:
                array = _to_ours(handle.get_tensor(hf_name), transform)
                try:
                    filler.set(name, array)
                except ValueError as error:
                    raise ValueError(f"{path / file_name}: tensor {hf_name}: {error}") from None
                used.add(hf_name)
                del array
    unused = sorted(n for n in available - used if not n.endswith(_IGNORED_SUFFIXES)
                    and not n.startswith(MTP_PREFIX)
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
        if transform == "T":
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
