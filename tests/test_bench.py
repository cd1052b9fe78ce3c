"""specjax.bench.run: every method decodes every prompt, plain decoding is the baseline,
tau and tokens agree with the decoders' own, a method whose tokens leave plain decoding's
is a failure naming the prompt, costs are measured, a journal resumes a killed run."""

import dataclasses
import json

import numpy as np
import pytest

import specjax
import specjax.bench.runner as bench
from specjax import GREEDY, DraftModel, PromptLookup
from specjax.bench.prompts import BenchPrompt
from specjax.bench.runner import BenchMethod

PROMPTS = [BenchPrompt((1, 2, 3, 4, 1, 2), "copy", "p0"), BenchPrompt((7, 7), "copy", "p1"),
           BenchPrompt((30, 2, 5, 9), "other", "p2")]


def _methods(draft):
    return [BenchMethod("draft", DraftModel(draft, "sample"), num_draft_tokens=3),
            BenchMethod("lookup", PromptLookup(max_ngram_size=2), num_draft_tokens=3)]


def test_a_greedy_run_is_exact_and_its_tau_is_the_decoders(tiny_lm, close_draft):
    seen = []
    report = bench.run(tiny_lm, _methods(close_draft), PROMPTS, max_new_tokens=12, reps=1,
                       batch_size=2, cost_reps=1,
                       progress=lambda done, total, speedups: seen.append((done, total,
                                                                           sorted(speedups))))
    assert report.ok and seen[-1] == (2, 2, ["draft", "lookup"])
    assert [r["method"] for r in report.rows][:3] == ["plain"] * 3  # the baseline first
    out = specjax.speculative_generate(tiny_lm, DraftModel(close_draft, "sample"),
                                       [list(p.ids) for p in PROMPTS[:2]], max_new_tokens=12,
                                       num_draft_tokens=3, sampling=GREEDY,
                                       cache_size=report.settings["cache_size"])
    copy = report.row("draft", "copy")
    assert copy["tau"] == pytest.approx(out.stats.mean_accepted_length)
    assert copy["tokens"] == int(np.asarray(out.lengths).sum()) == 24
    assert copy["exact"] is True and copy["verification"] == "greedy"
    for row in report.rows:
        if row["method"] != "plain":
            assert row["draft_block_cost"] > 0 and row["verify_cost"] > 0
            assert row["ideal_speedup"] == pytest.approx(
                row["tau"] / (row["draft_block_cost"] + row["verify_cost"]))
        assert row["tokens_per_second"] > 0 and row["compile_seconds"] >= 0


def test_tokens_that_leave_plain_decoding_are_failures(tiny_lm, close_draft, monkeypatch):
    real = bench.speculative_generate

    def off_by_one(*args, **kwargs):  # a broken method: row 0's third token moves
        out = real(*args, **kwargs)
        return dataclasses.replace(out, tokens=out.tokens.at[0, 2].add(1))

    monkeypatch.setattr(bench, "speculative_generate", off_by_one)
    report = bench.run(tiny_lm, _methods(close_draft)[1:], PROMPTS[:2], max_new_tokens=8,
                       reps=1, cost_reps=1)
    assert not report.ok
    assert report.failures == [{"method": "lookup", "prompt": "p0", "category": "copy",
                                "position": 2},
                               {"method": "lookup", "prompt": "p1", "category": "copy",
                                "position": 2}]


def test_a_journal_resumes_without_measuring_again(tiny_lm, tmp_path, monkeypatch):
    journal = tmp_path / "run.journal.jsonl"
    methods = [BenchMethod("lookup", PromptLookup(), num_draft_tokens=2)]
    first = bench.run(tiny_lm, methods, PROMPTS, max_new_tokens=6, reps=1, cost_reps=1,
                      journal=journal)
    lines = journal.read_text().splitlines()
    assert len(lines) == 1 + 3 + 1  # the fingerprint, three units, one method's costs
    # Killed while writing the last unit: that unit alone runs again.
    journal.write_text("\n".join(lines[:4] + [lines[4][:20]]) + "\n")
    measured = []
    real = bench.measure_unit
    monkeypatch.setattr(bench, "measure_unit", lambda *a: measured.append(a[2]) or real(*a))
    again = bench.run(tiny_lm, methods, PROMPTS, max_new_tokens=6, reps=1, cost_reps=1,
                      journal=journal, resume=True)
    assert [[p.name for p in unit] for unit in measured] == [["p2"]]
    assert again.row("lookup", "copy") == first.row("lookup", "copy")
    # Another run's journal is refused by name.
    with pytest.raises(ValueError, match="different run"):
        bench.run(tiny_lm, methods, PROMPTS, max_new_tokens=7, reps=1, journal=journal,
                  resume=True)
    assert json.loads(journal.read_text().splitlines()[0])["fingerprint"]


def test_sampled_runs_report_no_exactness_verdict(tiny_lm):
    report = bench.run(tiny_lm, [BenchMethod("lookup", PromptLookup(), num_draft_tokens=2)],
                       PROMPTS[:1], max_new_tokens=6, reps=1, cost_reps=1,
                       sampling=specjax.SamplingConfig(temperature=0.8))
    assert report.ok and report.row("lookup")["exact"] is None


@pytest.mark.parametrize("methods, prompts, settings, message", [
    ([], PROMPTS, {}, "at least one method"),
    (["x", "x"], PROMPTS, {}, "names repeat"),
    (["x"], [], {}, "at least one prompt"),
    (["x"], PROMPTS, {"reps": 0}, "reps must be a positive integer"),
    (["x"], PROMPTS, {"batch_size": 1.5}, "batch_size"),
    (["x"], PROMPTS, {"sampling": [GREEDY]}, "one SamplingConfig"),
])
def test_bad_runs_are_refused_before_decoding(tiny_lm, methods, prompts, settings, message):
    methods = [BenchMethod(n, PromptLookup()) for n in methods]
    with pytest.raises((ValueError, TypeError), match=message):
        bench.run(tiny_lm, methods, prompts, max_new_tokens=4, **settings)


def test_a_method_names_plain_exactly_when_it_has_no_drafter():
    with pytest.raises(ValueError, match="needs a drafter"):
        BenchMethod("lookup")
    with pytest.raises(ValueError, match="plain decoding"):
        BenchMethod("plain", PromptLookup())
    with pytest.raises(ValueError, match="needs a name"):
        BenchMethod(" ", PromptLookup())


def test_a_prompt_too_long_for_the_target_is_refused_by_its_name(tiny_lm):
    long = BenchPrompt(tuple(range(1, 31)) * 4, "essays", "q81, turn 2")
    with pytest.raises(ValueError, match=r"prompt q81, turn 2 \(essays\) has 120 tokens"):
        bench.run(tiny_lm, _methods(tiny_lm)[1:], [PROMPTS[0], long], max_new_tokens=16)


def test_a_category_named_overall_is_refused_not_hidden(tiny_lm):
    prompts = [BenchPrompt((1, 2), "overall", "p0"), BenchPrompt((3, 4), "code", "p1")]
    with pytest.raises(ValueError, match="'p0' have the category 'overall'.*rename"):
        bench.run(tiny_lm, _methods(tiny_lm)[1:], prompts, max_new_tokens=4)
    # The only category: its rows are the all-prompts rows, nothing is hidden.
    report = bench.run(tiny_lm, _methods(tiny_lm)[1:], prompts[:1], max_new_tokens=4, reps=1,
                       cost_reps=1)
    assert [r["category"] for r in report.rows] == ["overall", "overall"]
