"""Medusa heads as drafters: which hidden state they read, what they propose, errors.

Greedy equality and the chi-square tests are in tests/test_exactness.py (the registry)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specjax
import specjax_models
from specjax import GREEDY, SamplingConfig, SpeculativeConfig, TreeShape
from specjax.decoding.speculative_loop import init_speculative_state
from specjax.decoding.step import jitted_step
from specjax.drafters import Eagle, Medusa
from specjax.drafters.base import DraftContext
from specjax.drafters.medusa import medusa_logits


def random_medusa(lm, heads=3, seed=0, method="greedy") -> Medusa:
    medusa = Medusa.create(heads, specjax_models.embedding_and_head(lm)[1], method)
    key_w, key_b = jax.random.split(jax.random.key(seed))
    return medusa.with_params({"w": 0.3 * jax.random.normal(key_w, medusa.params["w"].shape),
                               "b": 0.3 * jax.random.normal(key_b, medusa.params["b"].shape)})


def full_hidden(lm, sequence_BT):
    batch, length = sequence_BT.shape
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    logits, hidden, _ = lm.apply(sequence_BT, positions, lm.init_cache(batch, length),
                                 jnp.zeros((batch,), jnp.int32))
    return np.asarray(logits), np.asarray(hidden)


def test_untrained_heads_are_the_targets_own_head(tiny_lm):
    """Zero residual blocks: every head's logits are the target's next-token logits."""
    medusa = Medusa.create(2, specjax_models.embedding_and_head(tiny_lm)[1])
    tokens = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
    logits, hidden = full_hidden(tiny_lm, tokens)
    heads = np.asarray(medusa_logits(medusa.params, medusa.lm_head, jnp.asarray(hidden)))
    for head in range(2):
        np.testing.assert_allclose(heads[:, :, head], logits, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_after_each_commit_the_heads_read_the_hidden_state_of_the_last_token_producer(tiny_lm):
    """The hidden state kept is the target's at position length - 2 (the one whose
    distribution gave the last committed token), for every row however many drafts it
    accepted."""
    medusa = random_medusa(tiny_lm)
    config = SpeculativeConfig(num_draft_tokens=3, sampling=SamplingConfig(temperature=1.0))
    state, medusa = init_speculative_state(tiny_lm, medusa, [[1, 2, 3, 4], [5, 6], [7, 8, 9]],
                                           max_new_tokens=30, num_draft_tokens=3,
                                           sampling=config.sampling, key=jax.random.key(1))
    for _ in range(4):
        state = jitted_step(tiny_lm, medusa, state, config)
        lengths = np.asarray(state.lengths)
        _, hidden = full_hidden(tiny_lm, state.sequence[:, :int(lengths.max())])
        want = hidden[np.arange(3), lengths - 2]
        np.testing.assert_allclose(np.asarray(state.drafter_state.hidden), want, rtol=1e-4,
                                   atol=1e-5)


def test_chain_and_tree_proposals_take_each_heads_top_tokens(tiny_lm):
    medusa = random_medusa(tiny_lm, heads=3)
    hidden = jax.random.normal(jax.random.key(2), (2, 64))
    state = medusa.init(jnp.zeros((2, 3), jnp.int32), jnp.asarray([3, 3]), 16,
                        features=jnp.stack([hidden, hidden, hidden], axis=1))
    order = np.argsort(-np.asarray(medusa_logits(medusa.params, medusa.lm_head, hidden)),
                       axis=-1)  # [B, M, V]
    context = DraftContext(jnp.zeros((2, 16), jnp.int32), jnp.asarray([3, 3]))
    _, chain = medusa.propose(state, context, jax.random.key(0), num_draft_tokens=3,
                              sampling=GREEDY, vocab_size=32)
    np.testing.assert_array_equal(np.asarray(chain.tokens), order[:, :, 0])
    tree = TreeShape.from_paths([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    _, proposal = medusa.propose(state, context, jax.random.key(0), num_draft_tokens=6,
                                 sampling=GREEDY, vocab_size=32, tree=tree)
    # depth-1 ranks 0, 1; depth-2 ranks 0, 1, 0; depth 3 rank 0.
    want = np.stack([order[:, 0, 0], order[:, 0, 1], order[:, 1, 0], order[:, 1, 1],
                     order[:, 1, 0], order[:, 2, 0]], axis=1)
    np.testing.assert_array_equal(np.asarray(proposal.tokens), want)
    assert proposal.q is None


def test_drafting_deeper_than_the_heads_is_refused(tiny_lm):
    medusa = random_medusa(tiny_lm, heads=2)
    with pytest.raises(ValueError, match="needs 4 Medusa heads but there are 2"):
        specjax.speculative_generate(tiny_lm, medusa, [[1, 2]], max_new_tokens=4,
                                     num_draft_tokens=4, sampling=GREEDY)


def test_save_load_round_trip_and_kind_check(tiny_lm, tmp_path):
    medusa = random_medusa(tiny_lm, heads=2, seed=4)
    medusa.save(tmp_path / "medusa")
    lm_head = specjax_models.embedding_and_head(tiny_lm)[1]
    loaded = Medusa.load(tmp_path / "medusa", lm_head)
    np.testing.assert_array_equal(np.asarray(loaded.params["w"]), np.asarray(medusa.params["w"]))
    with pytest.raises(ValueError, match="not an EAGLE/MTP head"):
        Eagle.load(tmp_path / "medusa", lm_head, lm_head)
    with pytest.raises(ValueError, match="num_heads"):
        Medusa.create(0, lm_head)
