"""specjax.verification.tree_acceptance: the tree walk is exact for sampled (with and without
replacement) and deterministic children, and follows the argmax when greedy.

The target and the draft are bigram tables, so the target distribution at every node is
known exactly. Each row draws its own tree from the draft, the walk emits its accepted
path and the next token, and the row is completed to 3 tokens by exact sampling from the
target. The joint of those 3 tokens must be the target's (chi-square, 40,000 rows in one
call), and a deliberately wrong rule must fail the same test.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.testing import chi_square_pvalue
from specjax.trees.shapes import TreeShape
from specjax.verification import tree_acceptance

# Jitted, as a decoder runs them: called eagerly, each of their operations would compile
# a program of its own (hundreds per module, most of its time).
WALK = ("max_depth", "max_branching")
accept_tree_greedy = jax.jit(tree_acceptance.accept_tree_greedy, static_argnames=WALK)
accept_tree_sampled = jax.jit(tree_acceptance.accept_tree_sampled, static_argnames=WALK)

VOCAB, ROWS, ROOT = 5, 40_000, 1
RNG = np.random.default_rng(0)
TARGET = RNG.normal(size=(VOCAB, VOCAB)) * 1.2
DRAFT = TARGET + RNG.normal(size=(VOCAB, VOCAB)) * 0.8
TREE = TreeShape.from_paths([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]])


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def draw(probs_RV, rng):
    """One token per row from explicit probabilities (inverse CDF)."""
    cdf = np.cumsum(probs_RV, axis=1)
    u = rng.random((probs_RV.shape[0], 1)) * cdf[:, -1:]
    return np.minimum((u > cdf).sum(axis=1), probs_RV.shape[1] - 1)


def draw_trees(kind, rng):
    """tokens [R, N] and the q each node was drawn from [R, N, V] (None: deterministic)."""
    tokens = np.zeros((ROWS, TREE.num_nodes), np.int64)
    qs = np.zeros((ROWS, TREE.num_nodes, VOCAB))
    rows = np.arange(ROWS)
    for node, (parent, rank) in enumerate(zip(TREE.parents, TREE.ranks, strict=True)):
        parent_token = np.full(ROWS, ROOT) if parent < 0 else tokens[:, parent]
        q = softmax(DRAFT[parent_token])
        if kind == "deterministic":  # the draft's rank-th most probable token
            tokens[:, node] = np.argsort(-q, axis=1, kind="stable")[:, rank]
            continue
        if kind == "without replacement":
            earlier = [n for n in range(node) if TREE.parents[n] == parent]
            for sibling in earlier:
                q[rows, tokens[:, sibling]] = 0.0
            q /= q.sum(axis=1, keepdims=True)
        qs[:, node] = q
        tokens[:, node] = draw(q, rng)
    return tokens, (None if kind == "deterministic" else qs)


def target_p(tokens):
    """[R, N+1, V]: the target distribution at the root and at every node."""
    root = np.broadcast_to(softmax(TARGET[ROOT]), (ROWS, 1, VOCAB))
    return np.concatenate([root, softmax(TARGET[tokens])], axis=1)


def complete(emitted, rng, length=3):
    """Extend each row to `length` tokens by exact sampling from the target."""
    out = np.zeros((ROWS, length), np.int64)
    for j in range(length):
        have = np.array([len(e) > j for e in emitted])
        fixed = np.array([e[j] if len(e) > j else 0 for e in emitted])
        previous = np.full(ROWS, ROOT) if j == 0 else out[:, j - 1]
        out[:, j] = np.where(have, fixed, draw(softmax(TARGET[previous]), rng))
    return out


def target_joint(length=3):
    joint = np.zeros((VOCAB,) * length)
    for seq in itertools.product(range(VOCAB), repeat=length):
        prob, previous = 1.0, ROOT
        for token in seq:
            prob *= softmax(TARGET[previous])[token]
            previous = token
        joint[seq] = prob
    return joint


def walk(tokens, qs, seed, q_passed="as drawn"):
    q = None if qs is None else jnp.asarray(qs, jnp.float32)
    if q_passed == "uniform":
        q = jnp.full(q.shape, 1.0 / VOCAB, jnp.float32)
    out = accept_tree_sampled(
        jax.random.key(seed), jax.random.key(seed + 1), jnp.asarray(tokens, jnp.int32),
        TREE.parents_array(ROWS), jnp.asarray(target_p(tokens), jnp.float32), q,
        max_depth=TREE.max_depth, max_branching=TREE.max_branching)
    path, count, nxt = (np.asarray(x) for x in (out.path, out.num_accepted, out.next_token))
    return [list(tokens[r, path[r, : count[r]]]) + [int(nxt[r])] for r in range(ROWS)], count


@pytest.mark.parametrize("kind", ["with replacement", "without replacement", "deterministic"])
def test_the_walk_is_exact(kind):
    rng = np.random.default_rng({"with replacement": 1, "without replacement": 2,
                                 "deterministic": 3}[kind])
    tokens, qs = draw_trees(kind, rng)
    emitted, depth = walk(tokens, qs, seed=10)
    pvalue = chi_square_pvalue(complete(emitted, rng), target_joint())
    assert pvalue > 1e-3, pvalue
    assert 0 < depth.mean() < TREE.max_depth and (depth == TREE.max_depth).any()


def test_a_wrong_rule_fails_the_same_test():
    """Sampled drafts verified with the wrong q (uniform instead of the draft's). (The
    deterministic rule would not do: accepting x with p(x), else drawing from p without
    x, is exact whatever chose x, only less often accepted.)"""
    rng = np.random.default_rng(4)
    tokens, qs = draw_trees("with replacement", rng)
    emitted, _ = walk(tokens, qs, seed=20, q_passed="uniform")
    assert chi_square_pvalue(complete(emitted, rng), target_joint()) < 1e-6


def test_never_accepted_nodes_are_skipped_and_change_nothing():
    rng = np.random.default_rng(5)
    tokens, qs = draw_trees("with replacement", rng)
    skip = np.zeros((ROWS, TREE.num_nodes), bool)
    skip[:, 0] = True  # the first child of the root is only evaluated
    out = accept_tree_sampled(
        jax.random.key(30), jax.random.key(31), jnp.asarray(tokens, jnp.int32),
        TREE.parents_array(ROWS), jnp.asarray(target_p(tokens), jnp.float32),
        jnp.asarray(qs, jnp.float32), max_depth=TREE.max_depth,
        max_branching=TREE.max_branching, never_accept_BN=jnp.asarray(skip))
    path, count, nxt = (np.asarray(x) for x in (out.path, out.num_accepted, out.next_token))
    assert not np.isin(path, [0, 3, 4, 6, 7]).any()  # node 0 and its subtree unreachable
    emitted = [list(tokens[r, path[r, : count[r]]]) + [int(nxt[r])] for r in range(ROWS)]
    assert chi_square_pvalue(complete(emitted, rng), target_joint()) > 1e-3


def reference_greedy(tokens, logits):
    node, path = 0, []
    while True:
        best = int(np.argmax(logits[node]))
        children = [n for n, parent in enumerate(TREE.parents) if parent == node - 1]
        match = next((c for c in children if tokens[c] == best), None)
        if match is None:
            return path, best
        path.append(match)
        node = match + 1


def test_greedy_follows_the_target_argmax():
    rng = np.random.default_rng(6)
    batch = 64
    tokens = rng.integers(0, 3, size=(batch, TREE.num_nodes))  # repeats make matches common
    logits = rng.normal(size=(batch, TREE.num_nodes + 1, 3))
    out = accept_tree_greedy(jnp.asarray(tokens, jnp.int32), TREE.parents_array(batch),
                             jnp.asarray(logits, jnp.float32), max_depth=TREE.max_depth,
                             max_branching=TREE.max_branching)
    depths = []
    paths, counts, nexts = (np.asarray(x) for x in (out.path, out.num_accepted, out.next_token))
    for b in range(batch):
        path, best = reference_greedy(tokens[b], logits[b])
        count = int(counts[b])
        assert paths[b, :count].tolist() == path and int(nexts[b]) == best
        depths.append(count)
    assert max(depths) >= 2 and min(depths) == 0


def test_a_chain_walks_exactly_as_the_linear_rule():
    """On a chain the walk makes the very same decisions as `accept_sampled` with the same
    keys (one uniform per position, one correction draw per row)."""
    from specjax.verification.rejection import accept_sampled

    rng = np.random.default_rng(7)
    batch, k = 256, 4
    chain = TreeShape.chain(k)
    p = jnp.asarray(softmax(rng.normal(size=(batch, k + 1, VOCAB))), jnp.float32)
    q = jnp.asarray(softmax(rng.normal(size=(batch, k, VOCAB))), jnp.float32)
    tokens = jnp.asarray(draw(np.asarray(q).reshape(-1, VOCAB), rng).reshape(batch, k),
                         jnp.int32)
    keys = jax.random.key(40), jax.random.key(41)
    linear = accept_sampled(*keys, tokens, q, p)
    tree = accept_tree_sampled(*keys, tokens, chain.parents_array(batch), p, q,
                               max_depth=k, max_branching=1)
    np.testing.assert_array_equal(tree.num_accepted, linear.num_accepted)
    np.testing.assert_array_equal(tree.next_token, linear.next_token)
    assert 0 < float(np.mean(np.asarray(linear.num_accepted))) < k
