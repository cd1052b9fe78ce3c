"""specjax.decoding.streaming: streamed chunks reproduce speculative_generate, compiled once."""

import jax
import numpy as np
import pytest

from specjax import SamplingConfig, speculative_generate, speculative_stream
from specjax.testing import count_compilations, perturbed

PROMPTS = [[1, 2, 3, 4], [7, 7], [30, 2, 5]]


def test_stream_concatenation_equals_speculative_generate(tiny_lm):
    draft = perturbed(tiny_lm, 0.05, seed=1)
    kwargs = dict(max_new_tokens=20, num_draft_tokens=3, eos_id=5,
                  sampling=SamplingConfig(temperature=1.0), key=jax.random.key(11))
    whole = speculative_generate(tiny_lm, draft, PROMPTS, **kwargs)
    rows = [[] for _ in PROMPTS]
    drafted = [0] * len(PROMPTS)
    chunks = list(speculative_stream(tiny_lm, draft, PROMPTS, **kwargs))
    for chunk in chunks:
        for b, (tokens, flags) in enumerate(zip(chunk.tokens, chunk.from_draft, strict=True)):
            assert len(tokens) == len(flags)
            # Drafted tokens come first, then at most one token from the target.
            assert flags == sorted(flags, reverse=True) and flags.count(False) <= 1
            rows[b] += tokens
            drafted[b] += sum(flags)
    for b in range(len(PROMPTS)):
        length = int(whole.lengths[b])
        assert rows[b] == np.asarray(whole.tokens[b, :length]).tolist()
    assert chunks[-1].stats is not None and all(chunks[-1].done)
    assert all(c.stats is None for c in chunks[:-1])
    np.testing.assert_array_equal(chunks[-1].stats.emitted, whole.lengths)
    assert chunks[-1].stats.num_steps == len(chunks)
    # Accepted drafts that were not cut by EOS / max_new_tokens count as draft tokens.
    assert sum(drafted) <= int(whole.stats.accepted.sum())


def test_stream_compiles_the_step_once(tiny_lm):
    draft = perturbed(tiny_lm, 0.05, seed=1)
    kwargs = dict(num_draft_tokens=2, sampling=SamplingConfig(temperature=0.5))
    list(speculative_stream(tiny_lm, draft, PROMPTS, max_new_tokens=8,
                            key=jax.random.key(0), **kwargs))
    with count_compilations() as compiled:
        list(speculative_stream(tiny_lm, draft, [[5, 6], [1], [2, 2, 2]], max_new_tokens=12,
                                key=jax.random.key(1), **kwargs))
    assert compiled == []


def test_stream_takes_cache_size_and_pad_id_like_speculative_generate(tiny_lm):
    draft = perturbed(tiny_lm, 0.05, seed=1)
    kwargs = dict(max_new_tokens=10, num_draft_tokens=3, sampling=SamplingConfig(temperature=0),
                  cache_size=64)
    whole = speculative_generate(tiny_lm, draft, PROMPTS, pad_id=-7, **kwargs)
    chunks = list(speculative_stream(tiny_lm, draft, PROMPTS, pad_id=-7, **kwargs))
    for chunk in chunks:
        assert chunk.block.shape == (len(PROMPTS), 4) and chunk.block.dtype == np.int32
        for b, tokens in enumerate(chunk.tokens):
            assert chunk.block[b, : len(tokens)].tolist() == tokens
            assert (chunk.block[b, len(tokens):] == -7).all()
    joined = np.concatenate([c.block for c in chunks], axis=1)
    for b in range(len(PROMPTS)):
        kept = joined[b][joined[b] != -7][: int(whole.lengths[b])]
        assert kept.tolist() == np.asarray(whole.tokens[b, : int(whole.lengths[b])]).tolist()
    with pytest.raises(ValueError, match="cache_size=8 is too small"):
        next(speculative_stream(tiny_lm, draft, PROMPTS, **{**kwargs, "cache_size": 8}))


def test_a_drafter_with_its_own_tree_streams_blocks_of_its_depth(tiny_lm):
    from specjax.drafters import Lookahead

    lookahead = Lookahead(window=3, ngram=3, guesses=2, buckets=16)
    kwargs = dict(max_new_tokens=12, sampling=SamplingConfig(temperature=1.0),
                  key=jax.random.key(2))
    whole = speculative_generate(tiny_lm, lookahead, PROMPTS, **kwargs)
    chunks = list(speculative_stream(tiny_lm, lookahead, PROMPTS, **kwargs))
    assert all(chunk.block.shape == (len(PROMPTS), lookahead.ngram) for chunk in chunks)
    for b in range(len(PROMPTS)):
        streamed = [token for chunk in chunks for token in chunk.tokens[b]]
        assert streamed == np.asarray(whole.tokens[b, :int(whole.lengths[b])]).tolist()
