"""specjax_models.load_drafter against the authors' computations.

The references below are PyTorch transcriptions of the published forwards (cited per
function), run on the same random checkpoint the loader reads: same tensors, same
features and tokens, logits within 1e-4. The loaded drafters' exactness (greedy equality
with generate, the 3-token chi-square) is in tests/test_exactness.py ("published ...").
"""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax_models
from specjax import GREEDY
from specjax.drafters import Eagle, Medusa
from specjax.drafters.base import DraftContext
from specjax.drafters.medusa import medusa_logits
from specjax_models.published_layouts import SyntheticShape, write_synthetic_drafter
from tests.conftest import build_lm, imported_on_use, skip_module_without

skip_module_without("torch")
torch = imported_on_use("torch")

D, V, LAYERS = 64, 32, 8


@pytest.fixture(scope="module")
def deep_lm():
    """8 layers, so an EAGLE-3 head fuses three distinct ones (2, 4, 5)."""
    return build_lm(2, num_layers=LAYERS)


def shape(**overrides) -> SyntheticShape:
    return SyntheticShape(**{"d_model": D, "vocab_size": V, "num_layers": LAYERS,
                             "num_heads": 4, "num_kv_heads": 2, "draft_vocab_size": 20,
                             **overrides})


def tensors(directory) -> dict:
    from safetensors.torch import load_file

    return {k: v.double() if v.is_floating_point() else v
            for k, v in load_file(str(directory / "model.safetensors")).items()}


# ---------------------------------------------------------------- PyTorch references

