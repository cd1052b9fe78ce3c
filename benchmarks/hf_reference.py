"""Our Llama-family models as transformers' LlamaForCausalLM with the very same weights,
for side-by-side measurements (benchmarks only; PyTorch CPU)."""

from __future__ import annotations

import numpy as np
from flax import nnx

import models
import specjax


def nnx_module(lm: specjax.CausalLM) -> models.Transformer:
    """The NNX module behind a CausalLM made by `CausalLM.from_nnx`."""
    graphdef = getattr(lm.apply_fn, "graphdef", None)
    if graphdef is None:
        raise TypeError("this CausalLM was not built by CausalLM.from_nnx")
    return nnx.merge(graphdef, lm.params)


def to_transformers(model: models.Transformer | specjax.CausalLM):
    """A float32 LlamaForCausalLM holding exactly our weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if isinstance(model, specjax.CausalLM):
        model = nnx_module(model)
    cfg = model.config
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.resolved_head_dim,
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=cfg.qkv_bias)).eval()
    t = lambda x: torch.from_numpy(np.asarray(x[...], np.float32).copy())
    state = {"model.embed_tokens.weight": t(model.embed.embedding),
             "model.norm.weight": t(model.final_norm.weight)}
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = t(model.lm_head.kernel).T
    for i, block_ in enumerate(model.layers):
        p = f"model.layers.{i}."
        attn, mlp = block_.attention, block_.mlp
        state[p + "input_layernorm.weight"] = t(block_.input_norm.weight)
        state[p + "post_attention_layernorm.weight"] = t(block_.post_attention_norm.weight)
        for name in ["q_proj", "k_proj", "v_proj", "o_proj"]:
            state[p + f"self_attn.{name}.weight"] = t(getattr(attn, name).kernel).T
            bias = getattr(getattr(attn, name), "bias", None)
            if bias is not None:
                state[p + f"self_attn.{name}.bias"] = t(bias)
        for name in ["gate_proj", "up_proj", "down_proj"]:
            state[p + f"mlp.{name}.weight"] = t(getattr(mlp, name).kernel).T
    hf.load_state_dict(state, strict=not cfg.tie_embeddings)
    return hf
