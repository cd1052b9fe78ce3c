"""specjax.bench.report: the rows of a run from its per-unit records (speedup as a ratio
of summed tokens/s, a bootstrap interval over units, tau, acceptance, C, v, ideal and
efficiency), exactness failures, and the markdown, CSV, JSON and SVG outputs."""

import csv
import io
import json
import xml.etree.ElementTree as ElementTree

import numpy as np
import pytest

from specjax.bench.prompts import BenchPrompt
from specjax.bench.report import bootstrap_interval, interpolated, summarise
from specjax.bench.runner import BenchMethod, plan_units
from specjax.drafters import PromptLookup

PROMPTS = [BenchPrompt((1, 2), "code", "a"), BenchPrompt((3,), "code", "b"),
           BenchPrompt((4, 5, 6), "chat", "c")]
METHODS = [BenchMethod("plain"), BenchMethod("lookup", PromptLookup(), num_draft_tokens=4)]


def _record(plain_seconds, lookup_seconds, *, tokens=10, mismatches=()):
    return {"plain": {"tokens": tokens, "median_seconds": plain_seconds, "compile_seconds": 1.0},
            "lookup": {"tokens": tokens, "median_seconds": lookup_seconds,
                       "compile_seconds": 2.0, "emitted": tokens, "target_forwards": 5,
                       "proposed": 15, "accepted": 5, "verification": "block",
                       "mismatches": list(mismatches)}}


COSTS = {"lookup": {"draft_seconds": 0.5, "forward_seconds": {"1": 1.0, "2": 1.2, "3": 1.5,
                                                               "5": 2.0}}}


def _report(records, temperature=0.0, costs=COSTS):
    units = plan_units(PROMPTS, 1)
    return summarise(methods=METHODS, prompts=PROMPTS, units=units, records=records,
                     costs=costs, settings={"sampling": {"temperature": temperature}},
                     bootstrap_samples=500)


def test_units_batch_prompts_within_a_category():
    prompts = [BenchPrompt((1,), c) for c in "xyxxy"]
    assert plan_units(prompts, 2) == [[0, 2], [3], [1, 4]]
    assert plan_units(prompts, 1) == [[0], [2], [3], [1], [4]]


def test_rows_are_ratios_of_summed_rates_with_costs_and_the_ideal():
    report = _report([_record(2.0, 1.0), _record(2.0, 0.5), _record(3.0, 1.0)])
    code = report.row("lookup", "code")
    # 20 tokens in 1.5 s against 20 tokens in 4 s
    assert code["speedup"] == pytest.approx(4.0 / 1.5)
    assert code["tokens_per_second"] == pytest.approx(20 / 1.5)
    assert code["tau"] == pytest.approx(20 / 10) and code["acceptance"] == pytest.approx(10 / 30)
    assert code["nodes_per_step"] == pytest.approx(3.0)
    # C = 0.5 of a one-token forward; v at width nodes + 1 = 4: between 3 (1.5) and 5 (2.0)
    assert code["draft_block_cost"] == pytest.approx(0.5)
    assert code["draft_cost"] == pytest.approx(0.5 / 4)
    assert code["verify_cost"] == pytest.approx(1.75)
    assert code["ideal_speedup"] == pytest.approx(2.0 / 2.25)
    assert code["efficiency"] == pytest.approx(code["speedup"] / code["ideal_speedup"])
    assert code["compile_seconds"] == pytest.approx(4.0) and code["exact"] is True
    assert report.row("lookup")["prompts"] == 3
    assert report.row("lookup")["speedup"] == pytest.approx(7.0 / 2.5)
    assert report.row("plain", "chat")["speedup"] == 1.0
    assert report.row("plain")["draft_cost"] is None and report.row("plain")["tau"] == 1.0
    # one unit: no interval
    assert report.row("lookup", "chat")["speedup_low"] is None
    low, high = report.row("lookup")["speedup_low"], report.row("lookup")["speedup_high"]
    assert low <= report.row("lookup")["speedup"] <= high
    with pytest.raises(KeyError):
        report.row("eagle")


