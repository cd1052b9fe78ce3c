"""specjax_models.latent_attention (DeepSeek's MLA): the absorbed attention equals the
expanded one written out here, the cache holds the latent and the rotary key only, every
cache path (decode, verify, blocks, prefill in chunks, a tree compacted) equals the full
forward, and speculative decoding on it is greedy decoding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import specjax
import specjax_models
from specjax.lm.rope import apply_rotary, inverse_frequencies

MLA = dict(vocab_size=48, num_layers=2, d_model=32, num_heads=4, num_kv_heads=4, d_ff=64,
           max_seq_len=64, kv_lora_rank=16, q_lora_rank=12, qk_nope_head_dim=8,
           qk_rope_head_dim=4, v_head_dim=6, attention_block_size=8)


def mla_lm(seed=0, **fields) -> specjax.CausalLM:
    config = specjax_models.TransformerConfig(**(MLA | fields))
    return specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(seed)))


def expanded_attention(attention, x_BTD, positions_BT):
    """MLA as its paper writes it: every head's key [k_nope, k_rope] and value expanded
    from the latent, plain causal softmax attention."""
    cfg = attention.config
    batch, length, _ = x_BTD.shape
    heads, nope, rope = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
    if cfg.q_lora_rank:
        q = attention.q_b_proj(attention.q_a_norm(attention.q_a_proj(x_BTD)))
    else:
        q = attention.q_proj(x_BTD)
    q = q.reshape(batch, length, heads, nope + rope)
    inv_freq = inverse_frequencies(rope, cfg.rope_theta)
    q = jnp.concatenate([q[..., :nope], apply_rotary(q[..., nope:], positions_BT, inv_freq)], -1)
    compressed = attention.kv_a_proj(x_BTD)
    latent = attention.kv_a_norm(compressed[..., :cfg.kv_lora_rank])
    k_rope = apply_rotary(compressed[..., None, cfg.kv_lora_rank:], positions_BT, inv_freq)
    kv = attention.kv_b_proj(latent).reshape(batch, length, heads, nope + cfg.v_head_dim)
    keys = jnp.concatenate([kv[..., :nope], jnp.broadcast_to(k_rope, (batch, length, heads,
                                                                       rope))], -1)
    scores = jnp.einsum("BTNH,BSNH->BNTS", q, keys) * (nope + rope) ** -0.5
    scores = jnp.where(jnp.tril(jnp.ones((length, length), bool)), scores, -jnp.inf)
    out = jnp.einsum("BNTS,BSNV->BTNV", jax.nn.softmax(scores, -1), kv[..., nope:])
    return attention.o_proj(out.reshape(batch, length, heads * cfg.v_head_dim))


@pytest.mark.parametrize("q_lora_rank", [12, 0])
def test_absorbed_attention_equals_the_expanded_form(q_lora_rank):
    config = specjax_models.TransformerConfig(**(MLA | dict(q_lora_rank=q_lora_rank)))
    attention = specjax_models.Transformer(config, rngs=nnx.Rngs(1)).layers[0].attention
    x = jax.random.normal(jax.random.key(2), (2, 9, 32))
    positions = jnp.broadcast_to(jnp.arange(9) + 3, (2, 9))
    out, _ = attention(x, positions, None, None, None, None, None, None)
    np.testing.assert_allclose(np.asarray(out),
                               np.asarray(expanded_attention(attention, x, positions)),
                               atol=2e-6, rtol=1e-5)


def test_the_cache_holds_the_latent_and_the_rotary_key_only():
    lm = mla_lm()
    cache = lm.init_cache(3, 40)
    assert [k.shape for k in cache.keys] == [(3, 1, 40, 16)] * 2
    assert [v.shape for v in cache.values] == [(3, 1, 40, 4)] * 2
    # 20 floats per token and layer, against 2 x 4 heads x 12 for full keys and values
    per_token = sum(k.shape[-1] + v.shape[-1] for k, v in zip(cache.keys, cache.values,
                                                              strict=True))
    assert per_token == 2 * (16 + 4)


def test_every_cache_path_equals_the_full_forward():
    """Chunks of 5, 1, 3 and 11 tokens (decode, verify and prefill paths; the cache read
    in blocks of 8 slots) give the full forward's logits."""
    lm = mla_lm()
    tokens = np.random.default_rng(0).integers(0, 48, (2, 24)).astype(np.int32)
    reference = np.asarray(lm.logits(tokens))
    apply = jax.jit(lambda lm, t, p, c, n: lm.apply(t, p, c, n))
    cache, lengths = lm.init_cache(2, 32), np.zeros(2, np.int32)
    for chunk in (5, 1, 1, 3, 3, 11):
        cols = lengths[:, None] + np.arange(chunk)[None]
        logits, _, cache = apply(lm, np.take_along_axis(tokens, cols, 1), cols, cache, lengths)
        np.testing.assert_allclose(np.asarray(logits),
                                   np.take_along_axis(reference, cols[..., None], 1),
                                   atol=2e-5, rtol=1e-4)
        lengths = lengths + chunk


@pytest.mark.slow  # four decoders compiled; the unit suite keeps the cache paths above
def test_speculative_decoding_on_latent_attention_is_greedy_decoding():
    """A chain, a static tree (compaction of the latent cache) and a chunked prefill, on
    unrolled and scanned layers, against generate."""
    lm = mla_lm(3)
    draft = specjax_models.first_layers(lm, 1)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [30, 2, 5, 11]]
    plain = specjax.generate(lm, prompts, max_new_tokens=12, sampling=specjax.GREEDY)
    tree = specjax.TreeShape.from_paths([[0], [1], [0, 0], [1, 0], [0, 0, 0]])
    chunked = lm.with_prefill_chunk(3)
    for target, run in ((lm, dict(num_draft_tokens=3)),
                        (lm, dict(tree=tree, num_draft_tokens=None)),
                        (chunked, dict(num_draft_tokens=2))):
        out = specjax.speculative_generate(target, draft, prompts, max_new_tokens=12,
                                           sampling=specjax.GREEDY, **run)
        np.testing.assert_array_equal(out.tokens, plain.tokens, err_msg=str(run))
    scanned = specjax_models.Transformer(
        dataclasses.replace(specjax_models.TransformerConfig(**MLA), scan_layers=True),
        rngs=nnx.Rngs(3))
    again = specjax.generate(specjax.CausalLM.from_nnx(scanned), prompts, max_new_tokens=12,
                             sampling=specjax.GREEDY)
    np.testing.assert_array_equal(again.tokens, plain.tokens)


@pytest.mark.parametrize("fields, message", [
    (dict(kv_lora_rank=0), "q_lora_rank is a field of multi-head latent attention"),
    (dict(qk_rope_head_dim=0), "needs qk_rope_head_dim > 0"),
    (dict(qk_rope_head_dim=5), "qk_rope_head_dim must be even"),
    (dict(num_kv_heads=2), r"num_kv_heads \(2\) must equal num_heads \(4\)"),
    (dict(qk_norm=True), "no q/k norm"),
    (dict(v_head_dim=-1), "v_head_dim must be an int >= 0"),
])
def test_configurations_latent_attention_cannot_compute_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        specjax_models.TransformerConfig(**(MLA | fields))
