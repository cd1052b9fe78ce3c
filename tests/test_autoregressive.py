"""specjax.decoding.autoregressive (`specjax.generate`): loop mechanics, exactness of the
AR sampler, reproducibility, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import GREEDY, SamplingConfig, generate
from specjax.decoding.autoregressive import _decode_loop, _init_state
from specjax.testing import chi_square_pvalue, enumerate_joint, plus_one_lm


def test_plus_one_model_ragged_prompts_eos_and_padding():
    lm = plus_one_lm(vocab=16)
    out = generate(lm, [[1, 2, 3], [9], [4, 5, 6, 7, 8]], max_new_tokens=6, eos_id=12,
                   sampling=GREEDY, pad_id=0)
    assert out.tokens.shape == (3, 6)
    assert out.tokens.tolist() == [
        [4, 5, 6, 7, 8, 9],
        [10, 11, 12, 0, 0, 0],      # stops after emitting EOS 12, which is kept
        [9, 10, 11, 12, 0, 0],
    ]
    assert out.lengths.tolist() == [6, 3, 4]


def test_plus_one_model_wraps_and_samples_deterministically():
    lm = plus_one_lm(vocab=5)
    out = generate(lm, np.array([[3, 4, 0], [1, 0, 0]]), prompt_lengths=[2, 1],
                   max_new_tokens=7, sampling=SamplingConfig(temperature=1.0),
                   key=jax.random.key(0))
    # Logit gap 20 at temperature 1: the +1 token has probability 1 - 4e-9.
    assert out.tokens.tolist() == [[0, 1, 2, 3, 4, 0, 1], [2, 3, 4, 0, 1, 2, 3]]


def test_greedy_equals_stepwise_argmax_of_full_forward(tiny_lm):
    prompts = [[1, 2, 3, 4], [7, 7], [30, 2, 5]]
    out = generate(tiny_lm, prompts, max_new_tokens=12, sampling=GREEDY)
    for row, prompt in enumerate(prompts):
        seq = list(prompt)
        for _ in range(12):
            seq.append(int(jnp.argmax(tiny_lm.logits(jnp.array([seq]))[0, -1])))
        assert out.tokens[row].tolist() == seq[len(prompt):]


@pytest.mark.parametrize("sampling", [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.6, top_k=3),
    SamplingConfig(temperature=1.0, top_p=0.7),
], ids=["temperature", "top_k", "top_p"])
def test_ar_sampler_is_exact_chi_square_first_two_tokens(micro_lm, sampling):
    """20,000 rows in one call against the exactly enumerated warped joint of 2 tokens."""
    prompt = [1, 5, 2]
    rows = 20_000
    out = generate(micro_lm, [prompt] * rows, max_new_tokens=2, sampling=sampling,
                   key=jax.random.key(42))
    samples = np.asarray(out.tokens)
    joint = enumerate_joint(micro_lm, prompt, 2, sampling)
    assert chi_square_pvalue(samples, joint) > 1e-3
    # The test has power: the same samples are far from the unwarped distribution.
    if sampling != SamplingConfig(temperature=1.0):
        raw = enumerate_joint(micro_lm, prompt, 2, SamplingConfig(temperature=1.0))
        assert chi_square_pvalue(samples, raw) < 1e-6


def test_same_key_same_tokens_and_new_key_new_tokens(tiny_lm):
    config = SamplingConfig(temperature=1.0)
    prompts = [[1, 2, 3], [4, 5]]
    a = generate(tiny_lm, prompts, max_new_tokens=16, sampling=config, key=jax.random.key(7))
    b = generate(tiny_lm, prompts, max_new_tokens=16, sampling=config, key=jax.random.key(7))
    c = generate(tiny_lm, prompts, max_new_tokens=16, sampling=config, key=jax.random.key(8))
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, c.tokens)


def test_a_rows_tokens_do_not_depend_on_its_batch_mates(tiny_lm):
    config = SamplingConfig(temperature=1.0)
    alone = generate(tiny_lm, [[1, 2, 3]], max_new_tokens=16, sampling=config,
                     key=jax.random.key(3))
    crowd = generate(tiny_lm, [[1, 2, 3], [9, 9, 9, 9], [4]], max_new_tokens=16,
                     sampling=config, key=jax.random.key(3))
    np.testing.assert_array_equal(alone.tokens[0], crowd.tokens[0])


def test_no_recompilation_for_new_contents_key_or_max_new_tokens(tiny_lm):
    config = SamplingConfig(temperature=0.9)
    generate(tiny_lm, [[1, 2, 3], [4, 5]], max_new_tokens=5, sampling=config,
             key=jax.random.key(0))
    loops, inits = _decode_loop._cache_size(), _init_state._cache_size()
    generate(tiny_lm, [[7, 8, 9], [10, 11, 12]], max_new_tokens=9, sampling=config,
             key=jax.random.key(1))
    generate(tiny_lm, [[3], [1, 1, 1, 1]], max_new_tokens=2, sampling=config,
             key=jax.random.key(2))
    generate(tiny_lm, [[3] * 20, [1]], max_new_tokens=100, sampling=config,
             key=jax.random.key(3))
    assert _decode_loop._cache_size() == loops
    assert _init_state._cache_size() == inits


def test_prefill_then_loop_leaves_cache_lengths_one_short():
    """The decode invariant: the cache holds every committed token but the last."""
    lm = plus_one_lm(vocab=16)
    state = _init_state(lm, jnp.array([[1, 2, 3], [4, 0, 0]]), jnp.array([3, 1]),
                        jax.random.key(0), jnp.int32(0), jnp.array([True, True]),
                        capacity=16)
    assert state.cache_lengths.tolist() == [2, 0]
    assert state.last_token.tolist() == [3, 4]


def test_max_new_tokens_at_the_model_limit_fits(tiny_lm):
    out = generate(tiny_lm, [[1] * 100], max_new_tokens=28, sampling=GREEDY)  # 128 total
    assert out.tokens.shape == (1, 28) and int(out.lengths[0]) == 28


@pytest.mark.parametrize("kwargs, error, message", [
    ({"prompts": [[1, 2], []]}, ValueError, "prompt 1 is empty"),
    ({"prompts": []}, ValueError, "prompts is empty"),
    ({"prompts": [[1, 2, 40]]}, ValueError, r"token id 40, outside the model's vocabulary"),
    ({"prompts": [[-1]]}, ValueError, "outside the model's vocabulary"),
    ({"prompts": [[1] * 120], "max_new_tokens": 9}, ValueError, "exceed the model's max_seq_len"),
    ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be >= 1"),
    ({"sampling": SamplingConfig(top_k=64)}, ValueError, "exceeds the vocabulary"),
    ({"prompts": np.array([[1, 2], [3, 4]]), "prompt_lengths": [2]}, ValueError,
     "one length per row"),
    ({"prompts": np.array([[1, 2], [3, 4]]), "prompt_lengths": [2, 3]}, ValueError,
     "exceeds the prompts array width"),
    ({"prompts": np.array([[1, 2], [3, 4]]), "prompt_lengths": [0, 2]}, ValueError,
     "prompt 0 is empty"),
    ({"prompts": [[1, 2]], "prompt_lengths": [2]}, ValueError, "only for an array"),
    ({"prompts": [1, 2, 3]}, TypeError, "wrap a single prompt"),
    ({"sampling": SamplingConfig(temperature=1.0), "key": None}, ValueError, "needs a PRNG key"),
    ({"eos_id": 99}, ValueError, "eos_id=99 is outside"),
])
def test_bad_inputs_are_refused_before_tracing(tiny_lm, kwargs, error, message):
    call = {"prompts": [[1, 2, 3]], "max_new_tokens": 4, "sampling": GREEDY}
    call.update(kwargs)
    prompts = call.pop("prompts")
    with pytest.raises(error, match=message):
        generate(tiny_lm, prompts, **call)


def test_a_sampling_that_is_not_a_sampling_config_is_refused(tiny_lm):
    with pytest.raises(TypeError, match="sampling must be a specjax.SamplingConfig"):
        generate(tiny_lm, [[1]], max_new_tokens=1, sampling={"temperature": 0.5})


def test_non_causal_lm_is_refused():
    with pytest.raises(TypeError, match="CausalLM.from_nnx"):
        generate(object(), [[1]], max_new_tokens=1, sampling=GREEDY)


# ---------------------------------------------------------------- adversarial edge cases

def test_out_of_vocab_pad_id_only_fills_the_output(tiny_lm):
    prompts = [[1, 2, 3], [4]]
    base = generate(tiny_lm, prompts, max_new_tokens=10, sampling=GREEDY, eos_id=7)
    padded = generate(tiny_lm, prompts, max_new_tokens=10, sampling=GREEDY, eos_id=7,
                      pad_id=99)
    np.testing.assert_array_equal(padded.lengths, base.lengths)
    inside = np.arange(10)[None] < np.asarray(base.lengths)[:, None]
    np.testing.assert_array_equal(np.asarray(padded.tokens)[inside],
                                  np.asarray(base.tokens)[inside])
    assert np.all(np.asarray(padded.tokens)[~inside] == 99)
    assert np.asarray(base.tokens)[inside].any()  # not the all-zero output of the bug


@pytest.mark.parametrize("pad_id, error, message", [
    (1.5, TypeError, "pad_id must be an int"),
    (2**40, ValueError, "does not fit in int32"),
    (True, TypeError, "pad_id must be an int"),
])
def test_bad_pad_ids_are_refused(tiny_lm, pad_id, error, message):
    with pytest.raises(error, match=message):
        generate(tiny_lm, [[1]], max_new_tokens=2, sampling=GREEDY, pad_id=pad_id)


def test_tiny_temperatures_follow_the_greedy_limit_or_are_refused(tiny_lm):
    greedy = generate(tiny_lm, [[1, 2, 3], [9, 4]], max_new_tokens=12, sampling=GREEDY)
    cold = generate(tiny_lm, [[1, 2, 3], [9, 4]], max_new_tokens=12,
                    sampling=SamplingConfig(temperature=1e-30), key=jax.random.key(3))
    np.testing.assert_array_equal(cold.tokens, greedy.tokens)
    with pytest.raises(ValueError, match="use temperature=0 for greedy"):
        SamplingConfig(temperature=1e-40)


def test_several_eos_ids_and_numpy_ids_are_accepted(tiny_lm):
    free = generate(tiny_lm, [[1, 2, 3]], max_new_tokens=16, sampling=GREEDY)
    first, second = int(free.tokens[0, 6]), int(free.tokens[0, 3])
    out = generate(tiny_lm, [[1, 2, 3]], max_new_tokens=16, sampling=GREEDY,
                   eos_id=[first, np.int64(second)])
    assert int(out.lengths[0]) == 1 + min(
        int(np.argmax(np.asarray(free.tokens[0]) == t)) for t in (first, second))
    no_eos = generate(tiny_lm, [[1, 2, 3]], max_new_tokens=16, sampling=GREEDY, eos_id=[])
    np.testing.assert_array_equal(no_eos.tokens, free.tokens)
    with pytest.raises(TypeError, match="a list of ints"):
        generate(tiny_lm, [[1]], max_new_tokens=2, sampling=GREEDY, eos_id=[1.5])
    with pytest.raises(ValueError, match="eos_id=40 is outside"):
        generate(tiny_lm, [[1]], max_new_tokens=2, sampling=GREEDY, eos_id=[3, 40])


def test_a_prompt_that_fills_max_seq_len_names_the_prompt_limit(tiny_lm):
    with pytest.raises(ValueError, match="leaves no room for new tokens.*shorten the prompt "
                                         "to at most 124 tokens"):
        generate(tiny_lm, [[1] * 128], max_new_tokens=4, sampling=GREEDY)


def test_rows_with_different_settings_share_a_batch(tiny_lm):
    """Per-row settings: each row decodes exactly as it would in a batch where every row
    had its setting (same key and row index), greedy rows included."""
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
    configs = [SamplingConfig(temperature=0.0), SamplingConfig(temperature=0.8, top_k=6),
               SamplingConfig(top_p=0.7), SamplingConfig(temperature=1.5)]
    mixed = generate(tiny_lm, prompts, max_new_tokens=12, sampling=configs,
                     key=jax.random.key(9))
    for row, config in enumerate(configs):
        alone = generate(tiny_lm, prompts, max_new_tokens=12, sampling=config,
                         key=jax.random.key(9))
        np.testing.assert_array_equal(mixed.tokens[row], alone.tokens[row])
