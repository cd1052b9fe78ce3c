"""DeepSeek-V3's multi-token-prediction (MTP) module as a specjax drafter.

A DeepSeek-V3-layout checkpoint (DeepSeek-V3 / V3.1 / R1, Kimi K2 and the other configs
that reuse the architecture) stores, after its `num_hidden_layers` = L decoder layers,
`num_nextn_predict_layers` MTP modules `model.layers.{L + k}.*`, each:

    embed_tokens [V, D] (a copy of the target's), enorm [D], hnorm [D], eh_proj [D, 2D],
    one decoder layer of the model's own architecture (multi-head latent attention, a
    mixture of experts), shared_head.norm [D], shared_head.head [V, D] (a copy of the
    LM head).

Its forward at position i (the DeepSeek-V3 technical report, section 2.2, as vLLM runs
it: vllm/model_executor/models/deepseek_mtp.py, DeepSeekMultiTokenPredictorLayer):

    x = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])   (embedding zeroed at position 0)
    out = block(x);  logits = shared_head.head(shared_head.norm(out))  -> t_{i+2}

where h_i is the target's final hidden state (after its final norm, what vLLM's target
model returns and `specjax_models.Transformer` returns as `hidden`). Drafting deeper
feeds `out` back as the next h, module 0 reused (vLLM's recursion for depth > 1).

In specjax this is an `Eagle` head of kind "mtp" (the same input and output maths as
MiMo's module) whose block is `MtpBlock`, passed in as a `specjax.drafters.ModelBlock`:
the block keeps the model's latent cache (kv_lora_rank + qk_rope_head_dim per token)
and routes to its experts. `load_drafter` / `from_pretrained(dir, mtp=True)` read module
0; with more than one module, the others are left unused and module 0 drafts every depth.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from specjax.drafters import Eagle, FeatureHeadConfig, ModelBlock
from specjax_models.cache import KVCache, write_rows
from specjax_models.config import TransformerConfig
from specjax_models.params import ParamFiller, TensorShapeError
from specjax_models.transformer import Block, _ShapeOnlyKeys

# The MTP module's own tensors beside its decoder layer (`model.layers.{L}.` + name).
MTP_INPUTS = ("embed_tokens.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight",
              "shared_head.norm.weight", "shared_head.head.weight")


def mtp_block_config(config: TransformerConfig, layer: int) -> TransformerConfig:
    """The one-layer config of decoder layer `layer` of a model of `config` (layer may lie
    past its layers, as the MTP module's does): experts or the dense MLP as that layer has
    them, unscanned."""
    moe = config.layer_is_moe(layer)
    return dataclasses.replace(config, num_layers=1, scan_layers=False,
                               dense_layers=() if moe or not config.num_experts else (0,))


class MtpBlock(nnx.Module):
    """One decoder block of a `Transformer`'s architecture with a cache of its own (the
    `specjax.drafters.ModelBlock` contract): DeepSeek's MTP block.

    Call: `block(x[B, T, D], positions[B, T], cache, cache_lengths[B], new_mask[B, T, T])
    -> (out[B, T, D], cache)`; `cache=None` is a causal forward over the T positions alone.
    `layer`: the block's index in the checkpoint (its experts and sliding window follow
    the model's rules for that index)."""

    def __init__(self, config: TransformerConfig, layer: int, *, rngs: nnx.Rngs):
        self.config = mtp_block_config(config, layer)
        self.layer = layer
        self.window = config.layer_window(layer)
        self.d_model = config.d_model
        self.block = Block(self.config, rngs=rngs, layer=0)

    def init_cache(self, batch: int, slots: int) -> KVCache:
        return KVCache.create(self.config, batch, slots)

    def __call__(self, x_BTD: Array, positions_BT: Array, cache: KVCache | None = None,
                 cache_lengths_B: Array | None = None, new_mask_BTT: Array | None = None):
        x_BTD = x_BTD.astype(self.config.compute_dtype)
        positions_BT = positions_BT.astype(jnp.int32)
        if cache is None:
            out_BTD, _ = self.block(x_BTD, positions_BT, None, None, None, new_mask_BTT, None,
                                    self.window)
            return out_BTD, None
        key_positions_BS = write_rows(cache.positions, positions_BT, cache_lengths_B)
        out_BTD, (keys, values) = self.block(
            x_BTD, positions_BT, (cache.keys[0][None], cache.values[0][None]), 0,
            cache_lengths_B, new_mask_BTT, key_positions_BS, self.window)
        return out_BTD, KVCache((keys[0],), (values[0],), key_positions_BS)


def deepseek_mtp_layer(hf_config: dict) -> int | None:
    """The checkpoint index of the first MTP module (num_hidden_layers), or None when the
    config declares none."""
    if not hf_config.get("num_nextn_predict_layers"):
        return None
    return int(hf_config["num_hidden_layers"])


