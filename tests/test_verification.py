"""The verification rule: one name for every decoder, defaults by proposal shape, refusals
by name, and the rule that ran named in the stats."""

import jax
import numpy as np
import pytest

import specjax
from specjax import GREEDY, DraftModel, SamplingConfig, SpeculativeConfig, TypicalAcceptance
from specjax.trees.shapes import DynamicTree, TreeShape
from specjax.verification.rules import resolve_verification, rule_that_ran, verification_name

TREE = TreeShape.from_paths([[0], [1], [0, 0]])
PROMPTS = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3]]


def test_the_default_is_block_for_a_chain_and_traversal_for_a_tree():
    assert SpeculativeConfig(num_draft_tokens=4).verification == "block"
    assert SpeculativeConfig(num_draft_tokens=3, tree=TREE).verification == "traversal"
    dynamic = DynamicTree(num_nodes=4, max_depth=2, top_k=2)
    assert SpeculativeConfig(num_draft_tokens=4, tree=dynamic).verification == "traversal"
    assert SpeculativeConfig(num_draft_tokens=4, verification="token").verification == "token"
    assert SpeculativeConfig(num_draft_tokens=3, tree=TREE,
                             verification="token").verification == "token"
    assert SpeculativeConfig(num_draft_tokens=4,
                             verification="traversal").verification == "traversal"
    typical = TypicalAcceptance(epsilon=0.2, delta=0.5)
    assert resolve_verification(typical, TREE) == typical
    assert verification_name(typical) == "typical (not exact; epsilon=0.2, delta=0.5)"


def test_the_library_takes_the_command_lines_rule_names():
    """"typical" is Medusa's published setting, as `--verification typical` runs it."""
    config = SpeculativeConfig(num_draft_tokens=4, verification="typical")
    assert config.verification == TypicalAcceptance(epsilon=0.09, delta=0.3)
    assert verification_name(config.verification) == (
        "typical (not exact; epsilon=0.09, delta=0.3)")
    with pytest.raises(ValueError, match="'typical'"):
        SpeculativeConfig(num_draft_tokens=4, verification="typicl")


def test_the_rule_that_ran_is_named():
    """An all-greedy batch runs the argmax rules whatever was asked; a chain's traversal
    is block verification."""
    assert rule_that_ran("traversal", None, all_greedy=False) == "block"
    assert rule_that_ran("traversal", TREE, all_greedy=False) == "traversal"
    assert rule_that_ran("token", TREE, all_greedy=True) == "greedy"
    assert rule_that_ran(TypicalAcceptance(), None, all_greedy=True) == "greedy"
    assert rule_that_ran("token", None, all_greedy=False) == "token"


