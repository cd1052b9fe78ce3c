"""specjax_models.transformer: incremental decoding equals the full forward, masks,
dtypes, shapes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import build_lm, tiny_config
from flax import nnx

import specjax
import specjax_models


def _random_tokens(seed, shape, vocab):
    return np.random.default_rng(seed).integers(0, vocab, size=shape).astype(np.int32)


def test_issue_example_config_builds():
    config = specjax_models.TransformerConfig(vocab_size=32, num_layers=2, d_model=64, num_heads=4,
                                      num_kv_heads=2, d_ff=128, max_seq_len=128)
    model = specjax_models.Transformer(config, rngs=nnx.Rngs(0))
    # embed 32*64 + lm_head 64*32 + final norm 64
    # + per layer: q 64*64, k 64*32, v 64*32, o 64*64, mlp 3*64*128, two norms 2*64
    per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64
    assert specjax_models.count_params(model) == 32 * 64 * 2 + 64 + 2 * per_layer


@pytest.mark.parametrize("overrides", [
    {},
    {"qkv_bias": True, "tie_embeddings": True},
    {"num_kv_heads": 4, "head_dim": 8, "rope_theta": 500_000.0},
], ids=["gqa", "bias+tied", "mha+head_dim"])
def test_incremental_decoding_matches_full_forward(overrides):
    """Prefill ragged prompts, then 1 token at a time, then 3 at a time: the cached logits
    equal the no-cache full forward of each row's whole sequence."""
    lm = build_lm(1, **overrides)
    batch, total, vocab = 3, 14, lm.vocab_size
    sequences = _random_tokens(0, (batch, total), vocab)
    prompt_lengths = np.array([3, 5, 4], np.int32)
    reference = np.asarray(lm.logits(sequences))

    apply = jax.jit(lambda lm, t, p, c, n: lm.apply(t, p, c, n))
    cache = lm.init_cache(batch, 32)
    width = prompt_lengths.max()
    prefill_tokens = np.where(np.arange(width)[None] < prompt_lengths[:, None],
                              sequences[:, :width], 0)
    positions = np.broadcast_to(np.arange(width), (batch, width))
    logits, _, cache = apply(lm, prefill_tokens, positions, cache, np.zeros(batch, np.int32))
    for b in range(batch):
        np.testing.assert_allclose(logits[b, : prompt_lengths[b]],
                                   reference[b, : prompt_lengths[b]], rtol=1e-5, atol=1e-5)
    lengths = prompt_lengths.copy()
    for chunk in [1, 1, 1, 3, 3]:
        rows = np.arange(batch)[:, None]
        cols = lengths[:, None] + np.arange(chunk)[None]
        logits, _, cache = apply(lm, sequences[rows, cols], cols, cache, lengths)
        np.testing.assert_allclose(logits, reference[rows, cols], rtol=1e-5, atol=1e-5)
        lengths = lengths + chunk


@pytest.mark.parametrize("overrides", [{}, {"sliding_window": 20, "sliding_layers": "even"}],
                         ids=["full", "sliding-window"])
def test_both_cache_attention_paths_match_full_forward(overrides):
    """Inputs longer than READ_BEFORE_WRITE_MAX_TOKENS write the cache first and attend
    once; shorter ones attend to the old cache and the new tokens as two segments and write
    after. Both, on empty and on filled caches (ragged rows), give the full-forward logits."""
    long = specjax_models.transformer.READ_BEFORE_WRITE_MAX_TOKENS + 6
    lm = build_lm(2, max_seq_len=256, **overrides)
    batch = 2
    sequences = _random_tokens(5, (batch, 2 * long + 8), lm.vocab_size)
    reference = np.asarray(lm.logits(sequences))
    apply = jax.jit(lambda lm, t, p, c, n: lm.apply(t, p, c, n))
    cache = lm.init_cache(batch, 256)
    lengths = np.zeros(batch, np.int32)
    # 3 tokens into each row, then row 0 rolls back to 1 (its stale slots get overwritten):
    # ragged lengths [1, 3]; then long and short inputs on the filled cache.
    for chunk in [3, long, 2, 1, long, 1]:
        rows = np.arange(batch)[:, None]
        cols = lengths[:, None] + np.arange(chunk)[None]
        logits, _, cache = apply(lm, sequences[rows, cols], cols, cache, lengths)
        np.testing.assert_allclose(logits, reference[rows, cols], rtol=2e-5, atol=2e-5)
        lengths = lengths + chunk if chunk != 3 else np.array([1, 3], np.int32)


