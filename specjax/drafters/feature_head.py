"""The one-layer decoder that EAGLE-1, EAGLE-3 and MTP heads run over the target's features.

Pure functions over a dict of parameters (specjax imports no model code). A head reads,
at token position t, the pair (feature of position t - 1, token t) and outputs a hidden
state for position t whose logits (through the target's own LM head) predict token t + 1:

- "eagle1" (Li et al. 2024a): input `fc([embedding(token); feature])`; the feature is
  the target's final hidden state, and training regresses the output onto the target's
  feature at t (so drafting can feed the output back as the next feature).
- "eagle3" (Li et al. 2025): the feature is `fuse([low; middle; high])`, the residual
  streams entering three target layers (`eagle3_feature_layers`); the input combines
  embedding and feature as EAGLE-1 does; trained with training-time test (the head
  unrolled on its own outputs), no feature regression.
- "mtp" (DeepSeek-V3's multi-token prediction module): input
  `proj([norm(embedding(token)); norm(feature)])`, one module reused recursively.
- "kangaroo" (Liu et al. 2024, Kangaroo's adapter): the input at position t is the target's
  residual stream leaving its first n blocks at t itself (`feature_layers=(n,)`, the
  stream entering block n), which already holds token t; no embedding, no shift. Its
  output at t predicts token t + 1. At drafting time the target's own first n blocks
  give the stream of each drafted token (`specjax.drafters.EarlyExit`), so the adapter
  never reads its own outputs: trained teacher-forced, it sees at inference exactly what
  it was trained on.

The layer itself is a pre-norm Llama block (RMSNorm, RoPE, grouped-query attention,
SwiGLU) with its own KV cache `[B, S, H_kv, head_dim]`; logits are
`final_norm(out) @ lm_head.T` with the target's frozen embedding and LM head.

Switches for the layers published checkpoints carry (`specjax_models.load_drafter`):
- `layer_input="concat"` (the EAGLE-3 authors' and `speculators`' layer): the residual
  stream is the feature itself (`feature_norm(feature)` with `norm_before_residual`) and
  the attention reads `[embed_norm(embedding); feature_norm(feature)]`, 2D wide.
- `attn_norm=False` / `final_norm=False` (the EAGLE-1/2 authors' layer: no input norm in
  its layer 0, logits straight from the output); `qkv_bias` (heads for Qwen2 targets).
- `first_pair=False`: the published heads never saw a pair before the first token, so the
  slot-0 pair (zero feature, first token) is hidden from every later position.
- `rope_scaling`: Llama 3.1's band-wise rule or linear (`specjax.lm.rope`).
- `zero_first_embedding`: the embedding of token 1 (in the first pair such a head sees,
  (feature 0, token 1)) is zeroed, as Xiaomi's vLLM code runs MiMo's MTP module.
- `fuse_norm` ("joint": one RMSNorm over the concatenated layers, speculators'
  `norm_before_fc`; "per_layer": one per layer, `fc_norm`) before an eagle3 head's fuse,
  and `norm_output` (speculators' EAGLE 3.1: the block's output is normalised by
  `final_norm` before it is fed back, and the logits read it as it is).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import Float, Int

from specjax.lm import attention, rope

HEAD_KINDS = ("eagle1", "eagle3", "mtp", "kangaroo")
LAYER_INPUTS = ("fc", "concat")
FUSE_NORMS = ("none", "joint", "per_layer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FeatureHeadConfig:
    """Static shape of a feature head (frozen, hashable).

    kind: "eagle1", "eagle3", "mtp" or "kangaroo" (see the module docstring). d_model: the
    target's width (features and embeddings). feature_layers: the target layers whose
    incoming residual streams an "eagle3" head fuses, or the one layer a "kangaroo"
    adapter exits at (empty for the others, which read the final hidden state).
    num_heads / num_kv_heads / head_dim / d_ff: the head's block.
    layer_input, norm_before_residual, attn_norm, final_norm, qkv_bias, first_pair,
    rope_scaling, zero_first_embedding, fuse_norm, norm_output: the published layers'
    switches (module docstring); the defaults are the heads `specjax train-drafter` trains.
    own_lm_head / own_embedding: the head's LM head (EAGLE-3's over its draft vocabulary)
    or embedding is its own, not the target's, so `Eagle.save` keeps it.
    mask_id: a parallel head (P-EAGLE, `specjax.drafters.ParallelEagle`): the token of the
    placeholder pairs (mask_id, the learned feature `mask_hidden`) that stand for the
    drafts after the last committed token, so one head forward drafts K positions; None
    for an autoregressive head.
    """

    kind: str
    d_model: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    feature_layers: tuple[int, ...] = ()
    head_dim: int | None = None
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-5
    feature_norm: bool = False
    layer_input: str = "fc"
    norm_before_residual: bool = False
    attn_norm: bool = True
    final_norm: bool = True
    qkv_bias: bool = False
    first_pair: bool = True
    rope_scaling: tuple | None = None
    zero_first_embedding: bool = False
    fuse_norm: str = "none"
    norm_output: bool = False
    own_lm_head: bool = False
    own_embedding: bool = False
    mask_id: int | None = None

    def __post_init__(self):
        if self.mask_id is not None:
            if isinstance(self.mask_id, bool) or not isinstance(self.mask_id, int) or \
                    self.mask_id < 0:
                raise ValueError(f"mask_id must be a token id >= 0 (or None), got "
                                 f"{self.mask_id!r}")
            if self.kind not in ("eagle1", "eagle3"):
                raise ValueError(f"mask_id makes a parallel (P-EAGLE) head of kind eagle1 or "
                                 f"eagle3; a {self.kind} head drafts autoregressively")
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"kind must be one of {HEAD_KINDS}, got {self.kind!r}")
        object.__setattr__(self, "feature_layers", tuple(int(x) for x in self.feature_layers))
        if self.kind == "eagle3" and not self.feature_layers:
            raise ValueError("an eagle3 head fuses target layers: pass feature_layers (e.g. "
                             "specjax.drafters.eagle3_feature_layers(num_target_layers))")
        if self.kind == "mtp" and self.feature_norm:
            raise ValueError("an mtp head always normalises its feature; feature_norm is for "
                             "eagle1 and eagle3 heads")
        if self.kind == "kangaroo":
            if len(self.feature_layers) != 1 or self.feature_layers[0] < 0:
                raise ValueError("a kangaroo adapter reads the residual stream entering one "
                                 "target layer, its exit layer: pass feature_layers=(n,), "
                                 f"n >= 0, got {self.feature_layers}")
            if self.layer_input != "fc" or self.fuse_norm != "none" or \
                    self.zero_first_embedding or self.norm_output:
                raise ValueError("a kangaroo adapter reads the stream alone: layer_input, "
                                 "fuse_norm, zero_first_embedding and norm_output are for "
                                 "EAGLE / MTP heads")
        elif self.kind != "eagle3" and self.feature_layers:
            raise ValueError(f"a {self.kind} head reads the target's final hidden state only; "
                             "feature_layers is for kind='eagle3' (and a kangaroo adapter's "
                             "exit layer)")
        if self.layer_input not in LAYER_INPUTS:
            raise ValueError(f"layer_input must be one of {LAYER_INPUTS}, got "
                             f"{self.layer_input!r}")
        if self.layer_input == "concat" and self.kind == "mtp":
            raise ValueError("layer_input='concat' is EAGLE-3's published layer; an mtp head "
                             "projects [embedding; feature] with its own proj")
        if self.layer_input == "concat" and (self.feature_norm or not self.attn_norm):
            raise ValueError("a layer_input='concat' head always normalises its feature and "
                             "embedding (feature_norm / attn_norm do not apply)")
        if self.fuse_norm not in FUSE_NORMS:
            raise ValueError(f"fuse_norm must be one of {FUSE_NORMS}, got {self.fuse_norm!r}")
        if self.fuse_norm != "none" and self.kind != "eagle3":
            raise ValueError("fuse_norm normalises an eagle3 head's fused layers")
        if self.norm_output and not self.final_norm:
            raise ValueError("norm_output normalises the output with final_norm; it needs "
                             "final_norm=True")
        if self.norm_before_residual and self.layer_input != "concat":
            raise ValueError("norm_before_residual is for layer_input='concat' heads")
        if self.rope_scaling is not None:
            object.__setattr__(self, "rope_scaling", tuple(self.rope_scaling))
        rope.check_rope_scaling(self.rope_scaling)
        for name in ("d_model", "num_heads", "num_kv_heads", "d_ff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by num_heads="
                             f"{self.num_heads}; pass head_dim")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.d_model // self.num_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def attention_width(self) -> int:
        """The width the attention's projections read: D, or 2D for layer_input='concat'."""
        return 2 * self.d_model if self.layer_input == "concat" else self.d_model

    @classmethod
    def from_dict(cls, fields: dict) -> FeatureHeadConfig:
        fields = dict(fields)
        fields["feature_layers"] = tuple(fields.get("feature_layers", ()))
        if fields.get("rope_scaling") is not None:
            fields["rope_scaling"] = tuple(fields["rope_scaling"])
        return cls(**fields)


