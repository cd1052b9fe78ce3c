"""specjax.training: loss goes down, resume is exact, distillation raises acceptance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import build_lm

from specjax import SamplingConfig, analysis, probabilities
from specjax.testing import count_compilations
from specjax.training import DistillConfig, TrainConfig, distill, train

VOCAB = 32


def _periodic_batches(step):
    """A learnable stream: each row counts up by a row-specific stride (mod VOCAB)."""
    rng = np.random.default_rng([0, step])
    start = rng.integers(0, VOCAB, (8, 1))
    stride = rng.integers(1, 4, (8, 1))
    return ((start + stride * np.arange(24)[None]) % VOCAB).astype(np.int32)


def test_a_few_steps_lower_the_loss():
    lm = build_lm(21)
    heldout = [_periodic_batches(10_000)]
    result = train(lm, _periodic_batches, TrainConfig(steps=40, learning_rate=1e-2,
                                                      warmup_steps=5, log_every=5,
                                                      eval_every=40),
                   heldout=heldout, progress=False)
    first, last = result.history[0]["loss"], result.history[-1]["loss"]
    assert last < 0.6 * first
    assert result.heldout_loss < first
    assert result.heldout_bits_per_token == pytest.approx(result.heldout_loss / np.log(2))


def test_resume_continues_exactly_where_it_stopped(tmp_path):
    config = TrainConfig(steps=8, learning_rate=5e-3, warmup_steps=2, log_every=1,
                         checkpoint_every=4, eval_every=8)
    straight = train(build_lm(22), _periodic_batches, config, progress=False)
    # Interrupted after its first step (max_seconds=0), then resumed by the same call.
    first = train(build_lm(22), _periodic_batches, config, checkpoint_dir=tmp_path,
                  progress=False, max_seconds=0.0)
    assert first.history[-1] == {**first.history[-1], "step": 1, "stopped": "max_seconds"}
    resumed = train(build_lm(22), _periodic_batches, config, checkpoint_dir=tmp_path,
                    progress=False)
    assert [h["step"] for h in resumed.history if "stopped" not in h] == list(range(1, 9))
    for a, b in zip(jax.tree.leaves(straight.lm.params), jax.tree.leaves(resumed.lm.params),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _mean_acceptance(target, draft, tokens):
    sampling = SamplingConfig(temperature=1.0)
    p = np.asarray(probabilities(target.logits(tokens), sampling))
    q = np.asarray(probabilities(draft.logits(tokens), sampling))
    return float(np.mean(analysis.expected_acceptance_rate(p, q)))


@pytest.mark.parametrize("divergence, on_policy", [("fkl", 0.0), ("tvd", 0.5)])
def test_distillation_raises_acceptance(divergence, on_policy):
    target = build_lm(23)
    target = target.with_params(jax.tree.map(lambda x: 2.0 * x, target.params))  # peakier
    draft = build_lm(24, num_layers=1, d_model=32, num_heads=2, num_kv_heads=1, d_ff=64)
    probe = jnp.asarray(_periodic_batches(20_000))
    before = _mean_acceptance(target, draft, probe)
    result = distill(draft, target, _periodic_batches,
                     TrainConfig(steps=30, learning_rate=1e-2, warmup_steps=3, log_every=10,
                                 eval_every=30),
                     DistillConfig(divergence=divergence, on_policy_fraction=on_policy,
                                   prompt_len=8),
                     progress=False)
    after = _mean_acceptance(target, result.lm, probe)
    assert after > before + 0.1, (before, after)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="divergence"):
        DistillConfig(divergence="rkl")
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0)
    with pytest.raises(ValueError, match="equal vocabularies"):
        distill(build_lm(1, vocab_size=16), build_lm(2), _periodic_batches, TrainConfig(steps=1))


def test_the_callers_model_stays_usable_after_training():
    """The compiled step donates its buffers; the model passed in must not be consumed."""
    lm = build_lm(25)
    before = np.asarray(jax.tree.leaves(lm.params)[0]).copy()
    train(lm, _periodic_batches, TrainConfig(steps=2, log_every=1, eval_every=2),
          progress=False)
    np.testing.assert_array_equal(np.asarray(jax.tree.leaves(lm.params)[0]), before)
    assert np.isfinite(np.asarray(lm.logits(jnp.ones((1, 4), jnp.int32)))).all()


def test_the_training_step_compiles_once():
    """The step's first inputs (a copy of the caller's model, a fresh optimizer state) are
    placed as its outputs are, so the later steps take the first step's program. (A model
    whose arrays are partly committed to their device, as a head initialised in parts is:
    the first call would otherwise place the rest by them, a program of its own.)"""
    lm = build_lm(23)
    leaves, tree = jax.tree.flatten(lm.params)
    leaves = [jax.device_put(x, jax.devices()[0]) if i % 2 else jnp.asarray(np.asarray(x))
              for i, x in enumerate(leaves)]
    lm = lm.with_params(jax.tree.unflatten(tree, leaves))
    with count_compilations() as compiled:
        train(lm, _periodic_batches, TrainConfig(steps=3, log_every=3, eval_every=3),
              progress=False)
    assert [name for name in compiled if "step_fn" in name] == ["jit(step_fn)"]