def test_rollback_by_length_ignores_stale_slots(tiny_lm):
    """Writing wrong tokens and then keeping the old length leaves no trace."""
    batch = 2
    tokens = _random_tokens(1, (batch, 8), tiny_lm.vocab_size)
    apply = jax.jit(lambda lm, t, p, c, n: lm.apply(t, p, c, n))
    cache = tiny_lm.init_cache(batch, 16)
    positions = np.broadcast_to(np.arange(6), (batch, 6))
    _, _, cache = apply(tiny_lm, tokens[:, :6], positions, cache, np.zeros(batch, np.int32))
    junk = _random_tokens(2, (batch, 4), tiny_lm.vocab_size)
    junk_positions = 6 + np.broadcast_to(np.arange(4), (batch, 4))
    _, _, cache = apply(tiny_lm, junk, junk_positions, cache, np.full(batch, 6, np.int32))
    logits, _, _ = apply(tiny_lm, tokens[:, 6:8], junk_positions[:, :2], cache,
                         np.full(batch, 6, np.int32))
    np.testing.assert_allclose(logits, tiny_lm.logits(tokens)[:, 6:8], rtol=1e-5, atol=1e-5)


def test_causality_later_tokens_never_change_earlier_logits(tiny_lm):
    tokens = _random_tokens(3, (2, 12), tiny_lm.vocab_size)
    base = np.asarray(tiny_lm.logits(tokens))
    for t in [0, 5, 11]:
        changed = tokens.copy()
        changed[:, t] = (changed[:, t] + 7) % tiny_lm.vocab_size
        logits = np.asarray(tiny_lm.logits(changed))
        np.testing.assert_array_equal(logits[:, :t], base[:, :t])
        assert not np.allclose(logits[:, t], base[:, t])


def test_tree_mask_with_shared_positions_equals_each_branch(tiny_lm):
    """Two sibling branches in one forward (a token tree) give each branch's linear logits:
    the mask and the caller-given positions decouple slots from positions."""
    prefix = _random_tokens(4, (1, 5), tiny_lm.vocab_size)
    branch_a = np.array([[3, 9]], np.int32)
    branch_b = np.array([[11, 4]], np.int32)
    cache = tiny_lm.init_cache(1, 16)
    positions = np.arange(5)[None]
    _, _, cache = tiny_lm.apply(prefix, positions, cache, np.zeros(1, np.int32))
    # Slots: a0 a1 b0 b1 at positions 5 6 5 6; b never sees a and vice versa.
    tree_tokens = np.concatenate([branch_a, branch_b], axis=1)
    tree_positions = np.array([[5, 6, 5, 6]])
    mask = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], bool)[None]
    logits, _, _ = tiny_lm.apply(tree_tokens, tree_positions, cache, np.full(1, 5, np.int32),
                                 mask)
    full_a = tiny_lm.logits(np.concatenate([prefix, branch_a], 1))[:, 5:]
    full_b = tiny_lm.logits(np.concatenate([prefix, branch_b], 1))[:, 5:]
    np.testing.assert_allclose(logits[:, :2], full_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits[:, 2:], full_b, rtol=1e-5, atol=1e-5)


