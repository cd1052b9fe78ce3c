"""A retrieval datastore (REST, He et al. 2023): token ids and their suffix array.

Built on the host with numpy from tokenised documents; searched inside jit. The token
stream holds every document followed by a separator (-1), then padding up to a power of
two (`PADDING`, larger than any id, so padded suffixes sort last): a datastore that grows
between calls (`Datastore.add`, SuffixDecoding's store of earlier answers) keeps its
shapes, and so its compiled decoder, until it doubles.

Search (`longest_match`): for every query length m up to a static Q at once, two binary
searches over the suffix array find the range of suffixes that start with the row's last
m tokens; the longest m with a non-empty range wins. `continuations` then reads up to C
occurrences spread evenly over that range (the suffix array sorts them by what follows,
so even spacing samples continuations in proportion to their frequency) and the D tokens
after each, cut at a separator.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import Int

from specjax.runtime.files import damaged, load_npz, save_npz_atomically

SEPARATOR = -1
PADDING = np.iinfo(np.int32).max
FORMAT_VERSION = 1
REBUILD = "rebuild it (specjax datastore build ...)"


def suffix_array(tokens: np.ndarray) -> np.ndarray:
    """int32 [T]: the start of every suffix of `tokens` in lexicographic order (a shorter
    suffix before its extensions), by prefix doubling: O(T log^2 T) with numpy sorts."""
    tokens = np.asarray(tokens, np.int64)
    size = tokens.shape[0]
    if size == 0:
        return np.zeros((0,), np.int32)
    rank = np.unique(tokens, return_inverse=True)[1].astype(np.int64)
    order = np.argsort(rank, kind="stable")
    step = 1
    while True:
        following = np.full(size, -1, np.int64)
        following[:size - step] = rank[step:] if step < size else following[:0]
        key = rank * (size + 1) + following + 1
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        new_rank = np.empty(size, np.int64)
        new_rank[order] = np.concatenate([[0], np.cumsum(sorted_key[1:] != sorted_key[:-1])])
        rank = new_rank
        if rank[order[-1]] == size - 1 or step >= size:
            return order.astype(np.int32)
        step *= 2


def _capacity(size: int) -> int:
    """Slots for `size` tokens: a power of two >= 1024, with room for one padding slot."""
    return max(1024, 1 << math.ceil(math.log2(size + 1)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Datastore:
    """tokens int32 [T] (documents, each followed by SEPARATOR, then PADDING) and
    suffix_array int32 [T]; vocab_size (static) is the tokenizer's vocabulary the ids
    belong to. Build with `Datastore.build`, grow with `add`, keep with `save` / `load`."""

    tokens: Int[Array, " T"]
    suffix_array: Int[Array, " T"]
    vocab_size: int = dataclasses.field(metadata={"static": True})

    @classmethod
    def build(cls, documents: Iterable[Sequence[int]], vocab_size: int) -> Datastore:
        """The datastore of `documents` (each a sequence of token ids in [0, vocab_size))."""
        if (isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer))
                or not 1 <= vocab_size <= PADDING):
            raise ValueError(f"vocab_size must be an int in [1, 2**31 - 1] (the stream is "
                             f"int32, its padding 2**31 - 1), got {vocab_size!r}")
        vocab_size = int(vocab_size)
        pieces = []
        for index, document in enumerate(documents):
            ids = np.asarray(document)
            if ids.ndim != 1:
                raise ValueError(f"document {index} has shape {list(ids.shape)}: each document "
                                 "is one sequence of token ids (a list or a 1-D array)")
            if ids.size and not np.issubdtype(ids.dtype, np.integer):
                raise ValueError(f"document {index} holds {ids.dtype} values, not integer "
                                 "token ids (convert them with np.asarray(ids, np.int64) if "
                                 "they are whole numbers)")
            ids = ids.astype(np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
                raise ValueError(f"document {index} holds token ids in [{ids.min()}, "
                                 f"{ids.max()}], outside the vocabulary [0, {vocab_size})")
            if ids.size:
                pieces.append(np.append(ids, SEPARATOR))
        stream = np.concatenate(pieces) if pieces else np.zeros((0,), np.int64)
        return cls._from_stream(stream.astype(np.int32), vocab_size)

    @classmethod
    def _from_stream(cls, stream: np.ndarray, vocab_size: int,
                     order: np.ndarray | None = None) -> Datastore:
        capacity = _capacity(stream.shape[0])
        tokens = np.full((capacity,), PADDING, np.int32)
        tokens[:stream.shape[0]] = stream
        order = suffix_array(tokens) if order is None else order
        return cls(jnp.asarray(tokens), jnp.asarray(order, jnp.int32), vocab_size)

    @property
    def stream(self) -> np.ndarray:
        """The documents and their separators, without the padding (host numpy)."""
        tokens = np.asarray(self.tokens)
        return tokens[:int(np.sum(tokens != PADDING))]

    @property
    def num_tokens(self) -> int:
        """Token ids held (separators and padding not counted)."""
        return int(np.sum(self.stream >= 0))

    @property
    def num_documents(self) -> int:
        return int(np.sum(self.stream == SEPARATOR))

    def documents(self) -> list[np.ndarray]:
        """The documents held, in order (host numpy int32 arrays): `build`'s input back."""
        stream = self.stream
        ends = np.flatnonzero(stream == SEPARATOR)
        starts = np.concatenate([[0], ends + 1])[:ends.size].astype(int)
        return [stream[start:end] for start, end in zip(starts, ends, strict=True)]

    def add(self, documents: Iterable[Sequence[int]]) -> Datastore:
        """A datastore that also holds `documents` (e.g. the answers just generated)."""
        more = Datastore.build(documents, self.vocab_size).stream
        return Datastore._from_stream(np.concatenate([self.stream, more]), self.vocab_size)

    def save(self, path: str | os.PathLike) -> None:
        """One `.npz` file (written atomically): the stream, its suffix array, the
        vocabulary size and the format version."""
        stream = self.stream
        order = np.asarray(self.suffix_array)
        save_npz_atomically(path, stream=stream, suffix_array=order[order < stream.shape[0]],
                            vocab_size=np.int64(self.vocab_size),
                            format_version=np.int64(FORMAT_VERSION))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Datastore:
        """The datastore `save` wrote; a damaged or foreign file is refused by name."""
        arrays = load_npz(path, REBUILD)
        expected = {"stream", "suffix_array", "vocab_size", "format_version"}
        if set(arrays) != expected:
            raise damaged(path, f"holds {sorted(arrays)}, not a specjax datastore "
                          f"({sorted(expected)})", REBUILD)
        version = int(arrays["format_version"])
        if version != FORMAT_VERSION:
            raise damaged(path, f"is datastore format {version}; this specjax reads format "
                          f"{FORMAT_VERSION}", REBUILD)
        stream, order = arrays["stream"], arrays["suffix_array"]
        vocab_size = int(arrays["vocab_size"])
        if (stream.ndim != 1 or order.shape != stream.shape
                or not np.issubdtype(stream.dtype, np.integer)
                or not np.issubdtype(order.dtype, np.integer)):
            raise damaged(path, f"has a stream {stream.dtype}{list(stream.shape)} and a "
                          f"suffix array {order.dtype}{list(order.shape)}; expected two "
                          "integer arrays of one length", REBUILD)
        if stream.size and (stream.min() < SEPARATOR or stream.max() >= vocab_size):
            raise damaged(path, f"holds ids in [{stream.min()}, {stream.max()}], outside "
                          f"its vocabulary [0, {vocab_size})", REBUILD)
        if order.size and (order.min() < 0 or order.max() >= order.size
                           or np.bincount(order, minlength=order.size).max() != 1):
            raise damaged(path, "has a suffix array that is not a permutation of its "
                          "positions", REBUILD)
        capacity = _capacity(stream.shape[0])
        # Padding suffixes sort after every real one, the shortest (the last slot) first.
        padded = np.concatenate([order.astype(np.int32),
                                 np.arange(capacity - 1, stream.shape[0] - 1, -1, np.int32)])
        return cls._from_stream(stream.astype(np.int32), vocab_size, padded)


