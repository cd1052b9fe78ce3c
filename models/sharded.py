"""A Transformer's parameters and caches placed on a `jax.sharding.Mesh` by
`specjax.sharding` rules.

Every parameter has logical axes by its name (`param_axes`): the q/k/v projections split
their output columns by heads ("heads", "kv_heads"), the output projection its input rows,
the MLP's gate/up columns and down rows by "mlp", the embedding and LM head by "vocab";
a mixture of experts' stacked experts by "experts" and "mlp"; norms are replicated.
With `TENSOR_PARALLEL` this is Megatron's layout: each attention block and each MLP
computes its part locally and ends in one all-reduce. The KV cache is
("batch", "kv_heads", "cache_slots", None) per layer, so each device keeps the keys and
values of its own heads (tensor parallel) or rows (data parallel).

`shard(lm, mesh, rules)` returns the CausalLM with its parameters placed (each array
moved to its shards; on a single host nothing is gathered on one device) and a cache
factory that creates the cache sharded, so every decoder (`generate`,
`speculative_generate`, `speculative_stream`, `jitted_step`) runs under the mesh by
jit's propagation from these arrays; a drafter that is not sharded is replicated.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding

import specjax
from specjax.runtime.sharding import ShardingRules, check_mesh, default_rules, named_sharding

# The last name parts of a parameter -> its logical axes (without the [L] axis of a
# scanned model).
_AXES = {
    ("embed", "embedding"): ("vocab", "embed"),
    ("position_embed", "embedding"): (None, "embed"),
    ("lm_head", "kernel"): ("embed", "vocab"),
    ("q_proj", "kernel"): ("embed", "heads"), ("q_proj", "bias"): ("heads",),
    ("k_proj", "kernel"): ("embed", "kv_heads"), ("k_proj", "bias"): ("kv_heads",),
    ("v_proj", "kernel"): ("embed", "kv_heads"), ("v_proj", "bias"): ("kv_heads",),
    ("o_proj", "kernel"): ("heads", "embed"), ("o_proj", "bias"): ("embed",),
    ("gate_proj", "kernel"): ("embed", "mlp"), ("gate_proj", "bias"): ("mlp",),
    ("up_proj", "kernel"): ("embed", "mlp"), ("up_proj", "bias"): ("mlp",),
    ("down_proj", "kernel"): ("mlp", "embed"), ("down_proj", "bias"): ("embed",),
    # A mixture of experts: the stacked experts [E, D, F] / [E, F, D] split by "experts"
    # (expert parallel) and their hidden columns by "mlp" (tensor parallel); the router
    # and the shared expert's gate are small and replicated.
    ("mlp", "gate_kernel"): ("experts", "embed", "mlp"),
    ("mlp", "up_kernel"): ("experts", "embed", "mlp"),
    ("mlp", "down_kernel"): ("experts", "mlp", "embed"),
    ("router", "kernel"): ("embed", None), ("mlp", "router_bias"): (None,),
    ("shared_gate", "kernel"): ("embed", None),
    # Multi-head latent attention: the latents are shared by every head (replicated, as
    # the cache of latents is), the up-projections split by head.
    ("q_a_proj", "kernel"): ("embed", None), ("q_a_proj", "bias"): (None,),
    ("q_b_proj", "kernel"): (None, "heads"),
    ("kv_a_proj", "kernel"): ("embed", None), ("kv_a_proj", "bias"): (None,),
    ("kv_b_proj", "kernel"): (None, "heads"),
}
CACHE_AXES = ("batch", "kv_heads", "cache_slots", None)


def param_axes(path: tuple, ndim: int) -> tuple[str | None, ...]:
    """The logical axes of the parameter at `path` (nnx state keys) with `ndim` dims; a
    scanned model's `layers.X` (no layer index) has a leading "layers" axis."""
    names = tuple(str(p) for p in path)
    scanned = len(names) > 1 and names[0] == "layers" and not names[1].isdigit()
    axes = _AXES.get(names[-2:])
    if axes is None:
        if names[-1] not in ("weight", "bias", "scale"):  # anything else: refuse, not guess
            raise ValueError(f"no sharding rule for parameter {'.'.join(names)}")
        axes = (None,) * (ndim - int(scanned))  # norms (and q/k norms): replicated
    if scanned:
        axes = ("layers",) + axes
    if len(axes) != ndim:
        raise ValueError(f"parameter {'.'.join(names)} has {ndim} dims, its rule {axes}")
    return axes


@dataclasses.dataclass(frozen=True)
class _ShardedInitCache:
    """A cache factory whose caches are created sharded (inside jit: a constraint)."""

    inner: Any
    mesh: Mesh
    rules: ShardingRules
    latent: bool = False  # multi-head latent attention: one latent per token, no KV heads

    def __call__(self, params, batch: int, max_len: int):
        cache = self.inner(params, batch, max_len)
        constrain = lambda array, axes, what: jax.lax.with_sharding_constraint(
            array, named_sharding(self.mesh, self.rules, axes, array.shape, what))
        axes = ("batch", None, "cache_slots", None) if self.latent else CACHE_AXES
        if isinstance(cache.keys, tuple):
            keys = tuple(constrain(k, axes, "the KV cache") for k in cache.keys)
            values = tuple(constrain(v, axes, "the KV cache") for v in cache.values)
        else:  # scanned: [L, B, K, S, H]
            keys = constrain(cache.keys, ("layers",) + axes, "the KV cache")
            values = constrain(cache.values, ("layers",) + axes, "the KV cache")
        positions = constrain(cache.positions, ("batch", "cache_slots"), "the cache positions")
        return type(cache)(keys, values, positions)

    def place_like(self, lm: specjax.CausalLM) -> specjax.CausalLM:
        """Another model (a draft) placed by this model's mesh and rules: what
        `specjax.sharding.place_like_target` calls, so a draft that was never sharded
        follows its target's layout."""
        return shard(lm, self.mesh, self.rules)