def test_bfloat16_params_give_float32_logits_close_to_float32():
    lm32 = build_lm(5)
    # Same weights, rounded to bfloat16 and run by the bfloat16 graph.
    lm16 = build_lm(5, dtype="bfloat16", param_dtype="bfloat16")
    lm16 = lm16.with_params(jax.tree.map(lambda x: x.astype(jnp.bfloat16), lm32.params))
    leaves = jax.tree.leaves(lm16.params)
    assert all(leaf.dtype == jnp.bfloat16 for leaf in leaves)
    tokens = _random_tokens(5, (2, 10), lm32.vocab_size)
    logits16 = lm16.logits(tokens)
    assert logits16.dtype == jnp.float32
    np.testing.assert_allclose(logits16, lm32.logits(tokens), atol=0.15)
    cache = lm16.init_cache(2, 16)
    assert jax.tree.leaves(cache)[0].dtype == jnp.bfloat16


def test_llama3_8b_config_builds_abstractly_without_memory():
    config = specjax_models.TransformerConfig(vocab_size=128_256, num_layers=32, d_model=4096,
                                      num_heads=32, num_kv_heads=8, d_ff=14_336,
                                      max_seq_len=8192, rope_theta=500_000.0,
                                      rms_norm_eps=1e-5, param_dtype="bfloat16",
                                      dtype="bfloat16")
    abstract = nnx.eval_shape(lambda: specjax_models.Transformer(config, rngs=nnx.Rngs(0)))
    state = nnx.state(abstract, nnx.Param)
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(state))
    assert specjax_models.count_params(state) == 8_030_261_248  # the published Llama-3-8B count
    cache = jax.eval_shape(lambda: specjax_models.KVCache.create(config, 4, 8192))
    assert cache.keys[0].shape == (4, 8, 8192, 128) and len(cache.keys) == 32
    scanned = dataclasses.replace(config, scan_layers=True)
    cache = jax.eval_shape(lambda: specjax_models.KVCache.create(scanned, 4, 8192))
    assert cache.keys.shape == (32, 4, 8, 8192, 128)  # every layer in one array
    assert cache.values.shape == (32, 4, 8, 8192, 128)
    abstract = nnx.eval_shape(lambda: specjax_models.Transformer(scanned, rngs=nnx.Rngs(0)))
    assert specjax_models.count_params(nnx.state(abstract, nnx.Param)) == 8_030_261_248


@pytest.mark.parametrize("bad, message", [
    ({"num_kv_heads": 3}, "multiple of num_kv_heads"),
    ({"d_model": 66}, "divisible by num_heads"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"dtype": "float64"}, "not supported"),
])
def test_config_refuses_inconsistent_shapes(bad, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**bad)


def test_causal_lm_from_nnx_is_a_pytree_of_params_only(tiny_lm):
    leaves, treedef = jax.tree.flatten(tiny_lm)
    assert len(leaves) == len(jax.tree.leaves(tiny_lm.params))
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert rebuilt.apply_fn == tiny_lm.apply_fn and rebuilt.vocab_size == 32
    # Two models with the same architecture have equal static parts: one compilation.
    other = build_lm(9)
    assert jax.tree.structure(other) == jax.tree.structure(tiny_lm)


def test_causal_lm_default_logits_path_uses_the_cache_apply(tiny_lm):
    """Without a full_forward_fn, logits() runs apply on a fresh cache: same numbers."""
    plain = specjax.CausalLM(tiny_lm.params, tiny_lm.apply_fn, tiny_lm.init_cache_fn,
                             vocab_size=tiny_lm.vocab_size, max_seq_len=tiny_lm.max_seq_len)
    tokens = _random_tokens(6, (2, 9), tiny_lm.vocab_size)
    np.testing.assert_allclose(plain.logits(tokens), tiny_lm.logits(tokens), rtol=1e-5,
                               atol=1e-5)


def test_from_nnx_refuses_what_it_cannot_wrap():
    with pytest.raises(TypeError, match="nnx.Module"):
        specjax.CausalLM.from_nnx(object())

    class NoConfig(nnx.Module):
        pass

    with pytest.raises(TypeError, match="config"):
        specjax.CausalLM.from_nnx(NoConfig())


