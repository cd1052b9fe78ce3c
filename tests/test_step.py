"""specjax.decoding.step (`specjax.speculative_step`): the proposal contract, token trees, feature
drafters' inputs, confidence-graded verify widths and the KV cache left uncopied."""


import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import build_lm

import specjax
import specjax_models
from specjax import GREEDY, DraftModel, SamplingConfig, generate, speculative_generate
from specjax.decoding.sampling import sampling_params
from specjax.decoding.speculative_loop import _speculative_loop
from specjax.decoding.step import compile_key
from specjax.testing import (
    table_lm,
)
from specjax.trees.shapes import DynamicTree, TreeShape

PROMPTS = [[1, 2, 3, 4], [7, 7], [30, 2, 5, 9, 11, 3], [4]]
class _BrokenProposal(specjax.PromptLookup):
    """A user drafter whose proposals break the contract in the way `mangle` says."""

    def propose(self, state, context, key, *, num_draft_tokens, sampling, vocab_size):
        state, proposal = super().propose(state, context, key,
                                          num_draft_tokens=num_draft_tokens,
                                          sampling=sampling, vocab_size=vocab_size)
        return state, self.mangle(proposal, vocab_size)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _NarrowQ(_BrokenProposal):
    """q over fewer ids than the target's vocabulary."""

    def mangle(self, proposal, vocab_size):
        return specjax.drafters.Proposal(tokens=proposal.tokens,
                                         q=proposal.q[..., : vocab_size - 4])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _FlatTokens(_BrokenProposal):
    def mangle(self, proposal, vocab_size):
        return specjax.drafters.Proposal(tokens=proposal.tokens[:, 0], q=proposal.q)


@pytest.mark.parametrize("drafter, message", [
    (_NarrowQ(), r"_NarrowQ.propose returned Proposal.q with shape \(4, 3, 28\); expected "
                 r"\(4, 3, 32\)"),
    (_FlatTokens(), r"_FlatTokens.propose returned Proposal.tokens with shape \(4,\); "
                    r"expected \(4, 3\)"),
])
def test_a_drafter_breaking_the_proposal_contract_is_named(tiny_lm, drafter, message):
    with pytest.raises(ValueError, match=message):
        speculative_generate(tiny_lm, drafter, PROMPTS, max_new_tokens=8, num_draft_tokens=3,
                             sampling=SamplingConfig(temperature=1.0), key=jax.random.key(0))


class _NotAPytree:
    def check(self, target, sampling): ...
    def forwards_per_step(self, k): return 0
    def init(self, tokens, lengths, capacity): return None
    def propose(self, *args, **kwargs): ...
    def commit(self, state, commit): return state


def test_a_drafter_that_is_not_a_pytree_is_refused_clearly(tiny_lm):
    with pytest.raises(TypeError, match="_NotAPytree is not a JAX pytree"):
        speculative_generate(tiny_lm, _NotAPytree(), PROMPTS, max_new_tokens=4,
                             num_draft_tokens=2, sampling=GREEDY)




# ---------------------------------------------------------------- token trees

TREES = {
    "binary depth 3": TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
    "wide root": TreeShape.from_paths([[0], [1], [2], [3], [0, 0], [0, 0, 0], [0, 0, 0, 0]]),
    "chain shape": TreeShape.chain(3),
}


def test_a_draft_identical_to_the_target_accepts_a_full_depth_path_every_step(tiny_lm):
    tree = TREES["wide root"]
    out = speculative_generate(tiny_lm, DraftModel(tiny_lm, "greedy"), PROMPTS,
                               max_new_tokens=30, sampling=GREEDY, tree=tree)
    np.testing.assert_array_equal(out.stats.accepted, tree.max_depth * out.stats.target_forwards)
    # The accepted path is always the top-1 branch: nodes 0, 4, 5, 6.
    np.testing.assert_allclose(out.stats.accepted_per_position, [1, 0, 0, 0, 1, 1, 1])


