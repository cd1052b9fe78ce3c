"""A Llama-family decoder in Flax NNX with an explicit multi-token KV cache: the block,
the model, and what derives models from models (layer subsets, other attention blocks).

The module honours the CausalLM contract of DESIGN.md section 3: one call takes T new
tokens per row, writes their keys/values at per-row offsets `cache_lengths[b] + t`, and
attends to the cached slots below each row's length plus the new tokens allowed by
`new_mask[B, T, T]` (causal by default). Positions are passed by the caller, independent
of cache slots, so token trees need no change here.

The parts live by concern: `config` (TransformerConfig), `attention`, `feed_forward` (the
dense MLP and the mixture of experts), `latent_attention`, `norms`, `cache` (KVCache)
and `params` (loading by name); the names loaders and tests take from here
(TransformerConfig, KVCache, ParamFiller, per_layer_params, dtype_name,
READ_BEFORE_WRITE_MAX_TOKENS) are re-exported.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from specjax.lm.causal_lm import check_layer_mask
from specjax_models.attention import READ_BEFORE_WRITE_MAX_TOKENS, Attention, softcap  # noqa: F401
from specjax_models.cache import KVCache, write_rows
from specjax_models.config import TransformerConfig, dtype_name  # noqa: F401  (re-exported)
from specjax_models.feed_forward import MLP, MoE
from specjax_models.latent_attention import LatentAttention
from specjax_models.norms import make_norm
from specjax_models.params import ParamFiller, per_layer_params  # noqa: F401  (re-exported)


class Block(nnx.Module):
    """Attention then the feed-forward layer, each pre-normed with a residual; the feed-
    forward layer is the mixture of experts where `config.layer_is_moe(layer)`, else the
    dense MLP (both named `mlp`, as checkpoints name them)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, layer: int = 0):
        self.input_norm = make_norm(config)
        self.attention = LatentAttention(config, rngs=rngs) if config.kv_lora_rank \
            else Attention(config, rngs=rngs)
        self.post_attention_norm = make_norm(config)  # the pre-MLP norm, as HF names it
        self.mlp = MoE(config, rngs=rngs) if config.layer_is_moe(layer) \
            else MLP(config, rngs=rngs)
        self.sandwich = config.sandwich_norm
        if config.sandwich_norm:
            self.attn_out_norm = make_norm(config)
            self.mlp_out_norm = make_norm(config)

    def __call__(self, x_BTD, positions_BT, cache_kv, layer, cache_lengths_B, new_mask_BTT,
                 key_positions_BS, window):
        attended, cache_kv = self.attention(self.input_norm(x_BTD), positions_BT, cache_kv,
                                            layer, cache_lengths_B, new_mask_BTT,
                                            key_positions_BS, window)
        if self.sandwich:
            attended = self.attn_out_norm(attended)
        x_BTD = x_BTD + attended
        mlp_out = self.mlp(self.post_attention_norm(x_BTD))
        if self.sandwich:
            mlp_out = self.mlp_out_norm(mlp_out)
        return x_BTD + mlp_out, cache_kv


@functools.partial(jax.jit, static_argnames=("block_def", "window"))
def _unrolled_block(block_def, block_params, x_BTD, positions_BT, cache_kv, cache_lengths_B,
                    new_mask_BTT, key_positions_BS, *, window):
    """One block of an unrolled model (`cache_kv` a one-layer stack), as its own jitted
    function: every layer of a model shares the block's structure and shapes, so a forward
    traces and lowers one block instead of L (a decoder step of SmolLM2's 30 layers traced
    in 1.3 s, now a fraction of it), and XLA inlines the calls, so the compiled program
    is the unrolled one."""
    block = nnx.merge(block_def, block_params)
    return block(x_BTD, positions_BT, cache_kv, 0, cache_lengths_B, new_mask_BTT,
                 key_positions_BS, window)