def test_out_of_vocab_ids_in_masked_slots_cannot_poison_attention(tiny_lm):
    """Padding a prompt with an id outside the vocabulary (here 999 in a 32-id model) must
    leave the real rows' logits finite and unchanged: such ids read a real embedding row."""
    prompts = jnp.asarray([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]], jnp.int32)
    poisoned = prompts.at[0, 3:].set(999)
    lengths = jnp.asarray([3, 5], jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))

    def next_logits(tokens):
        cache = tiny_lm.init_cache(2, 16)
        _, _, cache = tiny_lm.apply(tokens, positions, cache, jnp.zeros((2,), jnp.int32))
        step = jnp.asarray([[9], [9]], jnp.int32)
        logits, _, _ = tiny_lm.apply(step, lengths[:, None], cache, lengths)
        return np.asarray(logits)

    clean, dirty = next_logits(prompts), next_logits(poisoned)
    assert np.isfinite(dirty).all()
    np.testing.assert_array_equal(dirty, clean)


def cache_rows(cache, b):
    """Row b of a KVCache (per-layer arrays, or stacked ones with the layers first)."""
    if isinstance(cache.keys, tuple):
        return jax.tree.map(lambda x: x[b:b + 1], cache)
    return specjax_models.KVCache(cache.keys[:, b:b + 1], cache.values[:, b:b + 1],
                                  cache.positions[b:b + 1])


@pytest.mark.parametrize("overrides", [{}, {"sliding_window": 6, "sliding_layers": "all"},
                                       {"scan_layers": True},
                                       {"sliding_window": 6, "sliding_layers": "even",
                                        "scan_layers": True}],
                         ids=["full", "sliding-window", "scanned", "scanned-even-windows"])
@pytest.mark.parametrize("wide", [False, True], ids=["short-input", "long-input"])
def test_tree_verify_then_compaction_equals_feeding_the_path_as_a_chain(overrides, wide):
    """A token tree verified in one forward (ancestor mask, positions by depth), then the
    accepted path compacted into contiguous slots, leaves the cache a chain of the same
    tokens would: the next step's logits agree, on both attention paths."""
    from specjax.trees.shapes import TreeShape, ancestor_mask

    lm = build_lm(4, max_seq_len=256, **overrides)
    batch, prompt_len = 2, 7
    # A wide first level makes the verify input longer than READ_BEFORE_WRITE_MAX_TOKENS.
    first = specjax_models.transformer.READ_BEFORE_WRITE_MAX_TOKENS + 2 if wide else 3
    tree = TreeShape.from_paths([[r] for r in range(first)] + [[0, 0], [0, 1], [1, 0],
                                                               [0, 1, 0]])
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, lm.vocab_size, (batch, prompt_len)), jnp.int32)
    nodes = jnp.asarray(rng.integers(0, lm.vocab_size, (batch, tree.num_nodes)), jnp.int32)
    # Row 0 accepts nodes 0, first + 1, first + 3 (depths 1, 2, 3); row 1 accepts node 1.
    paths = [[0, first + 1, first + 3], [1]]
    apply = jax.jit(lambda lm, t, p, c, n, m: lm.apply(t, p, c, n, m))
    cache = lm.init_cache(batch, 128)
    positions = jnp.broadcast_to(jnp.arange(prompt_len - 1), (batch, prompt_len - 1))
    _, _, cache = apply(lm, prompt[:, :-1], positions, cache, jnp.zeros(batch, jnp.int32), None)
    start = jnp.full((batch,), prompt_len - 1, jnp.int32)
    # The verify: the last prompt token (the root) then the tree.
    verify = jnp.concatenate([prompt[:, -1:], nodes], axis=1)
    depths = jnp.asarray((0,) + tree.depths, jnp.int32)
    parents = tree.parents_array(batch)
    _, _, tree_cache = apply(lm, verify, start[:, None] + depths[None], cache, start,
                             ancestor_mask(parents))
    sources = np.full((batch, tree.max_depth), 0, np.int32)
    for b, path in enumerate(paths):
        sources[b, : len(path)] = prompt_len + np.asarray(path)
    tree_cache = jax.jit(lambda lm, c, s, src: lm.compact_cache(c, s, src))(
        lm, tree_cache, start + 1, jnp.asarray(sources))
    for b, path in enumerate(paths):
        chain = jnp.concatenate([prompt[b:b + 1, -1:], nodes[b:b + 1, jnp.asarray(path)]], 1)
        row_cache = cache_rows(cache, b)
        chain_positions = (prompt_len - 1) + jnp.arange(chain.shape[1])[None]
        _, _, chain_cache = apply(lm, chain, chain_positions, row_cache, start[b:b + 1], None)
        # The next step reads both caches up to the same length: identical logits.
        length = jnp.asarray([prompt_len + len(path)], jnp.int32)
        probe = jnp.asarray([[5, 9]], jnp.int32)
        probe_positions = length[:, None] + jnp.arange(2)[None]
        want, _, _ = apply(lm, probe, probe_positions, chain_cache, length, None)
        tree_row = cache_rows(tree_cache, b)
        got, _, _ = apply(lm, probe, probe_positions, tree_row, length, None)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        np.testing.assert_array_equal(np.asarray(tree_row.positions)[0, : int(length[0])],
                                      np.arange(int(length[0])))


