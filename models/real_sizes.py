"""Real sizes without downloads: the architectures people decode (Llama-3.2-1B/3B,
Llama-3.1-8B, Qwen2.5-0.5B..7B, Gemma-2-2B/9B, Mixtral-8x7B, DeepSeek-V2-Lite) as named
configurations, from the values of their published config.json files, with random
weights created where they will live.

For SPEED AND MEMORY only: the weights are random, the outputs meaningless. What they
measure is what the shapes cost (bytes moved per forward, FLOPs, compile time, memory),
which is what a real checkpoint of the same architecture costs (`benchmarks/machines/roofline.py`,
`benchmarks/machines/device.py`).

`real_size_config(name, dtype)` is the `TransformerConfig` (through `config_from_hf`, the
path a downloaded checkpoint takes); `random_model(name, dtype)` builds it: every
parameter is drawn by a jitted initialiser whose outputs are placed on the default
device, or sharded over `mesh` by `specjax.sharding` rules, so no full host copy exists.
Before anything is allocated, `check_fits` compares the parameters' bytes (plus a cache,
when asked) with the device's memory and refuses, naming both, what does not fit.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from specjax_models.config import TransformerConfig

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
_LLAMA = dict(model_type="llama", vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
              max_position_embeddings=131072, hidden_act="silu", attention_bias=False,
              mlp_bias=False, torch_dtype="bfloat16")
_QWEN = dict(model_type="qwen2", vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6,
             max_position_embeddings=32768, hidden_act="silu", use_sliding_window=False,
             torch_dtype="bfloat16")
_GEMMA2 = dict(model_type="gemma2", vocab_size=256000, head_dim=256, rope_theta=10000.0,
               rms_norm_eps=1e-6, max_position_embeddings=8192, sliding_window=4096,
               attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
               query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh",
               torch_dtype="bfloat16")

# The published config.json values that decide the shapes (Hugging Face model pages).
PUBLISHED: dict[str, dict] = {
    "llama-3.2-1b": dict(_LLAMA, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=64, tie_word_embeddings=True,
                         rope_scaling=dict(_LLAMA3_ROPE, factor=32.0)),
    "llama-3.2-3b": dict(_LLAMA, hidden_size=3072, intermediate_size=8192,
                         num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                         head_dim=128, tie_word_embeddings=True,
                         rope_scaling=dict(_LLAMA3_ROPE, factor=32.0)),
    "llama-3.1-8b": dict(_LLAMA, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         tie_word_embeddings=False, rope_scaling=dict(_LLAMA3_ROPE, factor=8.0)),
    "qwen2.5-0.5b": dict(_QWEN, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(_QWEN, hidden_size=1536, intermediate_size=8960,
                         num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         tie_word_embeddings=True),
    "qwen2.5-3b": dict(_QWEN, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-7b": dict(_QWEN, vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       max_position_embeddings=131072, tie_word_embeddings=False),
    "gemma-2-2b": dict(_GEMMA2, hidden_size=2304, intermediate_size=9216,
                       num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4),
    "gemma-2-9b": dict(_GEMMA2, hidden_size=3584, intermediate_size=14336,
                       num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8),
    "mixtral-8x7b": dict(model_type="mixtral", vocab_size=32000, hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                         num_experts_per_tok=2, rope_theta=1000000.0, rms_norm_eps=1e-5,
                         max_position_embeddings=32768, sliding_window=None,
                         tie_word_embeddings=False, hidden_act="silu",
                         torch_dtype="bfloat16"),
    "deepseek-v2-lite": dict(
        model_type="deepseek_v2", vocab_size=102400, hidden_size=2048,
        intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27,
        num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64,
        n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1,
        moe_layer_freq=1, n_group=1, topk_group=1, topk_method="greedy",
        scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.0,
        rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=163840,
        rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                      "mscale_all_dim": 0.707},
        tie_word_embeddings=False, hidden_act="silu", torch_dtype="bfloat16"),
}

# Parameters of each published checkpoint (its model page), which the configurations
# must reproduce (tests/test_real_sizes.py counts them from the abstract model).
PUBLISHED_PARAMS = {
    "llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824,
    "llama-3.1-8b": 8_030_261_248, "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-7b": 7_615_616_512, "gemma-2-2b": 2_614_341_888, "gemma-2-9b": 9_241_705_984,
    "mixtral-8x7b": 46_702_792_704, "deepseek-v2-lite": 15_706_484_224,
}
DTYPES = ("float32", "bfloat16")


def real_size_names() -> list[str]:
    return list(PUBLISHED)


def real_size_config(name: str, dtype: str = "bfloat16", *, scan_layers: bool = False,
                     max_seq_len: int | None = None) -> TransformerConfig:
    """The named architecture's `TransformerConfig` in `dtype` (float32 or bfloat16);
    `max_seq_len` caps the positions (the published one by default)."""
    if name not in PUBLISHED:
        raise ValueError(f"unknown real-size model {name!r}; the names are: "
                         f"{', '.join(PUBLISHED)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    import dataclasses

    from specjax_models.hf_config import config_from_hf

    config = config_from_hf(PUBLISHED[name], dtype)
    changes = {"scan_layers": bool(scan_layers)}
    if max_seq_len is not None:
        changes["max_seq_len"] = int(max_seq_len)
    return dataclasses.replace(config, **changes)


def abstract_params(config: TransformerConfig):
    """The parameters' shapes and dtypes (`nnx.State` of ShapeDtypeStructs), no memory."""
    from flax import nnx

    from specjax_models.transformer import abstract_transformer

    return nnx.split(abstract_transformer(config), nnx.Param)[1]