class Transformer(nnx.Module):
    """Decoder-only transformer: embeddings, pre-norm blocks, final norm, LM head.

    Call: `model(tokens[B,T], positions[B,T], cache=None, cache_lengths=None, new_mask=None)
    -> (logits f32[B,T,V], hidden[B,T,D], cache)`. With `cache=None` it is a plain full
    forward over the T tokens (causal, or `new_mask`); with a `KVCache` it writes the new
    keys/values (and positions) at `cache_lengths[b] + t` and returns the updated cache.
    The caller must keep `cache_lengths[b] + T <= cache.max_len` (specjax checks this
    before tracing). `hidden` is the final-layer feature after the final norm, the input
    of the LM head.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed = nnx.Embed(config.embedding_rows, config.d_model, dtype=config.compute_dtype,
                               param_dtype=config.storage_dtype, rngs=rngs)
        if config.position_embedding == "learned":
            self.position_embed = nnx.Embed(config.max_seq_len, config.d_model,
                                            dtype=config.compute_dtype,
                                            param_dtype=config.storage_dtype, rngs=rngs)
        blocks = [Block(config, rngs=rngs, layer=i) for i in range(config.num_layers)]
        if config.scan_layers:
            # One Block whose parameters carry a leading [L] axis, scanned over. Built layer
            # by layer (the same random init as separate blocks), then stacked.
            graphdef, _ = nnx.split(blocks[0])
            self.layers = nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs),
                                                           *[nnx.state(b) for b in blocks]))
        else:
            self.layers = nnx.List(blocks)
        self.final_norm = make_norm(config)
        if not config.tie_embeddings:
            self.lm_head = nnx.Linear(config.d_model, config.vocab_size, use_bias=False,
                                      dtype=config.compute_dtype,
                                      param_dtype=config.storage_dtype, rngs=rngs)

    def init_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache.create(self.config, batch, max_len)

    def compact_cache(self, cache: KVCache, start_B: Array, sources_BD: Array) -> KVCache:
        """The CausalLM contract's compaction (see `KVCache.compact`)."""
        return cache.compact(start_B, sources_BD)

    def __call__(self, tokens_BT: Array, positions_BT: Array, cache: KVCache | None = None,
                 cache_lengths_B: Array | None = None, new_mask_BTT: Array | None = None,
                 feature_layers: tuple[int, ...] = (), layers: tuple[int, ...] | None = None,
                 head: bool = True, layer_mask: Array | None = None):
        """`(logits f32[B,T,V], hidden[B,T,D], cache)`. With `feature_layers` (static layer
        indices), hidden is `[B, T, F + 1, D]`: the residual stream entering each listed
        layer, then the final (normed) hidden state, from this same forward (EAGLE-3 reads
        layers 2, L // 2 and L - 3).

        `layers` (static, increasing layer indices; None: all): run only these blocks, the
        others pass the residual stream through unchanged and their cache entries are not
        touched (self-speculation drafts with the target's own weights this way, reading
        the cache the full model wrote for the layers it runs).

        `layer_mask` (bool [L], data: traced values allowed): the same as `layers` with the
        blocks where it is True, chosen at run time: one compiled program serves every
        subset (a skipped block is a `lax.cond` branch that passes its inputs through).

        `head=False`: stop after the blocks: `(None, residual stream [B, T, D], cache)`, the
        stream leaving the last block run, before the final norm and the LM head (an early
        exit: Kangaroo drafts from the stream after the first n blocks)."""
        cfg = self.config
        for layer in feature_layers:
            if not 0 <= layer < cfg.num_layers:
                raise ValueError(f"feature layer {layer} is outside [0, {cfg.num_layers})")
        if layers is not None:
            layers = tuple(layers)
            if list(layers) != sorted(set(layers)) or any(
                    not 0 <= i < cfg.num_layers for i in layers):
                raise ValueError(f"layers must be increasing indices in [0, {cfg.num_layers}),"
                                 f" got {layers}")
            if feature_layers:
                raise ValueError("feature_layers with a subset of layers is not defined: the "
                                 "residual streams then differ from the full model's")
        if layer_mask is not None:
            check_layer_mask(layer_mask, cfg.num_layers, layers, feature_layers)
            layer_mask = jnp.asarray(layer_mask, bool)
        running = range(cfg.num_layers) if layers is None else layers
        if cache is not None and cache_lengths_B is None:
            raise ValueError("cache_lengths is required when a cache is given")
        positions_BT = positions_BT.astype(jnp.int32)
        if cache is not None:
            # Opaque lengths: with constant ones (a prefill into a fresh cache) XLA would
            # constant-fold the fully masked attention to the empty cache, seconds of
            # compile time for long caches.
            cache_lengths_B = jax.lax.optimization_barrier(cache_lengths_B)
        # Ids outside the vocabulary would read NaN rows (an out-of-range gather fills NaN),
        # and a NaN value in a masked slot still poisons attention (0 * NaN). specjax
        # refuses such ids on input; a caller's own padding reads a real row instead.
        x_BTD = self.embed(jnp.clip(tokens_BT, 0, cfg.embedding_rows - 1))
        if cfg.embed_scale:
            x_BTD = x_BTD * jnp.asarray(math.sqrt(cfg.d_model), cfg.compute_dtype)
        if cfg.position_embedding == "learned":
            x_BTD = x_BTD + self.position_embed(jnp.clip(positions_BT, 0, cfg.max_seq_len - 1))
        # Every slot's position after this call's write (for sliding windows): committed
        # slots keep theirs, the new tokens' slots get theirs, the rest are masked anyway.
        key_positions_BS = None if cache is None else write_rows(
            cache.positions, positions_BT, cache_lengths_B)
        windows = [cfg.layer_window(i) for i in range(cfg.num_layers)]
        has_windows = any(w is not None for w in windows)

        def run_block(block, x_BTD, cache_kv, features, layer, window):
            # The residual stream entering each requested layer (static list).
            features = tuple(jnp.where(layer == wanted, x_BTD, kept)
                             for wanted, kept in zip(feature_layers, features, strict=True))
            if cfg.scan_layers:
                x_BTD, cache_kv = block(x_BTD, positions_BT, cache_kv, layer, cache_lengths_B,
                                        new_mask_BTT, key_positions_BS, window)
            else:
                block_def, block_params = nnx.split(block)
                x_BTD, cache_kv = _unrolled_block(block_def, block_params, x_BTD, positions_BT,
                                                  cache_kv, cache_lengths_B, new_mask_BTT,
                                                  key_positions_BS, window=window)
            return x_BTD, cache_kv, features

        def run_layer(block, x_BTD, cache_kv, features, layer, window):
            if layer_mask is None or cfg.scan_layers:  # scanned: masked_body's cond
                return run_block(block, x_BTD, cache_kv, features, layer, window)
            block_def, block_params = nnx.split(block)
            return jax.lax.cond(
                layer_mask[layer],
                lambda params, *carry: run_block(nnx.merge(block_def, params), *carry, layer,
                                                 window),
                lambda params, *carry: carry,  # skipped: the stream and cache pass through
                block_params, x_BTD, cache_kv, features)

        features = tuple(jnp.zeros_like(x_BTD) for _ in feature_layers)
        if cfg.scan_layers:
            block_def, layer_params = nnx.split(self.layers)
            no_window = jnp.iinfo(jnp.int32).max
            windows_L = jnp.asarray([no_window if w is None else w for w in windows],
                                    jnp.int32) if has_windows else None

            def scan_body(carry, layer_inputs):
                params, layer, window = layer_inputs
                return run_layer(nnx.merge(block_def, params), *carry, layer, window), None

            def block_at(layer):
                # Indexed inside the loop: gathering a subset first would copy the kept
                # layers' weights at every call.
                return nnx.merge(block_def, jax.tree.map(
                    lambda stack: jax.lax.dynamic_index_in_dim(stack, layer, keepdims=False),
                    layer_params))

            def subset_body(carry, layer_inputs):
                layer, window = layer_inputs
                return run_layer(block_at(layer), *carry, layer, window), None

            def masked_body(carry, layer_inputs):
                # Every layer, each run or passed through at run time; a skipped layer's
                # weights are not even sliced out of the stack (the slice is in the branch).
                layer, window = layer_inputs
                run = lambda *carry: run_layer(block_at(layer), *carry, layer, window)
                return jax.lax.cond(layer_mask[layer], run, lambda *carry: carry, *carry), None

            cache_kv = None if cache is None else (cache.keys, cache.values)
            if layer_mask is not None:
                (x_BTD, cache_kv, features), _ = jax.lax.scan(
                    masked_body, (x_BTD, cache_kv, features),
                    (jnp.arange(cfg.num_layers, dtype=jnp.int32), windows_L))
            elif layers is None:
                (x_BTD, cache_kv, features), _ = jax.lax.scan(
                    scan_body, (x_BTD, cache_kv, features),
                    (layer_params, jnp.arange(cfg.num_layers, dtype=jnp.int32), windows_L))
            elif layers:
                index_R = jnp.asarray(layers, jnp.int32)
                (x_BTD, cache_kv, features), _ = jax.lax.scan(
                    subset_body, (x_BTD, cache_kv, features),
                    (index_R, None if windows_L is None else windows_L[index_R]))
            new_kv = cache_kv
        else:
            new_keys, new_values = [], []
            for index, block in enumerate(self.layers):
                layer_kv = None if cache is None else (cache.keys[index][None],
                                                       cache.values[index][None])
                if index in running:
                    # This layer's arrays as a one-layer stack (a free reshape), so both
                    # layouts share the attention code; the write stays in place.
                    x_BTD, layer_kv, features = run_layer(block, x_BTD, layer_kv, features,
                                                          index, windows[index])
                if layer_kv is not None:
                    new_keys.append(layer_kv[0][0])
                    new_values.append(layer_kv[1][0])
            new_kv = None if cache is None else (tuple(new_keys), tuple(new_values))
        new_cache = None if cache is None else KVCache(new_kv[0], new_kv[1], key_positions_BS)
        if not head:
            if layers is None and layer_mask is None:
                raise ValueError("head=False is an early exit after a subset of the layers: "
                                 "pass layers= or layer_mask=")
            if feature_layers:
                raise ValueError("head=False returns the residual stream itself; "
                                 "feature_layers is for forwards that reach the head")
            return None, x_BTD, new_cache
        hidden_BTD = self.final_norm(x_BTD)
        # The head accumulates and returns float32 even for bfloat16 models: rounding the
        # logits to bfloat16 would make exact ties common (8 bits of mantissa), and which
        # of two tied tokens argmax picks then depends on the kernel's rounding, which
        # differs between a 1-token decode step and a (K+1)-token verify.
        hidden_c = hidden_BTD.astype(cfg.compute_dtype)
        if cfg.tie_embeddings:
            logits_BTV = jnp.einsum("BTD,VD->BTV", hidden_c,
                                    self.embed.embedding[...].astype(cfg.compute_dtype),
                                    preferred_element_type=jnp.float32)
        else:
            logits_BTV = jnp.einsum("BTD,DV->BTV", hidden_c,
                                    self.lm_head.kernel[...].astype(cfg.compute_dtype),
                                    preferred_element_type=jnp.float32)
        logits_BTV = softcap(logits_BTV.astype(jnp.float32), cfg.final_logit_softcap)
        if feature_layers:
            hidden_BTD = jnp.stack([f.astype(hidden_BTD.dtype) for f in features]
                                   + [hidden_BTD], axis=2)
        return logits_BTV, hidden_BTD, new_cache


