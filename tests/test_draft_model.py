"""specjax.drafters.draft_model: proposals, the q they carry, and cache bookkeeping."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import build_lm

from specjax import GREEDY, DraftModel, SamplingConfig, probabilities
from specjax.drafters import Commit, DraftContext
from specjax.drafters.draft_model import fit_vocab
from specjax_models import select_layers


def _context(rows, capacity=32):
    sequence = np.zeros((len(rows), capacity), np.int32)
    for b, row in enumerate(rows):
        sequence[b, : len(row)] = row
    return DraftContext(jnp.asarray(sequence), jnp.asarray([len(r) for r in rows], jnp.int32))


def _argmax_chain(lm, row, k):
    seq = list(row)
    for _ in range(k):
        seq.append(int(jnp.argmax(lm.logits(jnp.array([seq]))[0, -1])))
    return seq[len(row):]


def test_greedy_drafts_follow_the_draft_model_through_commits_with_and_without_lag():
    """Propose, commit (some rows accept all K plus a bonus, so the draft lags one token),
    propose again: every proposal equals the draft's own argmax continuation."""
    draft_lm = build_lm(5)
    drafter = DraftModel(draft_lm, method="greedy")
    k = 3
    rows = [[1, 2, 3], [4, 5], [6]]
    prompt = np.zeros((3, 4), np.int32)
    for b, row in enumerate(rows):
        prompt[b, : len(row)] = row
    state = drafter.init(jnp.asarray(prompt), jnp.array([3, 2, 1]), 32)
    propose = jax.jit(lambda st, ctx: drafter.propose(
        st, ctx, jax.random.key(0), num_draft_tokens=k, sampling=GREEDY, vocab_size=32))
    for round_ in range(3):
        context = _context(rows)
        state, proposal = propose(state, context)
        for b, row in enumerate(rows):
            assert proposal.tokens[b].tolist() == _argmax_chain(draft_lm, row, k), (round_, b)
            np.testing.assert_array_equal(
                proposal.q[b], jax.nn.one_hot(proposal.tokens[b], 32))
        # Row 0 accepts everything + a bonus (lag), row 1 accepts one, row 2 none.
        accepted = [k, 1, 0]
        new_rows = [row + proposal.tokens[b, : accepted[b]].tolist() + [(7 * b + round_) % 32]
                    for b, row in enumerate(rows)]
        new_context = _context(new_rows)
        state = drafter.commit(state, Commit(
            old_lengths=context.lengths, new_lengths=new_context.lengths,
            num_accepted=jnp.array(accepted), sequence=new_context.sequence,
            target_hidden=jnp.zeros((3, k + 1, 64)), active=jnp.ones(3, bool)))
        expected_lag = [1, 0, 0]
        assert (new_context.lengths - 1 - state.cache_lengths).tolist() == expected_lag
        rows = new_rows


def test_sampled_q_is_the_warped_draft_distribution_it_was_drawn_from():
    draft_lm = build_lm(6)
    sampling = SamplingConfig(temperature=0.8, top_k=10, top_p=0.9)
    drafter = DraftModel(draft_lm, method="sample")
    rows = [[3, 1, 4, 1, 5], [9, 2, 6]]
    prompt = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 0, 0]], np.int32)
    state = drafter.init(jnp.asarray(prompt), jnp.array([5, 3]), 32)
    _, proposal = drafter.propose(state, _context(rows), jax.random.key(3), num_draft_tokens=4,
                                  sampling=sampling, vocab_size=32)
    for b, row in enumerate(rows):
        seq = jnp.array([row + proposal.tokens[b].tolist()])
        expected = probabilities(draft_lm.logits(seq)[0, len(row) - 1: len(row) + 3], sampling)
        np.testing.assert_allclose(proposal.q[b], expected, atol=1e-5)
        # Each draft token lies in the support of its q.
        assert np.all(np.asarray(proposal.q[b])[np.arange(4), proposal.tokens[b]] > 0)


def test_fit_vocab_pads_and_truncates():
    logits = jnp.array([[1.0, 2.0, 3.0]])
    assert fit_vocab(logits, 3).tolist() == [[1.0, 2.0, 3.0]]
    assert fit_vocab(logits, 2).tolist() == [[1.0, 2.0]]
    padded = np.asarray(fit_vocab(logits, 5))
    assert padded[0, :3].tolist() == [1.0, 2.0, 3.0] and np.all(np.isneginf(padded[0, 3:]))