def load_deepseek_mtp(hf_config: dict, weights, embedding: Array, lm_head: Array,
                      method: str) -> Eagle:
    """The first MTP module of a DeepSeek-V3-layout checkpoint (`weights`: the
    `published_drafters` reader over its files) on a target whose embedding and LM head
    are given, as an `Eagle` with an `MtpBlock`."""
    from specjax_models.hf import config_from_hf, layer_weight_map, to_ours

    layer = deepseek_mtp_layer(hf_config)
    prefix = f"model.layers.{layer}."
    where = weights.directory
    if not any(name.startswith(prefix) for name in weights.names):
        raise ValueError(f"{where}: config.json declares num_nextn_predict_layers="
                         f"{hf_config['num_nextn_predict_layers']} but the weights hold no "
                         f"{prefix}* tensors (a checkpoint saved without its MTP module); "
                         "download the original checkpoint, which carries it")
    float_dtype = weights.float_dtype
    config = dataclasses.replace(config_from_hf(hf_config, "float32"),
                                 param_dtype="bfloat16" if float_dtype != np.float32
                                 else "float32")
    d_model, vocab = config.d_model, config.vocab_size
    if embedding.shape[1] != d_model:
        raise ValueError(f"{where}: the MTP module is {d_model} wide but this target is "
                         f"{embedding.shape[1]} wide: load the target from the same "
                         "checkpoint (from_pretrained)")
    abstract = nnx.eval_shape(lambda: MtpBlock(config, layer, rngs=_ShapeOnlyKeys()))
    graphdef, abstract_params = nnx.split(abstract, nnx.Param)
    filler = ParamFiller(abstract_params, config.storage_dtype)
    ours = f"layers.{layer}."
    mapping = {"block." + name[len(ours):]: entry for name, entry in
               layer_weight_map(config, layer, weights.names, hf_config).items()}
    for name, shape in filler.targets():
        hf_names, transform = mapping.get(name, ((name,), None))
        hf_names = hf_names if isinstance(hf_names, tuple) else (hf_names,)
        lacking = [n for n in hf_names if n not in weights.names]
        if name not in mapping or lacking:
            raise ValueError(f"{where}: the MTP module lacks {lacking[0] if lacking else name!r}"
                             f" (needed for {name}); the checkpoint does not match its "
                             "config.json")
        try:  # checked in the file's layout, naming the shard that holds the tensor
            array = to_ours(weights.read_raw, hf_names, transform, tuple(shape))
        except TensorShapeError as error:
            raise ValueError(f"{where / weights.file_of[error.tensor]}: {error}") from None
        if tuple(array.shape) != tuple(shape):  # a transform the file layout cannot check
            raise ValueError(f"{where / weights.file_of[hf_names[0]]}: tensor {hf_names[0]} "
                             f"converts to shape {tuple(array.shape)}, expected "
                             f"{tuple(shape)} by config.json; the checkpoint does not match "
                             "its config.json")
        filler.set(name, array)
    block = ModelBlock.from_nnx(nnx.merge(graphdef, filler.state()))
    params = {"embed_norm": weights.take(prefix + "enorm.weight", (d_model,)),
              "feature_norm": weights.take(prefix + "hnorm.weight", (d_model,)),
              "proj": weights.take(prefix + "eh_proj.weight", (d_model, 2 * d_model),
                                   transpose=True),
              "final_norm": weights.take(prefix + "shared_head.norm.weight", (d_model,))}
    # The module's own copies of the embedding and LM head, as vLLM reads them (DeepSeek
    # trains them shared with the target's; a checkpoint may leave them out).
    own_embedding = weights.has(prefix + "embed_tokens.weight")
    if own_embedding:
        embedding = weights.take(prefix + "embed_tokens.weight", (vocab, d_model))
    own_lm_head = weights.has(prefix + "shared_head.head.weight")
    if own_lm_head:
        lm_head = weights.take(prefix + "shared_head.head.weight", (vocab, d_model))
    weights.finish(prefix)
    return mtp_drafter(block, params, embedding, lm_head, config, method,
                       own_embedding=own_embedding, own_lm_head=own_lm_head)


def mtp_drafter(block: ModelBlock, params: dict, embedding: Array, lm_head: Array,
                config: TransformerConfig, method: str = "sample", *,
                own_embedding: bool = False, own_lm_head: bool = False) -> Eagle:
    """The `Eagle` that runs a DeepSeek MTP module: `params` its input and output
    (embed_norm = enorm, feature_norm = hnorm, proj = eh_proj^T [2D, D], final_norm =
    shared_head.norm), `block` its decoder block (`ModelBlock.from_nnx(MtpBlock(...))`),
    `config` the model's (for the norms' epsilon and the block's shape, recorded in the
    head's config), the embedding and LM head it reads [V, D]."""
    head_config = FeatureHeadConfig(
        kind="mtp", d_model=config.d_model, num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        head_dim=config.v_head_dim or config.resolved_head_dim,
        d_ff=config.expert_d_ff or config.d_ff, rope_theta=config.rope_theta,
        rope_scaling=config.rope_scaling, rms_norm_eps=config.rms_norm_eps, attn_norm=False,
        first_pair=False, zero_first_embedding=True, own_lm_head=own_lm_head,
        own_embedding=own_embedding)
    return Eagle(params, jnp.asarray(embedding), jnp.asarray(lm_head), head_config, method,
                 block=block)


def random_mtp_drafter(config: TransformerConfig, embedding: Array, lm_head: Array,
                       key: Array, method: str = "sample", scale: float = 0.02) -> Eagle:
    """An untrained MTP module of `config`'s architecture (its block is layer
    `config.num_layers`, as a checkpoint's first module is) on the given embedding and LM
    head: block weights as `Transformer` initialises them, the projection N(0, scale),
    norms at 1. For measuring cost and checking exactness; its drafts are noise."""
    import jax

    d_model = config.d_model
    block_key, proj_key = jax.random.split(key)
    module = MtpBlock(config, config.num_layers,
                      rngs=nnx.Rngs(int(jax.random.randint(block_key, (), 0, 2 ** 30))))
    params = {"embed_norm": jnp.ones((d_model,), jnp.float32),
              "feature_norm": jnp.ones((d_model,), jnp.float32),
              "proj": scale * jax.random.normal(proj_key, (2 * d_model, d_model), jnp.float32),
              "final_norm": jnp.ones((d_model,), jnp.float32)}
    return mtp_drafter(ModelBlock.from_nnx(module), params, embedding, lm_head, config, method)
