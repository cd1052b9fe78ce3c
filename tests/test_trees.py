"""specjax.trees: static tree shapes from paths, Sequoia-optimal trees, and the traced
per-row helpers."""

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

from specjax.trees.shapes import TreeShape, ancestor_mask, children_table, tree_depths

MEDUSA_LIKE = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def test_paths_become_a_topological_tree_in_rank_order():
    tree = TreeShape.from_paths(MEDUSA_LIKE)
    assert tree.parents == (-1, -1, -1, 0, 0, 1, 3)
    assert tree.ranks == (0, 1, 2, 0, 1, 0, 0)
    assert tree.depths == (1, 1, 1, 2, 2, 2, 3)
    assert (tree.num_nodes, tree.max_depth, tree.max_branching) == (7, 3, 3)
    assert TreeShape.from_paths([[0, 0, 0]]) == TreeShape.chain(3)  # prefixes are implied
    assert TreeShape.chain(4).is_chain and not tree.is_chain


@pytest.mark.parametrize("paths, message", [
    ([[0], [2]], "sibling of rank 1 is missing"),
    ([[]], "non-empty list of ranks"),
    ([[-1]], "non-empty list of ranks"),
])
def test_bad_paths_are_refused(paths, message):
    with pytest.raises(ValueError, match=message):
        TreeShape.from_paths(paths)


def test_bad_parents_are_refused():
    with pytest.raises(ValueError, match="topological order"):
        TreeShape((1, -1), (0, 0))
    with pytest.raises(ValueError, match="siblings in rank order"):
        TreeShape((-1, -1), (1, 0))


def test_traced_helpers_agree_with_the_static_shape():
    tree = TreeShape.from_paths(MEDUSA_LIKE)
    parents = tree.parents_array(2)
    np.testing.assert_array_equal(tree_depths(parents)[0], tree.depths)
    children = np.asarray(children_table(parents, tree.max_branching))[0]
    assert children[0].tolist() == [0, 1, 2]        # the root's children
    assert children[1].tolist() == [3, 4, -1]       # node 0's
    assert children[2].tolist() == [5, -1, -1]
    assert children[4].tolist() == [6, -1, -1]
    assert children[7].tolist() == [-1, -1, -1]     # node 6 is a leaf
    mask = np.asarray(ancestor_mask(parents))[0]
    # Input 7 is node 6: it sees the root, nodes 0 and 3, and itself.
    assert np.nonzero(mask[7])[0].tolist() == [0, 1, 4, 7]
    assert np.nonzero(mask[2])[0].tolist() == [0, 2]  # node 1: root and itself


def test_a_chain_gets_the_causal_mask():
    parents = TreeShape.chain(4).parents_array(1)
    np.testing.assert_array_equal(ancestor_mask(parents)[0], np.tril(np.ones((5, 5), bool)))


def test_rows_may_hold_different_trees():
    parents = jnp.asarray([[-1, 0, 1], [-1, -1, 0]], jnp.int32)
    np.testing.assert_array_equal(tree_depths(parents), [[1, 2, 3], [1, 1, 2]])
    assert np.asarray(children_table(parents, 2))[1, 0].tolist() == [0, 1]


def _closed_trees(num_nodes, max_depth, ranks):
    """Every tree of `num_nodes` nodes closed under parents and earlier siblings."""
    universe = [p for d in range(1, max_depth + 1)
                for p in itertools.product(range(ranks), repeat=d)]
    for subset in itertools.combinations(universe, num_nodes):
        chosen = set(subset)
        if all((len(p) == 1 or p[:-1] in chosen) and (p[-1] == 0 or p[:-1] + (p[-1] - 1,)
                                                          in chosen) for p in chosen):
            yield TreeShape.from_paths(subset)


@pytest.mark.parametrize("rank_p", [[0.5, 0.3, 0.1], [0.8, 0.1, 0.05], [0.3, 0.3, 0.2]])
def test_the_sequoia_tree_is_optimal_under_its_model(rank_p):
    best = max(tree.expected_accepted_length(rank_p) for tree in _closed_trees(5, 3, 3))
    tree = TreeShape.sequoia(rank_p, num_nodes=5, max_depth=3)
    assert tree.num_nodes == 5 and tree.max_depth <= 3
    assert tree.expected_accepted_length(rank_p) == pytest.approx(best)


def test_sequoia_degenerates_to_a_chain_and_matches_the_chain_formula():
    assert TreeShape.sequoia([1.0, 0.0, 0.0], num_nodes=4, max_depth=6) == TreeShape.chain(4)
    a = 0.7
    expected = sum(a**j for j in range(1, 5))  # tau - 1 of the i.i.d. chain formula
    assert TreeShape.chain(4).expected_accepted_length([a]) == pytest.approx(expected)
    small = TreeShape.sequoia([0.5, 0.3, 0.1], num_nodes=3, max_depth=4)
    assert small == TreeShape.from_paths([[0], [1], [0, 0]])
    with pytest.raises(ValueError, match="probabilities in"):
        TreeShape.sequoia([1.5], num_nodes=3, max_depth=2)
