"""The exactness suite: every drafter and proposal shape, one entry each.

For every entry, at batch > 1: greedy speculative decoding equals greedy `generate` token
for token (ragged prompts, an EOS that ends rows at different places), and in ONE batched
call whose row groups have different settings (settings are data: one compiled decoder),
the joint of the first 3 tokens of each group follows its own exactly enumerated target
distribution (chi-square, 12,000 rows per group) at temperature 1, temperature 0.7 +
top-k and top-p, while a greedy group (256 rows) follows the greedy continuation. Greedy rows of a
mixed batch equal `generate` (chain, static and dynamic trees). A drafter that
misreports how its tree was drawn fails the chi-square test (the power check).

Chains run block verification and trees traversal verification (their default rules);
the entries named "token rule" run the token rule (specjax.verification). A new drafter,
proposal shape or verification rule joins by adding one entry to ENTRIES.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import LATENT_ATTENTION_AND_EXPERTS

import specjax
import specjax_models
from specjax import GREEDY, DraftModel, PromptLookup, SamplingConfig
from specjax.drafters import (
    AdaptiveLength,
    Eagle,
    EarlyExit,
    FeatureHeadConfig,
    LayerSkip,
    Lookahead,
    Medusa,
    ParallelDraft,
    ParallelEagle,
    Retrieval,
    eagle3_feature_layers,
)
from specjax.drafters.datastore import Datastore
from specjax.testing import speculative_joint_pvalue, speculative_joint_pvalues
from specjax.trees.shapes import DynamicTree, TreeShape

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
    # Run in the `slow` set (CI runs it too), to keep the unit suite short: these paths
    # have cheaper relatives there.
    slow_greedy: bool = False
    slow_stats: bool = False
    stat_samplings: tuple = ("t1", "t0.7-topk4", "topp0.8")
    # The verification rule (specjax.verification); None: the shape's default ("block"
    # for a chain, "traversal" for a tree).
    verification: str | None = None


def eagle(kind: str, method: str = "sample", reduced_vocab: bool = False,
          min_confidence: float | None = None, parallel: bool = False):
    """A randomly initialised feature head of `kind` on the target (its embedding, LM head
    and block shape): untrained, so its drafts are often rejected, which the suite needs
    as much as accepted ones. parallel: a P-EAGLE head (`ParallelEagle`, the target's
    last id its mask token, its placeholder feature random)."""

    def make(draft, target):
        embedding, lm_head = specjax_models.embedding_and_head(target)
        d_model = embedding.shape[1]
        num_layers = sum(1 for name in target.params["layers"].keys())
        layers = eagle3_feature_layers(num_layers) if kind == "eagle3" else ()
        config = FeatureHeadConfig(kind=kind, d_model=d_model, num_heads=2, num_kv_heads=1,
                                   d_ff=2 * d_model, feature_layers=layers,
                                   mask_id=embedding.shape[0] - 1 if parallel else None)
        # A reduced draft vocabulary: every other id (q = 0 for the rest).
        vocab = np.arange(0, embedding.shape[0], 2) if reduced_vocab else None
        head = Eagle.create(config, embedding, lm_head, jax.random.key(5), method, vocab)
        # Sharper than the 0.02 init, so the head's distribution is far from uniform.
        head = head.with_params(jax.tree.map(lambda x: 8.0 * x if x.ndim == 2 else x,
                                             head.params))
        head = dataclasses.replace(head, min_confidence=min_confidence)
        if not parallel:
            return head
        mask_hidden = jax.random.normal(jax.random.key(7), (d_model,))
        return ParallelEagle(head.with_params({**head.params, "mask_hidden": mask_hidden}))

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


def parallel(method: str = "sample", reduced_vocab: bool = False,
             min_confidence: float | None = None):
    """The draft as a parallel draft (`ParallelDraft`), its last id the mask."""

    def make(draft, target):
        if not reduced_vocab:
            return ParallelDraft(draft, mask_id=draft.vocab_size - 1, method=method,
                                 min_confidence=min_confidence)
        ids = np.arange(0, target.vocab_size, 2)
        layers = tuple(range(sum(1 for _ in draft.params["layers"].keys())))
        return ParallelDraft(specjax_models.select_layers(draft, layers, ids),
                             mask_id=target.vocab_size - 1, method=method, draft_vocab=ids)

    return make


def medusa(method: str = "greedy"):
    def make(draft, target):
        head = Medusa.create(3, specjax_models.embedding_and_head(target)[1], method)
        key_w, key_b = jax.random.split(jax.random.key(6))
        return head.with_params({"w": 0.5 * jax.random.normal(key_w, head.params["w"].shape),
                                 "b": 0.5 * jax.random.normal(key_b, head.params["b"].shape)})

    return make


def published(layout: str, method: str | None = None):
    """A random checkpoint in a published layout (`specjax_models.published_layouts`),
    written for the target's shape and read back by `specjax_models.load_drafter`: the
    path a downloaded EAGLE-3 / EAGLE-1 / Medusa-1 head or MiMo's MTP module takes
    (EAGLE-3 over a reduced draft vocabulary of V - 2 ids, Medusa with two residual blocks
    and own LM heads)."""
    import tempfile

    from specjax_models.published_layouts import SyntheticShape, write_synthetic_drafter

    def make(draft, target):
        vocab, d_model = specjax_models.embedding_and_head(target)[0].shape
        shape = SyntheticShape(d_model=int(d_model), vocab_size=int(vocab),
                               num_layers=target.num_layers, draft_vocab_size=int(vocab) - 2,
                               medusa_layers=2)
        directory = write_synthetic_drafter(tempfile.mkdtemp(prefix="published-"), layout,
                                            shape, seed=9, scale=0.3)
        return specjax_models.load_drafter(directory, target, method=method)

    return make


def deepseek_mtp(method: str = "sample"):
    """DeepSeek-V3's MTP module (`specjax_models.mtp`): a random decoder block of latent
    attention and experts (the module's block, layer index 1, past the dense layer 0) on
    the target's width, embedding and LM head, its input projection sharpened as
    `eagle`'s; the first pair kept out of its latent cache, the first embedding zeroed."""
    from conftest import tiny_config

    from specjax_models.mtp import random_mtp_drafter

    def make(draft, target):
        embedding, lm_head = specjax_models.embedding_and_head(target)
        vocab, d_model = (int(n) for n in embedding.shape)
        config = tiny_config(vocab_size=vocab, d_model=d_model, num_layers=1, num_heads=2,
                             num_kv_heads=2, d_ff=2 * d_model, **LATENT_ATTENTION_AND_EXPERTS)
        return random_mtp_drafter(config, embedding, lm_head, jax.random.key(8), method,
                                  scale=0.5)

    return make


def retrieval(**settings):
    """A datastore of the target's own greedy text after the test prompts (what a
    datastore of earlier answers holds), so its drafts are often right."""

    def make(draft, target):
        prompts = [[t % target.vocab_size for t in p] for p in PROMPTS + [[1, 5, 2]]]
        out = specjax.generate(target, prompts, max_new_tokens=16, sampling=GREEDY)
        documents = [prompt + np.asarray(out.tokens[b, :int(out.lengths[b])]).tolist()
                     for b, prompt in enumerate(prompts)]
        return Retrieval(Datastore.build(documents, target.vocab_size), **settings)

    return make


def layer_skip(**settings):
    def make(draft, target):
        return LayerSkip(skip=(target.num_layers - 1,), allow_empty=True, **settings)

    return make


def early_exit(reduced_vocab: bool = False, **settings):
    """Kangaroo: the target's blocks before its last one (none for the 1-block micro
    target: the embedding alone), then a random adapter, sharpened as `eagle`'s (with a
    reduced draft vocabulary: every other id)."""

    def make(draft, target):
        _, lm_head = specjax_models.embedding_and_head(target)
        d_model = lm_head.shape[1]
        config = FeatureHeadConfig(kind="kangaroo", d_model=d_model, num_heads=2,
                                   num_kv_heads=1, d_ff=2 * d_model,
                                   feature_layers=(target.num_layers - 1,))
        vocab = np.arange(0, lm_head.shape[0], 2) if reduced_vocab else None
        drafter = EarlyExit.create(config, lm_head, jax.random.key(6), draft_vocab=vocab,
                                   **settings)
        return drafter.with_params(jax.tree.map(lambda x: 8.0 * x if x.ndim == 2 else x,
                                                drafter.params))

    return make


ENTRIES = {
    "draft model, chain, sampled": Entry(lambda d, t: DraftModel(d, "sample")),
    "draft model, chain, argmax": Entry(lambda d, t: DraftModel(d, "greedy"), slow_stats=True),
    # The token rule on chains (block verification is their default): sampled, one-hot
    # and graded (confidence-thresholded) offers.
    # (An all-greedy batch takes the argmax rules whatever the rule: their greedy
    # equality runs in the slow set.)
    "draft model, chain, sampled, token rule": Entry(lambda d, t: DraftModel(d, "sample"),
                                                     verification="token", slow_greedy=True),
    "prompt lookup, chain, token rule": Entry(lambda d, t: PromptLookup(max_ngram_size=2),
                                              stat_prompt=(1, 5, 2, 1, 5, 2, 1),
                                              verification="token", slow_greedy=True,
                                              slow_stats=True),
    "draft model, chain, confidence threshold, token rule": Entry(
        lambda d, t: DraftModel(d, "sample", min_confidence=0.1), verification="token",
        slow_greedy=True, slow_stats=True),
    # PARD: every draft of a step from one forward over [last committed, K - 1 masks]
    # (the mask: the draft's last id; untrained for it, which exactness does not need).
    "parallel draft, chain, sampled": Entry(parallel()),
    "parallel draft, chain, argmax": Entry(parallel("greedy"), slow_greedy=True,
                                           slow_stats=True),
    "parallel draft, static tree, sampled": Entry(parallel(), None, STATIC_TREE,
                                                  slow_greedy=True, slow_stats=True),
    "parallel draft, dynamic tree, top-k": Entry(parallel(), None, DYNAMIC_TREE,
                                                 slow_greedy=True, slow_stats=True),
    "parallel draft, chain, reduced draft vocabulary": Entry(
        parallel(reduced_vocab=True), slow_greedy=True, slow_stats=True),
    "parallel draft, chain, confidence threshold": Entry(
        parallel(min_confidence=0.1), slow_greedy=True, slow_stats=True),
    # The token rule on trees (traversal verification is their default): sampled and
    # top-k children.
    # (The walk itself is chi-squared in the unit suite: tests/test_tree_acceptance.py.)
    "draft model, static tree, sampled, token rule": Entry(
        lambda d, t: DraftModel(d, "sample"), None, STATIC_TREE, verification="token",
        slow_greedy=True, slow_stats=True),
    "draft model, dynamic tree, top-k, token rule": Entry(
        lambda d, t: DraftModel(d), None, DYNAMIC_TREE, verification="token", slow_greedy=True,
        slow_stats=True),
    # A repeating prompt, so that the lookup finds matches and drafts get accepted.
    "prompt lookup, chain": Entry(lambda d, t: PromptLookup(max_ngram_size=2),
                                  stat_prompt=(1, 5, 2, 1, 5, 2, 1)),
    # No match at the first step: one-token steps (Proposal.num_real) mixed with verifies.
    "prompt lookup, chain, no match at first": Entry(lambda d, t: PromptLookup(),
                                                     stat_prompt=(1, 5, 2), slow_stats=True),
    "draft model, static tree, sampled": Entry(lambda d, t: DraftModel(d, "sample"), None,
                                               STATIC_TREE, slow_greedy=True),
    "draft model, static tree, top-k": Entry(lambda d, t: DraftModel(d, "greedy"), None,
                                             STATIC_TREE, slow_stats=True),
    "draft model, Sequoia tree, sampled": Entry(lambda d, t: DraftModel(d, "sample"), None,
                                                SEQUOIA_TREE, slow_greedy=True,
                                                slow_stats=True),
    "draft model, Sequoia tree, top-k": Entry(lambda d, t: DraftModel(d, "greedy"), None,
                                              SEQUOIA_TREE, slow_greedy=True, slow_stats=True),
    # EAGLE-2: a different tree per row, grown from the draft's top-k (deterministic).
    "draft model, dynamic tree, top-k": Entry(lambda d, t: DraftModel(d), None, DYNAMIC_TREE,
                                              slow_stats=True),
    "draft model, chain, reduced draft vocabulary": Entry(reduced_draft("sample"),
                                                          slow_stats=True),
    "draft model, static tree, reduced draft vocabulary": Entry(
        reduced_draft("sample"), None, STATIC_TREE, slow_greedy=True, slow_stats=True),
    # A confidence threshold: each step verifies 0 to K drafts (graded num_real).
    "draft model, chain, confidence threshold": Entry(
        lambda d, t: DraftModel(d, "sample", min_confidence=0.1), slow_stats=True),
    # Feature drafters (EAGLE-1/3, MTP, Medusa): they read the target's features.
    "eagle3, chain, sampled": Entry(eagle("eagle3"), slow_stats=True),
    "eagle1, chain, argmax": Entry(eagle("eagle1", "greedy"), slow_greedy=True,
                                   slow_stats=True),
    "mtp, chain, sampled": Entry(eagle("mtp"), slow_greedy=True, slow_stats=True),
    "eagle3, static tree, sampled": Entry(eagle("eagle3"), None, STATIC_TREE, slow_greedy=True,
                                          slow_stats=True),
    "eagle3, chain, reduced draft vocabulary": Entry(eagle("eagle3", reduced_vocab=True),
                                                     slow_stats=True),
    "eagle3, chain, confidence threshold": Entry(eagle("eagle3", min_confidence=0.3),
                                                 slow_stats=True),
    "eagle3, dynamic tree, top-k": Entry(eagle("eagle3"), None, DYNAMIC_TREE,
                                         slow_greedy=True, slow_stats=True),
    # P-EAGLE: K drafts from one head forward over [committed pairs, K - 1 placeholders].
    "P-EAGLE head, chain, sampled": Entry(eagle("eagle3", parallel=True), slow_stats=True),
    "P-EAGLE head, chain, argmax": Entry(eagle("eagle3", "greedy", parallel=True),
                                         stat_prompt=(3, 1, 4), slow_greedy=True,
                                         slow_stats=True),
    "P-EAGLE head, static tree, sampled": Entry(eagle("eagle3", parallel=True), None,
                                                STATIC_TREE, slow_greedy=True, slow_stats=True),
    "P-EAGLE head, dynamic tree, top-k": Entry(eagle("eagle3", parallel=True), None,
                                               DYNAMIC_TREE, slow_greedy=True, slow_stats=True),
    "P-EAGLE head, chain, reduced draft vocabulary": Entry(
        eagle("eagle3", reduced_vocab=True, parallel=True), slow_greedy=True, slow_stats=True),
    "P-EAGLE head, chain, confidence threshold": Entry(
        eagle("eagle3", min_confidence=0.3, parallel=True), slow_greedy=True, slow_stats=True),
    "P-EAGLE head, chain, sampled, token rule": Entry(
        eagle("eagle3", parallel=True), verification="token", slow_greedy=True,
        slow_stats=True),
    "medusa, chain, top-1": Entry(medusa("greedy"), slow_stats=True),
    "medusa, chain, sampled": Entry(medusa("sample"), slow_greedy=True, slow_stats=True),
    "medusa, static tree, top-k": Entry(medusa(), None, MEDUSA_TREE, slow_greedy=True,
                                        slow_stats=True),
    # Model-free trees that the drafter builds itself (TreeBudget): lookahead's Jacobi window
    # (never accepted) beside its pooled n-grams; retrieval tries from a datastore and the
    # row's own text, with one-token steps where no row has a match.
    "lookahead, window and n-grams": Entry(
        lambda d, t: Lookahead(window=3, ngram=3, guesses=2, buckets=16), None,
        stat_prompt=(1, 5, 2, 1, 5, 2, 1), slow_stats=True),
    "retrieval, datastore and own text": Entry(retrieval(max_nodes=6, depth=3, samples=4),
                                               None, slow_stats=True),
    "retrieval, own text, adaptive length": Entry(
        lambda d, t: Retrieval(None, max_nodes=5, depth=3, speculation_factor=1.5,
                               min_probability=0.0), None,
        stat_prompt=(1, 5, 2, 1, 5, 2, 1), slow_greedy=True, slow_stats=True),
    # Self-speculation: the target without its last block (the micro target's only one),
    # on its own weights and cache; a per-row draft length that follows acceptance.
    "layer skip, chain, sampled": Entry(layer_skip()),
    "layer skip, chain, argmax, confidence threshold": Entry(
        layer_skip(method="greedy", min_confidence=0.2), slow_greedy=True, slow_stats=True),
    # Kangaroo: the target's first blocks, an adapter, the target's head; the early exit
    # (graded widths, a draft loop that stops when every row has exited).
    "kangaroo early exit, chain, sampled": Entry(early_exit(stop_below=0.3), slow_stats=True),
    "kangaroo, chain, argmax, every draft": Entry(early_exit(method="greedy", stop_below=None),
                                                  slow_greedy=True, slow_stats=True),
    "kangaroo, chain, reduced draft vocabulary": Entry(
        early_exit(reduced_vocab=True, stop_below=0.3), slow_greedy=True,
        slow_stats=True),
    "kangaroo, chain, adaptive length": Entry(
        lambda d, t: AdaptiveLength(early_exit(stop_below=None)(d, t), start=2),
        slow_greedy=True, slow_stats=True),
    "draft model, chain, adaptive length": Entry(
        lambda d, t: AdaptiveLength(DraftModel(d, "sample"), start=1), slow_stats=True),
    "draft model, chain, expected-speed length": Entry(
        lambda d, t: AdaptiveLength(DraftModel(d, "sample"), schedule="expected_speed",
                                    draft_cost=0.2, verify_costs=(1.0, 1.3, 1.5, 1.7)),
        slow_greedy=True, slow_stats=True),
    "eagle3, chain, adaptive length": Entry(
        lambda d, t: AdaptiveLength(eagle("eagle3")(d, t), start=2), slow_greedy=True,
        slow_stats=True),
    "layer skip, chain, adaptive length": Entry(
        lambda d, t: AdaptiveLength(layer_skip()(d, t), shrink=2), slow_greedy=True,
        slow_stats=True),
    "medusa, dynamic tree, top-k": Entry(medusa(), None, DynamicTree(num_nodes=6, max_depth=3,
                                                                      top_k=2),
                                         slow_greedy=True, slow_stats=True),
    # Published layouts read by specjax_models.load_drafter (EAGLE-3's concatenated layer
    # input, own LM head over a draft vocabulary; EAGLE-1's layer without norms; Medusa-1's
    # own LM heads).
    "published eagle3 (speculators), chain, sampled": Entry(
        published("eagle3-speculators", "sample"), slow_stats=True),
    "published eagle3 (authors), dynamic tree": Entry(published("eagle3"), None, DYNAMIC_TREE,
                                                      slow_greedy=True, slow_stats=True),
    "published eagle1, chain, argmax": Entry(published("eagle1", "greedy"), slow_greedy=True,
                                             slow_stats=True),
    "published medusa1, static tree": Entry(published("medusa1"), None, MEDUSA_TREE,
                                            slow_greedy=True, slow_stats=True),
    "published mimo mtp, chain, sampled": Entry(published("mimo-mtp"), slow_greedy=True,
                                                slow_stats=True),
    # DeepSeek-V3's MTP module: the model's own block (latent attention, experts) with its
    # latent cache, recursive for K > 1 (chains), level by level (trees).
    "deepseek mtp, chain, sampled": Entry(deepseek_mtp(), slow_stats=True),
    "deepseek mtp, static tree, sampled": Entry(deepseek_mtp(), None, STATIC_TREE,
                                                slow_greedy=True, slow_stats=True),
    "deepseek mtp, dynamic tree, top-k": Entry(deepseek_mtp(), None, DYNAMIC_TREE,
                                               slow_greedy=True, slow_stats=True),
}
SAMPLINGS = {"t1": SamplingConfig(temperature=1.0),
             "t0.7-topk4": SamplingConfig(temperature=0.7, top_k=4),
             "topp0.8": SamplingConfig(temperature=1.0, top_p=0.8)}
PROMPTS = [[1, 2, 3, 4, 1, 2], [7, 7], [30, 2, 5, 9, 11, 3], [4]]
# Rows per sampling setting in the one batched call of an entry's chi-square test.
STAT_ROWS = 12_000


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
            tree=entry.tree, verification=entry.verification)
        np.testing.assert_array_equal(spec.tokens, plain.tokens)
        np.testing.assert_array_equal(spec.lengths, plain.lengths)
        if getattr(drafter, "reads_target_features", False):
            break  # feature drafters ignore the draft model: one run is enough


