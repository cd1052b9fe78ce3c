"""specjax.decoding.speculative_loop (`specjax.speculative_generate`): exactness (greedy equality
with generate, chi-square of 3-token joints), edge cases, stats, reproducibility,
compilation and errors, all at batch > 1."""


import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import build_lm

import specjax
from specjax import GREEDY, DraftModel, SamplingConfig, generate, speculative_generate
from specjax.decoding.speculative_loop import _speculative_loop
from specjax.testing import (
    chi_square_pvalue,
    enumerate_joint,
    speculative_joint_pvalue,
    table_lm,
    unigram_lm,
)

PROMPTS = [[1, 2, 3, 4], [7, 7], [30, 2, 5, 9, 11, 3], [4]]


@pytest.mark.parametrize("num_draft_tokens", [1, 2, 4, 7])
@pytest.mark.parametrize("which", ["close", "random"])
def test_greedy_speculative_equals_greedy_generate(tiny_lm, close_draft, random_draft,
                                                   num_draft_tokens, which):
    draft = close_draft if which == "close" else random_draft
    plain = generate(tiny_lm, PROMPTS, max_new_tokens=24, sampling=GREEDY)
    # An EOS that row 0 really emits at step 6, so rows stop at different places.
    eos = int(plain.tokens[0, 5])
    plain = generate(tiny_lm, PROMPTS, max_new_tokens=24, sampling=GREEDY, eos_id=eos)
    spec = speculative_generate(tiny_lm, draft, PROMPTS, max_new_tokens=24,
                                num_draft_tokens=num_draft_tokens, sampling=GREEDY, eos_id=eos)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.lengths, plain.lengths)
    assert int(plain.lengths[0]) <= 6


@pytest.mark.parametrize("method", ["sample", "greedy"])
def test_greedy_speculative_with_greedy_or_sampled_draft_method(tiny_lm, close_draft, method):
    plain = generate(tiny_lm, PROMPTS, max_new_tokens=16, sampling=GREEDY)
    spec = speculative_generate(tiny_lm, DraftModel(close_draft, method), PROMPTS,
                                max_new_tokens=16, num_draft_tokens=3, sampling=GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(temperature=1.0)])
def test_draft_identical_to_target_accepts_everything(tiny_lm, sampling):
    k = 3
    spec = speculative_generate(tiny_lm, tiny_lm, PROMPTS, max_new_tokens=20,
                                num_draft_tokens=k, sampling=sampling, key=jax.random.key(0))
    stats = spec.stats
    assert stats.acceptance_rate == 1.0
    np.testing.assert_array_equal(stats.accepted, stats.proposed)
    # Every forward emits K+1 tokens; the last is cut at max_new_tokens=20.
    np.testing.assert_array_equal(stats.target_forwards, np.full(4, 5))
    np.testing.assert_array_equal(stats.draft_forwards, np.full(4, 5 * k))
    assert stats.accepted_per_position.tolist() == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------- distribution tests

STAT_PROMPT = [1, 5, 2]
STAT_ROWS = 30_000


def _joint_pvalue(target, draft, sampling, num_draft_tokens, seed, *, method="sample"):
    return speculative_joint_pvalue(target, DraftModel(draft, method) if method else draft,
                                    STAT_PROMPT, sampling, num_draft_tokens=num_draft_tokens,
                                    rows=STAT_ROWS, seed=seed)


@pytest.mark.parametrize("sampling", [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=4),
    SamplingConfig(temperature=1.0, top_p=0.8),
], ids=["t1", "t0.7-topk4", "topp0.8"])
@pytest.mark.slow  # `pytest -m slow` (CI runs it); the close draft runs in test_exactness
@pytest.mark.parametrize("method", ["sample", "greedy"])
def test_a_far_draft_is_exact_too(micro_lm, micro_drafts, sampling, method):
    """tests/test_exactness.py runs every drafter with a close draft; a draft far from the
    target (many rejections, large residuals) is checked here."""
    pvalue, out = _joint_pvalue(micro_lm, micro_drafts["far"], sampling, 2, seed=100,
                                method=method)
    assert pvalue > 1e-3, (pvalue, out.stats.acceptance_rate)
    # Speculation did happen: drafts were both accepted and rejected.
    assert 0.0 < out.stats.acceptance_rate < 1.0


