"""The exactness suite: every drafter and proposal shape, one entry each.

For every entry, at batch > 1: greedy speculative decoding equals greedy `generate` token
for token (ragged prompts, an EOS that ends rows at different places), and the joint of
the first 3 sampled tokens follows the exactly enumerated target distribution (chi-square,
30,000 rows in one call) at temperature 1, temperature 0.7 + top-k and top-p. A drafter
that misreports how its tree was drawn fails the same test (the power check).

A new drafter or proposal shape joins by adding one entry to ENTRIES.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import specjax_models
from specjax import GREEDY, DraftModel, PromptLookup, SamplingConfig
from specjax.drafters import Eagle, FeatureHeadConfig, Medusa, eagle3_feature_layers
from specjax.testing import speculative_joint_pvalue
from specjax.trees import DynamicTree, TreeShape

STATIC_TREE = TreeShape.from_paths([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
MEDUSA_TREE = TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
SEQUOIA_TREE = TreeShape.sequoia([0.6, 0.25, 0.1], num_nodes=8, max_depth=4)
DYNAMIC_TREE = DynamicTree(num_nodes=8, max_depth=4, top_k=3)


@dataclasses.dataclass(frozen=True)
class Entry:
    """How to build the drafter from a draft model, and the proposal shape."""

    make: object  # (draft CausalLM, target CausalLM) -> drafter
    num_draft_tokens: int | None = 3
    tree: TreeShape | DynamicTree | None = None
    stat_prompt: tuple = (1, 5, 2)  # the prompt of the chi-square test
    # Run in the `slow` set (CI runs it too), to keep the unit suite under 10 minutes:
    # trees compile a decoder per setting, and these paths have cheaper relatives there.
    slow_greedy: bool = False
    slow_stats: bool = False
    # Variants of a drafter whose main entry covers all three samplings run at t=1 only.
    stat_samplings: tuple = ("t1", "t0.7-topk4", "topp0.8")


def eagle(kind: str, method: str = "sample", reduced_vocab: bool = False,
          min_confidence: float | None = None):
    """A randomly initialised feature head of `kind` on the target (its embedding, LM head
    and block shape): untrained, so its drafts are often rejected, which the suite needs
    as much as accepted ones."""

    def make(draft, target):
        embedding, lm_head = specjax_models.embedding_and_head(target)
        d_model = embedding.shape[1]
        num_layers = sum(1 for name in target.params["layers"].keys())
        layers = eagle3_feature_layers(num_layers) if kind == "eagle3" else ()
        config = FeatureHeadConfig(kind=kind, d_model=d_model, num_heads=2, num_kv_heads=1,
                                   d_ff=2 * d_model, feature_layers=layers)
        # A reduced draft vocabulary: every other id (q = 0 for the rest).
        vocab = np.arange(0, embedding.shape[0], 2) if reduced_vocab else None
        head = Eagle.create(config, embedding, lm_head, jax.random.key(5), method, vocab)
        # Sharper than the 0.02 init, so the head's distribution is far from uniform.
        head = head.with_params(jax.tree.map(lambda x: 8.0 * x if x.ndim == 2 else x,
                                             head.params))
        return dataclasses.replace(head, min_confidence=min_confidence)

    return make


def reduced_draft(method: str):
    """The draft model over every other target id (`DraftModel(draft_vocab=...)`, its head
    keeping those rows: q = 0 for the rest, the draft still reads every id)."""

    def make(draft, target):
        ids = np.arange(0, target.vocab_size, 2)
        layers = tuple(range(sum(1 for _ in draft.params["layers"].keys())))
        return DraftModel(specjax_models.select_layers(draft, layers, ids), method,
                          draft_vocab=ids)

    return make


def medusa(method: str = "greedy"):
    def make(draft, target):
        head = Medusa.create(3, specjax_models.embedding_and_head(target)[1], method)
        key_w, key_b = jax.random.split(jax.random.key(6))
        return head.with_params({"w": 0.5 * jax.random.normal(key_w, head.params["w"].shape),
                                 "b": 0.5 * jax.random.normal(key_b, head.params["b"].shape)})

    return make


ENTRIES = {
    "draft model, chain, sampled": Entry(lambda d, t: DraftModel(d, "sample")),
    "draft model, chain, argmax": Entry(lambda d, t: DraftModel(d, "greedy"), slow_stats=True),
    # A repeating prompt, so that the lookup finds matches and drafts get accepted.
    "prompt lookup, chain": Entry(lambda d, t: PromptLookup(max_ngram_size=2),
                                  stat_prompt=(1, 5, 2, 1, 5, 2, 1)),
    # No match at the first step: one-token steps (Proposal.num_real) mixed with verifies.
    "prompt lookup, chain, no match at first": Entry(lambda d, t: PromptLookup(),
                                                     stat_prompt=(1, 5, 2), slow_stats=True),
    "draft model, static tree, sampled": Entry(lambda d, t: DraftModel(d, "sample"), None,
                                               STATIC_TREE, slow_greedy=True),
    "draft model, static tree, top-k": Entry(lambda d, t: DraftModel(d, "greedy"), None,
                                             STATIC_TREE),
    "draft model, Sequoia tree, sampled": Entry(lambda d, t: DraftModel(d, "sample"), None,
                                                SEQUOIA_TREE, slow_greedy=True),
    "draft model, Sequoia tree, top-k": Entry(lambda d, t: DraftModel(d, "greedy"), None,
                                              SEQUOIA_TREE, slow_greedy=True),
    # EAGLE-2: a different tree per row, grown from the draft's top-k (deterministic).
    "draft model, dynamic tree, top-k": Entry(lambda d, t: DraftModel(d), None, DYNAMIC_TREE),
    "draft model, chain, reduced draft vocabulary": Entry(reduced_draft("sample"),
                                                          slow_stats=True,
                                                          stat_samplings=("t1", "topp0.8")),
    "draft model, static tree, reduced draft vocabulary": Entry(
        reduced_draft("sample"), None, STATIC_TREE, slow_greedy=True, stat_samplings=("t1",)),
    # A confidence threshold: each step verifies 0 to K drafts (graded num_real).
    "draft model, chain, confidence threshold": Entry(
        lambda d, t: DraftModel(d, "sample", min_confidence=0.1), stat_samplings=("t1",)),
    # Feature drafters (EAGLE-1/3, MTP, Medusa): they read the target's features.
    "eagle3, chain, sampled": Entry(eagle("eagle3"), slow_stats=True),
    "eagle1, chain, argmax": Entry(eagle("eagle1", "greedy"), slow_greedy=True,
                                   slow_stats=True),
    "mtp, chain, sampled": Entry(eagle("mtp"), slow_greedy=True, slow_stats=True,
                                 stat_samplings=("t1",)),
    "eagle3, static tree, sampled": Entry(eagle("eagle3"), None, STATIC_TREE, slow_greedy=True),
    "eagle3, chain, reduced draft vocabulary": Entry(eagle("eagle3", reduced_vocab=True),
                                                     slow_stats=True, stat_samplings=("t1",)),
    "eagle3, chain, confidence threshold": Entry(eagle("eagle3", min_confidence=0.3),
                                                 slow_stats=True, stat_samplings=("t1",)),
    "eagle3, dynamic tree, top-k": Entry(eagle("eagle3"), None, DYNAMIC_TREE,
                                         slow_greedy=True),
    "medusa, chain, top-1": Entry(medusa("greedy"), slow_stats=True),
    "medusa, chain, sampled": Entry(medusa("sample"), slow_greedy=True, slow_stats=True,
                                    stat_samplings=("t1",)),
    "medusa, static tree, top-k": Entry(medusa(), None, MEDUSA_TREE, slow_greedy=True),
    "medusa, dynamic tree, top-k": Entry(medusa(), None, DynamicTree(num_nodes=6, max_depth=3,
                                                                      top_k=2),
                                         slow_greedy=True),
}
SAMPLINGS = {"t1": SamplingConfig(temperature=1.0),
             "t0.7-topk4": SamplingConfig(temperature=0.7, top_k=4),
             "topp0.8": SamplingConfig(temperature=1.0, top_p=0.8)}
PROMPTS = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3], [4]]
STAT_ROWS = 30_000


GREEDY_CASES = [pytest.param(name, marks=pytest.mark.slow) if ENTRIES[name].slow_greedy
                else name for name in sorted(ENTRIES)]


@pytest.mark.parametrize("name", GREEDY_CASES)
def test_greedy_output_equals_generate(tiny_lm, close_draft, random_draft, name):
    entry = ENTRIES[name]
    plain = specjax.generate(tiny_lm, PROMPTS, max_new_tokens=24, sampling=GREEDY)
    eos = int(plain.tokens[0, 5])  # row 0 ends at step 6, the others elsewhere
    plain = specjax.generate(tiny_lm, PROMPTS, max_new_tokens=24, sampling=GREEDY, eos_id=eos)
    for draft in (close_draft, random_draft):
        drafter = entry.make(draft, tiny_lm)
        spec = specjax.speculative_generate(
            tiny_lm, drafter, PROMPTS, max_new_tokens=24,
            num_draft_tokens=entry.num_draft_tokens, sampling=GREEDY, eos_id=eos,
            tree=entry.tree)
        np.testing.assert_array_equal(spec.tokens, plain.tokens)
        np.testing.assert_array_equal(spec.lengths, plain.lengths)
        if getattr(drafter, "reads_target_features", False):
            break  # feature drafters ignore the draft model: one run is enough


# Tree entries compile a decoder per sampling setting: their chi-square runs are in the
# `slow` set (`pytest -m slow`, which CI runs too) to keep the default suite short.
STAT_CASES = [pytest.param(name, sampling, marks=pytest.mark.slow)
              if ENTRIES[name].tree is not None or ENTRIES[name].slow_stats
              else (name, sampling)
              for name in sorted(ENTRIES) for sampling in sorted(SAMPLINGS)
              if sampling in ENTRIES[name].stat_samplings]


@pytest.mark.parametrize("name, sampling", STAT_CASES)
def test_sampled_output_follows_the_target(micro_lm, micro_drafts, name, sampling):
    entry = ENTRIES[name]
    pvalue, out = speculative_joint_pvalue(
        micro_lm, entry.make(micro_drafts["close"], micro_lm), list(entry.stat_prompt),
        SAMPLINGS[sampling],
        num_draft_tokens=entry.num_draft_tokens, rows=STAT_ROWS, seed=200, tree=entry.tree)
    assert pvalue > 1e-3, (pvalue, out.stats.acceptance_rate)
    assert out.stats.acceptance_rate > 0.0  # drafts were accepted: the test saw speculation


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _MisreportedTree(DraftModel):
    """Samples its tree as DraftModel does but reports a uniform q: not exact."""

    def propose(self, state, context, key, **kwargs):
        state, proposal = super().propose(state, context, key, **kwargs)
        uniform = jnp.full_like(proposal.q, 1.0 / proposal.q.shape[-1])
        return state, dataclasses.replace(proposal, q=uniform)


@pytest.mark.slow
def test_the_suite_fails_a_drafter_that_misreports_its_tree(micro_lm, micro_drafts):
    pvalue, _ = speculative_joint_pvalue(
        micro_lm, _MisreportedTree(micro_drafts["far"], "sample"), [1, 5, 2],
        SAMPLINGS["t1"], num_draft_tokens=None, rows=STAT_ROWS, seed=201, tree=STATIC_TREE)
    assert pvalue < 1e-6
