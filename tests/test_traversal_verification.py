"""Traversal verification: an independent float64 reference of the rule, its output
distribution enumerated exactly over every tree the draft can draw (it is the target's),
the traced `traverse` equal to the reference node by node, the sampled step chi-squared,
chains equal to block verification, greedy rows equal to the argmax walk, and never fewer
accepted tokens than the token rule in expectation.

Trees are small (vocabulary 3, up to 6 nodes) so that every draw is enumerated; target and
draft give a distribution for every prefix (a table filled on demand)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_block_verification import (
    VOCAB,
    add_continued,
    random_model,
    target_distribution,
    total_variation,
)

from specjax.testing import chi_square_pvalue
from specjax.trees.shapes import TreeShape
from specjax.verification import block_verification, traversal_verification, tree_acceptance

# Jitted, as a decoder runs them: called eagerly, each of their operations would compile
# a program of its own (hundreds per module, most of its time).
WALK = ("max_depth", "max_branching")
accept_block = jax.jit(block_verification.accept_block)
chain_distributions = jax.jit(block_verification.chain_distributions)
keep_probabilities = jax.jit(block_verification.keep_probabilities)
accept_traversal = jax.jit(traversal_verification.accept_traversal, static_argnames=WALK)
traverse = jax.jit(traversal_verification.traverse, static_argnames=WALK)
accept_tree_greedy = jax.jit(tree_acceptance.accept_tree_greedy, static_argnames=WALK)

SHAPES = {
    "wide": TreeShape.from_paths([[0], [1], [2], [0, 0], [1, 0]]),
    "deep": TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [0, 0, 0], [1, 0]]),
    "chain": TreeShape.chain(4),
}


def prefixes(shape: TreeShape, tokens: tuple) -> list:
    """The token path (root excluded) to each node."""
    out = []
    for node, parent in enumerate(shape.parents):
        out.append((() if parent < 0 else out[parent]) + (tokens[node],))
    return out


def node_q(shape: TreeShape, draft, tokens: tuple, node: int, kind: str) -> np.ndarray:
    """The distribution node `node` was drawn from, given the earlier draws."""
    parent = shape.parents[node]
    q = draft(() if parent < 0 else prefixes(shape, tokens)[parent]).copy()
    earlier = [n for n in range(node) if shape.parents[n] == parent]
    if kind == "deterministic":  # the rank-th most probable: one-hot
        return np.eye(VOCAB)[np.argsort(-q, kind="stable")[len(earlier)]]
    if kind == "without replacement":
        q[[tokens[n] for n in earlier]] = 0.0
        q /= q.sum()
    return q


def all_trees(shape: TreeShape, draft, kind: str):
    """Every tree the draft can draw, with its probability and each node's q."""
    for tokens in itertools.product(range(VOCAB), repeat=shape.num_nodes):
        qs = [node_q(shape, draft, tokens, n, kind) for n in range(shape.num_nodes)]
        probability = np.prod([qs[n][tokens[n]] for n in range(shape.num_nodes)])
        if probability > 0:
            yield tokens, probability, qs


def reference(shape: TreeShape, target, tokens: tuple, qs: list, skip=()):
    """The rule written directly, in float64: (weight, residual, turn) of every visited
    node, root = -1; a node in `skip` is left out with its subtree."""
    paths = prefixes(shape, tokens)
    out, turn = {}, [0]

    def visit(node: int, weight: float):
        r = target(() if node < 0 else paths[node]).copy()
        for child in [n for n, p in enumerate(shape.parents) if p == node and n not in skip]:
            x, q = tokens[child], qs[child]
            visit(child, min(1.0, weight * r[x] / q[x]) if q[x] > 0 else 0.0)
            # The subtree failed (after a subtree kept with certainty nothing here is
            # reached, and the update is made all the same).
            excess = np.maximum(weight * r - q, 0.0)
            mass = excess.sum()
            failure = mass + 1.0 - weight
            if mass > 0:
                r = excess / mass
            weight = mass / failure if failure > 0 else 1.0
        out[node] = (weight, r, turn[0])
        turn[0] += 1

    visit(-1, 1.0)
    return out


def stop_distribution(states: dict) -> dict:
    """P(the step stops at each node): kept at its turn, every earlier turn not kept."""
    out, not_yet = {}, 1.0
    for node, (weight, _, _) in sorted(states.items(), key=lambda item: item[1][2]):
        out[node] = not_yet * (1.0 if node < 0 else weight)
        not_yet *= 1.0 - (1.0 if node < 0 else weight)
    return out