MIXED = [GREEDY, SamplingConfig(temperature=0.9, top_k=6), GREEDY,
         SamplingConfig(temperature=1.0, top_p=0.7)]


@pytest.mark.parametrize("name", ["draft model, chain, sampled",
                                  pytest.param("draft model, chain, sampled, token rule",
                                               marks=pytest.mark.slow),
                                  pytest.param("draft model, static tree, sampled",
                                               marks=pytest.mark.slow),
                                  pytest.param("draft model, dynamic tree, top-k",
                                               marks=pytest.mark.slow)])
def test_greedy_rows_of_a_mixed_batch_equal_generate(tiny_lm, close_draft, name):
    """Rows with different settings share a batch: its greedy rows (on the sampled path,
    where p is their argmax one-hot) are exactly greedy decoding, token for token."""
    entry = ENTRIES[name]
    plain = specjax.generate(tiny_lm, PROMPTS, max_new_tokens=24, sampling=GREEDY)
    eos = int(plain.tokens[0, 5])
    plain = specjax.generate(tiny_lm, PROMPTS, max_new_tokens=24, sampling=GREEDY, eos_id=eos)
    spec = specjax.speculative_generate(
        tiny_lm, entry.make(close_draft, tiny_lm), PROMPTS, max_new_tokens=24,
        num_draft_tokens=entry.num_draft_tokens, sampling=MIXED, eos_id=eos,
        key=jax.random.key(3), tree=entry.tree, verification=entry.verification)
    greedy_rows = [row for row, config in enumerate(MIXED) if config.greedy]
    np.testing.assert_array_equal(np.asarray(spec.tokens)[greedy_rows],
                                  np.asarray(plain.tokens)[greedy_rows])
    np.testing.assert_array_equal(np.asarray(spec.lengths)[greedy_rows],
                                  np.asarray(plain.lengths)[greedy_rows])
    assert spec.stats.acceptance_rate > 0.0


