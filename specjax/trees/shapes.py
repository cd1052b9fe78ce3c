"""Token trees: the shape of a multi-branch proposal (SpecInfer, Medusa, EAGLE, Sequoia).

A proposal of N nodes per row is a tree in topological order: node i's parent is -1 (the
last committed token, the root) or an earlier node; siblings are in draw order. A linear
chain of K drafts is the tree with parents (-1, 0, 1, ..., K-2).

`TreeShape` is a static tree (the same for every row), built from a list of paths of child
ranks as Medusa and EAGLE-1 write them, or by `TreeShape.sequoia`. `DynamicTree` is the
budget of a tree that the drafter grows per row inside jit (EAGLE-2,
`specjax.trees.dynamic_trees`); its proposals carry their own `parents[B, N]`. The traced
helpers (`tree_depths`, `ancestor_mask`, `children_table`) work per row on
`parents[B, N]`, so both kinds use the same verification.
"""

from __future__ import annotations

import dataclasses
import heapq

import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import Bool, Int


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """A static tree of N nodes (frozen, hashable: a static jit argument).

    parents: parent index of each node, -1 for a child of the root; a parent always comes
      before its children. ranks: each node's position among its parent's children (its
      draw order: rank r is the (r+1)-th child drawn or the (r+1)-th most probable).
    """

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    def __post_init__(self):
        if len(self.parents) != len(self.ranks) or not self.parents:
            raise ValueError("a tree needs at least one node, and one rank per node")
        seen: dict[int, list[int]] = {}
        for node, (parent, rank) in enumerate(zip(self.parents, self.ranks, strict=True)):
            if not -1 <= parent < node:
                raise ValueError(f"node {node} has parent {parent}: parents must be -1 (the "
                                 "root) or an earlier node (topological order)")
            siblings = seen.setdefault(parent, [])
            if rank != len(siblings):
                raise ValueError(f"node {node} has rank {rank} but is child number "
                                 f"{len(siblings)} of its parent: list siblings in rank order")
            siblings.append(node)

    @classmethod
    def chain(cls, num_draft_tokens: int) -> TreeShape:
        """K drafts in a line (the classic speculative decoding proposal)."""
        if num_draft_tokens < 1:
            raise ValueError(f"a chain needs num_draft_tokens >= 1, got {num_draft_tokens}")
        return cls(tuple(range(-1, num_draft_tokens - 1)), (0,) * num_draft_tokens)

    @classmethod
    def from_paths(cls, paths) -> TreeShape:
        """A tree from paths of child ranks, e.g. `[[0], [1], [0, 0], [0, 1], [1, 0]]`: the
        top two children of the root, the top two under the first, the top one under the
        second. Missing prefixes are added (a path's ancestors are always in the tree).
        Nodes are ordered by depth, then by path, so parents precede children and
        siblings come in rank order."""
        cleaned = set()
        for path in paths:
            path = tuple(int(r) for r in path)
            if not path or min(path) < 0:
                raise ValueError(f"a path is a non-empty list of ranks >= 0, got {path}")
            for end in range(1, len(path) + 1):
                cleaned.add(path[:end])
        ordered = sorted(cleaned, key=lambda p: (len(p), p))
        index = {path: i for i, path in enumerate(ordered)}
        for path in ordered:  # ranks under one parent must be 0, 1, 2, ... without gaps
            if path[-1] > 0 and path[:-1] + (path[-1] - 1,) not in index:
                raise ValueError(f"path {list(path)} has rank {path[-1]} but its sibling of "
                                 f"rank {path[-1] - 1} is missing")
        parents = tuple(index[p[:-1]] if len(p) > 1 else -1 for p in ordered)
        return cls(parents, tuple(p[-1] for p in ordered))

    @classmethod
    def sequoia(cls, rank_acceptance, num_nodes: int, max_depth: int) -> TreeShape:
        """The tree of `num_nodes` nodes and depth <= `max_depth` with the largest expected
        accepted length when the draft's rank-r child of any node is the accepted one with
        probability `rank_acceptance[r]`, independently of the node (Sequoia, Chen et al.
        2024, whose dynamic program solves the same problem).

        Under that model a node is on the accepted path with the product of its ranks'
        probabilities along the path, and the expected accepted length is the sum over
        nodes. Adding nodes best-first (a node becomes a candidate once its parent and its
        previous sibling are in) is optimal because scores never grow from parent to child
        or from one sibling to the next; the vector is first made non-increasing (a
        running minimum), which the model assumes and which a measured vector may break
        by noise. Measure the vector with `specjax.analysis.measure_rank_acceptance`.
        """
        rank_p = np.minimum.accumulate(np.asarray(rank_acceptance, np.float64))
        if rank_p.ndim != 1 or not len(rank_p) or np.any((rank_p < 0) | (rank_p > 1)):
            raise ValueError(f"rank_acceptance must be probabilities in [0, 1], one per "
                             f"rank, got {rank_acceptance!r}")
        if num_nodes < 1 or max_depth < 1:
            raise ValueError(f"num_nodes and max_depth must be >= 1, got {num_nodes} and "
                             f"{max_depth}")
        chosen: list[tuple[int, ...]] = []
        # Entries: (-score, path, the parent's score); the heap pops the best score.
        frontier = [(-rank_p[0], (0,), 1.0)]
        while frontier and len(chosen) < num_nodes:
            negative, path, parent_score = heapq.heappop(frontier)
            chosen.append(path)
            score, rank = -negative, path[-1]
            if len(path) < max_depth:
                heapq.heappush(frontier, (-score * rank_p[0], path + (0,), score))
            if rank + 1 < len(rank_p):
                heapq.heappush(frontier, (-parent_score * rank_p[rank + 1],
                                          path[:-1] + (rank + 1,), parent_score))
        return cls.from_paths(chosen)

    def expected_accepted_length(self, rank_acceptance) -> float:
        """Expected accepted nodes per step under the rank model of `sequoia` (tau - 1)."""
        rank_p = np.asarray(rank_acceptance, np.float64)
        if self.max_branching > len(rank_p):
            raise ValueError(f"the tree has {self.max_branching} ranks but the vector only "
                             f"{len(rank_p)}")
        scores: list[float] = []
        for parent, rank in zip(self.parents, self.ranks, strict=True):
            scores.append((1.0 if parent < 0 else scores[parent]) * rank_p[rank])
        return float(sum(scores))

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node (children of the root have depth 1)."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return tuple(depths)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @property
    def max_branching(self) -> int:
        return max(self.ranks) + 1

    @property
    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, self.num_nodes - 1))

    @property
    def per_row(self) -> bool:
        """False: the config fixes the shape; proposals carry no parents."""
        return False

    def parents_array(self, batch: int) -> Int[Array, "B N"]:
        return jnp.broadcast_to(jnp.asarray(self.parents, jnp.int32), (batch, self.num_nodes))