@pytest.mark.slow  # keeps the unit suite under 10 minutes
def test_an_identical_draft_accepts_every_dynamic_tree_to_its_depth(tiny_lm):
    """With top_k = 1 a dynamic tree is the draft's greedy chain: an identical draft is
    accepted to full depth every step. Wider trees accept the target's argmax path as
    deep as the tree holds it; the depth histogram says how deep that was."""
    chain = DynamicTree(num_nodes=4, max_depth=4, top_k=1)
    out = speculative_generate(tiny_lm, DraftModel(tiny_lm), PROMPTS, max_new_tokens=30,
                               sampling=GREEDY, tree=chain)
    np.testing.assert_array_equal(out.stats.accepted, 4 * out.stats.target_forwards)
    np.testing.assert_allclose(out.stats.accepted_length_distribution, [0, 0, 0, 0, 1])
    wide = DynamicTree(num_nodes=30, max_depth=4, top_k=3)
    out = speculative_generate(tiny_lm, DraftModel(tiny_lm), PROMPTS, max_new_tokens=30,
                               sampling=GREEDY, tree=wide)
    depths = out.stats.accepted_length_distribution
    assert depths.shape == (31,) and depths[0] == 0 and np.all(depths[5:] == 0)
    np.testing.assert_allclose(depths.sum(), 1.0)
    np.testing.assert_array_equal(out.stats.row_accepted_length_counts.sum(1),
                                  out.stats.target_forwards)
    assert out.stats.nodes_per_step == 30


def test_dynamic_tree_proposals_must_carry_their_parents(tiny_lm):
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Orphans(DraftModel):
        def propose(self, *args, **kwargs):
            state, proposal = super().propose(*args, **kwargs)
            return state, dataclasses.replace(proposal, parents=None)

    with pytest.raises(ValueError, match="Orphans.propose returned Proposal.parents = None"):
        speculative_generate(tiny_lm, Orphans(tiny_lm), PROMPTS, max_new_tokens=4,
                             sampling=GREEDY, tree=DynamicTree(4, 2, 2))

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Adopter(DraftModel):
        def propose(self, state, context, key, **kwargs):
            state, proposal = super().propose(state, context, key, **kwargs)
            return state, dataclasses.replace(proposal, parents=jnp.zeros_like(proposal.tokens))

    with pytest.raises(ValueError, match="return parents only for a DynamicTree"):
        speculative_generate(tiny_lm, Adopter(tiny_lm), PROMPTS, max_new_tokens=4,
                             sampling=GREEDY, tree=TREES["binary depth 3"])


@pytest.mark.slow
def test_tree_stream_equals_tree_generate(tiny_lm, close_draft):
    tree = TREES["binary depth 3"]
    kwargs = dict(max_new_tokens=16, sampling=SamplingConfig(temperature=1.0),
                  key=jax.random.key(5), tree=tree)
    whole = speculative_generate(tiny_lm, close_draft, PROMPTS, **kwargs)
    rows = [[] for _ in PROMPTS]
    for chunk in specjax.speculative_stream(tiny_lm, close_draft, PROMPTS, **kwargs):
        assert chunk.block.shape == (len(PROMPTS), tree.max_depth + 1)
        for b, tokens in enumerate(chunk.tokens):
            rows[b] += tokens
    for b in range(len(PROMPTS)):
        assert rows[b] == np.asarray(whole.tokens[b, : int(whole.lengths[b])]).tolist()