def shard(lm: specjax.CausalLM, mesh: Mesh, rules: ShardingRules) -> specjax.CausalLM:
    """`lm` (a CausalLM of a `specjax_models.Transformer`) with its parameters placed on
    `mesh` by `rules` and caches created sharded. A dimension that does not divide by its
    mesh axis is refused, naming the parameter and the dimension; so are rules that name
    an axis the mesh lacks."""
    if isinstance(getattr(lm, "init_cache_fn", None), _ShardedInitCache):  # placed before
        lm = dataclasses.replace(lm, init_cache_fn=lm.init_cache_fn.inner)
    if not isinstance(lm, specjax.CausalLM) or not hasattr(lm.apply_fn, "graphdef") \
            or not hasattr(lm.init_cache_fn, "graphdef"):
        raise TypeError("shard expects a CausalLM of a specjax_models.Transformer "
                        "(CausalLM.from_nnx)")
    module_config = getattr(nnx.merge(lm.apply_fn.graphdef, lm.params), "config", None)
    if not hasattr(module_config, "num_kv_heads"):
        raise TypeError("shard expects a CausalLM of a specjax_models.Transformer")
    where = Placement(mesh, rules).for_model(module_config)
    placed = [(path, leaf.replace(jax.device_put(leaf.get_value(),
                                                 where(path, leaf.get_value().shape))))
              for path, leaf in nnx.to_flat_state(lm.params)]
    return dataclasses.replace(lm, params=nnx.from_flat_state(placed),
                               init_cache_fn=_ShardedInitCache(
                                   lm.init_cache_fn, mesh, rules,
                                   bool(getattr(module_config, "kv_lora_rank", 0))))


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each parameter of a model goes on `mesh` by `rules`: `placement(path, shape)`
    is its sharding (loaders place each tensor on its shards as they read it:
    `ParamFiller(placement=...)`). `for_model(config)` checks the model's head counts
    first (heads are split whole), so a mesh that cannot hold the model is refused before
    anything is read."""

    mesh: Mesh
    rules: ShardingRules

    def __post_init__(self):
        check_mesh(self.mesh, self.rules)

    def for_model(self, config) -> Placement:
        _check_heads(config, self.mesh, self.rules)
        return self

    def __call__(self, path: tuple, shape: tuple) -> NamedSharding:
        what = "parameter " + ".".join(str(p) for p in path)
        return named_sharding(self.mesh, self.rules, param_axes(path, len(shape)), shape, what)


def loading_placement(mesh: Mesh | None, rules: ShardingRules | None):
    """What a loader's `mesh=` and `rules=` mean: `(rules, placement)`, both None without a
    mesh; rules default to the mesh's axes (`specjax.sharding.default_rules`)."""
    if mesh is None:
        if rules is not None:
            raise ValueError("rules= needs mesh=: pass the jax.sharding.Mesh to place on")
        return None, None
    rules = default_rules(mesh) if rules is None else rules
    return rules, Placement(mesh, rules)


def _check_heads(config, mesh: Mesh, rules: ShardingRules) -> None:
    """Heads split whole: the projections' columns divide only if the head counts do."""
    for logical, count, name in (("heads", config.num_heads, "num_heads"),
                                 ("kv_heads", config.num_kv_heads, "num_kv_heads")):
        axis = getattr(rules, logical)
        if axis is not None and count % mesh.shape[axis]:
            raise ValueError(f"the model's {name} ({count}) does not divide by the mesh axis "
                             f"{axis!r} ({mesh.shape[axis]} devices): heads are split "
                             "whole; choose a smaller axis or rules that do not split "
                             f"{logical}")


_DTYPE_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2,
                "f16": 2, "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}
_COLLECTIVE = re.compile(r"= (\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|"
                         r"collective-permute)(?:-start)?\(")


def forward_collectives(lm: specjax.CausalLM, batch: int, cache_slots: int = 64) -> dict:
    """`{op: {"count", "bytes"}}`: the collectives XLA compiled into `lm`'s one-token
    forward over a cache (bytes of each result, per device), read from the optimized HLO.
    Tensor parallelism's price per token: on a 1 x 8 mesh, two all-reduces per layer."""
    def forward(model, tokens_B1, lengths_B):
        cache = model.init_cache(batch, cache_slots)
        return model.apply(tokens_B1, lengths_B[:, None] + 0 * tokens_B1, cache, lengths_B)[0]

    text = jax.jit(forward).lower(lm, jnp.ones((batch, 1), jnp.int32),
                                  jnp.zeros((batch,), jnp.int32)).compile().as_text()
    found: dict = {}
    for shapes, op in _COLLECTIVE.findall(text):
        size = 0
        for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shapes):
            size += math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES.get(dtype, 4)
        entry = found.setdefault(op, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += size
    return found