def init_head_params(config: FeatureHeadConfig, key: Array) -> dict:
    """Random float32 parameters (normal, std 0.02; norms at 1; biases at 0)."""
    d, hd, a = config.d_model, config.resolved_head_dim, config.attention_width
    shapes = {"wq": (a, config.num_heads * hd), "wk": (a, config.num_kv_heads * hd),
              "wv": (a, config.num_kv_heads * hd), "wo": (config.num_heads * hd, d),
              "w_gate": (d, config.d_ff), "w_up": (d, config.d_ff), "w_down": (config.d_ff, d)}
    if config.kind == "mtp":
        shapes["proj"] = (2 * d, d)
    elif config.layer_input == "fc" and config.kind != "kangaroo":
        shapes["fc"] = (2 * d, d)
    if config.kind == "eagle3":
        shapes["fuse"] = (len(config.feature_layers) * d, d)
    keys = jax.random.split(key, len(shapes))
    fuse_norm_shape = {"joint": (len(config.feature_layers) * d,),
                       "per_layer": (len(config.feature_layers), d)}.get(config.fuse_norm)
    params = {name: 0.02 * jax.random.normal(k, shape, jnp.float32)
              for k, (name, shape) in zip(keys, sorted(shapes.items()), strict=True)}
    norms = ["mlp_norm"]
    norms += ["attn_norm"] if config.attn_norm and config.layer_input == "fc" else []
    norms += ["final_norm"] if config.final_norm else []
    if config.kind == "mtp" or config.layer_input == "concat":
        norms += ["embed_norm", "feature_norm"]
    elif config.feature_norm:
        norms += ["feature_norm"]
    for norm in norms:
        params[norm] = jnp.ones((d,), jnp.float32)
    if config.kind not in ("mtp", "kangaroo") and config.layer_input == "fc":
        params["fc_bias"] = jnp.zeros((d,), jnp.float32)
    if fuse_norm_shape is not None:
        params["fuse_norm"] = jnp.ones(fuse_norm_shape, jnp.float32)
    if config.mask_id is not None:  # P-EAGLE's placeholder feature for the drafts' pairs
        params["mask_hidden"] = init_mask_hidden(d, key)
    if config.qkv_bias:
        for name, width in (("bq", config.num_heads), ("bk", config.num_kv_heads),
                            ("bv", config.num_kv_heads)):
            params[name] = jnp.zeros((width * hd,), jnp.float32)
    return params