def rms_norm(x, weight, eps=1e-5):
    # transformers' LlamaRMSNorm (the EAGLE code copies it).
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention(w, prefix, x, heads, kv_heads, theta=10_000.0):
    """LlamaAttention (Qwen2Attention when the checkpoint has q/k/v biases) over T
    positions (causal, positions 0 ... T - 1, as the EAGLE and MTP drafters number the
    pairs), repeat_kv for grouped heads."""
    length = x.shape[0]

    def project(name, count):
        out = x @ w[f"{prefix}self_attn.{name}_proj.weight"].T
        if f"{prefix}self_attn.{name}_proj.bias" in w:
            out = out + w[f"{prefix}self_attn.{name}_proj.bias"]
        return out.view(length, count, -1).transpose(0, 1)

    q, k, v = project("q", heads), project("k", kv_heads), project("v", kv_heads)
    hd = q.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(heads // kv_heads, dim=0)
    v = v.repeat_interleave(heads // kv_heads, dim=0)
    scores = q @ k.transpose(1, 2) / hd ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(length, length, dtype=torch.bool), 1),
                                float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(length, -1)
    return out @ w[prefix + "self_attn.o_proj.weight"].T


def mlp(w, prefix, x):
    gate = x @ w[prefix + "mlp.gate_proj.weight"].T
    return (torch.nn.functional.silu(gate) * (x @ w[prefix + "mlp.up_proj.weight"].T)) \
        @ w[prefix + "mlp.down_proj.weight"].T


def eagle3_reference(w, prefix, embedding, hidden_TD, ids_T, norm_before_residual=False):
    """SafeAILab/EAGLE eagle/model/cnets.py LlamaDecoderLayeremb.forward and Model.forward
    (speculators' Eagle3FirstLayerMixin.forward is the same with norm_before_residual):
    the head's outputs [T, D] for pairs (hidden t, token t + 1)."""
    emb = embedding[ids_T]
    residual = hidden_TD
    hidden = rms_norm(hidden_TD, w[prefix + "hidden_norm.weight"])
    if norm_before_residual:
        residual = hidden
    x = torch.cat((rms_norm(emb, w[prefix + "input_layernorm.weight"]), hidden), dim=-1)
    h = residual + attention(w, prefix, x, 4, 2)
    return h + mlp(w, prefix, rms_norm(h, w[prefix + "post_attention_layernorm.weight"]))


def eagle3_logits(w, out_TD):
    """Model.topK_genrate: lm_head(norm(out)) over the draft vocabulary, ids + d2t."""
    return rms_norm(out_TD, w["norm.weight"]) @ w["lm_head.weight"].T


def eagle1_reference(w, embedding, lm_head, hidden_TD, ids_T):
    """eagle/model/cnets1.py: fc(cat(embedding, feature)) then layers.0 with no
    input_layernorm (index 0); logits = the target's lm_head(out), no final norm."""
    x = torch.cat((embedding[ids_T], hidden_TD), dim=-1) @ w["fc.weight"].T + w["fc.bias"]
    h = x + attention(w, "layers.0.", x, 4, 2)
    h = h + mlp(w, "layers.0.", rms_norm(h, w["layers.0.post_attention_layernorm.weight"]))
    return h, h @ lm_head.T


def mimo_mtp_reference(w, embedding, lm_head, hidden_TD, ids_T, eps):
    """Xiaomi's vLLM mimo_mtp.py MiMoMultiTokenPredictorLayer.forward: the embedding at
    position 0 zeroed, input_proj(cat(hidden_layernorm(h), token_layernorm(emb))), a
    Qwen2 decoder layer, final_layernorm; logits through the target's lm_head."""
    p = "model.mtp_layers.0."
    emb = embedding[ids_T].clone()
    emb[0] = 0
    x = torch.cat((rms_norm(hidden_TD, w[p + "hidden_layernorm.weight"], eps),
                   rms_norm(emb, w[p + "token_layernorm.weight"], eps)), dim=-1) \
        @ w[p + "input_proj.weight"].T
    h = x + attention(w, p, rms_norm(x, w[p + "input_layernorm.weight"], eps), 4, 2)
    h = h + mlp(w, p, rms_norm(h, w[p + "post_attention_layernorm.weight"], eps))
    return rms_norm(h, w[p + "final_layernorm.weight"], eps) @ lm_head.T


def medusa_reference(w, hidden_D, heads, layers):
    """medusa/model/medusa_model.py: medusa_head[i](hidden) for each head."""
    out = []
    for i in range(heads):
        x = hidden_D
        for j in range(layers):
            x = x + torch.nn.functional.silu(
                x @ w[f"medusa_head.{i}.{j}.linear.weight"].T
                + w[f"medusa_head.{i}.{j}.linear.bias"])
        out.append(x @ w[f"medusa_head.{i}.{layers}.weight"].T)
    return torch.stack(out)


# ---------------------------------------------------------------- conformance

def our_chain(drafter: Eagle, tokens, features, steps):
    """The drafter's root logits after init, and its greedy chain of `steps` drafts."""
    length = tokens.shape[1]
    state = drafter.init(tokens, jnp.asarray([length]), 32, features=features)
    sequence = jnp.zeros((1, 32), jnp.int32).at[:, :length].set(tokens)
    _, proposal = drafter.propose(state, DraftContext(sequence, jnp.asarray([length])),
                                  jax.random.key(0), num_draft_tokens=steps,
                                  sampling=GREEDY, vocab_size=V)
    return np.asarray(drafter._logits(state.root_hidden))[0], np.asarray(proposal.tokens)[0]


@pytest.mark.parametrize("layout,before,fuse_norm,norm_output", [
    ("eagle3", False, None, False), ("eagle3-speculators", False, None, False),
    # EAGLE 3.1's switches in the slow set (the unit suite keeps both layouts).
    pytest.param("eagle3-speculators", True, "norm_before_fc", False, marks=pytest.mark.slow),
    pytest.param("eagle3-speculators", False, "fc_norm", True, marks=pytest.mark.slow)])
def test_eagle3_logits_and_chain_equal_the_authors(deep_lm, tmp_path, layout, before,
                                                   fuse_norm, norm_output):
    """The authors' forward, and speculators' switches: norm_before_residual,
    norm_before_fc (one RMSNorm over the concatenated layers), fc_norm (one per layer),
    norm_output (EAGLE 3.1: the output normalised before it is fed back)."""
    switches = {} if fuse_norm is None else {fuse_norm: True}
    directory = write_synthetic_drafter(tmp_path, layout, shape(), seed=3, scale=0.3,
                                        norm_before_residual=before, norm_output=norm_output,
                                        **switches)
    drafter = specjax_models.load_drafter(directory, deep_lm, method="greedy")
    assert drafter.config.layer_input == "concat" and drafter.feature_layers == (2, 4, 5)
    w = tensors(directory)
    prefix = "midlayer." if layout == "eagle3" else "layers.0."
    embedding = torch.from_numpy(np.asarray(specjax_models.embedding_and_head(deep_lm)[0],
                                            np.float64))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, (1, 7)).astype(np.int32)
    # Target features: three fused layers and the final state, [1, T, 4, D].
    features = rng.standard_normal((1, 7, 4, D)).astype(np.float32)
    # speculators core.py forward: input_norm or fc_norm, then fc.
    aux = torch.from_numpy(features[0, :, :3].reshape(7, 3 * D).astype(np.float64))
    if fuse_norm == "norm_before_fc":
        aux = rms_norm(aux, w["input_norm.weight"])
    if fuse_norm == "fc_norm":
        aux = torch.cat([rms_norm(chunk, w[f"fc_norm.{i}.weight"])
                         for i, chunk in enumerate(aux.chunk(3, dim=-1))], dim=-1)
    fused = aux @ w["fc.weight"].T
    ids = torch.from_numpy(tokens[0].astype(np.int64))
    d2t = w["d2t"]
    # The authors pair hidden t with token t + 1 and draft from the last pair.
    hidden, pair_ids = list(fused[:-1]), list(ids[1:])
    reference_tokens, root = [], None
    for step in range(4):
        out = eagle3_reference(w, prefix, embedding, torch.stack(hidden),
                               torch.stack(pair_ids), before)
        if norm_output:  # fed back normalised; the logits read it as it is
            out = rms_norm(out, w["norm.weight"])
            logits = out[-1] @ w["lm_head.weight"].T
        else:
            logits = eagle3_logits(w, out[-1])
        if step == 0:
            root = logits
        draft = int(logits.argmax())
        token = draft + int(d2t[draft])
        reference_tokens.append(token)
        hidden.append(out[-1])
        pair_ids.append(torch.tensor(token))
    ours_root, ours_tokens = our_chain(drafter, jnp.asarray(tokens), jnp.asarray(features), 4)
    mapped = np.full(V, -np.inf)
    mapped[np.arange(20) + d2t.numpy()] = root.numpy()
    np.testing.assert_allclose(ours_root, mapped, rtol=1e-4, atol=1e-4)
    assert ours_tokens.tolist() == reference_tokens


