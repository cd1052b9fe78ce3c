"""OnlineDistiller (OSD): the draft learns from the texts it helps decode, between calls;
every call stays exact for the draft it was given."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import specjax
from specjax import GREEDY, DraftModel, SamplingConfig
from specjax.testing import speculative_joint_pvalue
from specjax.training.online import OnlineConfig, OnlineDistiller

STREAM = [[3, 4, 5, 3, 4], [9, 2, 9, 2], [7, 7, 1], [12, 3, 12], [5, 6, 5, 6, 5], [1, 30, 2]]


def acceptance(target, drafter, prompts) -> float:
    out = specjax.speculative_generate(target, drafter, prompts, max_new_tokens=16,
                                       num_draft_tokens=3, sampling=GREEDY)
    return out.stats.acceptance_rate


def test_the_draft_learns_the_target_on_its_stream(tiny_lm, random_draft):
    distiller = OnlineDistiller(tiny_lm, DraftModel(random_draft, "greedy"),
                                OnlineConfig(learning_rate=1e-2, steps_per_update=8,
                                             batch_size=8, window=32), seed=0)
    before = acceptance(tiny_lm, distiller.drafter, STREAM)
    for _ in range(6):
        distiller.generate(STREAM, max_new_tokens=16, num_draft_tokens=3, sampling=GREEDY)
    after = acceptance(tiny_lm, distiller.drafter, STREAM)
    assert after >= before + 0.2, (before, after, distiller.losses)
    assert distiller.losses[-1] < distiller.losses[0]


def test_calls_between_updates_stay_exact(micro_lm, micro_drafts):
    distiller = OnlineDistiller(micro_lm, DraftModel(micro_drafts["far"]),
                                OnlineConfig(learning_rate=3e-2, steps_per_update=4,
                                             window=16), seed=1)
    t1 = SamplingConfig(temperature=1.0)
    old = jax.tree.leaves(distiller.drafter.lm.params)[0]
    for round_ in range(2):
        pvalue, out = speculative_joint_pvalue(micro_lm, distiller.drafter, [1, 5, 2], t1,
                                               num_draft_tokens=3, rows=12_000,
                                               seed=300 + round_)
        assert pvalue > 1e-3, (round_, pvalue)
        tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
        distiller.observe([[1, 5, 2]] * 64, [tokens[b, :lengths[b]] for b in range(64)])
        assert distiller.update() is not None
    assert not np.array_equal(old, jax.tree.leaves(distiller.drafter.lm.params)[0])


def test_the_batch_weighs_generated_positions_then_the_prompt(tiny_lm, close_draft):
    distiller = OnlineDistiller(tiny_lm, close_draft, OnlineConfig(batch_size=2, window=6,
                                                                   prompt_weight=0.25))
    assert distiller.update() is None  # nothing observed yet
    distiller.observe([[1, 2, 3]], [[4, 5]])
    tokens, generated = distiller._batch()
    np.testing.assert_array_equal(tokens[0], [1, 2, 3, 4, 5, 0])
    np.testing.assert_array_equal(generated[0], [0.25, 0.25, 1, 1, 0])  # 4 and 5 generated
    distiller.observe([[1, 2, 3, 4, 5, 6, 7]], [[8, 9]])  # cut to its last 6 tokens
    distiller._texts.popleft()
    tokens, generated = distiller._batch()
    np.testing.assert_array_equal(tokens[0], [4, 5, 6, 7, 8, 9])
    np.testing.assert_array_equal(generated[0], [0.25, 0.25, 0.25, 1, 1])


def test_frozen_groups_stay_as_they_were(tiny_lm, close_draft):
    distiller = OnlineDistiller(tiny_lm, close_draft,
                                OnlineConfig(frozen=("embed",), steps_per_update=2,
                                             window=16))
    distiller.observe(STREAM[:2], [[1, 2, 3], [4, 5, 6]])
    distiller.update()
    after = distiller.drafter.lm.params
    np.testing.assert_array_equal(after["embed"]["embedding"][...],
                                  close_draft.params["embed"]["embedding"][...])
    assert not np.array_equal(after["final_norm"]["weight"][...],
                              close_draft.params["final_norm"]["weight"][...])


@pytest.mark.parametrize("make, message", [
    (lambda t, d: OnlineDistiller(t, d, OnlineConfig(frozen=("nope",))), "frozen names"),
    (lambda t, d: OnlineDistiller(t, DraftModel(d, draft_vocab=np.arange(16)),
                                  OnlineConfig(divergence="fkl")), "needs a draft"),
    (lambda t, d: OnlineConfig(window=1), "window"),
    (lambda t, d: OnlineConfig(divergence="rkl"), "divergence"),
    (lambda t, d: OnlineConfig(agreed_weight=2.0), "agreed_weight"),
    (lambda t, d: OnlineConfig(prompt_weight=-1.0), "prompt_weight"),
])
def test_bad_settings_are_refused(tiny_lm, close_draft, make, message):
    with pytest.raises(ValueError, match=message):
        make(tiny_lm, close_draft)


def test_an_array_of_prompts_is_kept_without_its_padding(tiny_lm, close_draft):
    distiller = OnlineDistiller(tiny_lm, close_draft, OnlineConfig(window=16))
    prompts = np.array([[3, 0, 0], [4, 5, 6]], np.int32)
    out = distiller.generate(prompts, prompt_lengths=[1, 3], max_new_tokens=3,
                             num_draft_tokens=2, sampling=GREEDY)
    kept = [(text.tolist(), length) for text, length in distiller._texts]
    tokens = np.asarray(out.tokens)
    assert kept == [([3, *tokens[0, :3].tolist()], 1), ([4, 5, 6, *tokens[1, :3].tolist()], 3)]


def test_observed_ids_outside_the_vocabulary_are_refused_and_nothing_is_kept(tiny_lm,
                                                                            close_draft):
    distiller = OnlineDistiller(tiny_lm, close_draft, OnlineConfig(window=16))
    for prompts, generated in [([[1, 2]], [[tiny_lm.vocab_size]]), ([[-1, 2]], [[3]])]:
        with pytest.raises(ValueError, match="outside the target's vocabulary"):
            distiller.observe([[4, 5]] + prompts, [[6]] + generated)
    assert len(distiller._texts) == 0 and distiller.update() is None


def test_one_frozen_group_may_be_named_alone():
    assert OnlineConfig(frozen="embed").frozen == ("embed",)
    with pytest.raises(ValueError, match="group names"):
        OnlineConfig(frozen=[1])


def test_an_update_compiles_once_for_a_draft_placed_on_a_device(tiny_lm, close_draft):
    """A loaded draft's weights are committed to their device and optimizer.init's fresh
    arrays are not: the update's state is committed from the start, so the second update
    takes the first one's program."""
    from specjax.testing import count_compilations

    device = jax.devices()[0]
    placed = close_draft.with_params(jax.device_put(close_draft.params, device))
    distiller = OnlineDistiller(tiny_lm, placed, OnlineConfig(window=8))
    distiller.observe([[1, 2, 3]], [[4, 5, 6, 7]])
    with count_compilations() as compiled:
        for _ in range(3):
            distiller.update()
    assert [name for name in compiled if "_update_step" in name] == ["jit(_update_step)"]