def _positive_ints(settings, names) -> None:
    """Refuse a setting of a frozen dataclass that is not an int >= 1; store it as int."""
    for name in names:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{type(settings).__name__}.{name} must be an int >= 1, got "
                             f"{value!r}")
        object.__setattr__(settings, name, int(value))


def node_paths(tokens_N, parents_N, keep_N=None) -> list[tuple[int, ...]]:
    """Host-side: each kept node of one row's tree as its token path from the root (in
    node order; parents come first). For reading proposals in tests and benchmarks."""
    tokens_N, parents_N = np.asarray(tokens_N), np.asarray(parents_N)
    keep_N = np.ones(tokens_N.shape, bool) if keep_N is None else np.asarray(keep_N)
    paths: dict[int, tuple[int, ...]] = {}
    for node in range(tokens_N.shape[0]):
        if keep_N[node]:
            parent = int(parents_N[node])
            paths[node] = (() if parent < 0 else paths[parent]) + (int(tokens_N[node]),)
    return list(paths.values())


class _TreesPerRow:
    """What a budget whose trees differ per row (`DynamicTree`, `TreeBudget`) tells the
    step: no chain, and each proposal carries its own `parents`."""

    @property
    def is_chain(self) -> bool:
        return False

    @property
    def per_row(self) -> bool:
        """True: every row has its own tree, in `Proposal.parents`."""
        return True


@dataclasses.dataclass(frozen=True)
class DynamicTree(_TreesPerRow):
    """The budget of an EAGLE-2 dynamic tree (Li et al. 2024), grown per row inside jit.

    The drafter expands, at each depth, the `top_k` nodes with the highest cumulative draft
    log-probability into their `top_k` most probable children, down to `max_depth`; then
    it reranks every drafted node by that score and keeps the best `num_nodes` (an
    ancestor-closed set: a child never scores above its parent). Every row gets its own
    tree, so `Proposal.parents` carries it. Children are the draft's top-k (deterministic):
    the selection looks at the drafted tokens' scores, which a sampled draw could not
    survive exactly, and deterministic children are exact at every temperature.
    """

    num_nodes: int
    max_depth: int
    top_k: int

    def __post_init__(self):
        _positive_ints(self, ("num_nodes", "max_depth", "top_k"))
        if self.num_nodes > self.pool_size:
            raise ValueError(
                f"DynamicTree(num_nodes={self.num_nodes}) exceeds the {self.pool_size} nodes "
                f"that max_depth={self.max_depth} and top_k={self.top_k} draft (top_k + "
                "(max_depth - 1) * top_k**2); lower num_nodes or raise max_depth / top_k")

    @property
    def pool_size(self) -> int:
        """Nodes drafted before the rerank: top_k at depth 1, top_k**2 at each later depth."""
        return self.top_k + (self.max_depth - 1) * self.top_k ** 2

    @property
    def max_branching(self) -> int:
        return self.top_k