class _ShapeOnlyKeys:
    """Stands in for `nnx.Rngs` while a module is built only for its shapes: the same key
    for every initialiser. Inside `nnx.eval_shape` each draw from a real `nnx.Rngs`
    updates its counter, and flax's update probes the traced counter in a way that costs
    the length of the whole trace so far: quadratic in the parameters (SmolLM2: 0.52 s,
    against 0.16 s with this)."""

    def __init__(self):
        self._key = jax.random.key(0)

    def params(self) -> Array:
        return self._key

    def __call__(self) -> Array:
        return self._key


def abstract_transformer(config: TransformerConfig) -> Transformer:
    """The model's structure with `jax.ShapeDtypeStruct` parameters (nothing allocated),
    for loaders to fill with real weights."""
    return nnx.eval_shape(lambda: Transformer(config, rngs=_ShapeOnlyKeys()))


def count_params(model_or_state) -> int:
    """Number of parameters of an NNX module (or of a params state / abstract state)."""
    state = model_or_state
    if isinstance(model_or_state, nnx.Module):
        state = nnx.state(model_or_state, nnx.Param)
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(state))


def embedding_and_head(lm) -> tuple[Array, Array]:
    """The token embedding [V, D] and the LM head [V, D] (the embedding again when tied) of
    a Transformer (an NNX module or its `specjax.CausalLM`): what feature drafters (EAGLE,
    MTP, Medusa) share with their target. Arrays, not copies: they stay frozen."""
    params = lm.params if hasattr(lm, "apply_fn") else nnx.state(lm, nnx.Param)
    names = set(params.keys()) if hasattr(params, "keys") else set()
    if "embed" not in names:
        raise TypeError("embedding_and_head needs a specjax_models.Transformer (or its "
                        f"CausalLM); these parameters have no 'embed': {sorted(names)}")
    embedding = jnp.asarray(params["embed"]["embedding"][...])
    if "lm_head" in names:
        return embedding, jnp.asarray(params["lm_head"]["kernel"][...]).T
    return embedding, embedding


