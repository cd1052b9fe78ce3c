"""Sharding over a `jax.sharding.Mesh`: logical axis names and the rules that map them to
mesh axes, the way MaxText and the jax-llm-examples models name theirs.

Arrays are described by logical axes (`LOGICAL_AXES`): a parameter of shape [D, N*H] is
("embed", "heads"), a KV cache [B, K, S, H] is ("batch", "kv_heads", "cache_slots",
None). A `ShardingRules` maps each logical axis to a mesh axis or to None (replicated);
`NamedSharding`s follow, and jit's GSPMD partitioner inserts the collectives. Presets:

- `DATA_PARALLEL`: rows split over the mesh axis "data"; every weight replicated.
- `TENSOR_PARALLEL` (Megatron): attention heads, KV heads and the MLP's hidden columns
  split over "model", so each attention block and each MLP ends in one all-reduce; the
  vocabulary of the embedding and the LM head split too.
- `DATA_AND_TENSOR`: both, on a mesh with axes ("data", "model").
- `EXPERT_PARALLEL`: a mixture of experts' experts split whole over "model" (each
  device holds E / n experts, every token's pairs computed where their expert lives),
  attention and the vocabulary tensor parallel as above, dense MLPs replicated.

Nothing changes without a mesh: a model that was never sharded runs on one device as
before. `specjax_models.shard(lm, mesh, rules)` places a model's parameters and makes
its caches sharded.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

LOGICAL_AXES = ("batch", "vocab", "embed", "heads", "kv_heads", "mlp", "cache_slots",
                "layers", "experts")


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Logical axis -> mesh axis name (or None: replicated), e.g.
    `ShardingRules(batch="data", heads="model")`; axes not named are replicated."""

    batch: str | None = None
    vocab: str | None = None
    embed: str | None = None
    heads: str | None = None
    kv_heads: str | None = None
    mlp: str | None = None
    cache_slots: str | None = None
    layers: str | None = None
    experts: str | None = None

    def __post_init__(self):
        for axis in LOGICAL_AXES:
            value = getattr(self, axis)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"ShardingRules.{axis} must be a mesh axis name or None, "
                                 f"got {value!r}")

    def mesh_axes(self) -> set[str]:
        """The mesh axes these rules use."""
        return {getattr(self, axis) for axis in LOGICAL_AXES} - {None}

    def spec(self, logical: Sequence[str | None]) -> PartitionSpec:
        """The `PartitionSpec` of an array with these logical axes (None: replicated)."""
        unknown = [axis for axis in logical if axis is not None and axis not in LOGICAL_AXES]
        if unknown:
            raise ValueError(f"unknown logical axes {unknown}; known: {LOGICAL_AXES}")
        mapped = [None if axis is None else getattr(self, axis) for axis in logical]
        used = [axis for axis in mapped if axis is not None]
        if len(used) != len(set(used)):
            raise ValueError(f"logical axes {tuple(logical)} map two dimensions to one mesh "
                             f"axis ({tuple(mapped)})")
        return PartitionSpec(*mapped)


DATA_PARALLEL = ShardingRules(batch="data")
TENSOR_PARALLEL = ShardingRules(vocab="model", heads="model", kv_heads="model", mlp="model")
DATA_AND_TENSOR = dataclasses.replace(TENSOR_PARALLEL, batch="data")
EXPERT_PARALLEL = dataclasses.replace(TENSOR_PARALLEL, mlp=None, experts="model")


def default_rules(mesh: Mesh) -> ShardingRules:
    """The preset a mesh's axis names ask for: ("data",) data parallel, ("model",) tensor
    parallel, ("data", "model") both; other names need explicit rules."""
    presets = {("data",): DATA_PARALLEL, ("model",): TENSOR_PARALLEL,
               ("data", "model"): DATA_AND_TENSOR, ("model", "data"): DATA_AND_TENSOR}
    names = tuple(mesh.axis_names)
    if names not in presets:
        raise ValueError(f"no preset for a mesh with axes {names}: name them data and/or "
                         "model, or pass rules=ShardingRules(...)")
    return presets[names]