def test_draft_model_is_a_pytree_of_the_draft_params():
    draft_lm = build_lm(7)
    drafter = DraftModel(draft_lm, "greedy")
    leaves, treedef = jax.tree.flatten(drafter)
    assert len(leaves) == len(jax.tree.leaves(draft_lm.params))
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert rebuilt.method == "greedy" and rebuilt.lm.vocab_size == 32
    with pytest.raises(TypeError, match="CausalLM"):
        DraftModel("not a model")


def test_every_confidence_threshold_shares_one_compiled_decoder(tiny_lm):
    """`min_confidence` is data (a float32 leaf): after one threshold compiles the decoder,
    others compile nothing, offer different numbers of drafts, and stay exact (greedy
    equals generate). Only None or a threshold is part of the program."""
    import specjax
    from specjax.testing import count_compilations

    draft = DraftModel(build_lm(7), "greedy", min_confidence=0.5)
    (threshold,) = [leaf for leaf in jax.tree.leaves(draft) if leaf.ndim == 0]
    assert threshold.dtype == np.float32 and float(threshold) == 0.5
    prompts = [[1, 5, 9, 30, 2, 7], [4, 4, 8]]
    plain = specjax.generate(tiny_lm, prompts, max_new_tokens=10, sampling=GREEDY)
    run = lambda c: specjax.speculative_generate(
        tiny_lm, DraftModel(build_lm(7), "greedy", min_confidence=c), prompts,
        max_new_tokens=10, num_draft_tokens=4, sampling=GREEDY)
    run(0.5)
    with count_compilations() as compiled:
        outs = [run(c) for c in (0.01, 0.2, 0.99)]
    assert compiled == []
    for out in outs:
        np.testing.assert_array_equal(out.tokens, plain.tokens)
    offered = [int(np.sum(out.stats.proposed)) for out in outs]
    assert offered[0] > offered[-1]
    with pytest.raises(ValueError, match="min_confidence"):
        DraftModel(build_lm(7), min_confidence=np.float32(1.5))


def test_a_reduced_vocabulary_draft_proposes_its_ids_with_q_zero_elsewhere(tiny_lm):
    """DraftModel(draft_vocab=ids): drafts come from the ids, q is the warped draft
    distribution over them (scattered to the target's 32 ids, 0 elsewhere), and the
    draft reads target ids it cannot produce."""
    ids = np.arange(0, 32, 2)
    draft_lm = select_layers(tiny_lm, (1,), ids)
    drafter = DraftModel(draft_lm, "sample", draft_vocab=ids.tolist())
    assert len(jax.tree.leaves(drafter)) == len(jax.tree.leaves(draft_lm.params)) + 1
    drafter.check(tiny_lm, SamplingConfig())
    rows = [[3, 1, 7, 1, 5], [9, 2, 6]]
    prompt = np.array([[3, 1, 7, 1, 5], [9, 2, 6, 0, 0]], np.int32)
    sampling = SamplingConfig(temperature=0.8, top_p=0.95)
    state = drafter.init(jnp.asarray(prompt), jnp.array([5, 3]), 32)
    _, proposal = drafter.propose(state, _context(rows), jax.random.key(3), num_draft_tokens=3,
                                  sampling=sampling, vocab_size=32)
    assert set(np.asarray(proposal.tokens).ravel()) <= set(ids.tolist())
    for b, row in enumerate(rows):
        seq = jnp.array([row + proposal.tokens[b].tolist()])
        logits = draft_lm.logits(seq)[0, len(row) - 1: len(row) + 2]
        full = jnp.full((3, 32), -jnp.inf).at[:, ids].set(logits)
        np.testing.assert_allclose(proposal.q[b], probabilities(full, sampling), atol=1e-5)
    assert np.all(np.asarray(proposal.q)[..., 1::2] == 0)


def test_a_reduced_vocabulary_that_does_not_match_the_draft_is_refused(tiny_lm):
    ids = np.arange(0, 32, 2)
    draft_lm = select_layers(tiny_lm, (1,), ids)
    cases = {"lists 15 target ids": ids[:-1], "must be sorted": ids[::-1],
             "ids in \\[0, 32\\)": ids + 2, "repeats": np.concatenate([ids[:-1], ids[:1]])}
    for message, wrong in cases.items():
        with pytest.raises(ValueError, match=message):
            DraftModel(draft_lm, draft_vocab=wrong).check(tiny_lm, SamplingConfig())
    with pytest.raises(ValueError, match="share a tokenizer"):  # without draft_vocab
        DraftModel(draft_lm, max_vocab_padding=8).check(tiny_lm, SamplingConfig())