def test_trees_are_refused_where_they_cannot_run(tiny_lm):
    tree = TREES["binary depth 3"]
    with pytest.raises(ValueError, match="PromptLookup drafts chains only"):
        speculative_generate(tiny_lm, specjax.PromptLookup(), PROMPTS, max_new_tokens=4,
                             sampling=GREEDY, tree=tree)
    with pytest.raises(ValueError, match="the tree has 6 nodes but num_draft_tokens=4"):
        speculative_generate(tiny_lm, tiny_lm, PROMPTS, max_new_tokens=4, num_draft_tokens=4,
                             sampling=GREEDY, tree=tree)
    with pytest.raises(ValueError, match="exceeds the target's vocab_size 32"):
        speculative_generate(tiny_lm, tiny_lm, PROMPTS, max_new_tokens=4, sampling=GREEDY,
                             tree=DynamicTree(num_nodes=40, max_depth=2, top_k=33))
    with pytest.raises(ValueError, match="PromptLookup drafts chains only"):
        speculative_generate(tiny_lm, specjax.PromptLookup(), PROMPTS, max_new_tokens=4,
                             sampling=GREEDY, tree=DynamicTree(4, 2, 2))
    table = table_lm(np.zeros((32, 32)))
    table = specjax.CausalLM(table.params, table.apply_fn, table.init_cache_fn,
                             vocab_size=32)  # a hand-written model without compaction
    with pytest.raises(ValueError, match="no compact_fn"):
        speculative_generate(table, table, [[1]], max_new_tokens=4, sampling=GREEDY,
                             tree=tree)


# ---------------------------------------------------------------- target features

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _FeatureRecorder(specjax.PromptLookup):
    """Prompt lookup that records the target features it is given (at init and commit)."""

    reads_target_features: ClassVar[bool] = True
    feature_layers: ClassVar[tuple] = (0, 1)

    def init(self, prompt_tokens, prompt_lengths, capacity, features):
        return {"init": features, "commit": jnp.zeros((prompt_tokens.shape[0], 4, 3, 64))}

    def commit(self, state, commit):
        return {"init": state["init"], "commit": commit.target_hidden}