@dataclasses.dataclass(frozen=True)
class TreeBudget(_TreesPerRow):
    """The static bounds of a tree that a drafter builds per row by its own rule (a
    retrieval trie, the lookahead window with its candidate n-grams): `num_nodes` nodes,
    accepted paths of at most `max_depth` nodes, at most `max_branching` children per
    node. Proposals carry their parents, as for a `DynamicTree`. Such a drafter names its
    budget (`drafter.proposal_tree`), which decoding takes when no tree is given.
    Nodes may be deeper than `max_depth` when they are marked `never_accept` (the
    lookahead window): the walk never goes there."""

    num_nodes: int
    max_depth: int
    max_branching: int

    def __post_init__(self):
        _positive_ints(self, ("num_nodes", "max_depth", "max_branching"))
        if self.max_depth > self.num_nodes:
            raise ValueError(f"TreeBudget(max_depth={self.max_depth}) exceeds its "
                             f"num_nodes={self.num_nodes}: a path of d nodes needs d nodes")


def tree_depths(parents_BN: Int[Array, "B N"]) -> Int[Array, "B N"]:
    """Depth of every node per row (children of the root: 1), for topologically ordered
    parents. N passes over [B, N]: trees are small (tens of nodes)."""
    num_nodes = parents_BN.shape[1]
    depths_BN = jnp.ones(parents_BN.shape, jnp.int32)
    for _ in range(num_nodes - 1):  # static; depth can grow by one per pass
        parent_depth_BN = jnp.take_along_axis(depths_BN, jnp.maximum(parents_BN, 0), axis=1)
        depths_BN = jnp.where(parents_BN < 0, 1, parent_depth_BN + 1)
    return depths_BN


def ancestor_mask(parents_BN: Int[Array, "B N"]) -> Bool[Array, "B N+1 N+1"]:
    """`mask[b, t, s]`: may token t of the verify input attend to token s? The input is the
    root (the last committed token, index 0) then the N nodes (index i + 1); a token sees
    itself and its ancestors, the root included. For a chain this is the causal mask."""
    batch, num_nodes = parents_BN.shape
    # Parent of each input index (the root's parent is itself).
    parent_B1N = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), parents_BN + 1], axis=1)
    size = num_nodes + 1
    mask_BTS = jnp.broadcast_to(jnp.eye(size, dtype=bool), (batch, size, size))
    ancestor_BT = jnp.broadcast_to(jnp.arange(size, dtype=jnp.int32), (batch, size))
    for _ in range(num_nodes):  # walk up one level per pass; static
        ancestor_BT = jnp.take_along_axis(parent_B1N, ancestor_BT, axis=1)
        mask_BTS = mask_BTS | (jnp.arange(size)[None, None, :] == ancestor_BT[:, :, None])
    return mask_BTS


def children_table(parents_BN: Int[Array, "B N"], max_branching: int) -> Int[Array, "B N+1 M"]:
    """`children[b, n, r]`: the node index of the child of rank r (draw order) of node n - 1
    (n = 0 is the root), or -1. Ranks are the nodes' order among siblings."""
    batch, num_nodes = parents_BN.shape
    node_N = jnp.arange(num_nodes)
    same_parent_BNN = parents_BN[:, :, None] == parents_BN[:, None, :]
    earlier_NN = node_N[None, :] < node_N[:, None]
    rank_BN = jnp.sum(same_parent_BNN & earlier_NN[None], axis=2).astype(jnp.int32)
    table = jnp.full((batch, num_nodes + 1, max_branching), -1, jnp.int32)
    rows_BN = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, num_nodes))
    # Ranks past max_branching would be dropped (out of bounds): callers size the table
    # with the tree's own max_branching.
    return table.at[rows_BN, parents_BN + 1, rank_BN].set(
        jnp.broadcast_to(node_N.astype(jnp.int32), (batch, num_nodes)), mode="drop")
