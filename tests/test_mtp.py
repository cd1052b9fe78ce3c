"""specjax_models.mtp: DeepSeek-V3's MTP module as a drafter (an Eagle whose block is the
model's own: latent attention and experts, `specjax.drafters.ModelBlock`).

Unit: the block's cache path equals its full forward; the drafter's state equals the
module's maths computed directly (the first pair kept out, the first embedding zeroed);
chains feed each output back; the cache after commits equals one built from scratch;
refusals. Slow: a DeepSeek-V3 checkpoint written by transformers with an MTP module added
in the published layout, loaded by `from_pretrained(dir, mtp=True)`, against a PyTorch
transcription of vLLM's DeepSeekMultiTokenPredictorLayer around transformers'
DeepseekV3DecoderLayer. Greedy equality and the chi-square are in tests/test_exactness.py
("deepseek mtp ...").
"""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import LATENT_ATTENTION_AND_EXPERTS, build_lm, tiny_config
from flax import nnx
from test_eagle import head_state_from_scratch, run_steps

import specjax
import specjax_models
from specjax import GREEDY, SamplingConfig, SpeculativeConfig
from specjax.drafters import Eagle, ModelBlock
from specjax.drafters.base import DraftContext
from specjax.drafters.feature_head import rms_norm
from specjax_models.mtp import MtpBlock, mtp_block_config, random_mtp_drafter

CONFIG = tiny_config(num_layers=2, num_heads=2, num_kv_heads=2, **LATENT_ATTENTION_AND_EXPERTS)


@jax.jit
def init(drafter: Eagle, tokens, lengths, features):
    return drafter.init(tokens, lengths, 32, features=features)


@jax.jit
def block_forward(block: ModelBlock, x, positions):
    return block.apply(x, positions, None, None)[0]


@jax.jit
def logits_of(drafter: Eagle, out):
    return drafter._logits(out)


@pytest.fixture(scope="module")
def target():
    return build_lm(5, num_layers=2, num_heads=2, num_kv_heads=2,
                    **LATENT_ATTENTION_AND_EXPERTS)


@pytest.fixture(scope="module")
def drafter(target):
    embedding, lm_head = specjax_models.embedding_and_head(target)
    return random_mtp_drafter(CONFIG, embedding, lm_head, jax.random.key(1), "greedy",
                              scale=0.5)


def test_the_block_config_follows_the_layer_it_stands_for():
    assert mtp_block_config(CONFIG, 2).dense_layers == ()  # past the dense layer 0: experts
    assert mtp_block_config(CONFIG, 0).dense_layers == (0,)
    block = MtpBlock(CONFIG, 2, rngs=nnx.Rngs(0))
    assert type(block.block.mlp).__name__ == "MoE"
    assert type(block.block.attention).__name__ == "LatentAttention"


def test_the_blocks_cache_path_equals_its_full_forward():
    """Two writes (a prefill, then 3 tokens) equal the causal forward over all positions;
    the cache holds the latent and the rotary key, not keys and values."""
    block = ModelBlock.from_nnx(MtpBlock(CONFIG, 2, rngs=nnx.Rngs(2)))
    x = jax.random.normal(jax.random.key(3), (2, 7, CONFIG.d_model))
    positions = jnp.broadcast_to(jnp.arange(7), (2, 7)) + 1
    full = block_forward(block, x, positions)
    cache = block.init_cache(2, 16)
    assert cache.keys[0].shape == (2, 1, 16, CONFIG.kv_lora_rank)
    assert cache.values[0].shape == (2, 1, 16, CONFIG.qk_rope_head_dim)

    @jax.jit
    def two_writes(block, cache):
        first, cache = block.apply(x[:, :4], positions[:, :4], cache, jnp.zeros(2, jnp.int32))
        rest, _ = block.apply(x[:, 4:], positions[:, 4:], cache, jnp.full(2, 4, jnp.int32))
        return first, rest

    first, rest = two_writes(block, cache)
    np.testing.assert_allclose(np.concatenate([first, rest], 1), full, rtol=2e-5, atol=2e-5)


def reference_outputs(drafter: Eagle, tokens, features, length: int) -> np.ndarray:
    """The module's outputs for a row's pairs (feature t - 1, token t), t = 1 .. length - 1,
    computed directly: enorm / hnorm / eh_proj with the embedding at position 1 zeroed (the
    reference's position 0), then the block's causal forward over those pairs alone."""
    p, eps = drafter.params, drafter.config.rms_norm_eps
    embedded = drafter.embedding[tokens[1:length]].at[0].set(0.0)
    joined = jnp.concatenate([rms_norm(embedded, p["embed_norm"], eps),
                              rms_norm(features[:length - 1], p["feature_norm"], eps)], -1)
    x = (joined @ p["proj"])[None]
    return np.asarray(block_forward(drafter.block, x, jnp.arange(1, length)[None])[0])