def init_mask_hidden(d_model: int, key: Array) -> Array:
    """A new parallel head's placeholder feature `mask_hidden` float32 [D]."""
    return 0.02 * jax.random.normal(jax.random.fold_in(key, 1), (d_model,), jnp.float32)


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    x32 = x.astype(jnp.float32)
    scale = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return x32 * scale * _lead(weight, x32.ndim)


def _lead(vector: Array, ndim: int) -> Array:
    """`vector` [D] with leading unit axes up to `ndim` (explicit broadcasting)."""
    return vector.reshape((1,) * (ndim - vector.ndim) + vector.shape)


def fuse_features(params: dict, config: FeatureHeadConfig, hidden: Array) -> Array:
    """The feature a head reads from the target's output `hidden` ([..., D], or
    [..., F + 1, D] when it asked for feature layers): the final hidden state, or for
    eagle3 the fused [low; middle; high] streams; for kangaroo the stream entering its exit
    layer (`hidden` [..., 2, D]). Returns float32 [..., D]."""
    if config.kind == "kangaroo":
        if hidden.shape[-2:] != (2, config.d_model):
            raise ValueError(f"a kangaroo adapter reads [..., 2, {config.d_model}] features "
                             f"(its exit layer's stream, then the final hidden state), got "
                             f"{tuple(hidden.shape)}")
        return hidden[..., 0, :].astype(jnp.float32)
    if config.kind != "eagle3":
        if hidden.shape[-1] != config.d_model:
            raise ValueError(f"the target's features have width {hidden.shape[-1]} but the "
                             f"head was built for d_model={config.d_model}")
        return hidden.astype(jnp.float32)
    layers = len(config.feature_layers)
    if hidden.shape[-2:] != (layers + 1, config.d_model):
        raise ValueError(f"an eagle3 head over {layers} target layers of width "
                         f"{config.d_model} needs features [..., {layers + 1}, "
                         f"{config.d_model}], got {tuple(hidden.shape)}")
    stacked = hidden[..., :layers, :].astype(jnp.float32)
    if config.fuse_norm == "per_layer":
        stacked = rms_norm(stacked, params["fuse_norm"], config.rms_norm_eps)
    flat = stacked.reshape(stacked.shape[:-2] + (layers * config.d_model,))
    if config.fuse_norm == "joint":
        flat = rms_norm(flat, params["fuse_norm"], config.rms_norm_eps)
    return flat @ params["fuse"]


