"""Token trees, the shape of a multi-branch proposal: static shapes and budgets
(`shapes`: `TreeShape`, `TreeBudget`, `DynamicTree`, masks and depths), EAGLE-2's dynamic
trees grown per row inside jit (`dynamic_trees`), and candidate continuations merged into
a trie (`tries`). The package's attributes are `shapes`' public names
(`specjax.trees.TreeShape`, ...)."""

from __future__ import annotations

from specjax.runtime.lazy import lazy_attributes

# Public name -> the module that defines it; any other name loads as a submodule.
_SOURCES = {
    "TreeShape": "specjax.trees.shapes",
    "node_paths": "specjax.trees.shapes",
    "DynamicTree": "specjax.trees.shapes",
    "TreeBudget": "specjax.trees.shapes",
    "tree_depths": "specjax.trees.shapes",
    "ancestor_mask": "specjax.trees.shapes",
    "children_table": "specjax.trees.shapes",
}

__getattr__, __dir__ = lazy_attributes(__name__, _SOURCES, globals())