def first_layers(model, num_layers: int):
    """A shallower copy of `model`: its first `num_layers` blocks with the same embeddings,
    final norm and head (a layer-truncated draft sharing the target's tokenizer).

    `model` is a `Transformer` (returns a Transformer) or a `specjax.CausalLM` made from
    one, as `from_pretrained` and `load_checkpoint` return (returns a CausalLM).
    """
    depth = _config_of(model).num_layers
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) \
            or not 1 <= num_layers <= depth:
        raise ValueError(f"num_layers must be an int in [1, {depth}], got {num_layers!r}")
    return select_layers(model, tuple(range(num_layers)))


def select_layers(model, layers, draft_vocab=None):
    """A draft built from `model`: the blocks listed in `layers` (target layer indices, run
    in that order) with the same embeddings and final norm, and its LM head; with
    `draft_vocab` (target token ids) the head keeps only those rows, so its logits cover
    the reduced vocabulary (column j is id `draft_vocab[j]`; pair it with
    `specjax.DraftModel(draft, draft_vocab=ids)`) while the embedding still reads every
    target id (`TransformerConfig.input_vocab_size`). The starting point of a distilled
    layer draft (`specjax_models.recipes.smollm2_draft`).

    `model` is a `Transformer` (returns a Transformer) or a `specjax.CausalLM` made from
    one (returns a CausalLM). The result's config is `result.config` (a Transformer) or
    `select_layers_config(config, layers, draft_vocab)`.
    """
    import specjax
    from specjax.drafters.base import draft_vocab_ids

    if isinstance(model, specjax.CausalLM):
        return specjax.CausalLM.from_nnx(select_layers(_module_of(model), layers, draft_vocab))
    if not isinstance(model, Transformer):
        raise TypeError(f"select_layers expects a Transformer or a CausalLM, got "
                        f"{type(model).__name__}")
    source_config = model.config
    ids = None if draft_vocab is None else np.asarray(
        draft_vocab_ids(draft_vocab, source_config.vocab_size))
    config = select_layers_config(source_config, layers, ids)
    chosen = np.asarray(layers, np.int64)
    shallow = abstract_transformer(config)
    flat_source = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    updated = []
    for path, _ in nnx.to_flat_state(nnx.state(shallow, nnx.Param)):
        if path[0] == "layers" and config.scan_layers:  # stacked: pick along the [L] axis
            leaf = flat_source[path]
            leaf = leaf.replace(leaf.get_value()[chosen])
        elif path[0] == "layers":
            leaf = flat_source[("layers", int(chosen[path[1]]), *path[2:])]
        elif path == ("lm_head", "kernel") and ids is not None:
            if source_config.tie_embeddings:
                rows_VD = flat_source[("embed", "embedding")].get_value()
                leaf = flat_source[("embed", "embedding")].replace(rows_VD[ids].T)
            else:
                leaf = flat_source[path]
                leaf = leaf.replace(leaf.get_value()[:, ids])
        else:
            leaf = flat_source[path]
        updated.append((path, leaf))
    nnx.update(shallow, nnx.from_flat_state(updated))
    return shallow