def head_inputs(params: dict, config: FeatureHeadConfig, embedding_VD: Array,
                tokens_BT: Int[Array, "B T"], features_BTD: Float[Array, "B T D"],
                positions_BT: Array | None = None) -> tuple[Array, Array]:
    """The block's inputs at each position, from the token's embedding and the feature of
    the previous position: `(residual [B, T, D], attention input [B, T, A])`, float32; A is
    `config.attention_width`. `positions` (the tokens' positions) are needed by a
    `zero_first_embedding` head."""
    if config.kind == "kangaroo":  # the stream at t already holds token t: no embedding
        x_BTD = features_BTD.astype(jnp.float32)
        if config.feature_norm:
            x_BTD = rms_norm(x_BTD, params["feature_norm"], config.rms_norm_eps)
        return x_BTD, (rms_norm(x_BTD, params["attn_norm"], config.rms_norm_eps)
                       if config.attn_norm else x_BTD)
    token_ids = jnp.clip(tokens_BT, 0, embedding_VD.shape[0] - 1)
    embedded_BTD = embedding_VD[token_ids].astype(jnp.float32)
    if config.zero_first_embedding:
        if positions_BT is None:
            raise ValueError("a zero_first_embedding head needs the tokens' positions")
        embedded_BTD = jnp.where((positions_BT == 1)[..., None], 0.0, embedded_BTD)
    features_BTD = features_BTD.astype(jnp.float32)
    eps = config.rms_norm_eps
    if config.layer_input == "concat":
        normed_BTD = rms_norm(features_BTD, params["feature_norm"], eps)
        attention_input = jnp.concatenate([rms_norm(embedded_BTD, params["embed_norm"], eps),
                                           normed_BTD], axis=-1)
        return (normed_BTD if config.norm_before_residual else features_BTD), attention_input
    if config.kind == "mtp":
        joined = jnp.concatenate([rms_norm(embedded_BTD, params["embed_norm"], eps),
                                  rms_norm(features_BTD, params["feature_norm"], eps)], axis=-1)
        x_BTD = joined @ params["proj"]
    else:
        if config.feature_norm:
            features_BTD = rms_norm(features_BTD, params["feature_norm"], eps)
        joined = jnp.concatenate([embedded_BTD, features_BTD], axis=-1)
        x_BTD = joined @ params["fc"] + _lead(params["fc_bias"], joined.ndim)
    return x_BTD, (rms_norm(x_BTD, params["attn_norm"], eps) if config.attn_norm else x_BTD)


