"""specjax_models.hf: conformance with transformers for every supported family (random weights
made here, nothing downloaded), export round trips, tokenizers, and a speculative pair."""

import json
import re

import jax
import numpy as np
import pytest
from conftest import imported_on_use, skip_module_without

pytestmark = pytest.mark.slow  # `pytest -m slow` (CI runs it)
skip_module_without("torch", "transformers")
torch = imported_on_use("torch")
transformers = imported_on_use("transformers")

import specjax  # noqa: E402
import specjax_models  # noqa: E402

COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              initializer_range=0.1)
DEEPSEEK = dict(COMMON, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
                qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, moe_intermediate_size=32,
                n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                first_k_dense_replace=1)
FAMILIES = {
    "llama3": ("LlamaConfig", dict(COMMON, rope_theta=500_000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "llama-tied-bias": ("LlamaConfig", dict(COMMON, tie_word_embeddings=True,
                                            attention_bias=True)),
    "mistral": ("MistralConfig", dict(COMMON, sliding_window=8)),
    "qwen2": ("Qwen2Config", dict(COMMON, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(COMMON, head_dim=32)),
    "gemma": ("GemmaConfig", dict(COMMON, head_dim=16, num_key_value_heads=1)),
    "gemma2": ("Gemma2Config", dict(COMMON, head_dim=16, num_hidden_layers=4, sliding_window=8,
                                    query_pre_attn_scalar=24, attn_logit_softcapping=20.0,
                                    final_logit_softcapping=15.0)),
    "gpt2": ("GPT2Config", dict(vocab_size=300, n_embd=64, n_layer=3, n_head=4,
                                n_positions=256, initializer_range=0.1)),
    # Mixtures of experts: 8 experts, so a decode step (2-3 routed pairs per token) takes
    # the gathered dispatch and the 24-token forwards the grouped one.
    "mixtral": ("MixtralConfig", dict(COMMON, num_local_experts=8, num_experts_per_tok=2,
                                      sliding_window=8)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(COMMON, num_experts=8, num_experts_per_tok=2,
                                         moe_intermediate_size=32, norm_topk_prob=True,
                                         shared_expert_intermediate_size=48,
                                         mlp_only_layers=[0])),
    "qwen3_moe": ("Qwen3MoeConfig", dict(COMMON, head_dim=32, num_experts=8,
                                         num_experts_per_tok=3, moe_intermediate_size=32,
                                         decoder_sparse_step=2)),
    "olmoe": ("OlmoeConfig", dict(COMMON, num_experts=8, num_experts_per_tok=2,
                                  clip_qkv=0.5)),
    # Multi-head latent attention, a dense first layer, then 8 experts and a shared one:
    # V2's softmax router limited to 2 of 4 groups with a scaling factor (and no q latent),
    # V3's sigmoid router with a (randomised) correction bias; rotary features interleaved.
    "deepseek_v2": ("DeepseekV2Config", dict(DEEPSEEK, q_lora_rank=None,
                                             topk_method="group_limited_greedy", n_group=4,
                                             topk_group=2, routed_scaling_factor=2.0)),
    # YaRN as DeepSeek-V3 ships it (factor 40, mscale and mscale_all_dim: cos and sin and
    # every score rescaled), over 24-token prompts past its 16-token original context.
    "deepseek_v3": ("DeepseekV3Config", dict(DEEPSEEK, n_group=4, topk_group=2,
                                             max_position_embeddings=640, rope_parameters={
        "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 16,
        "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10_000.0})),
    "qwen2-yarn": ("Qwen2Config", dict(COMMON, rope_parameters={
        "rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16,
        "rope_theta": 10_000.0})),
}
TOKENS = np.random.default_rng(0).integers(0, 300, (3, 24)).astype(np.int64)
MLA_FAMILIES = ("deepseek_v2", "deepseek_v3")


def _hf_model(family, seed=0):
    config_class, kwargs = FAMILIES[family]
    config = getattr(transformers, config_class)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    if family == "deepseek_v3":  # a buffer initialised to zeros: give the bias a say
        with torch.no_grad():
            for layer in model.model.layers[1:]:
                layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.3)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_pair(request, tmp_path_factory):
    hf = _hf_model(request.param)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return request.param, hf, specjax_models.from_pretrained(path), path


def _hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.from_numpy(tokens)).logits.float().numpy()


def test_logits_equal_transformers(family_pair):
    _, hf, ours, _ = family_pair
    np.testing.assert_allclose(ours.logits(TOKENS), _hf_logits(hf, TOKENS), atol=2e-4,
                               rtol=1e-4)


def test_greedy_32_tokens_equal_transformers_generate(family_pair):
    _, hf, ours, _ = family_pair
    prompts = TOKENS[:, :10]
    with torch.no_grad():
        theirs = hf.generate(torch.from_numpy(prompts), max_new_tokens=32, min_new_tokens=32,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    out = specjax.generate(ours, prompts.astype(np.int32), max_new_tokens=32,
                           sampling=specjax.GREEDY)
    np.testing.assert_array_equal(np.asarray(out.tokens), theirs[:, 10:].numpy())


def test_incremental_cache_path_equals_full_forward(family_pair):
    _, _, ours, _ = family_pair
    tokens = TOKENS[:2, :20].astype(np.int32)
    reference = np.asarray(ours.logits(tokens))
    apply = jax.jit(lambda lm, t, p, c, n: lm.apply(t, p, c, n))
    cache = ours.init_cache(2, 32)
    lengths = np.zeros(2, np.int32)
    for chunk in [5, 1, 1, 3, 3, 7]:
        cols = lengths[:, None] + np.arange(chunk)[None]
        logits, _, cache = apply(ours, np.take_along_axis(tokens, cols, 1), cols, cache, lengths)
        np.testing.assert_allclose(logits, np.take_along_axis(reference, cols[..., None], 1),
                                   atol=2e-4, rtol=1e-4)
        lengths = lengths + chunk


def test_export_round_trip_loads_in_transformers(family_pair, tmp_path):
    family, _, ours, _ = family_pair
    if family in MLA_FAMILIES:
        with pytest.raises(ValueError, match="multi-head latent attention .* not exported"):
            specjax_models.save_pretrained(ours, tmp_path / "export")
        return
    specjax_models.save_pretrained(ours, tmp_path / "export")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export",
                                                             attn_implementation="eager")
    np.testing.assert_allclose(_hf_logits(back.eval(), TOKENS), ours.logits(TOKENS),
                               atol=2e-4, rtol=1e-4)
    assert specjax_models.from_pretrained(tmp_path / "export").vocab_size == 300


def test_bundled_pair_exports_to_transformers(tmp_path):
    target = specjax_models.load_bundled("target")
    specjax_models.save_pretrained(target, tmp_path / "target")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "target").eval()
    tokens = TOKENS[:2, :16] % 256
    np.testing.assert_allclose(_hf_logits(back, tokens), target.logits(tokens), atol=2e-4)


def test_bfloat16_checkpoints_stay_bfloat16(tmp_path):
    hf = _hf_model("qwen2").to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    lm = specjax_models.from_pretrained(tmp_path)
    assert {x.dtype for x in jax.tree.leaves(lm.params)} == {np.dtype(jax.numpy.bfloat16)}
    as_f32 = specjax_models.from_pretrained(tmp_path, dtype="float32")
    assert {x.dtype for x in jax.tree.leaves(as_f32.params)} == {np.dtype(np.float32)}


@pytest.mark.parametrize("patch, message", [
    ({"model_type": "falcon"}, "model_type 'falcon' is not supported"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}},
     "rope scaling type 'longrope'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
     "original_max_position_embeddings is missing"),
    ({"hidden_act": "relu"}, "hidden activation 'relu' is not supported"),
    ({"use_sliding_window": True}, "use_sliding_window=true is not supported"),
])
def test_unsupported_options_are_named(tmp_path, patch, message):
    hf = _hf_model("qwen2")
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(patch)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        specjax_models.from_pretrained(tmp_path)


def test_qwen2_pair_with_padded_vocabs_speculative_equals_transformers_greedy(tmp_path):
    """A 3-layer target over 320 ids and a 1-layer draft over a 300-id prefix."""
    target_cfg = transformers.Qwen2Config(**dict(COMMON, vocab_size=320))
    draft_cfg = transformers.Qwen2Config(**dict(COMMON, num_hidden_layers=1))
    torch.manual_seed(1)
    hf_target = transformers.AutoModelForCausalLM.from_config(target_cfg).eval()
    hf_draft = transformers.AutoModelForCausalLM.from_config(draft_cfg).eval()
    hf_target.save_pretrained(tmp_path / "t")
    hf_draft.save_pretrained(tmp_path / "d")
    target = specjax_models.from_pretrained(tmp_path / "t")
    draft = specjax_models.from_pretrained(tmp_path / "d")
    prompts = TOKENS[:, :8]
    with torch.no_grad():
        theirs = hf_target.generate(torch.from_numpy(prompts), max_new_tokens=24,
                                    min_new_tokens=24, do_sample=False, eos_token_id=None,
                                    pad_token_id=0)[:, 8:].numpy()
    ours = specjax.speculative_generate(target, specjax.DraftModel(draft, max_vocab_padding=20),
                                        prompts.astype(np.int32), max_new_tokens=24,
                                        num_draft_tokens=3, sampling=specjax.GREEDY)
    np.testing.assert_array_equal(np.asarray(ours.tokens), theirs)


def test_tokenizer_special_ids_and_chat_template(tmp_path):
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models

    vocab = {"<s>": 0, "</s>": 1, "<pad>": 2, "hello": 3, "world": 4, "user": 5, ":": 6,
             "assistant": 7, "[UNK]": 8}
    tokenizer = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "chat_template": "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
                         "{{ eos_token }} {% endfor %}{% if add_generation_prompt %}"
                         "assistant :{% endif %}"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    tok = specjax_models.load_tokenizer(tmp_path)
    assert (tok.bos_id, tok.eos_id, tok.eos_ids, tok.pad_id) == (0, 1, [1, 2], 2)
    assert tok.encode("hello world") == [3, 4]
    assert tok.decode([3, 4]) == "hello world"
    ids = tok.apply_chat_template([{"role": "user", "content": "hello"}])
    assert ids == [5, 6, 3, 1, 7, 6]


def test_a_weight_the_architecture_does_not_use_is_refused(tmp_path):
    """Only named buffers are skipped: an extra bias (here on a Llama q_proj without
    attention_bias) means an option we would otherwise silently drop."""
    from safetensors.numpy import load_file, save_file

    hf = _hf_model("llama3")
    hf.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.layers.0.self_attn.c_attn.bias"] = np.zeros(64, np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="weights this architecture does not use"):
        specjax_models.from_pretrained(tmp_path)


def test_a_loaded_checkpoint_drafts_for_itself(tmp_path):
    """LayerSkip on a Hugging Face checkpoint: its own blocks minus one, greedy =
    generate."""
    _hf_model("llama3").save_pretrained(tmp_path)
    lm = specjax_models.from_pretrained(tmp_path)
    prompts = [[1, 2, 3, 4], [5, 6]]
    plain = specjax.generate(lm, prompts, max_new_tokens=8, sampling=specjax.GREEDY)
    spec = specjax.speculative_generate(lm, specjax.LayerSkip(skip=(lm.num_layers - 1,)),
                                        prompts, max_new_tokens=8, num_draft_tokens=3,
                                        sampling=specjax.GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_experts_load_from_the_fused_layout_and_across_shards(family, tmp_path):
    """transformers' in-memory layout (`experts.gate_up_proj` [E, 2F, D], `down_proj`
    [E, D, F]) written as it is, and the published per-expert layout split over shards
    (an expert stack whose tensors lie in several files)."""
    from safetensors.torch import save_file

    hf = _hf_model(family)
    want = _hf_logits(hf, TOKENS)
    fused = tmp_path / "fused"
    hf.save_pretrained(fused)
    state = {name: tensor.contiguous() for name, tensor in hf.state_dict().items()}
    assert any(name.endswith("experts.gate_up_proj") for name in state)
    if family == "mixtral":  # its published block name, with the fused tensors
        state = {name.replace(".mlp.", ".block_sparse_moe."): t for name, t in state.items()}
    save_file(state, str(fused / "model.safetensors"), metadata={"format": "pt"})
    np.testing.assert_allclose(specjax_models.from_pretrained(fused).logits(TOKENS), want,
                               atol=2e-4, rtol=1e-4)
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="40KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]
    stack = [index[name] for name in index if ".layers.1." in name and ".experts." in name]
    assert len(set(stack)) > 1, "the experts of layer 1 should span shards"
    np.testing.assert_allclose(specjax_models.from_pretrained(sharded).logits(TOKENS), want,
                               atol=2e-4, rtol=1e-4)


def test_moe_options_we_do_not_compute_are_named(tmp_path):
    _hf_model("qwen2_moe").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["mlp_only_layers"] = "first"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="mlp_only_layers is 'first', expected layer indices"):
        specjax_models.from_pretrained(tmp_path)


def test_deepseek_mtp_layers_are_not_the_targets(tmp_path):
    """A DeepSeek-V3 checkpoint's MTP layers (model.layers.{L}.*, num_nextn_predict_layers)
    belong to its drafter: the target loads without them and is unchanged."""
    from safetensors.numpy import load_file, save_file

    hf = _hf_model("deepseek_v3")
    hf.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["model.layers.3.eh_proj.weight"] = np.zeros((64, 128), np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    np.testing.assert_allclose(specjax_models.from_pretrained(tmp_path).logits(TOKENS),
                               _hf_logits(hf, TOKENS), atol=2e-4, rtol=1e-4)



def _rewrite(path, change):
    """Rewrite model.safetensors through `change(tensors)`."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("family, tensor, published", [
    ("mixtral", "model.layers.1.mlp.experts.3.gate_proj.weight", (128, 64)),
    ("deepseek_v3", "model.layers.1.mlp.experts.2.down_proj.weight", (64, 32)),
])
def test_an_expert_tensor_of_the_wrong_shape_is_named_with_its_file(family, tensor,
                                                                     published, tmp_path):
    """A stack of experts is checked tensor by tensor, in the file's layout, before it is
    stacked (not numpy's 'all input arrays must have the same shape')."""
    _hf_model(family).save_pretrained(tmp_path)
    names = _saved_names(tmp_path)
    if tensor not in names:  # Mixtral's published block name
        tensor = tensor.replace(".mlp.", ".block_sparse_moe.").replace(
            "gate_proj", "w1").replace("down_proj", "w2")
    assert tensor in names
    _rewrite(tmp_path, lambda t: t.update({tensor: np.zeros((5, 7), np.float32)}))
    with pytest.raises(ValueError, match=re.escape(
            f"{tmp_path / 'model.safetensors'}: tensor {tensor} has shape (5, 7), expected "
            f"{published} by config.json")):
        specjax_models.from_pretrained(tmp_path)


def test_a_fused_expert_tensor_of_the_wrong_shape_is_named(tmp_path):
    from safetensors.torch import save_file

    hf = _hf_model("qwen3_moe")
    hf.save_pretrained(tmp_path)
    state = {name: tensor.contiguous() for name, tensor in hf.state_dict().items()}
    fused = next(name for name in state if name.endswith("experts.gate_up_proj"))
    expected = tuple(state[fused].shape)
    state[fused] = state[fused][:, :-2].contiguous()
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape(
            f"tensor {fused} has shape {(expected[0], expected[1] - 2, expected[2])}, "
            f"expected {expected}")):
        specjax_models.from_pretrained(tmp_path)


def test_a_transposed_tensor_is_reported_in_the_files_layout(tmp_path):
    _hf_model("llama3").save_pretrained(tmp_path)
    name = "model.layers.0.self_attn.k_proj.weight"  # [kv heads x head dim, hidden]
    _rewrite(tmp_path, lambda t: t.update({name: np.zeros((64, 32), np.float32)}))
    with pytest.raises(ValueError, match=re.escape(
            f"tensor {name} has shape (64, 32), expected (32, 64)")):
        specjax_models.from_pretrained(tmp_path)


def test_asking_for_an_absent_mtp_module_names_the_layer_it_looked_for(tmp_path):
    _hf_model("llama3").save_pretrained(tmp_path)
    layers = json.loads((tmp_path / "config.json").read_text())["num_hidden_layers"]
    with pytest.raises(ValueError, match=re.escape(f"model.layers.{layers}.*")) as error:
        specjax_models.from_pretrained(tmp_path, mtp=True)
    assert "{" not in str(error.value)


def _saved_names(path) -> set:
    from safetensors import safe_open

    with safe_open(path / "model.safetensors", framework="numpy") as handle:
        return set(handle.keys())
