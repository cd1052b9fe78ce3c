"""specjax.datastore: the suffix array, matches and continuations against brute force;
growing, saving and loading; damaged files refused by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.drafters.datastore import (
    PADDING,
    SEPARATOR,
    Datastore,
    continuations,
    longest_match,
    suffix_array,
)


def _documents(seed=0, count=30, vocab=5):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, rng.integers(1, 40)).tolist() for _ in range(count)]


def test_the_suffix_array_sorts_every_suffix():
    for tokens in ([3, 1, 2, 1, 2, 1], [0, 0, 0, 0], [5], _documents(1, 3)[0] * 3):
        order = suffix_array(np.array(tokens))
        assert [tokens[i:] for i in order] == sorted(tokens[i:] for i in range(len(tokens)))


def test_the_stream_holds_documents_separators_and_padding():
    store = Datastore.build([[1, 2], [], [3]], vocab_size=4)
    assert store.stream.tolist() == [1, 2, SEPARATOR, 3, SEPARATOR]
    assert store.tokens.shape == (1024,) and int(store.tokens[5]) == PADDING
    assert (store.num_documents, store.num_tokens) == (2, 3)
    assert [d.tolist() for d in store.documents()] == [[1, 2], [3]]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        Datastore.build([[1, 4]], vocab_size=4)


def _brute_force(stream, row, max_query, min_match):
    best, where = 0, []
    for m in range(min_match, min(max_query, len(row)) + 1):
        found = [i for i in range(len(stream)) if stream[i:i + m].tolist() == row[-m:]]
        if found:
            best, where = m, found
    return best, where


def test_longest_match_finds_every_occurrence_of_the_longest_suffix():
    store = Datastore.build(_documents(), vocab_size=5)
    rng = np.random.default_rng(2)
    rows = [rng.integers(0, 5, n).tolist() for n in (12, 3, 1, 12, 7, 9)]
    rows[5] = [4, 4, 4, 4, 4, 4, 4, 4, 4]  # longer than anything stored
    capacity = 16
    sequence = np.full((len(rows), capacity), 3, np.int32)  # stale slots: junk
    for b, row in enumerate(rows):
        sequence[b, :len(row)] = row
    lengths = jnp.array([len(r) for r in rows], jnp.int32)
    for min_match in (1, 2):
        start, count, match = jax.jit(longest_match, static_argnums=(3, 4))(
            store, jnp.asarray(sequence), lengths, 6, min_match)
        for b, row in enumerate(rows):
            best, where = _brute_force(store.stream, row, 6, min_match)
            assert int(match[b]) == best
            found = np.asarray(store.suffix_array)[int(start[b]):int(start[b]) + int(count[b])]
            assert sorted(found.tolist()) == sorted(where)


def test_continuations_spread_over_the_occurrences_and_stop_at_a_document_end():
    # [1 2] occurs 8 times: followed by 3 (x6, the last one at a document's end) or 4 (x2).
    documents = [[1, 2, 3, 0]] * 5 + [[1, 2, 4, 4]] * 2 + [[1, 2, 3]]
    store = Datastore.build(documents, vocab_size=5)
    sequence = jnp.array([[0, 1, 2], [0, 0, 1]], jnp.int32)
    start, count, match = longest_match(store, sequence, jnp.array([3, 3]), 4)
    assert match.tolist() == [2, 1] and int(count[0]) == 8
    tokens, lengths = continuations(store, start, count, match, 4, 3, 5)
    row = [tuple(tokens[0, c, :lengths[0, c]].tolist()) for c in range(4)]
    # Sorted suffixes: [1 2 3] (end), [1 2 3 0] x5, [1 2 4 4] x2; every other one is read.
    assert row == [(3,), (3, 0), (3, 0), (4, 4)]
    few, few_lengths = continuations(store, start, count, match, 16, 2, 5)
    assert int(jnp.sum(few_lengths[0] > 0)) == 8  # all 8 when there are fewer than C


def test_add_grows_without_new_shapes_until_it_doubles():
    store = Datastore.build([[1, 2, 3]], vocab_size=8)
    grown = store.add([[4, 5], [6]])
    assert grown.stream.tolist() == [1, 2, 3, SEPARATOR, 4, 5, SEPARATOR, 6, SEPARATOR]
    assert grown.tokens.shape == store.tokens.shape
    assert grown.add([[1] * 2000]).tokens.shape == (2048,)  # 2010 ids and separators


def test_save_and_load_round_trip(tmp_path):
    store = Datastore.build(_documents(3), vocab_size=5)
    store.save(tmp_path / "ds.npz")
    loaded = Datastore.load(tmp_path / "ds.npz")
    assert loaded.vocab_size == 5
    np.testing.assert_array_equal(loaded.tokens, store.tokens)
    np.testing.assert_array_equal(loaded.suffix_array, store.suffix_array)


def test_damaged_and_foreign_files_are_refused_by_name(tmp_path):
    store = Datastore.build(_documents(4), vocab_size=5)
    path = tmp_path / "ds.npz"
    store.save(path)
    data = path.read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match="cut.npz.*cut short.*specjax datastore build"):
        Datastore.load(tmp_path / "cut.npz")
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(ValueError, match="other.npz.*not a specjax datastore"):
        Datastore.load(tmp_path / "other.npz")
    arrays = dict(np.load(path))
    arrays["suffix_array"] = np.zeros_like(arrays["suffix_array"])
    np.savez(tmp_path / "bad_order.npz", **arrays)
    with pytest.raises(ValueError, match="not a permutation"):
        Datastore.load(tmp_path / "bad_order.npz")
    arrays = dict(np.load(path))
    arrays["vocab_size"] = np.int64(3)
    np.savez(tmp_path / "bad_ids.npz", **arrays)
    with pytest.raises(ValueError, match="outside its vocabulary"):
        Datastore.load(tmp_path / "bad_ids.npz")
    with pytest.raises(FileNotFoundError):
        Datastore.load(tmp_path / "missing.npz")


def test_an_empty_datastore_has_no_documents_and_saves_under_any_name(tmp_path):
    empty = Datastore.build([], vocab_size=4)
    assert empty.documents() == [] and empty.num_documents == 0
    store = Datastore.build([[1, 2], [3]], vocab_size=4)
    store.save(tmp_path / "store")  # no .npz suffix: written at exactly that name
    assert [p.name for p in tmp_path.iterdir()] == ["store"]
    again = Datastore.load(tmp_path / "store")
    assert [d.tolist() for d in again.documents()] == [[1, 2], [3]]


@pytest.mark.parametrize("documents, vocab_size, message", [
    ([[1.0, 2.5]], 4, "holds float64 values, not integer token ids"),
    ([[[1, 2], [3, 0]]], 4, r"has shape \[2, 2\]: each document is one sequence"),
    ([[2**31 - 1]], 2**31, r"vocab_size must be an int in \[1, 2\*\*31 - 1\]"),
    ([[2**31 + 5]], 2**31 - 1, "outside the vocabulary"),
    ([[1]], 4.0, "vocab_size must be an int"),
])
def test_ids_a_datastore_cannot_hold_are_refused(documents, vocab_size, message):
    with pytest.raises(ValueError, match=message):
        Datastore.build(documents, vocab_size)