def check_mesh(mesh: Mesh, rules: ShardingRules) -> None:
    """Refuse rules that name a mesh axis the mesh does not have."""
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if not isinstance(rules, ShardingRules):
        raise TypeError(f"rules must be a specjax.sharding.ShardingRules, got "
                        f"{type(rules).__name__}")
    missing = sorted(rules.mesh_axes() - set(mesh.axis_names))
    if missing:
        raise ValueError(f"the sharding rules use mesh axes {missing}, which this mesh "
                         f"(axes {tuple(mesh.axis_names)}) does not have")


def named_sharding(mesh: Mesh, rules: ShardingRules, logical: Sequence[str | None],
                   shape: Sequence[int], what: str) -> NamedSharding:
    """The sharding of an array `what` of `shape` with logical axes `logical`, after
    checking that every split dimension divides by its mesh axis (the error names the
    array, the dimension and the mesh axis)."""
    if len(logical) != len(shape):
        raise ValueError(f"{what}: {len(logical)} logical axes for a shape of rank "
                         f"{len(shape)} {tuple(shape)}")
    spec = rules.spec(logical)
    for size, axis, mesh_axis in zip(shape, logical, spec, strict=True):
        if mesh_axis is not None and size % mesh.shape[mesh_axis]:
            raise ValueError(f"{what}: its {axis} dimension ({size}) does not divide by the "
                             f"mesh axis {mesh_axis!r} ({mesh.shape[mesh_axis]} devices); "
                             "choose a mesh whose axis size divides it, or rules that do "
                             f"not split {axis}")
    return NamedSharding(mesh, spec)


def model_placement(lm) -> tuple[Mesh, ShardingRules] | None:
    """`(mesh, rules)` a CausalLM was placed with (`specjax_models.shard` and the loaders'
    `mesh=` record them on its cache factory), or None for a model on one device."""
    factory = getattr(lm, "init_cache_fn", None)
    mesh, rules = getattr(factory, "mesh", None), getattr(factory, "rules", None)
    if isinstance(mesh, Mesh) and isinstance(rules, ShardingRules) and mesh.size > 1:
        return mesh, rules
    return None


# Drafts placed on a target's mesh, by (draft, target placement): a decode call with the
# same draft and target finds its placed copy instead of moving the weights again. A
# handful at most (a notebook compares a few drafts); the oldest is dropped.
_PLACED_DRAFTS: dict[tuple[int, int], tuple] = {}
_PLACED_LIMIT = 8


def place_like_target(draft, target):
    """`draft` (a CausalLM) with its parameters split over the target's mesh by the
    target's rules, when the target is placed, the draft is not, and the model package
    that placed the target can place the draft (its cache factory's `place_like`); else
    `draft` as it is. A draft replicated on a model-parallel mesh drafts every row on every
    device and keeps every row's cache there (6.8 GB against 1.5 GB split, 8,000 rows on 8
    devices). A draft whose dimensions do not divide the mesh stays replicated (exact
    either way: placement changes where the arithmetic runs, not what it computes)."""
    placement = model_placement(target)
    if placement is None or model_placement(draft) is not None:
        return draft
    place = getattr(target.init_cache_fn, "place_like", None)
    if place is None:
        return draft
    key = (id(draft), id(target.init_cache_fn))
    found = _PLACED_DRAFTS.get(key)
    if found is not None and found[0] is draft and found[1] is target.init_cache_fn:
        return found[2]
    try:
        placed = place(draft)
    except (TypeError, ValueError):  # not a model it knows, or heads that do not divide
        placed = draft
    if len(_PLACED_DRAFTS) >= _PLACED_LIMIT:
        _PLACED_DRAFTS.pop(next(iter(_PLACED_DRAFTS)))
    # The originals are held with the copy, so their ids cannot be reused by new objects.
    _PLACED_DRAFTS[key] = (draft, target.init_cache_fn, placed)
    return placed


