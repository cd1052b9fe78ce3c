"""Logical axes and sharding rules: the specs they give, the presets, meshes from a spec
string, and refusals that name what does not fit (8-device runs: tests/test_sharded.py)."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, PartitionSpec

from specjax.runtime.sharding import (
    DATA_AND_TENSOR,
    DATA_PARALLEL,
    TENSOR_PARALLEL,
    ShardingRules,
    check_mesh,
    commit_beside_weights,
    committed_shardings,
    mesh_from_spec,
    model_placement,
    named_sharding,
    pin_rows,
)


def test_rules_map_logical_axes_to_mesh_axes():
    assert DATA_PARALLEL.spec(("batch", "kv_heads", "cache_slots", None)) == PartitionSpec(
        "data", None, None, None)
    assert TENSOR_PARALLEL.spec(("embed", "heads")) == PartitionSpec(None, "model")
    assert TENSOR_PARALLEL.spec(("mlp", "embed")) == PartitionSpec("model", None)
    assert DATA_AND_TENSOR.spec(("batch", "kv_heads", "cache_slots", None)) == PartitionSpec(
        "data", "model", None, None)
    assert DATA_AND_TENSOR.mesh_axes() == {"data", "model"}


def test_rules_refuse_unknown_axes_and_two_dimensions_on_one_mesh_axis():
    with pytest.raises(ValueError, match="unknown logical axes"):
        TENSOR_PARALLEL.spec(("embed", "routers"))
    with pytest.raises(ValueError, match="map two dimensions to one mesh axis"):
        TENSOR_PARALLEL.spec(("heads", "mlp"))
    with pytest.raises(ValueError, match="ShardingRules.heads must be a mesh axis name"):
        ShardingRules(heads="")


def test_a_dimension_that_does_not_divide_is_named():
    mesh = AbstractMesh((4,), ("model",))
    with pytest.raises(ValueError, match=r"parameter w: its heads dimension \(6\) does not "
                                         r"divide by the mesh axis 'model' \(4 devices\)"):
        named_sharding(mesh, TENSOR_PARALLEL, ("embed", "heads"), (8, 6), "parameter w")
    with pytest.raises(ValueError, match="2 logical axes for a shape of rank 3"):
        named_sharding(mesh, TENSOR_PARALLEL, ("embed", "heads"), (8, 8, 8), "x")


def test_meshes_from_a_spec_string():
    mesh = mesh_from_spec("data=1")
    assert mesh.axis_names == ("data",) and mesh.devices.size == len(jax.devices())
    assert mesh_from_spec({"data": 1, "model": 1}).axis_names == ("data", "model")
    for bad, message in (("data=two", "name=size pairs"), ("=1", "has no name"),
                         ("data=0", "size >= 1"), ("data=1,model=3", "devices, but"),
                         ("data=1,data=1", "'data' is given twice"),
                         ({"model": 8.7}, "has size 8.7; sizes are whole numbers"),
                         ({"model": True}, "has size True"), ({"": 1}, "has no name")):
        with pytest.raises(ValueError, match=message):
            mesh_from_spec(bad)


def test_rules_that_name_a_missing_mesh_axis_are_refused():
    with pytest.raises(ValueError, match=r"mesh axes \['model'\], which this mesh"):
        check_mesh(mesh_from_spec("data=1"), TENSOR_PARALLEL)
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        check_mesh("data=1", DATA_PARALLEL)


def test_a_model_on_one_device_has_no_placement_and_its_rows_are_left_alone(tiny_lm):
    assert model_placement(tiny_lm) is None
    tree = {"lengths": jax.numpy.zeros(4, "int32")}
    assert pin_rows(tree, tiny_lm, 4) is tree


def test_fresh_arrays_are_committed_beside_the_weights():
    """Beside weights committed to a device, uncommitted arrays (optimizer.init's fresh
    counters) go to that device; with nothing committed the tree is left as it is (the
    mesh's case, replicated over it: tests/test_sharded.py)."""
    device = jax.devices()[0]
    weights, counter = jax.device_put(jnp.ones((2, 3)), device), jnp.zeros((), jnp.int32)
    assert not counter.committed and set(committed_shardings((weights, counter))) == {
        frozenset({device})}
    placed_weights, placed_counter = commit_beside_weights((weights, counter))
    assert placed_weights is weights and placed_counter.committed
    assert placed_counter.sharding.device_set == {device}
    fresh = (jnp.ones(3), counter)
    assert committed_shardings(fresh) == {}
    assert all(a is b for a, b in zip(commit_beside_weights(fresh), fresh, strict=True))