def project_qkv(params: dict, config: FeatureHeadConfig, attention_input_BTA: Array,
                positions_BT: Array):
    """Queries [B, T, H, hd], keys and values [B, T, H_kv, hd] of the block's attention
    (RoPE applied at the given positions) from `head_inputs`' attention input."""
    batch, length, _ = attention_input_BTA.shape
    hd = config.resolved_head_dim
    inv_freq_F = rope.inverse_frequencies(hd, config.rope_theta, config.rope_scaling)

    def project(name, heads):
        out = attention_input_BTA @ params["w" + name]
        if config.qkv_bias:
            out = out + _lead(params["b" + name], out.ndim)
        return out.reshape(batch, length, heads, hd)

    q, k = project("q", config.num_heads), project("k", config.num_kv_heads)
    scale = rope.rotary_scale(config.rope_scaling)
    return (rope.apply_rotary(q, positions_BT, inv_freq_F, scale),
            rope.apply_rotary(k, positions_BT, inv_freq_F, scale),
            project("v", config.num_kv_heads))


def first_pair_visibility(config: FeatureHeadConfig, query_slots_BT: Array,
                          slots_S: Array) -> Array | None:
    """`[B, T, S]` bool: may a query at `query_slots` read each key slot, as far as the
    first pair goes (`first_pair=False` hides slot 0 from every query but its own); None
    when every slot is visible."""
    if config.first_pair:
        return None
    return (slots_S >= 1)[None, None, :] | (query_slots_BT == 0)[:, :, None]


def attention_weights(config: FeatureHeadConfig, q_BTNH: Array, keys_BSKH: Array,
                      visible_BTS: Array, extra_scores=None):
    """Softmax attention weights [B, K, G, T, S (+ E)] of GQA queries over keys, masked by
    `visible`; `extra_scores` [B, K, G, T, E] are appended columns (training-time test)."""
    batch, length, heads, hd = q_BTNH.shape
    groups = heads // config.num_kv_heads
    q_BTKGH = q_BTNH.reshape(batch, length, config.num_kv_heads, groups, hd)
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", q_BTKGH, keys_BSKH) / math.sqrt(hd)
    scores = jnp.where(visible_BTS[:, None, None], scores, -jnp.inf)
    if extra_scores is not None:
        scores = jnp.concatenate([scores, extra_scores], axis=-1)
    return jax.nn.softmax(scores, axis=-1), q_BTKGH


def finish_block(params: dict, config: FeatureHeadConfig, x_BTD: Array,
                 attended_BTNH: Array) -> Array:
    """Output projection, residual, then the SwiGLU MLP with its residual (normalised by
    final_norm with `norm_output`)."""
    batch, length = x_BTD.shape[:2]
    x_BTD = x_BTD + attended_BTNH.reshape(batch, length, -1) @ params["wo"]
    normed = rms_norm(x_BTD, params["mlp_norm"], config.rms_norm_eps)
    out = x_BTD + (jax.nn.silu(normed @ params["w_gate"]) * (normed @ params["w_up"])) \
        @ params["w_down"]
    return rms_norm(out, params["final_norm"], config.rms_norm_eps) if config.norm_output \
        else out


def _write_rows(cache_BSKH: Array, new_BTKH: Array, starts_B: Array) -> Array:
    write = lambda row, new, start: jax.lax.dynamic_update_slice(row, new, (start, 0, 0))
    return jax.vmap(write)(cache_BSKH, new_BTKH.astype(cache_BSKH.dtype), starts_B)