def test_chi_square_has_power_against_the_draft_distribution(micro_lm, micro_drafts):
    """The draft's own joint is rejected on the same samples: the test can fail."""
    sampling = SamplingConfig(temperature=1.0)
    _, out = _joint_pvalue(micro_lm, micro_drafts["far"], sampling, 2, seed=101)
    draft_joint = enumerate_joint(micro_drafts["far"], STAT_PROMPT, 3, sampling)
    assert chi_square_pvalue(np.asarray(out.tokens), draft_joint) < 1e-6


@pytest.mark.slow
def test_longer_blocks_are_exact_too(micro_lm, micro_drafts):
    pvalue, out = _joint_pvalue(micro_lm, micro_drafts["close"], SamplingConfig(temperature=0.9),
                                5, seed=102)
    assert pvalue > 1e-3
    assert out.stats.mean_accepted_length > 1.5


VOCAB = 6
BIGRAM = np.random.default_rng(0).normal(size=(VOCAB, VOCAB)).astype(np.float32) * 1.5


@pytest.mark.parametrize("case", ["zero_mass", "disjoint", "identical", "draft_smaller_vocab",
                                  "draft_larger_vocab"])
def test_edge_cases_stay_exact(case):
    sampling = SamplingConfig(temperature=1.0)
    target_table = BIGRAM.copy()
    if case == "disjoint":
        target_table[:, 3:] = -np.inf        # target lives on {0, 1, 2}
        draft = unigram_lm([-np.inf, -np.inf, -np.inf, 0.0, 0.5, 1.0])
    elif case == "zero_mass":
        draft = unigram_lm([-np.inf, -np.inf, 0.0, 1.0, 0.2, 0.4])  # no mass on 0, 1
    elif case == "identical":
        draft = table_lm(target_table)
    elif case == "draft_smaller_vocab":      # the draft knows only ids 0..4
        draft = unigram_lm([0.1, 0.5, 0.0, 1.0, 0.3], vocab_rows=5)
    else:                                    # the draft has two extra ids
        draft = unigram_lm([0.1, 0.5, 0.0, 1.0, 0.3, 0.0, 2.0, 2.0], vocab_rows=8)
    target = table_lm(target_table)
    out = speculative_generate(target, draft, [[1, 2]] * STAT_ROWS, max_new_tokens=3,
                               num_draft_tokens=3, sampling=sampling, key=jax.random.key(5))
    joint = enumerate_joint(target, [1, 2], 3, sampling)
    assert chi_square_pvalue(np.asarray(out.tokens), joint) > 1e-3
    if case == "disjoint":
        assert out.stats.acceptance_rate == 0.0
    if case == "identical":
        assert out.stats.acceptance_rate == 1.0


@pytest.mark.slow
def test_bfloat16_params_are_exact_with_float32_maths(micro_lm, micro_drafts):
    cast = lambda lm: lm.with_params(jax.tree.map(lambda x: x.astype(jnp.bfloat16), lm.params))
    target16 = build_lm(3, vocab_size=8, num_layers=1, d_model=16, num_heads=2,
                        num_kv_heads=1, d_ff=32, max_seq_len=64, dtype="bfloat16",
                        param_dtype="bfloat16").with_params(cast(micro_lm).params)
    draft16 = build_lm(3, vocab_size=8, num_layers=1, d_model=16, num_heads=2,
                       num_kv_heads=1, d_ff=32, max_seq_len=64, dtype="bfloat16",
                       param_dtype="bfloat16").with_params(cast(micro_drafts["close"]).params)
    pvalue, out = _joint_pvalue(target16, draft16, SamplingConfig(temperature=1.0), 2, seed=103)
    assert pvalue > 1e-3
    assert 0.0 < out.stats.acceptance_rate < 1.0


# ---------------------------------------------------------------- stats