def test_eagle1_logits_and_chain_equal_the_authors(tiny_lm, tmp_path):
    directory = write_synthetic_drafter(tmp_path, "eagle1", shape(num_layers=2), seed=5,
                                        scale=0.3)
    drafter = specjax_models.load_drafter(directory, tiny_lm, method="greedy")
    w = tensors(directory)
    embedding, lm_head = (torch.from_numpy(np.asarray(a, np.float64))
                          for a in specjax_models.embedding_and_head(tiny_lm))
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, V, (1, 6)).astype(np.int32)
    features = rng.standard_normal((1, 6, D)).astype(np.float32)
    hidden = list(torch.from_numpy(features[0, :-1].astype(np.float64)))
    pair_ids = list(torch.from_numpy(tokens[0, 1:].astype(np.int64)))
    reference_tokens, root = [], None
    for step in range(4):
        out, logits = eagle1_reference(w, embedding, lm_head, torch.stack(hidden),
                                       torch.stack(pair_ids))
        root = logits[-1] if step == 0 else root
        reference_tokens.append(int(logits[-1].argmax()))
        hidden.append(out[-1])
        pair_ids.append(torch.tensor(reference_tokens[-1]))
    ours_root, ours_tokens = our_chain(drafter, jnp.asarray(tokens), jnp.asarray(features), 4)
    np.testing.assert_allclose(ours_root, root.numpy(), rtol=1e-4, atol=1e-4)
    assert ours_tokens.tolist() == reference_tokens