def test_the_interval_resamples_units():
    # Every unit the same ratio: the interval is that ratio.
    assert bootstrap_interval([10, 20], [1, 2], [10, 20], [2, 4], 200) == pytest.approx(
        (2.0, 2.0))
    low, high = bootstrap_interval([10, 10, 10], [1, 2, 4], [10, 10, 10], [2, 2, 2], 2000)
    assert 0.5 <= low < high <= 2.0
    assert bootstrap_interval([1], [1], [1], [1], 100) == (None, None)


def test_interpolation_is_linear_between_widths_and_clamped():
    seconds = {"1": 1.0, "3": 2.0, "9": 5.0}
    assert interpolated(seconds, 2) == pytest.approx(1.5)
    assert interpolated(seconds, 6) == pytest.approx(3.5)
    assert interpolated(seconds, 20) == pytest.approx(5.0)


def test_a_mismatch_is_a_failure_that_names_the_prompt():
    miss = {"prompt": "b", "category": "code", "position": 3}
    report = _report([_record(1, 1), _record(1, 1, mismatches=[miss]), _record(1, 1)])
    assert not report.ok
    assert report.failures == [{"method": "lookup", **miss}]
    assert report.row("lookup", "code")["exact"] is False
    assert report.row("lookup", "chat")["exact"] is True
    text = report.to_markdown()
    assert "1 exactness failure" in text and "prompt b (code), first difference at new " \
        "token 3" in text


def test_sampled_runs_compare_only_distributions():
    report = _report([_record(1, 1)] * 3, temperature=0.7)
    assert report.ok and report.row("lookup")["exact"] is None
    assert "distribution only" in report.to_markdown()


def test_csv_json_and_svg_carry_every_row(tmp_path):
    report = _report([_record(2.0, 1.0), _record(2.0, 0.5), _record(3.0, 1.0)], costs={})
    rows = list(csv.DictReader(io.StringIO(report.to_csv(tmp_path / "r.csv"))))
    assert len(rows) == len(report.rows) == 6
    assert float(rows[3]["speedup"]) == pytest.approx(report.rows[3]["speedup"])
    assert (tmp_path / "r.csv").read_text() == report.to_csv()
    report.to_json(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["rows"][4]["category"] == "chat"
    assert report.row("lookup")["ideal_speedup"] is None  # no costs measured
    svg = ElementTree.fromstring(report.to_svg(tmp_path / "r.svg"))
    bars = [e for e in svg.iter() if e.tag.endswith("rect") and e.find(
        "{http://www.w3.org/2000/svg}title") is not None]
    assert len(bars) == 3  # lookup in code, chat, overall
    heights = [float(b.get("height")) for b in bars]
    speedups = [report.row("lookup", c)["speedup"] for c in ("code", "chat", "overall")]
    np.testing.assert_allclose(np.array(heights) / heights[0],
                               np.array(speedups) / speedups[0], rtol=1e-3)


def test_rows_of_the_lossy_rule_say_not_exact_in_every_format(tmp_path):
    typical = "typical (not exact; epsilon=0.09, delta=0.3)"
    records = [_record(2.0, 1.0), _record(2.0, 0.5), _record(3.0, 1.0)]
    for record in records:
        record["lookup"]["verification"] = typical
    for temperature in (0.0, 0.8):
        report = _report(records, temperature)
        row = report.row("lookup")
        assert row["exact"] is False and row["verification"] == typical
        table = report.to_markdown()
        assert "| NOT exact (typical: epsilon=0.09, delta=0.3) |" in table
        assert "distribution only" not in table.split("| lookup |")[1]
        rows = list(csv.DictReader(io.StringIO(report.to_csv())))
        assert {r["exact"] for r in rows if r["method"] == "lookup"} == {"False"}
        assert all(r["exact"] is False for r in report.as_dict()["rows"]
                   if r["method"] == "lookup")