def test_the_drafters_root_is_the_modules_output_without_the_first_pair(drafter):
    """Rows of lengths 6, 3 and 1: the root output after init is the module's output at
    the last pair, computed with the slot-0 pair (zero feature, token 0) absent, as the
    reference never sees it; a one-token prompt has only that pair (its own output)."""
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 32, (3, 6)), jnp.int32)
    features = jnp.asarray(rng.standard_normal((3, 6, CONFIG.d_model)), jnp.float32)
    lengths = jnp.asarray([6, 3, 1], jnp.int32)
    state = init(drafter, tokens, lengths, features)
    for row, length in enumerate((6, 3)):
        want = reference_outputs(drafter, tokens[row], features[row], length)[-1]
        np.testing.assert_allclose(np.asarray(state.root_hidden[row]), want, rtol=2e-4,
                                   atol=2e-5)
    p, eps = drafter.params, drafter.config.rms_norm_eps
    joined = jnp.concatenate([rms_norm(drafter.embedding[tokens[2, 0]], p["embed_norm"], eps),
                              jnp.zeros(CONFIG.d_model)])  # hnorm(0) = 0
    alone = block_forward(drafter.block, (joined @ p["proj"])[None, None],
                          jnp.zeros((1, 1), jnp.int32))
    np.testing.assert_allclose(np.asarray(state.root_hidden[2]), np.asarray(alone[0, 0]),
                               rtol=2e-4, atol=2e-5)


def test_a_chain_feeds_each_output_back_as_the_next_feature(drafter):
    """Greedy drafts of depth 1..3 equal the argmax of the module recomputed from scratch
    over the pairs with each draft appended, its feature the previous output (the root's
    pair: (the output at the last prompt token, draft 1))."""
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, 32, (1, 5)), jnp.int32)
    features = jnp.asarray(rng.standard_normal((1, 5, CONFIG.d_model)), jnp.float32)
    state = init(drafter, tokens, jnp.asarray([5]), features)
    sequence = jnp.zeros((1, 32), jnp.int32).at[:, :5].set(tokens)
    _, proposal = jax.jit(lambda d, s: d.propose(
        s, DraftContext(sequence, jnp.asarray([5])), jax.random.key(0), num_draft_tokens=3,
        sampling=GREEDY, vocab_size=32))(drafter, state)
    all_tokens, all_features = tokens[0], features[0, :4]
    previous = np.asarray(state.root_hidden[0])
    for depth in range(3):
        draft = int(np.argmax(np.asarray(logits_of(drafter, jnp.asarray(previous)))))
        assert int(proposal.tokens[0, depth]) == draft
        all_tokens = jnp.append(all_tokens, draft)
        all_features = jnp.concatenate([all_features, jnp.asarray(previous)[None]])
        previous = reference_outputs(drafter, all_tokens, all_features, len(all_tokens))[-1]


@pytest.mark.slow  # five verify/commit rounds and a rebuild of the latent cache: 12 s
def test_the_latent_cache_after_commits_equals_one_built_from_scratch(target, drafter):
    """After verify/commit rounds with rows accepting different numbers of drafts, block
    slot s holds the pair of committed token s + 1 exactly as a fresh build writes it, and
    the root output matches: no stale drafts in the latent cache."""
    sampled = dataclasses.replace(drafter, method="sample")
    config = SpeculativeConfig(num_draft_tokens=3, sampling=SamplingConfig(temperature=1.0))
    prompts = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3, 8, 8, 1]]
    state = run_steps(target, sampled, prompts, 5, config)
    lengths = np.asarray(state.lengths)
    head = state.drafter_state
    np.testing.assert_array_equal(np.asarray(head.cache_lengths), lengths)
    fresh = head_state_from_scratch(target, sampled, state.sequence[:, :int(lengths.max())],
                                    state.lengths, 96)
    for row, length in enumerate(lengths):
        for got, want in ((head.cache.keys[0], fresh.cache.keys[0]),
                          (head.cache.values[0], fresh.cache.values[0])):
            np.testing.assert_allclose(np.asarray(got[row, :, :length - 1]),
                                       np.asarray(want[row, :, :length - 1]), rtol=2e-4,
                                       atol=2e-5)
    np.testing.assert_allclose(np.asarray(head.root_hidden), np.asarray(fresh.root_hidden),
                               rtol=2e-4, atol=2e-5)