def test_stats_are_consistent(tiny_lm, close_draft):
    out = speculative_generate(tiny_lm, close_draft, PROMPTS, max_new_tokens=30,
                               num_draft_tokens=4, sampling=SamplingConfig(temperature=1.0),
                               key=jax.random.key(1))
    s = out.stats
    assert s.acceptance_rate == pytest.approx(s.accepted.sum() / s.proposed.sum())
    assert s.mean_accepted_length == pytest.approx(s.emitted.sum() / s.target_forwards.sum())
    np.testing.assert_array_equal(s.emitted, out.lengths)
    # K drafts a step, but near the row's end only those that fit its room (a draft past
    # max_new_tokens is not proposed): rooms of 3, 2, 1 take at most 1 + 2 + 3 off.
    assert np.all(0 <= 4 * s.target_forwards - s.proposed)
    assert np.all(4 * s.target_forwards - s.proposed <= 6)
    per_position = s.row_accepted_per_position
    assert np.all(np.diff(per_position, axis=1) <= 0)  # a prefix: j+1 accepted => j accepted
    # Per-position counts are what verification accepted (uncut by max_new_tokens): at
    # least the drafts that became output.
    assert np.all(np.rint(per_position.sum(1) * s.target_forwards) >= s.accepted)
    assert s.num_steps == s.target_forwards.max()
    assert set(s.as_dict()) >= {"acceptance_rate", "mean_accepted_length",
                                "accepted_per_position", "target_forwards", "draft_forwards"}


# ---------------------------------------------------------------- reproducibility

REPRO_SCRIPT = textwrap.dedent("""
    import jax, numpy as np
    from flax import nnx
    import specjax
    import specjax_models
    def lm(seed, **kw):
        cfg = dict(vocab_size=32, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                   d_ff=128, max_seq_len=128)
        cfg.update(kw)
        config = specjax_models.TransformerConfig(**cfg)
        return specjax.CausalLM.from_nnx(specjax_models.Transformer(config,
                                                                    rngs=nnx.Rngs(seed)))
    out = specjax.speculative_generate(
        lm(0), lm(17),  # conftest.random_draft
        [[1, 2, 3, 4], [7, 7], [30, 2, 5, 9, 11, 3], [4]], max_new_tokens=16,
        num_draft_tokens=3, sampling=specjax.SamplingConfig(temperature=1.0),
        key=jax.random.key(1234))
    print(np.asarray(out.tokens).tolist())
""")


@pytest.mark.slow
def test_same_key_same_tokens_in_this_process_and_a_fresh_one(tiny_lm, random_draft):
    call = lambda key: speculative_generate(tiny_lm, random_draft, PROMPTS, max_new_tokens=16,
                                            num_draft_tokens=3,
                                            sampling=SamplingConfig(temperature=1.0), key=key)
    first = np.asarray(call(jax.random.key(1234)).tokens)
    np.testing.assert_array_equal(first, call(jax.random.key(1234)).tokens)
    assert not np.array_equal(first, call(jax.random.key(4321)).tokens)
    fresh = subprocess.run([sys.executable, "-c", REPRO_SCRIPT], capture_output=True,
                           text=True, check=True)
    assert eval(fresh.stdout.strip().splitlines()[-1]) == first.tolist()


def test_a_rows_tokens_do_not_depend_on_its_batch_mates(tiny_lm, close_draft):
    """Row b draws from fold_in(step key, b): adding rows after it changes nothing, provided
    its logits are bit-identical in both batches (true on CPU for these shapes; a backend
    whose matmul blocking changes with the batch size may flip a near-tie)."""
    call = lambda prompts: speculative_generate(tiny_lm, close_draft, prompts,
                                                max_new_tokens=16, num_draft_tokens=3,
                                                sampling=SamplingConfig(temperature=1.0),
                                                key=jax.random.key(9))
    alone = call([PROMPTS[2]])
    crowd = call([PROMPTS[2]] + PROMPTS)  # row 0 keeps its index, so its keys
    np.testing.assert_array_equal(alone.tokens[0], crowd.tokens[0])