def test_feature_layers_are_the_residual_streams_entering_those_layers(tiny_lm):
    """With feature_layers, hidden is [B, T, F+1, D]: the residual stream entering each
    listed layer (computed here layer by layer), then the usual final hidden state; the
    logits do not change."""
    from flax import nnx

    tokens = _random_tokens(3, (2, 6), tiny_lm.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    plain_logits, plain_hidden, _ = tiny_lm.apply(tokens, positions, tiny_lm.init_cache(2, 16),
                                                  jnp.zeros(2, jnp.int32))
    logits, features, _ = tiny_lm.apply(tokens, positions, tiny_lm.init_cache(2, 16),
                                        jnp.zeros(2, jnp.int32), feature_layers=(0, 1))
    assert features.shape == (2, 6, 3, plain_hidden.shape[-1])
    np.testing.assert_array_equal(logits, plain_logits)
    np.testing.assert_allclose(features[:, :, 2], plain_hidden, rtol=1e-6, atol=1e-6)
    module = nnx.merge(tiny_lm.apply_fn.graphdef, tiny_lm.params)
    stream = module.embed(jnp.asarray(tokens))
    np.testing.assert_allclose(features[:, :, 0], stream, rtol=1e-6, atol=1e-6)
    stream, _ = module.layers[0](stream, positions, None, 0, None, None, None, None)
    np.testing.assert_allclose(features[:, :, 1], stream, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="feature layer 5 is outside"):
        tiny_lm.apply(tokens, positions, None, None, feature_layers=(5,))


@pytest.mark.parametrize("overrides", [
    pytest.param({}, marks=pytest.mark.slow),  # the windowed case covers it in the unit suite
    {"sliding_window": 3, "sliding_layers": "even"}], ids=["full", "even-windows"])
def test_scanned_layers_compute_what_unrolled_layers_do(tmp_path, overrides):
    """scan_layers only changes how the layers run: the same parameters (stacked) give the
    same logits, features, cache and greedy tokens; checkpoints load in either layout;
    first_layers keeps the first layers of both."""
    unrolled = build_lm(7, num_layers=3, **overrides)
    specjax_models.save_checkpoint(unrolled, tiny_config(num_layers=3, **overrides), tmp_path)
    scanned = specjax_models.load_checkpoint(tmp_path, scan_layers=True)
    assert scanned.params["layers"]["input_norm"]["weight"].shape[0] == 3  # stacked
    tokens = jnp.asarray([[1, 5, 9, 30, 2, 7, 7, 3]])
    positions = jnp.arange(8)[None]
    outs = [lm.apply(tokens, positions, lm.init_cache(1, 16), jnp.zeros(1, jnp.int32),
                     feature_layers=(1, 2)) for lm in (unrolled, scanned)]
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jnp.stack(outs[0][2].keys), outs[1][2].keys, rtol=1e-5,
                               atol=1e-5)
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 9]]
    greedy = [specjax.generate(lm, prompts, max_new_tokens=12, sampling=specjax.GREEDY).tokens
              for lm in (unrolled, scanned)]
    np.testing.assert_array_equal(greedy[0], greedy[1])
    spec = specjax.speculative_generate(scanned, specjax_models.first_layers(scanned, 1),
                                        prompts, max_new_tokens=12, num_draft_tokens=3,
                                        sampling=specjax.GREEDY)
    np.testing.assert_array_equal(spec.tokens, greedy[0])
    # A scanned model saved loads back unrolled.
    specjax_models.save_checkpoint(scanned, tiny_config(num_layers=3, scan_layers=True,
                                                        **overrides), tmp_path / "s")
    back = specjax_models.load_checkpoint(tmp_path / "s", scan_layers=False)
    np.testing.assert_allclose(back.logits(tokens), unrolled.logits(tokens), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("tie, scan", [(True, False), (False, True)])
def test_select_layers_keeps_the_chosen_blocks_and_head_rows(tmp_path, tie, scan):
    """Every layer kept with a reduced draft vocabulary: the logits are the full model's
    columns for those ids (tied or untied head, either layer layout); a subset of layers
    runs those blocks in order; the result saves and loads as a checkpoint."""
    config = tiny_config(num_layers=3, tie_embeddings=tie, scan_layers=scan)
    full = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(4)))
    tokens = jnp.asarray(_random_tokens(0, (2, 9), 32))
    ids = np.array([1, 5, 7, 30, 31])
    every = specjax_models.select_layers(full, (0, 1, 2), ids)
    assert every.vocab_size == 5
    np.testing.assert_allclose(every.logits(tokens), full.logits(tokens)[..., ids], rtol=1e-5,
                               atol=1e-5)
    # Layers 0 and 2 of the full model, run by hand (the unrolled copy's blocks).
    module = specjax_models.select_layers(
        specjax_models.Transformer(dataclasses.replace(config, scan_layers=False),
                                   rngs=nnx.Rngs(4)), (0, 2), ids)
    draft_config = specjax_models.select_layers_config(config, (0, 2), ids)
    assert module.config == dataclasses.replace(draft_config, scan_layers=False)
    assert draft_config.input_vocab_size == 32 and not draft_config.tie_embeddings
    subset = specjax_models.select_layers(full, (0, 2), ids)
    np.testing.assert_allclose(subset.logits(tokens), specjax.CausalLM.from_nnx(module).logits(
        tokens), rtol=1e-5, atol=1e-5)
    specjax_models.save_checkpoint(subset, draft_config, tmp_path)
    np.testing.assert_array_equal(specjax_models.load_checkpoint(tmp_path).logits(tokens),
                                  subset.logits(tokens))


def test_select_layers_refuses_bad_layers_and_vocabularies(tiny_lm):
    with pytest.raises(ValueError, match="layer indices in \\[0, 2\\)"):
        specjax_models.select_layers(tiny_lm, (0, 2))
    with pytest.raises(ValueError, match="non-empty sequence"):
        specjax_models.select_layers(tiny_lm, ())
    with pytest.raises(ValueError, match="ids in \\[0, 32\\)"):
        specjax_models.select_layers(tiny_lm, (0,), [3, 40])
    with pytest.raises(ValueError, match="repeats 1 ids"):
        specjax_models.select_layers(tiny_lm, (0,), [3, 3, 4])
    with pytest.raises(ValueError, match="untie it"):
        tiny_config(input_vocab_size=64, tie_embeddings=True)
    with pytest.raises(ValueError, match="save_checkpoint, not as a transformers"):
        specjax_models.hf.config_to_hf(tiny_config(vocab_size=8, input_vocab_size=32))