def _compare(datastore: Datastore, starts: Array, query: Array, length: Array) -> Array:
    """-1, 0 or 1 per entry: the first `length` tokens of the suffix at `starts` against
    `query[..., :length]` (`query` [..., Q])."""
    size = datastore.tokens.shape[0]
    offsets = jnp.arange(query.shape[-1], dtype=jnp.int32).reshape(
        (1,) * starts.ndim + (query.shape[-1],))
    index = starts[..., None] + offsets
    tokens = jnp.where(index < size, datastore.tokens[jnp.minimum(index, size - 1)], PADDING)
    differ = (tokens != query) & (offsets < length[..., None])
    first = jnp.argmax(differ, axis=-1)
    ahead = jnp.take_along_axis(tokens, first[..., None], axis=-1)[..., 0]
    wanted = jnp.take_along_axis(query, first[..., None], axis=-1)[..., 0]
    return jnp.where(jnp.any(differ, axis=-1), jnp.where(ahead < wanted, -1, 1), 0)


def _bound(datastore: Datastore, query: Array, length: Array, upper: bool) -> Array:
    """The first suffix-array index whose suffix is >= (`upper`: >) the query prefix."""
    size = datastore.tokens.shape[0]
    low = jnp.zeros(length.shape, jnp.int32)
    high = jnp.full(length.shape, size, jnp.int32)
    for _ in range(max(1, math.ceil(math.log2(size + 1)))):  # static: a binary search
        middle = (low + high) // 2
        order = _compare(datastore, datastore.suffix_array[jnp.minimum(middle, size - 1)],
                         query, length)
        searching = low < high
        go_right = ((order <= 0) if upper else (order < 0)) & searching
        go_left = searching & ~go_right
        low, high = jnp.where(go_right, middle + 1, low), jnp.where(go_left, middle, high)
    return low