def pin_rows(tree, lm, batch: int):
    """Inside jit: the per-row arrays of a decode state (rank 1 or 2, leading axis `batch`)
    laid out explicitly by the rows' rule (split over the rules' batch axis when it
    divides the batch, replicated otherwise), when `lm` is placed on a mesh. A state then
    has one layout from its prefill on: left to propagation, the prefill returned them
    replicated and the first step split them, so the second step compiled again and the
    first one's donated buffers could not be reused. Caches (rank >= 3) keep what their
    factories give them; nothing changes without a mesh."""
    placement = model_placement(lm)
    if placement is None:
        return tree
    mesh, rules = placement
    axis = rules.batch if rules.batch and batch % mesh.shape[rules.batch] == 0 else None

    def pin(x):
        if getattr(x, "ndim", 0) not in (1, 2) or x.shape[0] != batch:
            return x
        spec = PartitionSpec(axis, *(None,) * (x.ndim - 1))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    return jax.tree.map(pin, tree)


def committed_shardings(tree) -> dict[frozenset, jax.sharding.Sharding]:
    """The shardings of `tree`'s committed arrays, one per set of devices they span. A
    jitted call's outputs are committed where its committed arguments are, and jit
    refuses committed arguments on different sets of devices."""
    return {frozenset(x.sharding.device_set): x.sharding for x in jax.tree.leaves(tree)
            if isinstance(x, jax.Array) and x.committed}


def commit_beside_weights(tree):
    """`tree` with its uncommitted arrays committed where its committed ones are: on their
    device, or replicated over their mesh (committed to one device, jit would refuse them
    beside the mesh's arrays). A jitted step's outputs are all committed; a first call
    whose inputs mix committed arrays with others (`optimizer.init`'s fresh counters
    beside loaded weights, a head initialised in parts) takes a program of its own, and
    the second call compiles the whole step again. With nothing committed, or committed
    arrays on different sets of devices (which jit refuses by name), `tree` is returned
    as it is."""
    placements = committed_shardings(tree)
    if len(placements) != 1:
        return tree
    (devices, sharding), = placements.items()
    if len(devices) == 1:
        target = jax.sharding.SingleDeviceSharding(next(iter(devices)))
    elif isinstance(sharding, NamedSharding):
        target = NamedSharding(sharding.mesh, PartitionSpec())
    else:
        return tree
    return jax.tree.map(lambda x: jax.device_put(x, target)
                        if isinstance(x, jax.Array) and not x.committed else x, tree)


def mesh_from_spec(spec: str | Mapping[str, int], devices=None) -> Mesh:
    """A mesh from "data=2,model=4" (or {"data": 2, "model": 4}) over `devices` (default:
    all of them); the sizes must multiply to the number of devices."""
    if isinstance(spec, str):
        pairs = []
        for part in spec.split(","):
            name, _, size = part.partition("=")
            try:
                pairs.append((name.strip(), int(size)))
            except ValueError:
                raise ValueError(f"mesh spec {spec!r}: expected name=size pairs separated "
                                 "by commas, e.g. data=2,model=4") from None
    else:
        pairs = list(dict(spec).items())  # a Mapping cannot repeat a name
    sizes = {}
    for name, size in pairs:
        if not isinstance(name, str) or not name:
            raise ValueError(f"mesh spec {spec!r}: an axis has no name")
        if name in sizes:
            raise ValueError(f"mesh spec {spec!r}: axis {name!r} is given twice; name each "
                             "axis once")
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise ValueError(f"mesh spec {spec!r}: axis {name!r} has size {size!r}; sizes "
                             "are whole numbers of devices")
        sizes[name] = int(size)
    if not sizes or any(size < 1 for size in sizes.values()):
        raise ValueError(f"mesh spec {spec!r}: every axis needs a size >= 1")
    devices = list(jax.devices() if devices is None else devices)
    if math.prod(sizes.values()) != len(devices):
        raise ValueError(f"mesh spec {spec!r} has {math.prod(sizes.values())} devices, but "
                         f"{len(devices)} are available")
    grid = np.asarray(devices, dtype=object).reshape(tuple(sizes.values()))
    return Mesh(grid, tuple(sizes))