@pytest.mark.parametrize("verification,tree,message", [
    ("block", TREE, "judges a chain"),
    ("Traversal", None, "must be one of"),
    ("Block", None, "must be one of"),
    (1, None, "must be one of"),
])
def test_a_rule_that_does_not_fit_is_refused_by_name(verification, tree, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig(num_draft_tokens=3, tree=tree, verification=verification)


@pytest.mark.parametrize("settings", [dict(epsilon=0.0), dict(epsilon=1.0), dict(delta=-0.1),
                                      dict(delta=float("nan")), dict(epsilon="0.1"),
                                      dict(delta=True)])
def test_typical_acceptance_refuses_parameters_outside_zero_one(settings):
    with pytest.raises(ValueError, match="must be a number in \\(0, 1\\)"):
        TypicalAcceptance(**settings)


def test_decoders_refuse_block_verification_of_a_tree_before_any_work(tiny_lm, close_draft):
    with pytest.raises(ValueError, match="verification='traversal'"):
        specjax.speculative_generate(tiny_lm, close_draft, PROMPTS, max_new_tokens=4,
                                     tree=TREE, verification="block")
    with pytest.raises(ValueError, match="verification='traversal'"):
        next(specjax.speculative_stream(tiny_lm, close_draft, PROMPTS, max_new_tokens=4,
                                        tree=TREE, verification="block"))


def test_every_decoder_runs_the_rule_it_is_given_and_names_it(tiny_lm, close_draft):
    """speculative_generate, speculative_stream and jitted_step take the same rule to the
    same tokens (the same key), and the stats name the rule that ran."""
    sampling = SamplingConfig(temperature=1.0)
    key = jax.random.key(4)
    for verification, name in [(None, "block"), ("token", "token"), ("traversal", "block"),
                               (TypicalAcceptance(),
                                "typical (not exact; epsilon=0.09, delta=0.3)")]:
        out = specjax.speculative_generate(tiny_lm, close_draft, PROMPTS, max_new_tokens=12,
                                           num_draft_tokens=3, sampling=sampling, key=key,
                                           verification=verification)
        assert out.stats.verification == name
        chunks = list(specjax.speculative_stream(tiny_lm, close_draft, PROMPTS,
                                                 max_new_tokens=12, num_draft_tokens=3,
                                                 sampling=sampling, key=key,
                                                 verification=verification))
        assert chunks[-1].stats.verification == name
        streamed = [sum((c.tokens[b] for c in chunks), []) for b in range(len(PROMPTS))]
        for b in range(len(PROMPTS)):
            assert streamed[b] == np.asarray(out.tokens[b, :int(out.lengths[b])]).tolist()
        state, drafter = specjax.init_speculative_state(
            tiny_lm, close_draft, PROMPTS, max_new_tokens=12, num_draft_tokens=3,
            sampling=sampling, key=key, verification=verification)
        config = SpeculativeConfig(num_draft_tokens=3, sampling=sampling,
                                   verification=verification)
        while not bool(np.all(np.asarray(state.done))):
            state = specjax.jitted_step(tiny_lm, drafter, state, config)
        stepped = specjax.SpeculativeStats.from_state(state)
        np.testing.assert_array_equal(stepped.emitted, out.stats.emitted)
        np.testing.assert_array_equal(stepped.accepted, out.stats.accepted)


def test_traversal_of_a_chain_is_block_verification_and_named_so(tiny_lm, close_draft):
    """The same key, the same tokens: a chain's traversal runs block verification, and
    the stats name the rule that ran."""
    runs = {rule: specjax.speculative_generate(
        tiny_lm, DraftModel(close_draft, "sample"), PROMPTS, max_new_tokens=12,
        num_draft_tokens=3, sampling=SamplingConfig(temperature=1.0), key=jax.random.key(7),
        verification=rule) for rule in ("block", "traversal")}
    np.testing.assert_array_equal(runs["traversal"].tokens, runs["block"].tokens)
    assert runs["traversal"].stats.verification == "block"


def test_greedy_decoding_is_the_same_under_every_rule(tiny_lm, close_draft):
    """Rows at temperature 0 in a sampled batch: the same tokens as generate, whatever
    the rule."""
    mixed = [GREEDY, SamplingConfig(temperature=1.0), GREEDY]
    plain = specjax.generate(tiny_lm, PROMPTS, max_new_tokens=16, sampling=GREEDY)
    for verification in ("block", "token", TypicalAcceptance(epsilon=0.3, delta=0.3)):
        out = specjax.speculative_generate(tiny_lm, DraftModel(close_draft, "sample"),
                                           PROMPTS, max_new_tokens=16, num_draft_tokens=3,
                                           sampling=mixed, key=jax.random.key(1),
                                           verification=verification)
        for row in (0, 2):
            np.testing.assert_array_equal(out.tokens[row], plain.tokens[row])
    # An all-greedy batch runs the argmax rules whatever rule is asked for, and says so.
    for verification in ("token", TypicalAcceptance()):
        out = specjax.speculative_generate(tiny_lm, DraftModel(close_draft, "sample"),
                                           PROMPTS, max_new_tokens=16, num_draft_tokens=3,
                                           sampling=GREEDY, verification=verification)
        np.testing.assert_array_equal(out.tokens, plain.tokens)
        assert out.stats.verification == "greedy"