def head_block(params: dict, config: FeatureHeadConfig, inputs: tuple[Array, Array],
               positions_BT: Array, cache: tuple[Array, Array] | None,
               cache_lengths_B: Array | None = None, new_mask_BTT: Array | None = None):
    """The block over T new positions given `head_inputs`' `(residual, attention input)`:
    `(out [B, T, D], cache)`.

    With a cache `(keys, values)` each [B, S, H_kv, hd], the new keys/values are written at
    slots `cache_lengths[b] + t` and each new position attends to slots below
    `cache_lengths[b]` plus the new positions `new_mask` allows (causal when None). With
    `cache=None` it is a causal forward over the T positions alone (slots 0 ... T - 1)."""
    x_BTD, attention_input = inputs
    q, k, v = project_qkv(params, config, attention_input, positions_BT)
    batch, length = x_BTD.shape[:2]
    if cache is None:
        causal_TT = jnp.tril(jnp.ones((length, length), bool))
        visible_BTT = (jnp.broadcast_to(causal_TT, (batch, length, length))
                       if new_mask_BTT is None else new_mask_BTT)
        slots_T = jnp.arange(length)
        first = first_pair_visibility(config, jnp.broadcast_to(slots_T, (batch, length)),
                                      slots_T)
        visible_BTT = visible_BTT if first is None else visible_BTT & first
        weights, _ = attention_weights(config, q, k.astype(jnp.float32), visible_BTT)
        attended_BTKGH = jnp.einsum("BKGTS,BSKH->BTKGH", weights, v.astype(jnp.float32))
        return finish_block(params, config, x_BTD, attended_BTKGH), None
    keys = _write_rows(cache[0], k, cache_lengths_B)
    values = _write_rows(cache[1], v, cache_lengths_B)
    attended_BKGTH = _attend_cache(config, q, keys, values, cache_lengths_B, new_mask_BTT)
    out = finish_block(params, config, x_BTD, attended_BKGTH.transpose(0, 3, 1, 2, 4))
    return out, (keys, values)


def _attend_cache(config: FeatureHeadConfig, q_BTNH: Array, keys_BSKH: Array,
                  values_BSKH: Array, cache_lengths_B: Array,
                  new_mask_BTT: Array | None) -> Array:
    """Attention `[B, K, G, T, H]` of the new positions over the written cache: committed
    slots and the new positions `new_mask` allows, read in blocks only as far as the
    furthest visible slot (`specjax.lm.attention`: cost follows the tokens, not the
    capacity)."""
    batch, length, heads, hd = q_BTNH.shape
    q_BKGTH = q_BTNH.reshape(batch, length, config.num_kv_heads, heads // config.num_kv_heads,
                             hd).transpose(0, 2, 3, 1, 4).astype(jnp.float32)

    def read_block(start, size):
        shape = (batch, size, config.num_kv_heads, hd)
        keys = jax.lax.dynamic_slice(keys_BSKH, (0, start, 0, 0), shape)
        values = jax.lax.dynamic_slice(values_BSKH, (0, start, 0, 0), shape)
        return keys.transpose(0, 2, 1, 3), values.transpose(0, 2, 1, 3)

    def visible_block(query_t, slots_S):
        visible = attention.written_cache_visibility(cache_lengths_B, query_t, slots_S,
                                                     length, new_mask_BTT)
        first = first_pair_visibility(config, cache_lengths_B[:, None] + query_t[None],
                                      slots_S)
        return visible if first is None else visible & first

    reach_BT = cache_lengths_B[:, None] + attention.last_visible_new(new_mask_BTT, batch,
                                                                     length) + 1
    return attention.attend_written_cache(
        q_BKGTH, read_block, visible_block, reach_BT, capacity=keys_BSKH.shape[1],
        block_size=attention.DEFAULT_BLOCK_SIZE, query_block=attention.DEFAULT_QUERY_BLOCK,
        scale=1.0 / math.sqrt(hd), softcap=None, compute_dtype=jnp.float32)


def head_logits(params: dict, config: FeatureHeadConfig, lm_head_VD: Array,
                out_BTD: Array) -> Array:
    """Float32 logits [..., V] of head outputs through the LM head (the target's, or the
    head's own rows over a draft vocabulary)."""
    normed = (rms_norm(out_BTD, params["final_norm"], config.rms_norm_eps)
              if config.final_norm and not config.norm_output
              else out_BTD.astype(jnp.float32))
    return jnp.einsum("...D,VD->...V", normed, lm_head_VD.astype(jnp.float32))


def init_head_cache(config: FeatureHeadConfig, batch: int, slots: int) -> tuple[Array, Array]:
    shape = (batch, slots, config.num_kv_heads, config.resolved_head_dim)
    return jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)