@pytest.mark.slow  # keeps the unit suite under 10 minutes
def test_feature_drafters_get_the_prefill_and_verify_features(tiny_lm):
    """A drafter asking for layers (0, 1) gets, without extra forwards, the prompt's
    features at init and the verified positions' features at each commit: both equal a
    full forward's."""
    from specjax.drafters import eagle3_feature_layers

    assert eagle3_feature_layers(32) == (2, 16, 29) and eagle3_feature_layers(2) == (0, 1)
    prompts = [[1, 2, 3, 1, 2], [7, 7, 7, 7, 7]]
    recorder = _FeatureRecorder()
    state, drafter = specjax.init_speculative_state(tiny_lm, recorder, prompts,
                                                    max_new_tokens=8, num_draft_tokens=3,
                                                    sampling=GREEDY)
    def full_features(tokens):
        positions = jnp.broadcast_to(jnp.arange(len(tokens[0])), (len(tokens), len(tokens[0])))
        _, hidden, _ = tiny_lm.apply(jnp.asarray(tokens), positions,
                                     tiny_lm.init_cache(len(tokens), 64),
                                     jnp.zeros(len(tokens), jnp.int32), feature_layers=(0, 1))
        return np.asarray(hidden)

    init = np.asarray(state.drafter_state["init"])
    np.testing.assert_allclose(init[:, :5], full_features(prompts), rtol=1e-5, atol=1e-5)
    drafts, _ = recorder.lookup(state.sequence, state.lengths, 3)
    state = specjax.jitted_step(tiny_lm, drafter, state,
                                specjax.SpeculativeConfig(num_draft_tokens=3, sampling=GREEDY))
    verified = [p + np.asarray(d).tolist() for p, d in zip(prompts, drafts, strict=True)]
    want = full_features(verified)[:, 4:]  # the last prompt token, then the 3 drafts
    np.testing.assert_allclose(state.drafter_state["commit"], want, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- graded verify widths

def test_confident_drafts_offer_a_draft_by_what_was_known_before_it():
    """Draft j is offered while (the drafts before it's probabilities) x (its top
    probability) reaches the threshold; its own probability never decides (row 1: a draft
    of probability 0.1 is offered, its top probability was 0.95; the next is not)."""
    from specjax.drafters.base import confident_drafts

    chosen = jnp.asarray([[0.9, 0.9, 0.9, 0.9], [0.1, 1.0, 1.0, 1.0], [0.8, 0.5, 0.9, 1.0]])
    top = jnp.asarray([[0.9, 0.9, 0.9, 0.9], [0.95, 1.0, 1.0, 1.0], [0.6, 0.9, 0.9, 1.0]])
    confidence = jnp.stack([chosen, top], axis=-1)
    # Scores: [.9 .81 .73 .66], [.95 .1 .1 .1], [.6 .72 .36 .36].
    assert confident_drafts(confidence, 0.7).tolist() == [3, 1, 0]
    assert confident_drafts(confidence, 0.3).tolist() == [4, 1, 4]
    with pytest.raises(ValueError, match="min_confidence must be None"):
        DraftModel(build_lm(1), min_confidence=1.5)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _GradedDraft(DraftModel):
    """A draft model whose rows claim 1, 2, 0 and 0 real drafts at every step."""

    graded_num_real: ClassVar[bool] = True

    def propose(self, state, context, key, **kwargs):
        state, proposal = super().propose(state, context, key, **kwargs)
        return state, dataclasses.replace(proposal, num_real=jnp.asarray([1, 2, 0, 0]))


def test_a_graded_step_verifies_the_longest_rows_real_drafts_only(tiny_lm):
    """Rows claiming 1, 2, 0, 0 real drafts of K = 4: the step verifies 2 drafts (the
    longest row's), each row accepts only among the drafts it offered (the identical
    draft's drafts are all right, so exactly those), the stats count what was offered, and
    the output still equals plain decoding."""
    drafter = _GradedDraft(tiny_lm, "greedy")
    config = specjax.SpeculativeConfig(num_draft_tokens=4, sampling=GREEDY)
    state, drafter = specjax.init_speculative_state(tiny_lm, drafter, PROMPTS,
                                                    max_new_tokens=12, num_draft_tokens=4,
                                                    sampling=GREEDY)
    state = specjax.jitted_step(tiny_lm, drafter, state, config)
    assert state.proposed.tolist() == [1, 2, 0, 0]
    assert state.step_accepted.tolist() == [1, 2, 0, 0]
    assert state.step_emitted.tolist() == [2, 3, 1, 1]
    assert state.checked.tolist() == [1, 2, 0, 0]
    out = speculative_generate(tiny_lm, _GradedDraft(tiny_lm, "greedy"), PROMPTS,
                               max_new_tokens=12, num_draft_tokens=4, sampling=GREEDY)
    np.testing.assert_array_equal(out.tokens, generate(tiny_lm, PROMPTS, max_new_tokens=12,
                                                       sampling=GREEDY).tokens)


def test_a_confidence_threshold_verifies_fewer_drafts_and_stays_exact(tiny_lm, close_draft):
    """DraftModel(min_confidence=...): each step verifies the longest running row's
    confident drafts (0 to K): greedy output equals generate's; fewer drafts than K per
    forward on average, but some (the sampled case: test_exactness's chi-square)."""
    drafter = DraftModel(close_draft, "sample", min_confidence=0.12)
    out = speculative_generate(tiny_lm, drafter, PROMPTS, max_new_tokens=40,
                               num_draft_tokens=4, sampling=GREEDY)
    plain = generate(tiny_lm, PROMPTS, max_new_tokens=40, sampling=GREEDY)
    np.testing.assert_array_equal(out.tokens, plain.tokens)
    s = out.stats
    assert 0 < s.proposed.sum() < 4 * s.target_forwards.sum() and s.accepted.sum() > 0
    np.testing.assert_array_equal(s.emitted, out.lengths)


def test_a_confidence_threshold_with_a_tree_is_refused(tiny_lm, close_draft):
    with pytest.raises(ValueError, match="min_confidence=None"):
        speculative_generate(tiny_lm, DraftModel(close_draft, min_confidence=0.2), PROMPTS,
                             max_new_tokens=4, tree=DynamicTree(num_nodes=4, max_depth=2,
                                                                top_k=2))


def test_a_cache_read_in_blocks_is_not_copied(tiny_lm, close_draft):
    """The cache read in blocks of 16 slots of a 256-slot cache (a loop over the blocks
    that hold tokens, the default on real models): the loop reads slices of the cache and
    the write after it stays in place."""
    blocked = specjax_models.with_attention_blocks(tiny_lm, 16)
    assert _cache_copies(blocked, specjax.PromptLookup(), 4) == []


def _cache_copies(target, drafter, num_draft_tokens: int, sampling=GREEDY) -> list[str]:
    """The `copy` instructions of the compiled decode loop whose result has the shape of
    one of the target's KV-cache arrays."""
    state, drafter = specjax.init_speculative_state(target, drafter, PROMPTS,
                                                    max_new_tokens=8,
                                                    num_draft_tokens=num_draft_tokens,
                                                    sampling=sampling,
                                                    key=jax.random.key(0))
    config = specjax.SpeculativeConfig(num_draft_tokens=num_draft_tokens, sampling=sampling)
    params = sampling_params(sampling, len(PROMPTS))
    hlo = _speculative_loop.lower(target, drafter, state, compile_key(config, params),
                                  params, drafter_type=type(drafter)).compile().as_text()
    cache_shapes = {"[" + ",".join(map(str, leaf.shape)) + "]"
                    for leaf in jax.tree.leaves(state.target_cache) if leaf.ndim >= 3}
    return [line.strip() for line in hlo.splitlines() if " copy(" in line
            and any(f"f32{shape}" in line.split("copy(")[0] for shape in cache_shapes)]


@pytest.mark.parametrize("drafter", ["prompt lookup", "confidence"])
def test_choosing_a_verify_width_copies_no_kv_cache(tiny_lm, close_draft, drafter):
    """A step that picks its verify width (0 or K for prompt lookup; 0..K with a
    confidence threshold) updates the KV cache in place, as a fixed-width step does: the
    compiled loop holds no copy of a cache array (a `lax.switch` over the widths made XLA
    copy the whole cache once or twice per step). Sampled with traced settings too (the
    top-k / top-p searches run under a `lax.cond` over the logits, never the cache)."""
    drafter = (specjax.PromptLookup() if drafter == "prompt lookup"
               else DraftModel(close_draft, "greedy", min_confidence=0.3))
    assert _cache_copies(tiny_lm, DraftModel(close_draft, "greedy"), 4) == []
    assert _cache_copies(tiny_lm, drafter, 4) == []
    sampled = SamplingConfig(temperature=0.7, top_k=5, top_p=0.9)
    assert _cache_copies(tiny_lm, drafter, 4, sampled) == []


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class _ShiftedDraft(DraftModel):
    """Drafts the token after the draft model's: a subclass with the same fields."""

    def propose(self, state, context, key, *, num_draft_tokens, sampling, vocab_size):
        state, proposal = super().propose(state, context, key,
                                          num_draft_tokens=num_draft_tokens,
                                          sampling=sampling, vocab_size=vocab_size)
        tokens = (proposal.tokens + 1) % vocab_size
        return state, dataclasses.replace(proposal, tokens=tokens,
                                          q=jax.nn.one_hot(tokens, vocab_size))


def test_a_subclass_with_the_same_fields_gets_its_own_program(tiny_lm, close_draft):
    """JAX's tree structures of a registered dataclass and of such a subclass compare
    equal (their hashes differ), so a compile cache keyed on them alone could now and then
    hand the subclass its parent's program; the drafter's class is in every key."""
    parent, child = DraftModel(close_draft, "greedy"), _ShiftedDraft(close_draft, "greedy")
    assert jax.tree.structure(parent) == jax.tree.structure(child)
    kwargs = dict(max_new_tokens=12, num_draft_tokens=3, sampling=GREEDY)
    first = speculative_generate(tiny_lm, parent, PROMPTS, **kwargs)
    second = speculative_generate(tiny_lm, child, PROMPTS, **kwargs)
    assert first.tokens.tolist() == second.tokens.tolist()  # exact either way
    assert first.stats.accepted.tolist() != second.stats.accepted.tolist()  # other drafts