def output_distribution(shape, target, draft, kind, states_of, length) -> dict:
    """P(the first `length` tokens after one step, continued by sampling the target)."""
    out = {}
    for tokens, probability, qs in all_trees(shape, draft, kind):
        states = states_of(tokens, qs)
        paths = prefixes(shape, tokens)
        for node, stop in stop_distribution(states).items():
            prefix = () if node < 0 else paths[node]
            for token in range(VOCAB):
                add_continued(out, target, prefix + (token,),
                              probability * stop * states[node][1][token], length)
    return out


CASES = [("wide", "with replacement", 0), ("wide", "without replacement", 1),
         ("deep", "with replacement", 2), ("deep", "without replacement", 3),
         ("deep", "deterministic", 4), ("chain", "with replacement", 5)]


@pytest.mark.parametrize("shape_name,kind,seed", CASES)
def test_the_reference_rule_is_exact(shape_name, kind, seed):
    """The rule itself (float64, every tree, every stop and next token weighted exactly):
    the first depth + 1 tokens follow the target."""
    shape = SHAPES[shape_name]
    target, draft = random_model(seed, 1.5), random_model(seed + 100, 1.5)
    length = shape.max_depth + 1
    got = output_distribution(shape, target, draft, kind,
                              lambda tokens, qs: reference(shape, target, tokens, qs), length)
    assert total_variation(got, target_distribution(target, length)) < 1e-9


def test_leaving_out_a_subtree_stays_exact():
    shape = SHAPES["deep"]
    target, draft = random_model(6, 1.5), random_model(106, 1.5)
    got = output_distribution(
        shape, target, draft, "with replacement",
        lambda tokens, qs: reference(shape, target, tokens, qs, skip=(0,)), 4)
    assert total_variation(got, target_distribution(target, 4)) < 1e-9


def traced(shape: TreeShape, target, trees: list, kind: str, skip=None):
    """`traverse` on every tree at once (one row each)."""
    tokens = jnp.asarray([t for t, _, _ in trees], jnp.int32)
    p = jnp.asarray([[target(())] + [target(path) for path in prefixes(shape, t)]
                     for t, _, _ in trees], jnp.float32)
    q = None if kind == "deterministic" else jnp.asarray([qs for _, _, qs in trees],
                                                         jnp.float32)
    never = None if skip is None else jnp.zeros(tokens.shape, bool).at[:, list(skip)].set(True)
    return traverse(tokens, shape.parents_array(len(trees)), p, q,
                    max_depth=shape.max_depth, max_branching=shape.max_branching,
                    never_accept_BN=never)


@pytest.mark.parametrize("shape_name,kind,seed,skip", [
    (*case, None) for case in CASES] + [("deep", "with replacement", 7, (0,)),
                                          ("wide", "deterministic", 8, (1,))])
def test_traverse_is_the_reference_node_by_node(shape_name, kind, seed, skip):
    """Every tree the draft can draw, one row each: the traced pass gives every node the
    reference's weight, residual and turn (float32 rounding), and nodes left out are never
    visited."""
    shape = SHAPES[shape_name]
    target, draft = random_model(seed, 1.5), random_model(seed + 100, 1.5)
    trees = list(all_trees(shape, draft, kind))
    walk = traced(shape, target, trees, kind, skip)
    weight, residual, order = (np.asarray(a) for a in (walk.weight, walk.residual, walk.order))
    visited_somewhere = set()
    for row, (tokens, _, qs) in enumerate(trees):
        states = reference(shape, target, tokens, qs, skip=skip or ())
        for node in range(-1, shape.num_nodes):
            if node not in states:
                assert order[row, node + 1] == -1
                continue
            visited_somewhere.add(node)
            want_w, want_r, want_turn = states[node]
            assert order[row, node + 1] == want_turn
            assert abs(weight[row, node + 1] - want_w) < 2e-5
            np.testing.assert_allclose(residual[row, node + 1], want_r, atol=2e-5)
    expected = set(range(-1, shape.num_nodes)) - set(skip or ())
    expected -= {n for n in range(shape.num_nodes)
                 for s in (skip or ()) if s in ancestors(shape, n)}
    assert visited_somewhere == expected


def ancestors(shape: TreeShape, node: int) -> set:
    out = set()
    while shape.parents[node] >= 0:
        node = shape.parents[node]
        out.add(node)
    return out


