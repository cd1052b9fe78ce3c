"""Drafters published for real models, loaded from a local directory onto their target.

`load_drafter(directory, target)` reads the directory's config.json and weight files,
recognises the layout and returns a specjax drafter that computes what the authors' code
computes:

- EAGLE-3, the authors' layout (SafeAILab/EAGLE, `eagle/model/cnets.py`: `fc` over the
  three fused target layers, `midlayer.*` a Llama layer whose attention reads
  [input_layernorm(embedding); hidden_norm(feature)], `norm`, an own `lm_head` over
  `draft_vocab_size` ids, `d2t` / `t2d`); and the `speculators` layout that vLLM reads
  (vllm-project/speculators, `models/eagle3`: config.json with
  `"speculators_model_type": "eagle3"`, `transformer_layer_config`, `layers.0.*`,
  `norm_before_residual`, `eagle_aux_hidden_state_layer_ids`).
- EAGLE-1/2 (the authors' `eagle/model/cnets1.py`: `fc` (with bias) over
  [embedding; feature], `layers.0.*` without an input norm, logits through the target's
  own LM head with no final norm).
- Medusa-1 (FasterDecoding/Medusa, `medusa/model/medusa_model.py`: `medusa_head.{i}` =
  `medusa_num_layers` ResBlocks `x + SiLU(linear(x))` (one module repeated: the same
  weights under each index) then an own LM head `medusa_head.{i}.{L}.weight`).

PyTorch `nn.Linear` stores `[out, in]`; specjax multiplies `x @ w` with `[in, out]`, so
every projection is transposed. Weights come from safetensors (single, sharded, or any
`*.safetensors` file); a pickled `.bin` / `.pt` file is read with torch when it is
installed (`weights_only=True`), else refused with the one-line conversion. A key this
loader has no place for, a missing one, or a shape that does not fit is an error naming
the file and the key. What is not supported (multi-layer EAGLE-3 drafters, Qwen3 layers
with q/k norms, the MTP modules of families other than MiMo and DeepSeek, ...) is
refused by name.
- MiMo's MTP module (`model.mtp_layers.0.*` in the target's checkpoint) and DeepSeek-V3's
  (`model.layers.{num_hidden_layers}.*`: latent attention and experts,
  `specjax_models.mtp`).
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np

import specjax
from specjax.drafters import Eagle, FeatureHeadConfig, Medusa, eagle3_feature_layers
from specjax.runtime.files import read_json
from specjax_models.hf import MTP_PREFIX, rope_from_hf
from specjax_models.hf_deepseek import DEEPSEEK_MODEL_TYPES
from specjax_models.mtp import load_deepseek_mtp
from specjax_models.published_weights import REMEDY, PublishedWeights, read_weights
from specjax_models.transformer import embedding_and_head

LAYOUTS = ("eagle3", "eagle3-speculators", "eagle1", "medusa1", "mimo-mtp", "deepseek-mtp")
# ----------------------------------------------------------------------- detection

def detect_layout(config: dict, names: set[str], directory: Path) -> str:
    """One of LAYOUTS, from config.json and the tensor names; anything else refused."""
    kind = config.get("speculators_model_type")
    if kind is not None:
        if kind != "eagle3":
            raise ValueError(f"{directory}: a speculators {kind!r} drafter; only "
                             "speculators' eagle3 layout is supported")
        return "eagle3-speculators"
    if any(n.startswith("midlayer.") for n in names):
        return "eagle3"
    if any(n.startswith(MTP_PREFIX) for n in names):
        if config.get("model_type") != "mimo":
            raise ValueError(f"{directory}: mtp_layers in a {config.get('model_type')!r} "
                             "checkpoint; load_drafter reads MiMo's (Qwen2 blocks)")
        return "mimo-mtp"
    if any(n.startswith("medusa_head.") or n.split(".")[0].isdigit() for n in names):
        return "medusa1"
    if "fc.weight" in names and any(n.startswith("layers.0.") for n in names):
        return "eagle1"
    if config.get("num_nextn_predict_layers"):
        if config.get("model_type") in DEEPSEEK_MODEL_TYPES:
            return "deepseek-mtp"  # its module's tensors are checked as they are read
        raise ValueError(f"{directory}: a {config.get('model_type')!r} target's multi-token "
                         "prediction module is not supported; load_drafter reads MiMo's and "
                         f"DeepSeek-V3's ({', '.join(DEEPSEEK_MODEL_TYPES)})")
    raise ValueError(f"{directory}: not a drafter layout this loader knows (EAGLE-3 in the "
                     "authors' or the speculators layout, EAGLE-1/2, Medusa-1); its tensors "
                     f"start {sorted(names)[:4]}")


def load_drafter(directory: str | Path, target: specjax.CausalLM, *,
                 method: str | None = None, feature_layers=None, dtype="float32"):
    """The published drafter in `directory` (a local snapshot: config.json and its weights),
    on `target` (the model it was trained for, e.g. from `from_pretrained`).

    Returns a `specjax.drafters.Eagle` (EAGLE-1/2/3, MiMo's or DeepSeek-V3's MTP module)
    or `Medusa`
    (Medusa-1). method: the drafter's draw ("sample" or "greedy"; default "sample" for
    EAGLE and MTP, "greedy" for Medusa, as the papers do). feature_layers: the target
    layers an EAGLE-3 head fuses, when neither its config nor the default (2, L // 2,
    L - 3) is right. dtype: "float32" (default) or "bfloat16" for the drafter's weights
    (half the memory; its arithmetic stays float32)."""
    import ml_dtypes

    dtypes = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
    if str(dtype) not in dtypes:
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory (download the drafter with "
                                "huggingface_hub.snapshot_download and pass its folder)")
    config = read_json(directory / "config.json", REMEDY) \
        if (directory / "config.json").exists() else {}
    weights = read_weights(directory)
    weights.float_dtype = dtypes[str(dtype)]
    layout = detect_layout(config, weights.names, directory)
    # The target's LM head only where the drafter scores through it (an untied head is
    # stored [D, V]: taking it [V, D] is a copy); EAGLE-3 and Medusa-1 carry their own.
    embedding = embedding_and_head(target)[0]
    target_head = lambda: embedding_and_head(target)[1]  # noqa: E731
    if layout == "medusa1":
        return _medusa(weights, embedding.shape, method or "greedy")
    if layout == "mimo-mtp":
        return _mimo_mtp(config, weights, target, embedding, target_head(), method or "sample")
    if layout == "deepseek-mtp":
        return load_deepseek_mtp(config, weights, embedding, target_head(), method or "sample")
    return _eagle(layout, config, weights, target, embedding, target_head, method or "sample",
                  feature_layers)


def _config_file(directory: Path, config: dict) -> str:
    """How errors name the settings: config.json, or its absence."""
    path = directory / "config.json"
    return str(path) if config or path.exists() else f"{path} (absent)"


def _positive_int(config: dict, name: str, where: str, default: int | None = None) -> int:
    """config[name] as an int >= 1 (`default` when it is missing or null); anything else
    (0, a negative or fractional number, text) refused by name."""
    value = config.get(name)
    if value is None:
        if default is not None:
            return default
        said = "null" if name in config else "missing"
        raise ValueError(f"{where}: {name} is {said}, expected a positive integer; {REMEDY}")
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole or value < 1:
        raise ValueError(f"{where}: {name} is {value!r}, expected a positive integer; {REMEDY}")
    return int(value)


def _positive_float(config: dict, name: str, where: str, default: float) -> float:
    value = config.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{where}: {name} is {value!r}, expected a positive number; {REMEDY}")
    return float(value)


# ----------------------------------------------------------------------- EAGLE

def _layer_config(layout: str, config: dict, directory: Path) -> dict:
    """The decoder layer's Hugging Face config (speculators nests it)."""
    if layout != "eagle3-speculators":
        return config
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"{directory / 'config.json'}: a speculators eagle3 config without "
                         f"a transformer_layer_config object; {REMEDY}")
    if config.get("norm_before_fc") and config.get("fc_norm"):
        raise ValueError(f"{directory / 'config.json'}: norm_before_fc and fc_norm are both "
                         f"true (speculators builds one or the other); {REMEDY}")
    return layer