def test_a_rows_tokens_do_not_depend_on_its_batch_mates_settings(tiny_lm, close_draft):
    """Per-row settings: a row of a mixed batch (greedy, top-k, top-p and plain rows)
    commits exactly the tokens it commits in a batch where every row has its setting."""
    configs = [SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.8, top_k=6),
               SamplingConfig(top_p=0.7), SamplingConfig(temperature=1.5)]
    call = lambda sampling: speculative_generate(tiny_lm, DraftModel(close_draft), PROMPTS,
                                                 max_new_tokens=16, num_draft_tokens=3,
                                                 sampling=sampling, key=jax.random.key(9))
    mixed = call(configs)
    for row, config in enumerate(configs):
        np.testing.assert_array_equal(mixed.tokens[row], call(config).tokens[row])


def test_no_recompilation_for_new_contents_key_or_max_new_tokens(tiny_lm, close_draft):
    call = lambda prompts, n, seed: speculative_generate(
        tiny_lm, close_draft, prompts, max_new_tokens=n, num_draft_tokens=2,
        sampling=SamplingConfig(temperature=0.8), key=jax.random.key(seed))
    call([[1, 2, 3], [4, 5]], 10, 0)
    compiled = _speculative_loop._cache_size()
    call([[9, 8, 7], [6, 5, 4]], 40, 1)
    call([[3], [2, 2, 2, 2]], 5, 2)
    call([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [8]], 90, 3)
    assert _speculative_loop._cache_size() == compiled


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("kwargs, error, message", [
    ({"num_draft_tokens": 0}, ValueError, "num_draft_tokens must be an int >= 1"),
    ({"cache_size": 20}, ValueError, r"cache_size=20 is too small.*\+ 5 scratch slots"),
    ({"prompts": [[1, 2], []]}, ValueError, "prompt 1 is empty"),
    ({"prompts": [[1, 99]]}, ValueError, "outside the model's vocabulary"),
    ({"max_new_tokens": 200}, ValueError, "exceed the model's max_seq_len"),
    ({"sampling": SamplingConfig(temperature=1.0)}, ValueError, "needs a PRNG key"),
    ({"draft": object()}, TypeError, "draft must be a specjax.CausalLM or a drafter"),
])
def test_bad_inputs_are_refused_before_tracing(tiny_lm, close_draft, kwargs, error, message):
    call = {"prompts": [[1, 2, 3]], "max_new_tokens": 16, "num_draft_tokens": 4,
            "sampling": GREEDY, "draft": close_draft}
    call.update(kwargs)
    prompts, draft = call.pop("prompts"), call.pop("draft")
    with pytest.raises(error, match=message):
        speculative_generate(tiny_lm, draft, prompts, **call)


def test_unrelated_vocabularies_are_refused(tiny_lm):
    other = build_lm(2, vocab_size=2000)
    with pytest.raises(ValueError, match="must share a tokenizer"):
        speculative_generate(tiny_lm, other, [[1, 2]], max_new_tokens=4, num_draft_tokens=2,
                             sampling=GREEDY)
    with pytest.raises(ValueError, match="method must be one of"):
        DraftModel(tiny_lm, method="typical")


def test_padded_vocab_pair_matches_greedy_generate(tiny_lm):
    """A draft over a 24-id prefix of the target's 32 ids (as Qwen2.5 pairs differ)."""
    small = build_lm(4, vocab_size=24)
    plain = generate(tiny_lm, PROMPTS, max_new_tokens=12, sampling=GREEDY)
    spec = speculative_generate(tiny_lm, DraftModel(small, max_vocab_padding=8), PROMPTS,
                                max_new_tokens=12, num_draft_tokens=3, sampling=GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)


# ---------------------------------------------------------------- adversarial edge cases

def test_a_step_whose_k_differs_from_the_states_is_refused(tiny_lm, close_draft):
    state, drafter = specjax.init_speculative_state(tiny_lm, close_draft, PROMPTS,
                                                    max_new_tokens=8, num_draft_tokens=3,
                                                    sampling=GREEDY)
    assert state.num_draft_tokens == 3
    for other in (1, 6):
        config = specjax.SpeculativeConfig(num_draft_tokens=other, sampling=GREEDY)
        with pytest.raises(ValueError, match=r"built for num_draft_tokens=3, but the "
                                             rf"SpeculativeConfig asks for {other}"):
            specjax.jitted_step(tiny_lm, drafter, state, config)
    # The matching K still steps (the refused calls consumed nothing).
    state = specjax.jitted_step(tiny_lm, drafter, state,
                                specjax.SpeculativeConfig(num_draft_tokens=3, sampling=GREEDY))
    assert int(state.num_steps) == 1



