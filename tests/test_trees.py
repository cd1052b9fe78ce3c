"""specjax.trees: static tree shapes from paths, and the traced per-row helpers."""

import jax.numpy as jnp
import numpy as np
import pytest

from specjax.trees import TreeShape, ancestor_mask, children_table, tree_depths

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
