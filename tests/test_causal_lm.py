"""specjax.lm.causal_lm: the functional model view and the prefill, whole or in chunks."""

import jax
import numpy as np
import pytest
from conftest import build_lm

import specjax
from specjax.lm.causal_lm import prefill

# A full row, one ending on a block edge (blocks of 4), one token.
PROMPT_LENGTHS = np.array([13, 8, 1], np.int32)


def _prompts(vocab, width=13):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (len(PROMPT_LENGTHS), width)).astype(np.int32)
    return np.where(np.arange(width)[None] < PROMPT_LENGTHS[:, None], tokens, 0)


@jax.jit
def _prefill_and_step(lm, tokens, lengths):
    """Prefill, then one decode step: the logits after the prompt, the features of layer 0
    and the final hidden state at every prompt position."""
    cache = lm.init_cache(tokens.shape[0], 32)
    cache, cache_lengths, last, hidden = prefill(lm, cache, tokens, lengths,
                                                 feature_layers=(0,))
    logits, _, _ = lm.apply(last[:, None], cache_lengths[:, None], cache, cache_lengths)
    return logits[:, 0], hidden, cache_lengths, last


@pytest.mark.parametrize("overrides", [{}, {"sliding_window": 5, "sliding_layers": "even"}],
                         ids=["full", "sliding-window"])
@pytest.mark.parametrize("chunk", [1, 4, 5, 12])
def test_a_chunked_prefill_equals_one_forward(chunk, overrides):
    """Chunks that divide the prompt width, that do not (the last chunk starts inside the
    previous one) and of one token, in attention blocks of 4: the next step's logits, the
    prompt's features and the decode invariant equal the one-forward prefill's, for
    ragged rows and a 1-token row, with full and sliding-window attention."""
    lm = build_lm(0, attention_block_size=4, attention_query_block=4, **overrides)
    tokens = _prompts(lm.vocab_size)
    whole = _prefill_and_step(lm.with_prefill_chunk(None), tokens, PROMPT_LENGTHS)
    chunked = _prefill_and_step(lm.with_prefill_chunk(chunk), tokens, PROMPT_LENGTHS)
    np.testing.assert_allclose(chunked[0], whole[0], rtol=2e-5, atol=2e-5)
    valid = np.arange(tokens.shape[1])[None] < PROMPT_LENGTHS[:, None]
    np.testing.assert_allclose(np.asarray(chunked[1])[valid], np.asarray(whole[1])[valid],
                               rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(chunked[2], PROMPT_LENGTHS - 1)
    np.testing.assert_array_equal(chunked[3], whole[3])


def test_greedy_decoding_after_a_chunked_prefill_is_unchanged(tiny_lm):
    prompts = [list(row[:n]) for row, n in zip(_prompts(32, 40), [40, 23, 1], strict=True)]
    reference = specjax.generate(tiny_lm.with_prefill_chunk(None), prompts,
                                 max_new_tokens=12, sampling=specjax.GREEDY)
    chunked = specjax.generate(tiny_lm.with_prefill_chunk(16), prompts, max_new_tokens=12,
                               sampling=specjax.GREEDY)
    np.testing.assert_array_equal(chunked.tokens, reference.tokens)
    draft = specjax.DraftModel(build_lm(1).with_prefill_chunk(8), "greedy")
    speculative = specjax.speculative_generate(tiny_lm.with_prefill_chunk(16), draft, prompts,
                                               max_new_tokens=12, num_draft_tokens=3,
                                               sampling=specjax.GREEDY)
    np.testing.assert_array_equal(speculative.tokens, reference.tokens)


@pytest.mark.parametrize("chunk", [0, -3, 2.5, True])
def test_a_bad_prefill_chunk_is_refused(tiny_lm, chunk):
    with pytest.raises(ValueError, match="prefill_chunk must be a positive int or None"):
        tiny_lm.with_prefill_chunk(chunk)


def test_the_default_prefill_chunk_and_with_prefill_chunk(tiny_lm):
    from specjax.lm.causal_lm import DEFAULT_PREFILL_CHUNK

    assert tiny_lm.prefill_chunk == DEFAULT_PREFILL_CHUNK
    changed = tiny_lm.with_prefill_chunk(64)
    assert changed.prefill_chunk == 64 and changed.params is tiny_lm.params