def test_several_eos_ids_end_rows_as_in_generate(tiny_lm, close_draft):
    free = generate(tiny_lm, PROMPTS, max_new_tokens=24, sampling=GREEDY)
    eos = [int(free.tokens[0, 4]), int(free.tokens[1, 2])]
    plain = generate(tiny_lm, PROMPTS, max_new_tokens=24, sampling=GREEDY, eos_id=eos)
    assert int(plain.lengths[0]) <= 5 and int(plain.lengths[1]) <= 3
    spec = speculative_generate(tiny_lm, close_draft, PROMPTS, max_new_tokens=24,
                                num_draft_tokens=4, sampling=GREEDY, eos_id=eos)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    np.testing.assert_array_equal(spec.lengths, plain.lengths)


def test_out_of_vocab_pad_id_only_fills_the_output(tiny_lm, close_draft):
    eos = int(generate(tiny_lm, PROMPTS, max_new_tokens=12, sampling=GREEDY).tokens[0, 3])
    base = speculative_generate(tiny_lm, close_draft, PROMPTS, max_new_tokens=12,
                                num_draft_tokens=3, sampling=GREEDY, eos_id=eos)
    padded = speculative_generate(tiny_lm, close_draft, PROMPTS, max_new_tokens=12,
                                  num_draft_tokens=3, sampling=GREEDY, eos_id=eos, pad_id=99)
    inside = np.arange(12)[None] < np.asarray(base.lengths)[:, None]
    np.testing.assert_array_equal(np.asarray(padded.tokens)[inside],
                                  np.asarray(base.tokens)[inside])
    assert np.all(np.asarray(padded.tokens)[~inside] == 99) and (~inside).any()


def test_tiny_temperatures_follow_the_greedy_limit(tiny_lm, close_draft):
    greedy = generate(tiny_lm, PROMPTS, max_new_tokens=12, sampling=GREEDY)
    cold = SamplingConfig(temperature=1e-30)
    spec = speculative_generate(tiny_lm, close_draft, PROMPTS, max_new_tokens=12,
                                num_draft_tokens=3, sampling=cold, key=jax.random.key(0))
    np.testing.assert_array_equal(spec.tokens, greedy.tokens)


@pytest.mark.slow
def test_bfloat16_greedy_divergence_is_a_near_tie():
    """bf16: the 1-token decode and the (K+1)-token verify round differently, so greedy
    outputs may part where the top two logits nearly tie (docs/exactness.md). Wherever
    they part, the two tokens' logits must be within a few bfloat16 steps; float32 copies
    of the same weights never part on these prompts."""
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 64, size=int(rng.integers(3, 12))).tolist() for _ in range(12)]
    prompts[0] = [55, 48, 53, 34, 52, 21, 28, 50, 7]  # the reported case
    for dtype in ("float32", "bfloat16"):
        target = build_lm(0, vocab_size=64, dtype=dtype, param_dtype=dtype)
        plain = np.asarray(generate(target, prompts, max_new_tokens=40,
                                    sampling=GREEDY).tokens)
        spec = np.asarray(speculative_generate(target, target, prompts, max_new_tokens=40,
                                               num_draft_tokens=2, sampling=GREEDY).tokens)
        parted = [b for b in range(len(prompts)) if not np.array_equal(plain[b], spec[b])]
        if dtype == "float32":
            assert parted == []
            continue
        assert parted, "the bf16 case no longer parts: tighten the claim in docs/exactness.md"
        for b in parted:
            j = int(np.nonzero(plain[b] != spec[b])[0][0])
            logits = np.asarray(target.logits(jnp.asarray([prompts[b] + plain[b, :j].tolist()])))
            gap = abs(logits[0, -1, plain[b, j]] - logits[0, -1, spec[b, j]])
            bf16_step = 2.0 ** -7 * np.abs(logits[0, -1]).max()
            assert gap <= 4 * bf16_step, (b, j, gap, bf16_step)