def param_bytes(config: TransformerConfig) -> int:
    """Bytes of the parameters in their storage dtype."""
    return int(sum(np.prod(x.shape) * jnp.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(abstract_params(config))))


def cache_bytes(config: TransformerConfig, batch: int, length: int) -> int:
    """Bytes of a KV cache of `batch` rows and `length` slots (the model's own layout:
    latent attention caches its compressed keys)."""
    from specjax_models.cache import KVCache

    cache = jax.eval_shape(lambda: KVCache.create(config, batch, length))
    return int(sum(np.prod(x.shape) * jnp.dtype(x.dtype).itemsize
                   for x in jax.tree.leaves(cache)))


def device_memory_bytes(device=None) -> int | None:
    """The memory a device offers: an accelerator's allocator limit, the host's available
    memory for a CPU device; None when unknown."""
    device = device or jax.devices()[0]
    stats = None
    try:
        stats = device.memory_stats()
    except (AttributeError, RuntimeError, NotImplementedError):
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
    if device.platform == "cpu":
        try:
            with open("/proc/meminfo") as info:
                for line in info:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else None
        return None if pages is None else pages * os.sysconf("SC_PAGE_SIZE")
    return None


def check_fits(name: str, config: TransformerConfig, *, devices: int = 1,
               extra_bytes: int = 0, device=None) -> int:
    """Refuse, before anything is allocated, a model (plus `extra_bytes`: caches,
    activations) that does not fit: the bytes it needs per device (split over `devices`)
    against the bytes the device has. Returns the bytes needed per device."""
    needed = -(-(param_bytes(config) + extra_bytes) // max(devices, 1))
    available = device_memory_bytes(device)
    if available is not None and needed > available:
        raise MemoryError(f"{name} in {config.param_dtype} needs {needed:,} bytes "
                          f"({needed / 2**30:.1f} GiB) per device"
                          + (f" over {devices} devices" if devices > 1 else "")
                          + f", and the device has {available:,} bytes "
                          f"({available / 2**30:.1f} GiB) free: choose a smaller model, "
                          "bfloat16, or a mesh of more devices")
    return needed


def hashed_values(path: tuple, like, seed) -> jax.Array:
    """Pseudo-random values of `like`'s shape and dtype, computed from the element index
    by an integer hash (about a memory pass; threefry on a 2-core CPU takes a minute per
    half-billion parameters): unit-variance uniform noise scaled by 1/sqrt(fan-in) for a
    kernel or an embedding row, ones for a norm's scale, zeros for a bias. Inside a jit
    with sharded outputs each device computes only its own shard."""
    name = str(path[-1]) if path else ""
    if len(like.shape) <= 1:
        fill = 0.0 if "bias" in name else 1.0
        return jnp.full(like.shape, fill, like.dtype)
    index = jax.lax.iota(jnp.uint32, int(np.prod(like.shape))).reshape(like.shape)
    bits = index * jnp.uint32(0x9E3779B1) + seed * jnp.uint32(0x85EBCA77)
    bits = (bits ^ (bits >> 15)) * jnp.uint32(0x2C1B3C6D)
    bits = (bits ^ (bits >> 12)) * jnp.uint32(0x297A2D39)
    bits = bits ^ (bits >> 15)
    uniform = (bits >> 8).astype(jnp.float32) * (1.0 / (1 << 24)) - 0.5
    fan_in = like.shape[-2] if "embed" not in name else like.shape[-1]
    return (uniform * (np.sqrt(12.0) / np.sqrt(fan_in))).astype(like.dtype)


def random_model(name: str, dtype: str = "bfloat16", *, scan_layers: bool = False,
                 max_seq_len: int | None = None, seed: int = 0, mesh=None, rules=None,
                 extra_bytes: int = 0):
    """A `specjax.CausalLM` of the named architecture with random weights (speed and
    memory only). One jitted initialiser draws every parameter where it lives: on the
    default device, or with `mesh`, on its shards by `rules` (`specjax.sharding`; default:
    the mesh's own axes), so no full copy exists on the host or on one device. Refused by
    `check_fits` before anything is allocated. The values are pseudo-random
    (`hashed_values`, from `seed`), meaningful for speed and memory only."""
    import dataclasses

    from flax import nnx

    import specjax
    from specjax_models.sharded import _ShardedInitCache, loading_placement
    from specjax_models.transformer import abstract_transformer

    config = real_size_config(name, dtype, scan_layers=scan_layers, max_seq_len=max_seq_len)
    check_fits(name, config, devices=1 if mesh is None else mesh.size,
               extra_bytes=extra_bytes)
    rules, placement = loading_placement(mesh, rules)
    structure, abstract = nnx.split(abstract_transformer(config), nnx.Param)
    shardings = None
    if placement is not None:
        where = placement.for_model(config)
        shardings = nnx.from_flat_state([
            (path, leaf.replace(where(path, leaf.get_value().shape)))
            for path, leaf in nnx.to_flat_state(abstract)])

    def init(seed_u32):
        flat = nnx.to_flat_state(abstract)
        return nnx.from_flat_state([
            (path, leaf.replace(hashed_values(path, leaf.get_value(), seed_u32 + index)))
            for index, (path, leaf) in enumerate(flat)])

    params = jax.jit(init, out_shardings=shardings)(jnp.uint32(seed * 7919))
    lm = specjax.CausalLM.from_nnx(nnx.merge(structure, params))
    if mesh is not None:  # caches created sharded too, as `specjax_models.shard` does
        lm = dataclasses.replace(lm, init_cache_fn=_ShardedInitCache(
            lm.init_cache_fn, mesh, rules, bool(config.kv_lora_rank)))
    return lm