def longest_match(datastore: Datastore, sequence_BS: Array, lengths_B: Array,
                  max_query: int, min_match: int = 1):
    """`(start int32 [B], count int32 [B], match int32 [B])`: for each row, the longest
    suffix of its tokens (`sequence[b, :lengths[b]]`) of at most `max_query` and at least
    `min_match` tokens that the datastore holds; its occurrences are suffix-array entries
    [start, start + count). match = 0 (count 0) where none is found."""
    width_Q = jnp.arange(1, max_query + 1, dtype=jnp.int32)
    offsets_Q = jnp.arange(max_query, dtype=jnp.int32)
    # query[b, m - 1, i]: token i of the row's last m tokens.
    index_BQQ = lengths_B[:, None, None] - width_Q[None, :, None] + offsets_Q[None, None, :]
    query_BQQ = jnp.take_along_axis(
        sequence_BS, jnp.clip(index_BQQ, 0, sequence_BS.shape[1] - 1).reshape(
            lengths_B.shape[0], -1), axis=1).reshape(index_BQQ.shape)
    length_BQ = jnp.broadcast_to(width_Q[None], (lengths_B.shape[0], max_query))
    start_BQ = _bound(datastore, query_BQQ, length_BQ, upper=False)
    count_BQ = _bound(datastore, query_BQQ, length_BQ, upper=True) - start_BQ
    usable_BQ = ((count_BQ > 0) & (width_Q[None] <= lengths_B[:, None])
                 & (width_Q[None] >= min_match))
    match_B = jnp.max(jnp.where(usable_BQ, width_Q[None], 0), axis=1)
    pick_B = jnp.maximum(match_B - 1, 0)
    pick = lambda a_BQ: jnp.take_along_axis(a_BQ, pick_B[:, None], axis=1)[:, 0]
    count_B = jnp.where(match_B > 0, pick(count_BQ), 0)
    return pick(start_BQ), count_B.astype(jnp.int32), match_B.astype(jnp.int32)


def continuations(datastore: Datastore, start_B: Array, count_B: Array, match_B: Array,
                  num_samples: int, depth: int, vocab_size: int):
    """`(sequences int32 [B, C, D], lengths int32 [B, C])`: the D tokens after up to C
    occurrences of each row's match, spread evenly over its range (all of them when there
    are at most C), each cut at the end of its document (length 0: no sample)."""
    size = datastore.tokens.shape[0]
    sample_C = jnp.arange(num_samples, dtype=jnp.int32)
    taken_B = jnp.minimum(count_B, num_samples)
    # Even spacing, floor(c * count / taken), in int32 without overflow.
    taken_B1 = jnp.maximum(taken_B, 1)[:, None]
    whole_B1, rest_B1 = count_B[:, None] // taken_B1, count_B[:, None] % taken_B1
    spacing_BC = sample_C[None, :] * whole_B1 + (sample_C[None, :] * rest_B1) // taken_B1
    entry_BC = start_B[:, None] + spacing_BC
    entry_BC = jnp.clip(entry_BC, 0, size - 1)
    begin_BC = datastore.suffix_array[entry_BC] + match_B[:, None]
    index_BCD = begin_BC[:, :, None] + jnp.arange(depth, dtype=jnp.int32)[None, None, :]
    tokens_BCD = jnp.where(index_BCD < size, datastore.tokens[jnp.minimum(index_BCD, size - 1)],
                           PADDING)
    usable_BCD = (tokens_BCD >= 0) & (tokens_BCD < vocab_size)
    lengths_BC = jnp.sum(jnp.cumprod(usable_BCD.astype(jnp.int32), axis=2), axis=2)
    lengths_BC = jnp.where(sample_C[None, :] < taken_B[:, None], lengths_BC, 0)
    return jnp.where(usable_BCD, tokens_BCD, 0).astype(jnp.int32), lengths_BC.astype(jnp.int32)