def with_attention_blocks(model, block_size: int | None = None, query_block: int | None = None):
    """`model` (a `Transformer` or a `specjax.CausalLM` made from one) with other attention
    block sizes (`TransformerConfig.attention_block_size` / `attention_query_block`; None
    keeps the current one): the same parameters (no copy), other execution."""
    import specjax

    if isinstance(model, specjax.CausalLM):
        return specjax.CausalLM.from_nnx(with_attention_blocks(_module_of(model), block_size,
                                                               query_block))
    if not isinstance(model, Transformer):
        raise TypeError(f"with_attention_blocks expects a Transformer or a CausalLM, got "
                        f"{type(model).__name__}")
    changes = {name: value for name, value in (("attention_block_size", block_size),
                                                ("attention_query_block", query_block))
               if value is not None}
    config = dataclasses.replace(model.config, **changes)
    rebuilt = abstract_transformer(config)
    nnx.update(rebuilt, nnx.state(model, nnx.Param))
    return rebuilt


def select_layers_config(config: TransformerConfig, layers,
                         draft_vocab=None) -> TransformerConfig:
    """The config of `select_layers(model, layers, draft_vocab)` for a model of `config`."""
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__len__") or not len(layers) \
            or any(isinstance(i, bool) or not isinstance(i, (int, np.integer))
                   or not 0 <= i < config.num_layers for i in layers):
        raise ValueError(f"layers must be a non-empty sequence of layer indices in [0, "
                         f"{config.num_layers}), got {layers!r}")
    # A mixture of experts keeps each chosen layer's kind: its dense layers, renumbered.
    dense = tuple(j for j, i in enumerate(layers) if int(i) in config.dense_layers)
    config = dataclasses.replace(config, num_layers=len(layers),
                                 dense_layers=dense if config.num_experts else ())
    if draft_vocab is None:
        return config
    return dataclasses.replace(config, vocab_size=len(draft_vocab),
                               input_vocab_size=config.embedding_rows, tie_embeddings=False)


def _config_of(model) -> TransformerConfig:
    import specjax

    if isinstance(model, specjax.CausalLM):
        return _module_of(model).config
    if isinstance(model, Transformer):
        return model.config
    raise TypeError(f"expected a Transformer or a CausalLM, got {type(model).__name__}")


def _module_of(lm):
    graphdef = getattr(lm.apply_fn, "graphdef", None)
    if graphdef is None:
        raise TypeError("this needs a CausalLM made by CausalLM.from_nnx from a "
                        "specjax_models.Transformer (as from_pretrained, from_gguf and "
                        "load_checkpoint return)")
    return nnx.merge(graphdef, lm.params)