def test_mimo_mtp_from_a_target_checkpoint_equals_the_authors(tmp_path):
    """A MiMo checkpoint (Qwen2 blocks plus model.mtp_layers.0): from_pretrained reads the
    target and leaves the MTP module alone; load_drafter reads the module on that target;
    the first draft's logits equal Xiaomi's layer."""
    from conftest import tiny_hub_model
    from safetensors.numpy import load_file, save_file

    directory = tiny_hub_model(tmp_path / "mimo", 2)
    mtp = write_synthetic_drafter(tmp_path / "mtp", "mimo-mtp",
                                  shape(d_model=32, vocab_size=64, num_layers=2), seed=4,
                                  scale=0.3)
    merged = {**load_file(str(directory / "model.safetensors")),
              **load_file(str(mtp / "model.safetensors"))}
    save_file(merged, str(directory / "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    config.update(model_type="mimo", architectures=["MiMoForCausalLM"],
                  num_nextn_predict_layers=1)
    (directory / "config.json").write_text(json.dumps(config))
    target, drafter = specjax_models.from_pretrained(directory, mtp=True)
    assert drafter.config.kind == "mtp" and drafter.config.qkv_bias
    with pytest.raises(ValueError, match="carries no multi-token-prediction module"):
        specjax_models.from_pretrained(tiny_hub_model(tmp_path / "plain", 1), mtp=True)
    w = {k: v for k, v in tensors(directory).items() if k.startswith("model.mtp_layers.")}
    embedding, lm_head = (torch.from_numpy(np.asarray(a, np.float64))
                          for a in specjax_models.embedding_and_head(target))
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 64, (1, 6)).astype(np.int32)
    features = rng.standard_normal((1, 6, 32)).astype(np.float32)
    logits = mimo_mtp_reference(w, embedding, lm_head,
                                torch.from_numpy(features[0, :-1].astype(np.float64)),
                                torch.from_numpy(tokens[0, 1:].astype(np.int64)),
                                config["rms_norm_eps"])
    state = drafter.init(jnp.asarray(tokens), jnp.asarray([6]), 32,
                         features=jnp.asarray(features))
    np.testing.assert_allclose(np.asarray(drafter._logits(state.root_hidden))[0],
                               logits[-1].numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layers,pickled", [(1, False),
                                            pytest.param(2, True, marks=pytest.mark.slow)])
def test_medusa1_logits_equal_the_authors(tiny_lm, tmp_path, layers, pickled):
    directory = write_synthetic_drafter(tmp_path, "medusa1", shape(medusa_layers=layers),
                                        seed=7, scale=0.3)
    w = tensors(directory)
    if pickled:  # medusa_lm_head.pt: medusa_head.state_dict(), keys without the prefix
        torch.save({k[len("medusa_head."):]: v.float() for k, v in w.items()},
                   directory / "medusa_lm_head.pt")
        (directory / "model.safetensors").unlink()
    drafter = specjax_models.load_drafter(directory, tiny_lm)
    assert isinstance(drafter, Medusa) and drafter.num_heads == 3
    hidden = np.random.default_rng(2).standard_normal((5, D)).astype(np.float32)
    ours = np.asarray(medusa_logits(drafter.params, drafter.lm_head, jnp.asarray(hidden)))
    reference = np.stack([medusa_reference(w, torch.from_numpy(h.astype(np.float64)), 3,
                                           layers).numpy() for h in hidden])
    np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- refusals

def test_bad_checkpoints_are_refused_by_file_and_key(deep_lm, tiny_lm, tmp_path):
    from safetensors.numpy import load_file, save_file

    good = write_synthetic_drafter(tmp_path / "good", "eagle3-speculators", shape())
    weights = load_file(str(good / "model.safetensors"))
    config = json.loads((good / "config.json").read_text())

    def variant(name, tensors=None, **config_changes):
        directory = tmp_path / name
        directory.mkdir()
        save_file(tensors if tensors is not None else weights,
                  str(directory / "model.safetensors"))
        (directory / "config.json").write_text(json.dumps({**config, **config_changes}))
        return directory

    extra = variant("extra", {**weights, "layers.0.self_attn.q_norm.weight": np.ones(16,
                                                                                     np.float32)})
    with pytest.raises(ValueError, match="q_norm.weight.*no place"):
        specjax_models.load_drafter(extra, deep_lm)
    missing = variant("missing", {k: v for k, v in weights.items() if k != "norm.weight"})
    with pytest.raises(ValueError, match="lack 'norm.weight'"):
        specjax_models.load_drafter(missing, deep_lm)
    with pytest.raises(ValueError, match="64 wide.*this target is 64 wide|onto the model"):
        specjax_models.load_drafter(good, build_lm(0, d_model=32, num_heads=2,
                                                   num_kv_heads=1, num_layers=LAYERS))
    repeated = dict(weights, d2t=-np.arange(20, dtype=np.int64))  # every draft id -> 0
    with pytest.raises(ValueError, match="d2t.*maps draft ids to repeated target ids"):
        specjax_models.load_drafter(variant("d2t", repeated), deep_lm)
    other = dict(weights, d2t=np.zeros(20, np.int64))  # ids 0 ... 19, which t2d does not mark
    with pytest.raises(ValueError, match="t2d.*disagree"):
        specjax_models.load_drafter(variant("t2d", other), deep_lm)
    with pytest.raises(ValueError, match="norm_before_fc and fc_norm are both true"):
        specjax_models.load_drafter(variant("both", norm_before_fc=True, fc_norm=True),
                                    deep_lm)
    with pytest.raises(ValueError, match="speculators 'dflash' drafter"):
        specjax_models.load_drafter(variant("dflash", speculators_model_type="dflash"),
                                    deep_lm)
    qwen3 = dict(config["transformer_layer_config"], model_type="qwen3")
    with pytest.raises(ValueError, match="'qwen3' decoder layer"):
        specjax_models.load_drafter(variant("qwen3", transformer_layer_config=qwen3), deep_lm)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no drafter weights"):
        specjax_models.load_drafter(tmp_path / "empty", deep_lm)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    save_file({"model.layers.0.mlp.up_proj.weight": np.ones((2, 2), np.float32)},
              str(unknown / "model.safetensors"))
    with pytest.raises(ValueError, match="not a drafter layout"):
        specjax_models.load_drafter(unknown, deep_lm)
    cut = variant("cut")
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match="truncated|download it again"):
        specjax_models.load_drafter(cut, deep_lm)