# One batched call per entry: a row group per sampling setting (and a greedy group, which
# must follow the greedy continuation exactly), one compiled decoder for all of them.
STAT_CASES = [pytest.param(name, marks=pytest.mark.slow) if ENTRIES[name].slow_stats
              else name for name in sorted(ENTRIES)]


def chi_square_call(name: str, micro_lm, close_draft):
    """Entry `name`'s one batched call: the p-values of its settings (the greedy group's
    first) and the output (also timed by benchmarks/machines/registry_entry_time.py)."""
    entry = ENTRIES[name]
    settings = [GREEDY] + [SAMPLINGS[s] for s in entry.stat_samplings]
    return speculative_joint_pvalues(
        micro_lm, entry.make(close_draft, micro_lm), list(entry.stat_prompt),
        settings, num_draft_tokens=entry.num_draft_tokens, rows_per_setting=STAT_ROWS,
        seed=200, tree=entry.tree, verification=entry.verification)


@pytest.mark.parametrize("name", STAT_CASES)
def test_sampled_output_follows_the_target(micro_lm, micro_drafts, name):
    entry = ENTRIES[name]
    pvalues, out = chi_square_call(name, micro_lm, micro_drafts["close"])
    assert pvalues[0] == 1.0, "the greedy rows left the greedy continuation"
    for setting, pvalue in zip(entry.stat_samplings, pvalues[1:], strict=True):
        assert pvalue > 1e-3, (setting, pvalue, out.stats.acceptance_rate)
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
