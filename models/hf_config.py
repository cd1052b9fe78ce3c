"""Hugging Face config.json <-> `TransformerConfig`: which model types we build, and how
their fields (rope scaling, sliding windows, experts) translate, both ways."""

from __future__ import annotations

from specjax.lm.rope import yarn_mscale
from specjax_models.config import TransformerConfig, dtype_name
from specjax_models.hf_deepseek import DEEPSEEK_MODEL_TYPES, deepseek_fields
from specjax_models.hf_moe import MOE_MODEL_TYPES, moe_config_to_hf, moe_fields, moe_model_type

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gpt2",
                         "mimo", *MOE_MODEL_TYPES, *DEEPSEEK_MODEL_TYPES)
_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


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
    if kind == "yarn":
        factor = _rope_number(spec, "factor")
        attention_factor = spec.get("attention_factor")
        if attention_factor is None:  # as transformers infers it (YaRN's Eq. 21)
            mscale, mscale_all_dim = spec.get("mscale"), spec.get("mscale_all_dim")
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(
                factor, mscale_all_dim) if mscale and mscale_all_dim else yarn_mscale(factor)
        return theta, ("yarn", factor,
                       int(_rope_number(spec, "original_max_position_embeddings")),
                       float(spec.get("beta_fast") or 32), float(spec.get("beta_slow") or 1),
                       float(attention_factor), bool(spec.get("truncate", True)))
    raise ValueError(f"rope scaling type {kind!r} is not supported (supported: default, "
                     "llama3, linear, yarn)")


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


def stored_dtype(hf: dict) -> str:
    """The dtype a Hugging Face config.json says the weights are stored in ("float32",
    "bfloat16" or "float16"; float32 when it says nothing we know)."""
    return _TORCH_DTYPES.get(hf.get("torch_dtype") or hf.get("dtype") or "float32", "float32")


def config_from_hf(hf: dict, dtype=None) -> TransformerConfig:
    """A TransformerConfig from a Hugging Face config.json dict."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    dtype = dtype_name(dtype) if dtype is not None else stored_dtype(hf)
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

    family = MOE_MODEL_TYPES.get(model_type, model_type)  # the attention's family
    if model_type in DEEPSEEK_MODEL_TYPES:
        family = "llama"  # norms, biases and dense layers as Llama's; attention below
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
    if family in ("llama", "mistral", "olmoe"):
        fields.update(qkv_bias=attention_bias, attn_out_bias=attention_bias)
    if family == "mistral" and hf.get("sliding_window"):
        fields.update(sliding_window=int(hf["sliding_window"]), sliding_layers="all")
    if family in ("qwen2", "mimo"):  # MiMo: Qwen2 blocks (plus MTP modules)
        fields.update(qkv_bias=bool(hf.get("qkv_bias", True)))
    if family == "qwen3":
        fields.update(qk_norm=True, qkv_bias=attention_bias, attn_out_bias=attention_bias)
    if family == "olmoe":  # q and k normed over the whole projection, then clipped
        fields.update(qk_norm=True, qk_norm_scope="projection", clip_qkv=hf.get("clip_qkv"))
    if model_type in MOE_MODEL_TYPES:
        fields.update(moe_fields(hf))
    if model_type in DEEPSEEK_MODEL_TYPES:
        fields.update(deepseek_fields(hf))
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
    if config.kv_lora_rank:
        return "deepseek_v3" if config.router_bias else "deepseek_v2"
    if config.num_experts:
        return moe_model_type(config)
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
    if config.kv_lora_rank:
        raise ValueError("a model with multi-head latent attention (DeepSeek) is not exported "
                         "to transformers' layout (its interleaved rotary columns are not "
                         "written back); save it with save_checkpoint")
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
    family = model_type
    if config.num_experts:  # the dense family's fields, completed below
        model_type = {"olmoe": "llama", "qwen3_moe": "qwen3", "qwen2_moe": "qwen2",
                      "mixtral": "mistral"}[family]
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
        elif config.rope_scaling[0] == "yarn":
            _, factor, original, fast, slow, attention_factor, truncate = config.rope_scaling
            hf["rope_scaling"] = {"rope_type": "yarn", "factor": factor,
                                  "original_max_position_embeddings": original,
                                  "beta_fast": fast, "beta_slow": slow,
                                  "attention_factor": attention_factor, "truncate": truncate}
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
    return moe_config_to_hf(config, family, hf) if config.num_experts else hf
