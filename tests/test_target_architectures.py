"""Exactness of the targets of the newer architectures: a mixture of experts and
DeepSeek's latent attention with its router, as targets (the exactness registry,
tests/test_exactness.py, covers every drafter on a dense target): greedy speculative
decoding equals generate, and the sampled 3-token joint follows the enumerated target at
batch > 1."""

import numpy as np
import pytest
from conftest import LATENT_ATTENTION_AND_EXPERTS, build_lm
from test_exactness import PROMPTS, SAMPLINGS, STAT_ROWS

import specjax
import specjax_models
from specjax import GREEDY
from specjax.testing import speculative_joint_pvalues

NEW_ARCHITECTURES = {
    "mixture of experts": dict(num_experts=8, experts_per_token=2, expert_d_ff=16,
                               dense_layers=(0,)),
    "latent attention and experts": LATENT_ATTENTION_AND_EXPERTS,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NEW_ARCHITECTURES))
def test_targets_of_the_new_architectures_are_exact(name):
    """A mixture-of-experts target (8 experts, top 2, a dense first layer), and one with
    DeepSeek's latent attention and router: decode steps route fewer pairs than experts
    (gathered dispatch), verifies and prefills more (grouped). Greedy speculative
    decoding equals generate, and the sampled 3-token joint follows the enumerated target
    at batch > 1, with the target's first layer as the draft."""
    fields = NEW_ARCHITECTURES[name]
    heads = dict(num_heads=4, num_kv_heads=4) if "kv_lora_rank" in fields else {}
    target = build_lm(5, num_layers=2, **heads, **fields)
    draft = specjax_models.first_layers(target, 1)
    plain = specjax.generate(target, PROMPTS, max_new_tokens=16, sampling=GREEDY)
    spec = specjax.speculative_generate(target, draft, PROMPTS, max_new_tokens=16,
                                        num_draft_tokens=3, sampling=GREEDY)
    np.testing.assert_array_equal(spec.tokens, plain.tokens)
    micro = build_lm(6, vocab_size=8, num_layers=2, d_model=16, num_heads=2, num_kv_heads=2
                     if heads else 1, d_ff=32, max_seq_len=64, **fields)
    settings = [GREEDY] + [SAMPLINGS[s] for s in ("t1", "t0.7-topk4")]
    pvalues, out = speculative_joint_pvalues(
        micro, specjax_models.first_layers(micro, 1), [1, 5, 2], settings,
        num_draft_tokens=3, rows_per_setting=STAT_ROWS, seed=202)
    assert pvalues[0] == 1.0
    assert min(pvalues[1:]) > 1e-3, pvalues
    assert out.stats.acceptance_rate > 0.0