def _eagle(layout, config, weights, target, embedding, target_head, method, feature_layers):
    directory = weights.directory
    layer = _layer_config(layout, config, directory)
    model_type = layer.get("model_type", "llama")
    # The authors' code builds its own Llama layer whatever the config's model_type;
    # speculators builds the model_type's layer (Qwen3's has q/k norms).
    if layout == "eagle3-speculators" and model_type not in ("llama", "qwen2", "mistral"):
        raise ValueError(f"{directory}: a {model_type!r} decoder layer (its attention has "
                         "q/k norms or another block) is not supported; Llama-style layers are")
    where = _config_file(directory, config)
    layers = _positive_int(layer, "num_hidden_layers", where, default=1)
    prefix = "midlayer." if layout == "eagle3" else "layers.0."
    if layers != 1 or weights.has("layers.1.mlp.down_proj.weight"):
        raise ValueError(f"{directory}: a {layers}-layer drafter; load_drafter runs one-layer "
                         "EAGLE heads (the published EAGLE-1/2/3 heads have one)")
    d_model = embedding.shape[1]
    hidden = _positive_int(layer, "hidden_size", where, default=d_model)
    target_width = _positive_int(config, "target_hidden_size", where, default=0) or \
        _positive_int(layer, "target_hidden_size", where, default=hidden)
    if hidden != d_model or target_width != d_model:
        raise ValueError(f"{directory}: the drafter is {hidden} wide over a {target_width}-wide "
                         f"target, but this target is {d_model} wide: load it onto the model "
                         "it was trained for")
    heads = _positive_int(layer, "num_attention_heads", where)
    kv_heads = _positive_int(layer, "num_key_value_heads", where, default=heads)
    # The authors' LlamaAttention takes hidden_size // num_heads, whatever head_dim says.
    head_dim = _positive_int(layer, "head_dim", where, default=d_model // heads) \
        if layout == "eagle3-speculators" else d_model // heads
    d_ff = _positive_int(layer, "intermediate_size", where)
    rms_norm_eps = _positive_float(layer, "rms_norm_eps", where, 1e-6)
    theta, scaling = rope_from_hf(layer)
    eagle3 = layout != "eagle1"
    if eagle3:
        ids = feature_layers if feature_layers is not None else (
            config.get("eagle_aux_hidden_state_layer_ids")
            or eagle3_feature_layers(target.num_layers))
        ids = [int(i) for i in ids]
        if len(set(ids)) != len(ids) or not all(0 <= i < target.num_layers for i in ids):
            raise ValueError(f"{directory}: feature layers {ids} are not distinct layers of "
                             f"this {target.num_layers}-layer target")
    else:
        ids = []
    bias = bool(layer.get("attention_bias") or layer.get("qkv_bias")
                or weights.has(prefix + "self_attn.q_proj.bias"))
    head_config = FeatureHeadConfig(
        kind="eagle3" if eagle3 else "eagle1", d_model=d_model, num_heads=heads,
        num_kv_heads=kv_heads, d_ff=d_ff,
        feature_layers=tuple(sorted(ids)), head_dim=head_dim, rope_theta=theta,
        rope_scaling=scaling, rms_norm_eps=rms_norm_eps,
        layer_input="concat" if eagle3 else "fc",
        norm_before_residual=bool(config.get("norm_before_residual", False)) and eagle3,
        attn_norm=eagle3, final_norm=eagle3, qkv_bias=bias, first_pair=False,
        fuse_norm=("joint" if config.get("norm_before_fc") else
                   "per_layer" if config.get("fc_norm") else "none") if eagle3 else "none",
        norm_output=bool(config.get("norm_output")) and eagle3, own_lm_head=eagle3,
        own_embedding=weights.has("embed_tokens.weight"))
    params = _layer_params(weights, prefix, head_config)
    if eagle3:
        # fc's column blocks follow the layers' order in the target, whatever order the
        # config lists them in: vLLM, which produced the features these heads trained on,
        # collects the aux hidden states as its layer loop passes them
        # (vllm/model_executor/models/llama.py), and specjax's target returns them sorted.
        params["fuse"] = weights.take("fc.weight", (d_model, len(ids) * d_model),
                                      transpose=True)
        if head_config.fuse_norm == "joint":  # speculators' input_norm over [h_a; h_b; h_c]
            params["fuse_norm"] = weights.take("input_norm.weight", (len(ids) * d_model,))
        elif head_config.fuse_norm == "per_layer":  # fc_norm.{i}, one per layer, in order
            params["fuse_norm"] = jnp.stack([weights.take(f"fc_norm.{i}.weight", (d_model,))
                                             for i in range(len(ids))])
        params["final_norm"] = weights.take("norm.weight", (d_model,))
        own_head, draft_vocab = _draft_vocabulary(weights, config, layer, target.vocab_size,
                                                  d_model)
        lm_head = own_head
    else:
        lm_head = target_head()
        params["fc"] = weights.take("fc.weight", (d_model, 2 * d_model), transpose=True)
        params["fc_bias"] = (weights.take("fc.bias", (d_model,)) if weights.has("fc.bias")
                             else jnp.zeros((d_model,), weights.float_dtype))
        draft_vocab = None
    if weights.has("embed_tokens.weight"):
        embedding = weights.take("embed_tokens.weight", (target.vocab_size, d_model))
    # Frozen copies of the target's that speculators keeps for training only.
    weights.ignore("verifier_norm.weight", "verifier_lm_head.weight")
    weights.finish()
    return Eagle(params, jnp.asarray(embedding), jnp.asarray(lm_head), head_config, method,
                 None if draft_vocab is None else jnp.asarray(draft_vocab))


def _layer_params(weights: PublishedWeights, prefix: str, config: FeatureHeadConfig) -> dict:
    """The decoder layer's projections and norms under our names."""
    d, a, hd = config.d_model, config.attention_width, config.resolved_head_dim
    q_out, kv_out = config.num_heads * hd, config.num_kv_heads * hd
    take = weights.take
    params = {
        "wq": take(prefix + "self_attn.q_proj.weight", (q_out, a), transpose=True),
        "wk": take(prefix + "self_attn.k_proj.weight", (kv_out, a), transpose=True),
        "wv": take(prefix + "self_attn.v_proj.weight", (kv_out, a), transpose=True),
        "wo": take(prefix + "self_attn.o_proj.weight", (d, q_out), transpose=True),
        "w_gate": take(prefix + "mlp.gate_proj.weight", (config.d_ff, d), transpose=True),
        "w_up": take(prefix + "mlp.up_proj.weight", (config.d_ff, d), transpose=True),
        "w_down": take(prefix + "mlp.down_proj.weight", (d, config.d_ff), transpose=True),
        "mlp_norm": take(prefix + "post_attention_layernorm.weight", (d,)),
    }
    if config.qkv_bias:
        for name, width in (("q", q_out), ("k", kv_out), ("v", kv_out)):
            key = f"{prefix}self_attn.{name}_proj.bias"
            params["b" + name] = take(key, (width,)) if weights.has(key) else \
                jnp.zeros((width,), weights.float_dtype)
    if config.layer_input == "concat":
        params["embed_norm"] = take(prefix + "input_layernorm.weight", (d,))
        params["feature_norm"] = take(prefix + "hidden_norm.weight", (d,))
    return params


def _draft_vocabulary(weights: PublishedWeights, config: dict, layer: dict, vocab_size: int,
                      d_model: int):
    """`(own LM head rows, draft vocabulary)`: EAGLE-3's head scores `draft_vocab_size`
    ids, draft id i being target id i + d2t[i] (t2d marks the same ids); rows are put in
    increasing target-id order (what `Eagle.draft_vocab` wants)."""
    where = _config_file(weights.directory, config)
    size = _positive_int(config, "draft_vocab_size", where, default=0) or \
        _positive_int(layer, "draft_vocab_size", where, default=vocab_size)
    rows = weights.take("lm_head.weight", (size, d_model))
    if not weights.has("d2t"):
        if size != vocab_size:
            raise ValueError(f"{weights.directory}: a {size}-id draft vocabulary without the "
                             f"d2t map that places it in the target's {vocab_size} ids; "
                             f"{REMEDY}")
        weights.ignore("t2d")
        return rows, None
    offsets = weights.take("d2t", (size,), host_dtype=np.int64)
    ids = np.arange(size, dtype=np.int64) + offsets
    where = weights.directory / weights.file_of["d2t"]
    if ids.min() < 0 or ids.max() >= vocab_size or np.unique(ids).size != size:
        problem = "repeated" if np.unique(ids).size != size else "out-of-range"
        raise ValueError(f"{where}: d2t maps draft ids to {problem} target ids (the target "
                         f"has {vocab_size}); {REMEDY}")
    if weights.has("t2d"):
        marks = weights.take("t2d", (vocab_size,), host_dtype=bool)
        if int(marks.sum()) != size or not marks[ids].all():
            raise ValueError(f"{weights.directory / weights.file_of['t2d']}: t2d and d2t "
                             f"disagree (t2d marks {int(marks.sum())} target ids, "
                             f"{int(marks[ids].sum())} of the {size} that d2t maps to); "
                             f"{REMEDY}")
    order = np.argsort(ids)
    if np.array_equal(order, np.arange(size)):  # the published heads' ids are sorted
        return rows, ids.astype(np.int32)
    return rows[order], ids[order].astype(np.int32)


# ----------------------------------------------------------------------- Medusa

def _medusa(weights: PublishedWeights, target_shape: tuple, method: str) -> Medusa:
    """Medusa-1: head i = L ResBlocks then an own LM head (keys with or without the
    `medusa_head.` prefix: the full model's state dict, or `medusa_head.state_dict()` as
    `medusa_lm_head.pt` holds). The heads and blocks are counted from the tensors: the
    authors' uploaded configs may name fewer heads than the weights hold (their loader
    overrides `medusa_num_heads`)."""
    prefix = "medusa_head." if any(n.startswith("medusa_head.") for n in weights.names) \
        else ""
    found = {int(n[len(prefix):].split(".")[0]) for n in weights.names
             if n.startswith(prefix) and n[len(prefix):].split(".")[0].isdigit()}
    heads = len(found)
    if found != set(range(heads)):
        raise ValueError(f"{weights.directory}: Medusa heads {sorted(found)} are not "
                         f"0 ... {heads - 1}; {REMEDY}")
    layers = sum(1 for n in weights.names if n.startswith(f"{prefix}0.")
                 and n.endswith(".linear.weight"))
    if not layers:
        raise ValueError(f"{weights.directory}: Medusa head 0 has no ResBlock "
                         f"({prefix}0.0.linear.weight); {REMEDY}")
    vocab, d_model = target_shape
    w, b, own = [], [], []
    for i in range(heads):
        blocks = [(weights.take(f"{prefix}{i}.{j}.linear.weight", (d_model, d_model),
                                transpose=True),
                   weights.take(f"{prefix}{i}.{j}.linear.bias", (d_model,)))
                  for j in range(layers)]
        w.append(jnp.stack([block[0] for block in blocks]))
        b.append(jnp.stack([block[1] for block in blocks]))
        own.append(weights.take(f"{prefix}{i}.{layers}.weight", (vocab, d_model)))
    weights.finish()
    lm_heads = jnp.stack(own)  # [M, V, D]: briefly twice the heads' LM heads in memory
    del own
    params = {"w": jnp.stack(w), "b": jnp.stack(b), "lm_heads": lm_heads}
    return Medusa(params, None, method)  # every head has its own LM head


# ----------------------------------------------------------------------- MiMo MTP

def _mimo_mtp(config, weights, target, embedding, lm_head, method) -> Eagle:
    """MiMo's first MTP module (`model.mtp_layers.0.*`, Xiaomi's vLLM mimo_mtp.py):
    `input_proj([hidden_layernorm(feature); token_layernorm(embedding)])`, a Qwen2 block
    (q/k/v biases), `final_layernorm`, the target's LM head; the embedding of the pair at
    the sequence's first position zeroed. Reused recursively for K > 1 (what specjax's
    "mtp" heads do; MiMo's own code drafts one token)."""
    d_model = embedding.shape[1]
    where = _config_file(weights.directory, config)
    hidden = _positive_int(config, "hidden_size", where)
    if hidden != d_model:
        raise ValueError(f"{weights.directory}: the MTP module is {hidden} wide but this "
                         f"target is {d_model} wide: load the target from the same "
                         "checkpoint (from_pretrained)")
    heads = _positive_int(config, "num_attention_heads", where)
    theta, scaling = rope_from_hf(config)
    head_config = FeatureHeadConfig(
        kind="mtp", d_model=d_model, num_heads=heads,
        num_kv_heads=_positive_int(config, "num_key_value_heads", where, default=heads),
        d_ff=_positive_int(config, "intermediate_size", where),
        head_dim=_positive_int(config, "head_dim", where, default=d_model // heads),
        rope_theta=theta, rope_scaling=scaling,
        rms_norm_eps=_positive_float(config, "rms_norm_eps", where, 1e-6),
        qkv_bias=True, first_pair=False, zero_first_embedding=True)
    prefix = MTP_PREFIX + "0."
    params = _layer_params(weights, prefix, head_config)
    params["attn_norm"] = weights.take(prefix + "input_layernorm.weight", (d_model,))
    params["embed_norm"] = weights.take(prefix + "token_layernorm.weight", (d_model,))
    params["feature_norm"] = weights.take(prefix + "hidden_layernorm.weight", (d_model,))
    params["final_norm"] = weights.take(prefix + "final_layernorm.weight", (d_model,))
    # input_proj reads [feature; embedding]; specjax's mtp proj reads [embedding; feature].
    proj = weights.take(prefix + "input_proj.weight", (d_model, 2 * d_model), transpose=True)
    params["proj"] = jnp.concatenate([proj[d_model:], proj[:d_model]], axis=0)
    weights.finish(prefix)
    return Eagle(params, jnp.asarray(embedding), jnp.asarray(lm_head), head_config, method)
