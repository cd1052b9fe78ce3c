"""specjax_models.heads: a head of every method made on a target of any shape, saved and put
back on its target with the same drafts, and refusals that name the problem."""

import jax
import numpy as np
import pytest
from conftest import tiny_config

import specjax
import specjax_models
from specjax.drafters import Eagle, EarlyExit, Medusa


@pytest.mark.parametrize("method, kind", [("medusa", None), ("eagle", "eagle1"),
                                          ("eagle3", "eagle3"), ("mtp", "mtp"),
                                          ("kangaroo", "kangaroo")])
def test_a_head_of_each_method_fits_its_target(tiny_lm, method, kind):
    head = specjax_models.create_head(method, tiny_lm, tiny_config(), medusa_heads=3,
                                      exit_layer=1)
    if method == "medusa":
        assert isinstance(head, Medusa) and head.num_heads == 3
        return
    assert isinstance(head, EarlyExit if kind == "kangaroo" else Eagle)
    assert head.config.kind == kind
    if kind == "kangaroo":  # it exits where it was told
        assert head.exit_layer == 1 and head.feature_layers == (1,)
    assert head.config.d_model == tiny_config().d_model
    if kind == "eagle3":  # the layers EAGLE-3 fuses, for this target's depth
        assert head.config.feature_layers == specjax.drafters.eagle3_feature_layers(2)


@pytest.mark.parametrize("method", ["medusa", "eagle3", "kangaroo"])
def test_a_saved_head_loads_back_and_drafts_the_same(tiny_lm, tmp_path, method):
    head = specjax_models.create_head(method, tiny_lm, tiny_config(), seed=4, exit_layer=1)
    if method == "kangaroo":  # every draft offered: the untrained adapter is unsure
        head = head.with_stop_below(None)
    head.save(tmp_path)
    loaded = specjax_models.load_head_for(tmp_path, tiny_lm)
    if method == "kangaroo":
        loaded = loaded.with_stop_below(None)
    for a, b in zip(jax.tree.leaves(head.params), jax.tree.leaves(loaded.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    kwargs = dict(max_new_tokens=8, num_draft_tokens=2, sampling=specjax.GREEDY)
    first = specjax.speculative_generate(tiny_lm, head, [[1, 2, 3]], **kwargs)
    again = specjax.speculative_generate(tiny_lm, loaded, [[1, 2, 3]], **kwargs)
    assert first.tokens.tolist() == again.tokens.tolist()
    assert first.stats.accepted.tolist() == again.stats.accepted.tolist()


def test_refusals_name_the_problem(tiny_lm, tmp_path):
    with pytest.raises(ValueError, match="reduced draft vocabulary is for eagle"):
        specjax_models.create_head("medusa", tiny_lm, tiny_config(), draft_vocab=[1, 2])
    with pytest.raises(ValueError, match="feature_norm is for eagle / eagle3"):
        specjax_models.create_head("mtp", tiny_lm, tiny_config(), feature_norm=True)
    with pytest.raises(ValueError, match="method must be one of"):
        specjax_models.create_head("lookahead", tiny_lm, tiny_config())
    with pytest.raises(FileNotFoundError):
        specjax_models.load_head_for(tmp_path / "none", tiny_lm)
    with pytest.raises(ValueError, match=r"exit_layer 2 is outside the target's \[0, 2\)"):
        specjax_models.create_head("kangaroo", tiny_lm, tiny_config(), exit_layer=2)
