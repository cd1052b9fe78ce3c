"""specjax.decoding.inputs: host-side input preparation (checks, packing, buckets, capacity)."""

import numpy as np
import pytest

import specjax
from specjax.decoding.inputs import (
    PROMPT_PAD_ID,
    bucket,
    check_eos_id,
    check_max_new_tokens,
    check_pad_id,
    pack_prompts,
    plan_capacity,
    prepare_batch,
    resolve_key,
)
from specjax.testing import plus_one_lm


def test_buckets_are_powers_of_two_with_a_floor():
    assert [bucket(n) for n in (1, 32, 33, 64, 65)] == [32, 32, 64, 64, 128]
    assert bucket(300, minimum=256) == 512 and bucket(3, minimum=1) == 4


def test_ragged_lists_and_arrays_pack_the_same_way():
    ragged = pack_prompts([[5, 6, 7], [8]], None, vocab_size=16)
    assert ragged.tokens.tolist() == [[5, 6, 7], [8, PROMPT_PAD_ID, PROMPT_PAD_ID]]
    assert ragged.lengths.tolist() == [3, 1] and ragged.tokens.dtype == np.int32
    array = pack_prompts(np.array([[5, 6, 7], [8, 9, 9]]), [3, 1], vocab_size=16)
    np.testing.assert_array_equal(array.tokens, ragged.tokens)
    np.testing.assert_array_equal(array.lengths, ragged.lengths)
    assert pack_prompts([[1]], None, vocab_size=4, pad_to=8).tokens.shape == (1, 8)



def test_equal_lists_take_the_whole_array_path_with_the_same_refusals():
    """Equally long lists are converted in one call (the harness's 36,256 rows); what they
    pack to, and every refusal, is what the row-by-row path gives."""
    rows = [[3, 1, 4], [1, 5, 9]] * 5_000
    packed = pack_prompts(rows, None, vocab_size=16)
    np.testing.assert_array_equal(packed.tokens, np.asarray(rows, np.int32))
    assert packed.lengths.tolist() == [3] * 10_000
    as_arrays = pack_prompts([np.asarray(r, np.uint8) for r in rows[:2]], None, vocab_size=16)
    np.testing.assert_array_equal(as_arrays.tokens, packed.tokens[:2])
    # The first row and id outside the vocabulary are named, on both paths.
    for bad in ([[1, 2], [3, 16]], [[1, 2, 3], [3, -1]]):
        with pytest.raises(ValueError, match="prompt 1 holds token id (16|-1), outside"):
            pack_prompts(bad, None, vocab_size=16)
    # An id past int64 is refused as the id it is, not wrapped by a conversion.
    with pytest.raises(ValueError, match=f"token id {2**63 + 5}, outside"):
        pack_prompts([[1], np.asarray([2**63 + 5], np.uint64)], None, vocab_size=16)
    with pytest.raises(ValueError, match=f"prompt 0 holds token id {2**63}"):
        pack_prompts([[2**63]], None, vocab_size=16)
    for bad, error in (([[1.0, 2.0]], TypeError), ([[True]], TypeError), ([[]], ValueError),
                       ([1, 2], TypeError), ([[2**64]], TypeError)):
        with pytest.raises(error, match="prompt|LISTS"):
            pack_prompts(bad, None, vocab_size=16)
    # An array's ids past a row's length are its padding, never checked.
    padded = pack_prompts(np.array([[5, 6, 99]]), [2], vocab_size=16)
    assert padded.tokens.tolist() == [[5, 6]]

def test_eos_ids_are_padded_to_a_bucket_with_never_matching_ids():
    assert check_eos_id(None, 10).tolist() == [-1, -1, -1, -1]
    assert check_eos_id(3, 10).tolist() == [3, -1, -1, -1]
    assert check_eos_id([1, np.int32(2)], 10).tolist() == [1, 2, -1, -1]
    assert check_eos_id(list(range(5)), 10).tolist() == [0, 1, 2, 3, 4, -1, -1, -1]
    assert check_eos_id([], 10).tolist() == [-1, -1, -1, -1]
    with pytest.raises(TypeError, match="eos_id must be an int"):
        check_eos_id("3", 10)
    with pytest.raises(ValueError, match="eos_id=10 is outside"):
        check_eos_id([2, 10], 10)


@pytest.mark.parametrize("value, expected", [(0, 0), (-1, -1), (np.int64(99), 99)])
def test_pad_ids_are_any_int32(value, expected):
    assert check_pad_id(value) == expected and isinstance(check_pad_id(value), int)


def test_max_new_tokens_accepts_numpy_ints_only():
    assert check_max_new_tokens(np.int16(4)) == 4
    for bad in (2.0, True, "3"):
        with pytest.raises(TypeError):
            check_max_new_tokens(bad)


def test_capacity_buckets_reserve_scratch_and_respect_the_model_limit():
    lengths = np.array([10, 3])
    assert plan_capacity(lengths, 20, None) == 256  # the shared minimum bucket
    assert plan_capacity(lengths, 300, None) == 512
    assert plan_capacity(lengths, 20, 100, extra_slots=5) == 105  # capped at limit + scratch
    assert plan_capacity(lengths, 20, None, extra_slots=5, cache_size=35) == 35
    with pytest.raises(ValueError, match="cache_size=34 is too small"):
        plan_capacity(lengths, 20, None, extra_slots=5, cache_size=34)
    with pytest.raises(ValueError, match="exceed the model's max_seq_len=25"):
        plan_capacity(lengths, 20, 25)


def test_prepare_batch_pads_prompts_with_a_safe_id_to_a_bucket():
    lm = plus_one_lm(vocab=16)
    batch, capacity, eos = prepare_batch(lm, [[1, 2, 3], [4]], None, 8, specjax.GREEDY, [5])
    assert batch.tokens.shape == (2, 32) and capacity == 256
    assert (batch.tokens[1, 1:] == PROMPT_PAD_ID).all() and eos.tolist() == [5, -1, -1, -1]
    with pytest.raises(TypeError, match="expected a specjax.CausalLM"):
        prepare_batch(object(), [[1]], None, 8, specjax.GREEDY, None)
    with pytest.raises(ValueError, match="needs a PRNG key"):
        resolve_key(None, specjax.SamplingConfig(temperature=1.0))