def test_traverse_output_is_exact():
    """The output distribution computed from the traced pass's own numbers (not the
    reference's) is the target's to float32 rounding."""
    shape = SHAPES["deep"]
    target, draft = random_model(9, 1.5), random_model(109, 1.5)
    trees = list(all_trees(shape, draft, "without replacement"))
    walk = traced(shape, target, trees, "without replacement")
    weight, residual, order = (np.asarray(x) for x in (walk.weight, walk.residual,
                                                        walk.order))
    by_tree = {}
    for row, (tokens, _, _) in enumerate(trees):
        by_tree[tokens] = {node: (float(weight[row, node + 1]),
                                  np.asarray(residual[row, node + 1], np.float64),
                                  int(order[row, node + 1]))
                           for node in range(-1, shape.num_nodes)
                           if int(order[row, node + 1]) >= 0}
    got = output_distribution(shape, target, draft, "without replacement",
                              lambda tokens, qs: by_tree[tokens], 4)
    assert total_variation(got, target_distribution(target, 4)) < 1e-5


def token_rule_expected_length(shape, target, tokens, qs) -> float:
    """E[accepted nodes] of the token rule (recursive rejection sampling) on one tree."""
    paths = prefixes(shape, tokens)

    def expected(node: int) -> float:
        r = target(() if node < 0 else paths[node]).copy()
        total, reach = 0.0, 1.0
        for child in [n for n, p in enumerate(shape.parents) if p == node]:
            x, q = tokens[child], qs[child]
            accept = min(1.0, r[x] / q[x])
            total += reach * accept * (1.0 + expected(child))
            reach *= 1.0 - accept
            excess = np.maximum(r - q, 0.0)
            if excess.sum() > 0:
                r = excess / excess.sum()
        return total

    return expected(-1)


@pytest.mark.parametrize("shape_name,kind", [
    ("wide", "with replacement"), ("wide", "without replacement"),
    ("deep", "with replacement"), ("deep", "without replacement"), ("deep", "deterministic"),
    ("chain", "with replacement")])
def test_never_fewer_accepted_tokens_than_the_token_rule(shape_name, kind):
    """Exact expectations over every tree, for drafts close to and far from the target."""
    shape = SHAPES[shape_name]
    depth = dict(zip(range(shape.num_nodes), np.asarray(
        [len(p) for p in prefixes(shape, (0,) * shape.num_nodes)]), strict=True))
    depth[-1] = 0
    for seed, sharpness in [(10, 0.5), (11, 1.5), (12, 3.0)]:
        target, draft = random_model(seed, sharpness), random_model(seed + 50, sharpness)
        token = traversal = 0.0
        for tokens, probability, qs in all_trees(shape, draft, kind):
            stops = stop_distribution(reference(shape, target, tokens, qs))
            traversal += probability * sum(s * depth[n] for n, s in stops.items())
            token += probability * token_rule_expected_length(shape, target, tokens, qs)
        assert traversal >= token - 1e-12, (seed, traversal, token)
        if shape_name != "wide" and kind != "deterministic":
            # Sampled drafts gain strictly; deterministic (one-hot) children tie, as block
            # verification ties the token rule on one-hot chains.
            assert traversal > token + 1e-4, (seed, traversal, token)


def bigram_rows(rows: int, seed: int, shape: TreeShape, kind: str):
    """Trees drawn from a bigram draft under a bigram target (vocabulary 5): tokens, q,
    the target at the root and every node, and the target's transition table."""
    rng = np.random.default_rng(seed)
    vocab, root = 5, 1
    target_logits = rng.normal(size=(vocab, vocab)) * 1.2
    draft_logits = target_logits + rng.normal(size=(vocab, vocab)) * 0.8
    soft = lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    tokens = np.zeros((rows, shape.num_nodes), np.int64)
    qs = np.zeros((rows, shape.num_nodes, vocab))
    for node, parent in enumerate(shape.parents):
        before = np.full(rows, root) if parent < 0 else tokens[:, parent]
        q = soft(draft_logits[before])
        if kind == "without replacement":
            for sibling in [n for n in range(node) if shape.parents[n] == parent]:
                q[np.arange(rows), tokens[:, sibling]] = 0.0
            q /= q.sum(axis=1, keepdims=True)
        qs[:, node] = q
        cdf = np.cumsum(q, axis=1)
        tokens[:, node] = np.minimum((rng.random((rows, 1)) > cdf).sum(1), vocab - 1)
    p = np.concatenate([np.broadcast_to(soft(target_logits[root]), (rows, 1, vocab)),
                        soft(target_logits[tokens])], axis=1)
    return tokens, qs, p, soft(target_logits), root, rng