def test_a_pickled_file_without_torch_is_refused_with_the_conversion(tiny_lm, tmp_path,
                                                                    monkeypatch):
    import sys

    directory = write_synthetic_drafter(tmp_path / "medusa", "medusa1", shape())
    torch.save({k: v.float() for k, v in tensors(directory).items()},
               directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="cannot be read as PyTorch weights"):
        specjax_models.load_drafter(_damaged(directory), tiny_lm)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails
    with pytest.raises(ValueError, match="pickled PyTorch file and torch is not installed.*"
                                         "safetensors.torch"):
        specjax_models.load_drafter(directory, tiny_lm)


def _damaged(directory):
    """A copy of `directory` whose pytorch_model.bin is not a pickle."""
    import shutil

    copy = directory.parent / (directory.name + "-damaged")
    shutil.copytree(directory, copy)
    (copy / "pytorch_model.bin").write_bytes(b"not a pickle")
    return copy


@pytest.mark.slow
def test_a_loaded_head_saves_and_loads_with_its_own_lm_head(deep_lm, tiny_lm, tmp_path):
    """Eagle.save keeps a published EAGLE-3 head's own LM head (and embedding when it has
    one); loading it back onto the target gives the same logits, not the target's head."""
    directory = write_synthetic_drafter(tmp_path / "eagle3", "eagle3-speculators", shape(),
                                        seed=3, scale=0.3, fc_norm=True, norm_output=True)
    head = specjax_models.load_drafter(directory, deep_lm, dtype="bfloat16")
    assert head.config.own_lm_head and not head.config.own_embedding
    head.save(tmp_path / "saved")
    embedding, lm_head = specjax_models.embedding_and_head(deep_lm)
    again = Eagle.load(tmp_path / "saved", embedding, lm_head)
    assert again.config == head.config
    features = jax.random.normal(jax.random.key(0), (1, 5, 4, D))
    tokens, lengths = jnp.asarray([[1, 2, 3, 4, 5]]), jnp.asarray([5])
    roots = [h._logits(h.init(tokens, lengths, 16, features=features).root_hidden)
             for h in (head, again)]
    np.testing.assert_allclose(np.asarray(roots[0]), np.asarray(roots[1]), rtol=1e-6)
    medusa = specjax_models.load_drafter(
        write_synthetic_drafter(tmp_path / "medusa", "medusa1", shape(medusa_layers=2)),
        tiny_lm, dtype="bfloat16")
    medusa.save(tmp_path / "medusa_saved")
    loaded = Medusa.load(tmp_path / "medusa_saved", specjax_models.embedding_and_head(
        tiny_lm)[1])
    assert loaded.num_layers == 2 and loaded.params["lm_heads"].shape == (3, V, D)