def test_a_model_block_head_refuses_what_it_cannot_do(drafter, target, tmp_path):
    from specjax.training import HeadTrainConfig, TrainConfig, train_head

    with pytest.raises(ValueError, match="a model block serves an MTP head"):
        Eagle(drafter.params, drafter.embedding, drafter.lm_head,
              dataclasses.replace(drafter.config, kind="eagle1"), block=drafter.block)
    with pytest.raises(TypeError, match="block must be a specjax.drafters.ModelBlock"):
        dataclasses.replace(drafter, block="MtpBlock")
    with pytest.raises(ValueError, match="is not saved as a head file"):
        drafter.save(tmp_path / "head")
    assert not (tmp_path / "head").exists()
    with pytest.raises(ValueError, match="block is model code"):
        train_head(drafter, target, np.zeros((4, 8), np.int32), TrainConfig(steps=1),
                   HeadTrainConfig(method="mtp"), progress=False)


# ---------------------------------------------------------------- DeepSeek-V3 checkpoints

def reference_mtp(w, layer, hf_config, embedding, lm_head, hidden_TD, ids_T):
    """vllm/model_executor/models/deepseek_mtp.py, DeepSeekMultiTokenPredictorLayer.forward
    and DeepSeekMultiTokenPredictor.compute_logits, with transformers' DeepseekV3DecoderLayer
    as the mtp_block (causal over the T pairs, positions 0 .. T - 1): the outputs [T, D]
    (pre-norm, what drafting feeds back) and logits [T, V] of pairs (hidden i, token i + 1),
    the embedding at position 0 zeroed."""
    import torch
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as reference

    config = DeepseekV3Config(**{k: v for k, v in hf_config.items()
                                 if k not in ("architectures", "transformers_version")})
    config._attn_implementation = "eager"
    prefix = f"model.layers.{layer}."
    block = reference.DeepseekV3DecoderLayer(config, layer_idx=layer).double().eval()
    own = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
    state = {k[len(prefix):]: v for k, v in w.items()
             if k.startswith(prefix) and not k[len(prefix):].startswith(own)}
    # The published per-expert tensors, in transformers' fused in-memory layout.
    experts = range(config.n_routed_experts)
    expert = lambda e, name: state.pop(f"mlp.experts.{e}.{name}.weight")  # noqa: E731
    state["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([expert(e, "gate_proj"), expert(e, "up_proj")]) for e in experts])
    state["mlp.experts.down_proj"] = torch.stack([expert(e, "down_proj") for e in experts])
    block.load_state_dict(state, strict=True)
    rotary = reference.DeepseekV3RotaryEmbedding(config)

    def norm(x, weight):  # DeepseekV3RMSNorm
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps))

    length = hidden_TD.shape[0]
    emb = embedding[ids_T].clone()
    emb[0] = 0
    joined = torch.cat([norm(emb, w[prefix + "enorm.weight"]),
                        norm(hidden_TD, w[prefix + "hnorm.weight"])], -1)
    x = joined @ w[prefix + "eh_proj.weight"].T
    positions = torch.arange(length)[None]
    cos, sin = rotary(x[None], positions)
    mask = torch.full((length, length), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        out = block(x[None], attention_mask=mask, position_ids=positions,
                    position_embeddings=(cos.double(), sin.double()))
    out = (out[0] if isinstance(out, tuple) else out)[0]
    return out, norm(out, w[prefix + "shared_head.norm.weight"]) @ lm_head.T


@pytest.mark.slow
def test_deepseek_v3_mtp_from_a_checkpoint_equals_the_reference(tmp_path):
    """transformers writes a DeepSeek-V3 target (YaRN, a correction bias); the published
    MTP module's tensors are added beside it. from_pretrained(dir, mtp=True) returns the
    target and the drafter; the drafter's logits at every prompt length, and its greedy
    chain of 3, equal the reference; speculative decoding with it equals generate; a
    checkpoint that declares the module but lacks it is refused by name."""
    import torch
    from safetensors.torch import load_file
    from test_hf import TOKENS, _hf_model

    from specjax_models.published_layouts import add_deepseek_mtp_module

    hf = _hf_model("deepseek_v3")
    hf.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="carries no multi-token-prediction module"):
        specjax_models.from_pretrained(tmp_path, mtp=True)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    hf_config["num_nextn_predict_layers"] = 1
    (tmp_path / "config.json").write_text(json.dumps(hf_config))
    plain_target = specjax_models.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"hold no model\.layers\.3\.\* tensors"):
        specjax_models.load_drafter(tmp_path, plain_target)
    add_deepseek_mtp_module(tmp_path, seed=4, scale=0.2)
    target, drafter = specjax_models.from_pretrained(tmp_path, mtp=True)
    assert drafter.block is not None and drafter.config.own_lm_head
    layer = hf_config["num_hidden_layers"]
    w = {k: v.double() for k, v in load_file(str(tmp_path / "model.safetensors")).items()}
    prefix = f"model.layers.{layer}."
    ids = TOKENS[0, :12]
    with torch.no_grad():
        hidden = hf.model(torch.from_numpy(ids)[None]).last_hidden_state[0].double()
    _, logits = reference_mtp(w, layer, hf_config, w[prefix + "embed_tokens.weight"],
                              w[prefix + "shared_head.head.weight"], hidden[:-1],
                              torch.from_numpy(ids[1:]))
    # One init over rows of lengths 2 .. 12 of the same tokens: row i's root is the
    # reference's pair i.
    lengths = np.arange(2, 13, dtype=np.int32)
    tokens = jnp.broadcast_to(jnp.asarray(ids, jnp.int32), (len(lengths), 12))
    features = jnp.broadcast_to(jnp.asarray(hidden.numpy(), jnp.float32),
                                (len(lengths), 12, hidden.shape[1]))
    state = drafter.init(tokens, jnp.asarray(lengths), 32, features=features)
    ours = np.asarray(drafter._logits(state.root_hidden))
    np.testing.assert_allclose(ours, logits.numpy(), rtol=1e-4, atol=1e-4)
    # The recursive chain: each draft's pair is (previous output, draft).
    greedy = dataclasses.replace(drafter, method="greedy")
    one = greedy.init(tokens[-1:], jnp.asarray([12]), 32, features=features[-1:])
    sequence = jnp.zeros((1, 32), jnp.int32).at[:, :12].set(tokens[-1:])
    _, proposal = greedy.propose(one, DraftContext(sequence, jnp.asarray([12])),
                                 jax.random.key(0), num_draft_tokens=3, sampling=GREEDY,
                                 vocab_size=target.vocab_size)
    pair_ids, pair_hidden = torch.from_numpy(ids[1:]), hidden[:-1]
    for depth in range(3):
        outputs, logits = reference_mtp(w, layer, hf_config, w[prefix + "embed_tokens.weight"],
                                        w[prefix + "shared_head.head.weight"], pair_hidden,
                                        pair_ids)
        draft = int(logits[-1].argmax())
        assert int(proposal.tokens[0, depth]) == draft, depth
        pair_ids = torch.cat([pair_ids, torch.tensor([draft])])
        pair_hidden = torch.cat([pair_hidden, outputs[-1:]])
    prompts = TOKENS[:, :10].astype(np.int32)
    plain = specjax.generate(target, prompts, max_new_tokens=16, sampling=GREEDY)
    spec = specjax.speculative_generate(target, greedy, prompts, max_new_tokens=16,
                                        num_draft_tokens=3, sampling=GREEDY)
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(plain.tokens))
    # bfloat16 weights (float32 arithmetic): the same logits to bfloat16's precision.
    half = specjax_models.load_drafter(tmp_path, target, dtype="bfloat16")
    assert half.block.params["block"]["mlp"]["gate_kernel"][...].dtype == jnp.bfloat16
    state = half.init(tokens, jnp.asarray(lengths), 32, features=features)
    np.testing.assert_allclose(np.asarray(half._logits(state.root_hidden)), ours, rtol=0.05,
                               atol=0.05)


@pytest.mark.slow
def test_a_routed_expert_of_the_wrong_shape_in_the_mtp_module_is_named(tmp_path):
    """DeepSeek's MTP module stacks its routed experts as the target does: a tensor of the
    wrong shape is named with its file and config.json's shape, in the file's layout."""
    from conftest import tiny_deepseek_model
    from safetensors.numpy import load_file, save_file

    path = tiny_deepseek_model(tmp_path / "deepseek")
    layer = json.loads((path / "config.json").read_text())["num_hidden_layers"]
    target = specjax_models.from_pretrained(path)
    name = f"model.layers.{layer}.mlp.experts.5.up_proj.weight"
    file = next(f for f in sorted(path.glob("*.safetensors")) if name in load_file(str(f)))
    tensors = load_file(str(file))
    expected = tensors[name].shape
    tensors[name] = np.zeros((expected[0] + 1, expected[1]), np.float32)
    save_file(tensors, str(file), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape(
            f"{file}: tensor {name} has shape {(expected[0] + 1, expected[1])}, expected "
            f"{tuple(expected)} by config.json")):
        specjax_models.load_drafter(path, target)
