"""The skipped-layer search: block influence from one forward, then the candidate sets
measured as speculative decoding. A block made an identity is the least influential, and
skipping it drafts exactly what the target says."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import build_lm

from specjax.drafters import LayerSkip
from specjax.drafters.layer_search import layer_influence, search_skip_layers
from specjax.testing import plus_one_lm

PROMPTS = [[1, 5, 9, 30, 2, 7, 3, 3], [4, 4, 8, 12]]


def with_identity_block(lm, block: int):
    """The model with block `block` adding nothing to the residual stream (its attention
    output and MLP down projections zeroed)."""
    def zero(path, leaf):
        names = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
        silenced = names[:2] == ["layers", str(block)] and (
            "o_proj" in names or "down_proj" in names)
        return jnp.zeros_like(leaf) if silenced else leaf

    return lm.with_params(jax.tree_util.tree_map_with_path(zero, lm.params))


@pytest.fixture(scope="module")
def four_blocks():
    return with_identity_block(build_lm(9, num_layers=4), 1)


def test_an_identity_block_has_no_influence(four_blocks):
    influence = layer_influence(four_blocks, PROMPTS)
    assert influence.shape == (4,) and np.isnan(influence[3])
    assert abs(influence[1]) < 1e-6
    assert np.all(influence[[0, 2]] > 1e-3)


def test_the_search_measures_each_candidate_and_finds_the_identity_block(four_blocks):
    search = search_skip_layers(four_blocks, PROMPTS, num_draft_tokens=3, max_new_tokens=12,
                                fractions=(0.25, 0.5), reps=1)
    assert [c.skip for c in search.candidates] == [(1,), tuple(sorted((1, int(np.argsort(
        search.influence[:-1])[1]))))]
    identity = search.candidates[0]
    assert identity.acceptance_rate == 1.0  # the skipped block changed nothing
    assert all(c.tokens_per_second > 0 for c in search.candidates)
    assert search.plain_tokens_per_second > 0
    assert isinstance(search.drafter(), LayerSkip)
    assert search.drafter().skip == search.best.skip


@pytest.mark.parametrize("kwargs, message", [
    ({"fractions": (0.0,)}, "fractions"),
    ({"fractions": ()}, "fractions"),
    ({"reps": 0}, "reps"),
])
def test_bad_settings_are_refused(four_blocks, kwargs, message):
    with pytest.raises(ValueError, match=message):
        search_skip_layers(four_blocks, PROMPTS, **kwargs)


def test_a_target_without_layers_is_refused():
    with pytest.raises(ValueError, match="subsets of its layers"):
        layer_influence(plus_one_lm(), [[1, 2]])
    with pytest.raises(ValueError, match="no block to skip"):
        search_skip_layers(build_lm(0, num_layers=1), [[1, 2]])