@pytest.mark.slow  # imports the package and its serving stack (fschat)
def test_medusa1_equals_the_medusa_llm_package(tiny_lm, tmp_path):
    """Against the authors' own package (medusa-llm installs beside the pinned torch): its
    ResBlock, the head structure MedusaModelABC.__init__ builds (one ResBlock repeated,
    then an LM head), the synthetic checkpoint loaded with strict key matching."""
    medusa_model = pytest.importorskip("medusa.model.medusa_model")
    from safetensors.torch import load_file

    directory = write_synthetic_drafter(tmp_path, "medusa1", shape(medusa_layers=2), seed=8,
                                        scale=0.3)
    heads = torch.nn.ModuleList([
        torch.nn.Sequential(*([medusa_model.ResBlock(D)] * 2),
                            torch.nn.Linear(D, V, bias=False)) for _ in range(3)])
    state = load_file(str(directory / "model.safetensors"))
    heads.load_state_dict({k[len("medusa_head."):]: v for k, v in state.items()},
                          strict=True)
    hidden = np.random.default_rng(4).standard_normal((5, D)).astype(np.float32)
    with torch.no_grad():
        reference = torch.stack([head(torch.from_numpy(hidden)) for head in heads], dim=1)
    drafter = specjax_models.load_drafter(directory, tiny_lm)
    ours = np.asarray(medusa_logits(drafter.params, drafter.lm_head, jnp.asarray(hidden)))
    np.testing.assert_allclose(ours, reference.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fuse_norm", [None, "norm_before_fc", "fc_norm"])
def test_unsorted_aux_layer_ids_read_fc_in_layer_order_as_vllm_does(deep_lm, tmp_path,
                                                                    fuse_norm):
    """vLLM concatenates the aux hidden states as its layer loop meets them, so fc's column
    blocks (and speculators' fuse norms) follow the layers' order whatever the config's."""
    switches = {} if fuse_norm is None else {fuse_norm: True}
    good = write_synthetic_drafter(tmp_path / "sorted", "eagle3-speculators", shape(), seed=4,
                                   **switches)
    unsorted = tmp_path / "unsorted"
    shutil.copytree(good, unsorted)
    config = json.loads((good / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    (unsorted / "config.json").write_text(json.dumps(
        {**config, "eagle_aux_hidden_state_layer_ids": [5, 2, 4]}))
    expected = specjax_models.load_drafter(good, deep_lm)
    loaded = specjax_models.load_drafter(unsorted, deep_lm)
    assert loaded.feature_layers == expected.feature_layers == (2, 4, 5)
    for name in ("fuse", "fuse_norm"):
        if name in expected.params:
            np.testing.assert_array_equal(loaded.params[name], expected.params[name])
    w = tensors(good)
    np.testing.assert_array_equal(loaded.params["fuse"], w["fc.weight"].numpy().T)


@pytest.mark.parametrize("where, value, message", [
    ("layer", {"num_attention_heads": None}, "num_attention_heads is null"),
    ("layer", {"num_attention_heads": 0}, "num_attention_heads is 0, expected a positive"),
    ("layer", {"intermediate_size": "big"}, "intermediate_size is 'big'"),
    ("layer", {"num_key_value_heads": 2.5}, "num_key_value_heads is 2.5"),
    ("layer", {"rms_norm_eps": "tiny"}, "rms_norm_eps is 'tiny', expected a positive number"),
    ("layer", {"rope_theta": "x"}, "rope settings"),
    ("top", {"transformer_layer_config": {}}, "num_attention_heads is missing"),
    ("top", {"draft_vocab_size": -3}, "draft_vocab_size is -3"),
])
def test_unusable_config_values_are_refused_by_name(deep_lm, tmp_path, where, value, message):
    good = write_synthetic_drafter(tmp_path / "good", "eagle3-speculators", shape())
    config = json.loads((good / "config.json").read_text())
    if where == "layer":
        config["transformer_layer_config"] = {**config["transformer_layer_config"], **value}
    else:
        config.update(value)
    (good / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message) as raised:
        specjax_models.load_drafter(good, deep_lm)
    assert "config.json" in str(raised.value) or "rope" in message


def test_a_drafter_without_its_config_or_width_is_refused_by_name(deep_lm, tmp_path):
    eagle = write_synthetic_drafter(tmp_path / "eagle", "eagle1", shape(num_layers=2))
    (eagle / "config.json").unlink()
    with pytest.raises(ValueError, match=r"config.json \(absent\).*num_attention_heads is "
                                         "missing"):
        specjax_models.load_drafter(eagle, deep_lm)
    mimo = write_synthetic_drafter(tmp_path / "mimo", "mimo-mtp", shape())
    config = json.loads((mimo / "config.json").read_text())
    del config["hidden_size"]
    (mimo / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hidden_size is missing"):
        specjax_models.load_drafter(mimo, deep_lm)
