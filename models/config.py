"""The static architecture of a `specjax_models.Transformer` (`TransformerConfig`), its
dtypes and activations."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specjax.lm import attention
from specjax.lm.rope import check_rope_scaling

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def dtype_name(dtype) -> str:
    """The canonical name ("float32", "bfloat16", "float16") of a dtype given as a string,
    a numpy dtype or a jnp scalar type (`jnp.bfloat16`, `np.float32`)."""
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = jnp.dtype(dtype).name
        except TypeError:
            raise TypeError(f"dtype must be a string or a dtype, got {dtype!r}") from None
    if name not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(_DTYPES)} "
                         "(as a string or jnp.float32 / jnp.bfloat16 / jnp.float16)")
    return name


def _dtype(name: str):
    return _DTYPES[dtype_name(name)]


ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """Static architecture of a decoder of the Llama family (frozen and hashable).

    The defaults are Llama: RMSNorm, RoPE, SwiGLU, grouped-query attention, no biases.
    The other fields switch on what Mistral, Qwen2/3, Gemma 1/2 and GPT-2 differ by:

    head_dim: defaults to d_model // num_heads. qkv_bias / attn_out_bias / mlp_bias: biases.
    norm_type: "rms" or "layer" (LayerNorm with bias); norm_weight_offset: Gemma's
      (1 + w) RMSNorm scale (computed in float32). qk_norm: Qwen3's per-head RMSNorm of q, k.
    gated_mlp + activation: SwiGLU ("silu"), GeGLU ("gelu_tanh"), or a plain fc-act-proj
      MLP (gated_mlp=False, GPT-2). embed_scale: multiply embeddings by sqrt(d_model).
    position_embedding: "rope" or "learned" (GPT-2); rope_scaling: None,
      ("linear", factor) or ("llama3", factor, low_freq_factor, high_freq_factor,
      original_max_position_embeddings).
    query_scale: attention scale (default head_dim ** -0.5); attn_logit_softcap /
      final_logit_softcap: cap * tanh(x / cap) (Gemma 2).
    sliding_window: attend to the last `sliding_window` positions only, in the layers
      listed by sliding_layers ("all", "even": layers 0, 2, 4, ... as Gemma 2, or "none").
    sandwich_norm: Gemma 2's extra norms after attention and around the MLP.
    attention_block_size / attention_query_block: execution, not architecture: a decode
      or verify step (up to READ_BEFORE_WRITE_MAX_TOKENS new tokens) reads the KV cache in
      blocks of `attention_block_size` slots, only as many blocks as the longest row
      fills (`specjax.lm.attention`); a longer input (a prefill) attends in square tiles of
      `attention_query_block` queries and keys, each block of queries reading only the
      key blocks its mask reaches. Any values give the same outputs up to float
      rounding; `with_attention_blocks` changes them on a loaded model.
    input_vocab_size: rows of the token embedding when they differ from the LM head's
      `vocab_size` (None: the same). A draft whose head scores a reduced vocabulary (a
      subset of its target's ids, `specjax.DraftModel(..., draft_vocab=ids)`) still reads
      every target id; the head is then untied.
    dtype / param_dtype: compute and storage dtypes ("float32", "bfloat16", "float16").
    Logits are always returned in float32.
    scan_layers: run the layers as one `lax.scan` over parameters (and a cache) stacked
      along a leading [L] axis, so tracing and compiling cost one layer whatever the depth;
      False (default) keeps one parameter array per layer and unrolls the layers. On CPU
      the scan costs a copy of each layer's weights per forward (XLA CPU cannot feed a
      matmul from a slice of the stacked array): plain decoding measured 0.66-0.69x the
      unrolled tokens/s, for a 3.8x shorter compile of SmolLM2's 30 layers
      (`benchmarks/results/compile_time_cpu.md`).

    OLMoE's attention: qk_norm_scope "projection" normalises the whole q and k
    projections (one RMSNorm over heads x head_dim) instead of each head ("head", Qwen3);
    clip_qkv clamps q, k and v to [-clip_qkv, clip_qkv].

    Mixture of experts (`specjax_models.feed_forward.MoE`; num_experts = 0: every layer
    dense): each token goes to `experts_per_token` of `num_experts` gated MLPs of width
    `expert_d_ff` (default d_ff), except in `dense_layers` (layer indices: DeepSeek's
    first_k_dense_replace, Qwen's mlp_only_layers / decoder_sparse_step), which keep the
    dense MLP of width d_ff. The router: router_scoring "softmax" or "sigmoid";
    router_groups > 1 lets only the router_topk_groups best groups of consecutive experts
    compete, each scored by its best expert ("max") or its two best ("top2_sum");
    router_bias: a learned correction added to the scores for the choice only
    (DeepSeek-V3); router_normalize: the chosen weights renormalised to sum 1;
    routed_scaling: a factor on the routed output. shared_d_ff: the width of the shared
    experts every token also goes through (0: none), scaled by a sigmoid gate when
    shared_expert_gate (Qwen2-MoE).

    Multi-head latent attention (`specjax_models.latent_attention`; kv_lora_rank = 0:
    grouped-query attention): keys and values from a latent of width kv_lora_rank and a
    shared rotary key of width qk_rope_head_dim (what the cache holds), each head's key
    qk_nope_head_dim + qk_rope_head_dim wide and its value v_head_dim; queries through a
    latent of width q_lora_rank (0: one projection). head_dim is then unused and
    num_kv_heads must equal num_heads.
    """

    vocab_size: int
    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    max_seq_len: int
    head_dim: int | None = None
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    tie_embeddings: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    attn_out_bias: bool = False
    mlp_bias: bool = False
    norm_type: str = "rms"
    norm_weight_offset: bool = False
    qk_norm: bool = False
    gated_mlp: bool = True
    activation: str = "silu"
    embed_scale: bool = False
    position_embedding: str = "rope"
    rope_scaling: tuple | None = None
    query_scale: float | None = None
    attn_logit_softcap: float | None = None
    final_logit_softcap: float | None = None
    sliding_window: int | None = None
    sliding_layers: str = "all"
    sandwich_norm: bool = False
    scan_layers: bool = False
    input_vocab_size: int | None = None
    attention_block_size: int = attention.DEFAULT_BLOCK_SIZE
    attention_query_block: int = attention.DEFAULT_QUERY_BLOCK
    qk_norm_scope: str = "head"
    clip_qkv: float | None = None
    num_experts: int = 0
    experts_per_token: int = 0
    expert_d_ff: int | None = None
    dense_layers: tuple[int, ...] = ()
    router_scoring: str = "softmax"
    router_groups: int = 1
    router_topk_groups: int = 1
    router_group_score: str = "max"
    router_bias: bool = False
    router_normalize: bool = False
    routed_scaling: float = 1.0
    shared_d_ff: int = 0
    shared_expert_gate: bool = False
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "num_kv_heads",
                     "d_ff", "max_seq_len", "attention_block_size", "attention_query_block"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TransformerConfig.{name} must be a positive int, got {value!r}")
        if self.input_vocab_size is not None:
            if not isinstance(self.input_vocab_size, int) or self.input_vocab_size < 1:
                raise ValueError(f"TransformerConfig.input_vocab_size must be a positive int "
                                 f"or None, got {self.input_vocab_size!r}")
            if self.tie_embeddings and self.input_vocab_size != self.vocab_size:
                raise ValueError(f"tie_embeddings needs input_vocab_size "
                                 f"({self.input_vocab_size}) == vocab_size ({self.vocab_size}): "
                                 "a tied head scores every embedded id; untie it")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads}) for grouped-query attention")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError(
                f"d_model ({self.d_model}) is not divisible by num_heads ({self.num_heads}); "
                "pass head_dim explicitly")
        if self.position_embedding not in ("rope", "learned"):
            raise ValueError(f"position_embedding must be 'rope' or 'learned', got "
                             f"{self.position_embedding!r}")
        if self.position_embedding == "rope" and self.resolved_head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got "
                             f"{self.resolved_head_dim}")
        if self.norm_type not in ("rms", "layer"):
            raise ValueError(f"norm_type must be 'rms' or 'layer', got {self.norm_type!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got "
                             f"{self.activation!r}")
        if self.sliding_layers not in ("all", "even", "none"):
            raise ValueError(f"sliding_layers must be 'all', 'even' or 'none', got "
                             f"{self.sliding_layers!r}")
        check_rope_scaling(self.rope_scaling)
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"scan_layers must be a bool, got {self.scan_layers!r}")
        if self.qk_norm_scope not in ("head", "projection"):
            raise ValueError(f"qk_norm_scope must be 'head' or 'projection', got "
                             f"{self.qk_norm_scope!r}")
        if self.clip_qkv is not None and not (
                isinstance(self.clip_qkv, (int, float)) and self.clip_qkv > 0):
            raise ValueError(f"clip_qkv must be a positive number or None, got {self.clip_qkv!r}")
        object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
        _check_experts(self)
        _check_latent_attention(self)
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        object.__setattr__(self, "param_dtype", dtype_name(self.param_dtype))

    @property
    def embedding_rows(self) -> int:
        return self.vocab_size if self.input_vocab_size is None else self.input_vocab_size

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    @property
    def compute_dtype(self):
        return _dtype(self.dtype)

    @property
    def storage_dtype(self):
        return _dtype(self.param_dtype)

    @property
    def resolved_expert_d_ff(self) -> int:
        return self.expert_d_ff if self.expert_d_ff is not None else self.d_ff

    def layer_is_moe(self, layer: int) -> bool:
        """Does layer `layer` route its tokens to experts (else: the dense MLP)?"""
        return self.num_experts > 0 and layer not in self.dense_layers

    @property
    def uniform_layers(self) -> bool:
        """Do all layers have the same structure (what `scan_layers` stacks)?"""
        return len({self.layer_is_moe(i) for i in range(self.num_layers)}) == 1

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of layer `layer` (None: full attention)."""
        if self.sliding_window is None or self.sliding_layers == "none":
            return None
        if self.sliding_layers == "even" and layer % 2:
            return None
        return self.sliding_window


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_experts(config: TransformerConfig) -> None:
    """Refuse a mixture-of-experts configuration the layer cannot compute, by field."""
    experts = config.num_experts
    if not isinstance(experts, int) or isinstance(experts, bool) or experts < 0:
        raise ValueError(f"num_experts must be an int >= 0 (0: dense), got {experts!r}")
    if not experts:
        moe_only = {"experts_per_token": 0, "dense_layers": (), "expert_d_ff": None,
                    "shared_d_ff": 0, "router_bias": False}
        for name, default in moe_only.items():
            if getattr(config, name) != default:
                raise ValueError(f"{name}={getattr(config, name)!r} needs num_experts > 0")
        return
    if not _positive_int(config.experts_per_token) or config.experts_per_token > experts:
        raise ValueError(f"experts_per_token must be an int in [1, num_experts={experts}], "
                         f"got {config.experts_per_token!r}")
    if config.expert_d_ff is not None and not _positive_int(config.expert_d_ff):
        raise ValueError(f"expert_d_ff must be a positive int or None, got "
                         f"{config.expert_d_ff!r}")
    if not isinstance(config.shared_d_ff, int) or config.shared_d_ff < 0:
        raise ValueError(f"shared_d_ff must be an int >= 0 (0: no shared experts), got "
                         f"{config.shared_d_ff!r}")
    if config.shared_expert_gate and not config.shared_d_ff:
        raise ValueError("shared_expert_gate needs shared experts (shared_d_ff > 0)")
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < config.num_layers
           for i in config.dense_layers) or len(set(config.dense_layers)) != len(
               config.dense_layers):
        raise ValueError(f"dense_layers must be distinct layer indices in [0, "
                         f"{config.num_layers}), got {config.dense_layers!r}")
    if not config.gated_mlp:
        raise ValueError("experts are gated MLPs (SwiGLU / GeGLU): gated_mlp=False with "
                         "num_experts > 0 is not a published architecture")
    if config.scan_layers and not config.uniform_layers:
        raise ValueError(f"scan_layers stacks identical layers, and dense_layers "
                         f"{config.dense_layers} differ from the expert layers: load with "
                         "scan_layers=False")
    if config.router_scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"router_scoring must be 'softmax' or 'sigmoid', got "
                         f"{config.router_scoring!r}")
    if config.router_group_score not in ("max", "top2_sum"):
        raise ValueError(f"router_group_score must be 'max' or 'top2_sum', got "
                         f"{config.router_group_score!r}")
    groups, kept = config.router_groups, config.router_topk_groups
    if not _positive_int(groups) or experts % groups:
        raise ValueError(f"router_groups must be a positive int dividing num_experts "
                         f"({experts}), got {groups!r}")
    if not _positive_int(kept) or kept > groups:
        raise ValueError(f"router_topk_groups must be an int in [1, router_groups={groups}], "
                         f"got {kept!r}")
    if groups > 1 and kept * (experts // groups) < config.experts_per_token:
        raise ValueError(f"the {kept} kept groups of {experts // groups} experts hold fewer "
                         f"than experts_per_token={config.experts_per_token}")
    if groups > 1 and config.router_group_score == "top2_sum" and experts // groups < 2:
        raise ValueError("router_group_score 'top2_sum' needs at least 2 experts per group")
    if isinstance(config.routed_scaling, bool) or not isinstance(
            config.routed_scaling, (int, float)) or not config.routed_scaling > 0:
        raise ValueError(f"routed_scaling must be a positive number, got "
                         f"{config.routed_scaling!r}")


def _check_latent_attention(config: TransformerConfig) -> None:
    """Refuse a multi-head latent attention configuration by field."""
    fields = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim")
    for name in fields:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    if not config.kv_lora_rank:
        used = [name for name in fields[1:] if getattr(config, name)]
        if used:
            raise ValueError(f"{used[0]} is a field of multi-head latent attention: it "
                             "needs kv_lora_rank > 0")
        return
    for name in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if not getattr(config, name):
            raise ValueError(f"multi-head latent attention needs {name} > 0")
    if config.qk_rope_head_dim % 2:
        raise ValueError(f"qk_rope_head_dim must be even for rotary embeddings, got "
                         f"{config.qk_rope_head_dim}")
    if config.position_embedding != "rope" or config.qk_norm or config.clip_qkv is not None \
            or config.attn_logit_softcap is not None:
        raise ValueError("multi-head latent attention takes rotary positions and no q/k norm, "
                         "clipping or logit soft-capping")
    if config.num_kv_heads != config.num_heads:
        raise ValueError(f"multi-head latent attention has a key and value per head: "
                         f"num_kv_heads ({config.num_kv_heads}) must equal num_heads "
                         f"({config.num_heads})")