@pytest.mark.parametrize("kind", ["with replacement", "without replacement"])
def test_the_sampled_step_passes_the_chi_square(kind):
    """40,000 rows, each its own tree, one call: the first three emitted tokens (completed
    by the target) follow the target's joint."""
    rows, shape = 40_000, TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    tokens, qs, p, table, root, rng = bigram_rows(rows, 20, shape, kind)
    out = accept_traversal(jax.random.key(1), jax.random.key(2), jnp.asarray(tokens, jnp.int32),
                           shape.parents_array(rows), jnp.asarray(p, jnp.float32),
                           jnp.asarray(qs, jnp.float32), max_depth=shape.max_depth,
                           max_branching=shape.max_branching)
    path, count, nxt = (np.asarray(a) for a in (out.path, out.num_accepted, out.next_token))
    sequences = np.zeros((rows, 3), np.int64)
    for r in range(rows):
        emitted = list(tokens[r, path[r, :count[r]]]) + [int(nxt[r])]
        previous = root
        for j in range(3):
            sequences[r, j] = (emitted[j] if j < len(emitted)
                               else rng.choice(5, p=table[previous]))
            previous = sequences[r, j]
    joint = np.zeros((5, 5, 5))
    for a, b, c in itertools.product(range(5), repeat=3):
        joint[a, b, c] = table[root][a] * table[a][b] * table[b][c]
    assert chi_square_pvalue(sequences, joint) > 1e-3
    assert (count == 3).any() and (count == 0).any()


def test_a_chain_is_block_verification():
    """Same keys, same decisions: the traversal of a chain keeps each prefix with block
    verification's probability, draws the same uniforms and the same next token."""
    rng = np.random.default_rng(30)
    batch, k = 512, 5
    soft = lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    p = jnp.asarray(soft(rng.normal(size=(batch, k + 1, VOCAB)) * 1.5), jnp.float32)
    q_np = soft(rng.normal(size=(batch, k, VOCAB)) * 1.5)
    tokens = jnp.asarray([[rng.choice(VOCAB, p=q_np[b, j]) for j in range(k)]
                          for b in range(batch)], jnp.int32)
    q = jnp.asarray(q_np, jnp.float32)
    chain = TreeShape.chain(k)
    walk = traverse(tokens, chain.parents_array(batch), p, q, max_depth=k, max_branching=1)
    _, q_BK1V, weights = chain_distributions(tokens, q, p, None)
    keep = keep_probabilities(p, q_BK1V, weights)
    np.testing.assert_allclose(walk.weight[:, 1:], keep, atol=1e-5)
    keys = jax.random.key(3), jax.random.key(4)
    block = accept_block(*keys, tokens, q, p)
    tree = accept_traversal(*keys, tokens, chain.parents_array(batch), p, q, max_depth=k,
                            max_branching=1)
    np.testing.assert_array_equal(tree.num_accepted, block.num_accepted)
    np.testing.assert_array_equal(tree.next_token, block.next_token)
    accepted = np.asarray(block.num_accepted)
    assert accepted.min() == 0 and accepted.max() == k


def test_greedy_rows_accept_exactly_the_argmax_matches():
    """One-hot target rows (temperature 0 in a mixed batch): the path and next token of
    the argmax walk, for sampled and deterministic drafts."""
    rng = np.random.default_rng(31)
    batch, shape = 256, SHAPES["deep"]
    tokens = jnp.asarray(rng.integers(0, VOCAB, size=(batch, shape.num_nodes)), jnp.int32)
    logits = jnp.asarray(rng.normal(size=(batch, shape.num_nodes + 1, VOCAB)), jnp.float32)
    one_hot = jax.nn.one_hot(jnp.argmax(logits, -1), VOCAB)
    greedy = accept_tree_greedy(tokens, shape.parents_array(batch), logits,
                                max_depth=shape.max_depth, max_branching=shape.max_branching)
    for q in (None, jax.nn.softmax(jnp.asarray(rng.normal(size=(batch, shape.num_nodes,
                                                                   VOCAB)), jnp.float32))):
        out = accept_traversal(jax.random.key(5), jax.random.key(6), tokens,
                               shape.parents_array(batch), one_hot, q,
                               max_depth=shape.max_depth, max_branching=shape.max_branching)
        np.testing.assert_array_equal(out.num_accepted, greedy.num_accepted)
        np.testing.assert_array_equal(out.path, greedy.path)
        np.testing.assert_array_equal(out.next_token, greedy.next_token)
    assert int(jnp.max(greedy.num_accepted)) == shape.max_depth
