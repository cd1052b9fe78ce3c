"""specjax.trees.tries: candidate sequences merged into a trie, against a trie built in Python."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from specjax.trees.tries import merge_into_trie


def _merge(rows, num_nodes, **kwargs):
    """rows: per row, a list of candidate token lists (the longest sets L)."""
    width = max(len(c) for row in rows for c in row) if any(rows) else 1
    count = max(len(row) for row in rows)
    sequences = np.zeros((len(rows), count, width), np.int32)
    lengths = np.zeros((len(rows), count), np.int32)
    for b, row in enumerate(rows):
        for c, candidate in enumerate(row):
            sequences[b, c, :len(candidate)] = candidate
            lengths[b, c] = len(candidate)
    kwargs = {k: (jnp.asarray(v, jnp.int32) if k.endswith("_B") else v)
              for k, v in kwargs.items()}
    trie = jax.jit(lambda s, n: merge_into_trie(s, n, num_nodes, **kwargs))(
        jnp.asarray(sequences), jnp.asarray(lengths))
    return jax.tree.map(np.asarray, trie)


def _paths(trie, row):
    """Each real node as its token path from the root, with its count."""
    paths = {}
    for node in range(trie.tokens.shape[1]):
        if not trie.real[row, node]:
            continue
        parent = trie.parents[row, node]
        assert parent < node  # topological order
        prefix = () if parent < 0 else paths[parent][0]
        paths[node] = (prefix + (int(trie.tokens[row, node]),), int(trie.counts[row, node]))
    return list(paths.values())


def _reference(candidates):
    """{prefix: number of candidates that start with it}: the trie, built in Python."""
    counts = {}
    for candidate in candidates:
        for end in range(1, len(candidate) + 1):
            counts[tuple(candidate[:end])] = counts.get(tuple(candidate[:end]), 0) + 1
    return counts


def test_every_distinct_prefix_is_one_node_with_its_count():
    rows = [[[3, 4, 5], [3, 4, 6], [3, 7], [8]],
            [[1, 1, 1], [1, 1, 1], [], [2, 1]],
            [[], [], [], []]]
    trie = _merge(rows, 12)
    for b, candidates in enumerate(rows):
        got = dict(_paths(trie, b))
        assert got == _reference(candidates)
        assert trie.real[b].tolist() == sorted(trie.real[b].tolist(), reverse=True)  # real first
    # Most frequent first, then shallower: 3 (x3), then 3 4 (x2), then the singles.
    assert [p for p, _ in _paths(trie, 0)][:2] == [(3,), (3, 4)]


def test_siblings_are_distinct_and_in_decreasing_frequency():
    rows = [[[5, 1], [6, 1], [6, 2], [6, 2], [5, 3], [6, 2]]]
    trie = _merge(rows, 8)
    paths = _paths(trie, 0)
    children = {}
    for path, count in paths:
        children.setdefault(path[:-1], []).append((path[-1], count))
    for siblings in children.values():
        tokens = [t for t, _ in siblings]
        assert len(tokens) == len(set(tokens))
        counts = [c for _, c in siblings]
        assert counts == sorted(counts, reverse=True)
    assert children[()] == [(6, 4), (5, 2)]


def test_budget_threshold_and_branching_keep_the_best_ancestor_closed_set():
    rng = np.random.default_rng(0)
    rows = [[rng.integers(0, 3, rng.integers(1, 5)).tolist() for _ in range(8)]
            for _ in range(5)]
    for num_nodes, min_count, max_nodes, branching in itertools.product(
            (3, 9), (1, 2), (None, 4), (None, 1, 2)):
        extra = {"min_count_B": [min_count] * 5}
        if max_nodes is not None:
            extra["max_nodes_B"] = [max_nodes] * 5
        trie = _merge(rows, num_nodes, max_branching=branching, **extra)
        for b, candidates in enumerate(rows):
            reference = _reference(candidates)
            got = _paths(trie, b)  # parents resolve, so the set is ancestor-closed
            for path, count in got:
                assert reference[path] == count >= min_count
            if branching is not None:
                per_parent = {}
                for path, _ in got:
                    per_parent[path[:-1]] = per_parent.get(path[:-1], 0) + 1
                assert max(per_parent.values(), default=0) <= branching
            limit = min(num_nodes, max_nodes or num_nodes)
            assert len(got) <= limit
            if branching is None:  # without a branching cut, the best `limit` by count
                eligible = sorted((c for c in reference.values() if c >= min_count),
                                  reverse=True)
                assert sorted((c for _, c in got), reverse=True) == eligible[:limit]
