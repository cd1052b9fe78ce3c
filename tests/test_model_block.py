"""specjax.drafters.ModelBlock: a block from model code as params + pure functions.

The contract with a block built here (a causal running sum with a cache of its inputs),
its jit sharing and its refusals; DeepSeek's MTP block under this contract is in
tests/test_mtp.py, and in the exactness registry ("deepseek mtp ...")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specjax.drafters import ModelBlock


class RunningSum(nnx.Module):
    """out[t] = x[t] + W (sum of the visible inputs): the cache holds the inputs by slot."""

    def __init__(self, d_model: int, seed: int):
        self.d_model = d_model
        self.kernel = nnx.Param(jax.random.normal(jax.random.key(seed), (d_model, d_model)))

    def init_cache(self, batch: int, slots: int):
        return jnp.zeros((batch, slots, self.d_model))

    def __call__(self, x_BTD, positions_BT, cache, cache_lengths_B, new_mask_BTT):
        length = x_BTD.shape[1]
        visible_BTT = new_mask_BTT if new_mask_BTT is not None else jnp.broadcast_to(
            jnp.tril(jnp.ones((length, length), bool)), (x_BTD.shape[0], length, length))
        new_sum = jnp.einsum("BTS,BSD->BTD", visible_BTT.astype(x_BTD.dtype), x_BTD)
        if cache is None:
            return x_BTD + new_sum @ self.kernel[...], None
        slots_S = jnp.arange(cache.shape[1])
        old_sum = jnp.einsum("BS,BSD->BD", (slots_S[None] < cache_lengths_B[:, None]).astype(
            x_BTD.dtype), cache)
        cache = jax.vmap(lambda row, new, start: jax.lax.dynamic_update_slice(
            row, new, (start, 0)))(cache, x_BTD, cache_lengths_B)
        return x_BTD + (old_sum[:, None] + new_sum) @ self.kernel[...], cache


def test_a_block_with_its_cache_equals_its_forward_over_every_position():
    block = ModelBlock.from_nnx(RunningSum(4, seed=0))
    assert block.d_model == 4
    x = jax.random.normal(jax.random.key(1), (2, 5, 4))
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))
    full, none = block.apply(x, positions, None, None)
    assert none is None
    cache = block.init_cache(2, 8)
    first, cache = block.apply(x[:, :3], positions[:, :3], cache, jnp.zeros(2, jnp.int32))
    rest, _ = block.apply(x[:, 3:], positions[:, 3:], cache, jnp.full(2, 3, jnp.int32))
    np.testing.assert_allclose(np.concatenate([first, rest], 1), full, rtol=1e-5, atol=1e-5)


def test_blocks_of_one_structure_share_one_compilation():
    """Parameters are the only leaves: a second block of the same structure (other
    weights) reuses the compiled function, and gives its own result."""
    traces = []

    @jax.jit
    def forward(block, x):
        traces.append(1)
        return block.apply(x, jnp.zeros(x.shape[:2], jnp.int32), None, None)[0]

    x = jnp.ones((1, 2, 4))
    one = forward(ModelBlock.from_nnx(RunningSum(4, seed=0)), x)
    two = forward(ModelBlock.from_nnx(RunningSum(4, seed=1)), x)
    assert len(traces) == 1
    assert not np.allclose(one, two)


def test_what_is_not_a_block_is_refused_by_name():
    with pytest.raises(TypeError, match="expects a flax.nnx.Module"):
        ModelBlock.from_nnx(lambda x: x)

    class NoCache(nnx.Module):
        d_model = 4

    with pytest.raises(TypeError, match=r"needs module.init_cache"):
        ModelBlock.from_nnx(NoCache())
    block = ModelBlock.from_nnx(RunningSum(4, seed=0))
    with pytest.raises(ValueError, match="pass cache and cache_lengths together"):
        block.apply(jnp.ones((1, 2, 4)), jnp.zeros((1, 2), jnp.int32), block.init_cache(1, 4),
                    None)
    with pytest.raises(ValueError, match="d_model must be a positive int"):
        ModelBlock(block.params, block.apply_fn, block.init_cache_fn, d_model=0)
    assert "d_model=4" in repr(block)
