"""specjax.cli.layouts: `--layers auto` decided by the timings runs recorded on this
machine (the choice rule, the file, and two `specjax generate` runs that measure both
layouts)."""

import argparse
import json
import os

import pytest
from conftest import run_cli

from specjax.cli.layouts import (
    SCANNED,
    SCANNED_UP_TO_TOKENS,
    UNROLLED,
    choose_layout,
    measured_layouts,
    read_timings,
    record_timing,
    timings_path,
)


def _args(**overrides):
    values = dict(model="bundled", target="target", hf=None, gguf=None, drafter=None,
                  draft=None, no_speculation=True, num_draft_tokens=4, tree=None, mesh=None,
                  layers="auto", max_new_tokens=32)
    values.update(overrides)
    return argparse.Namespace(**values)


def test_both_measured_picks_the_least_total_time():
    # Scanned starts 2 s sooner and costs 0.05 s more per token: it wins below 40 tokens.
    measured = {SCANNED: {"start_seconds": 1.0, "seconds_per_token": 0.15},
                UNROLLED: {"start_seconds": 3.0, "seconds_per_token": 0.10}}
    assert choose_layout(measured, 39)[0] == SCANNED
    assert choose_layout(measured, 41)[0] == UNROLLED
    layout, why = choose_layout(measured, 41)
    assert "measured here" in why and "scanned" in why and "unrolled" in why
    # A tie goes to the unrolled layout (faster steps for what the request did not count).
    assert choose_layout(measured, 40)[0] == UNROLLED
    # Where the scanned step is no slower (a compiler that feeds matmuls from the stack),
    # scanned wins at every length.
    fast_scan = dict(measured, scanned={"start_seconds": 1.0, "seconds_per_token": 0.10})
    assert choose_layout(fast_scan, 10_000)[0] == SCANNED


def test_a_layout_that_only_compiled_is_run_again_before_it_is_compared():
    measured = {SCANNED: {"start_seconds": 1.0, "seconds_per_token": 0.15, "runs": 3},
                UNROLLED: {"start_seconds": 9.0, "seconds_per_token": 0.10, "runs": 1}}
    layout, why = choose_layout(measured, 8)
    assert layout == UNROLLED and "measuring it again" in why
    measured[UNROLLED]["runs"] = 2
    assert choose_layout(measured, 8)[0] == SCANNED
    measured[SCANNED]["runs"] = measured[UNROLLED]["runs"] = 1  # both compiled: comparable
    assert choose_layout(measured, 8)[0] == SCANNED


def test_one_measured_runs_the_other_and_none_follows_the_fixed_rule():
    one = {SCANNED: {"start_seconds": 1.0, "seconds_per_token": 0.1}}
    assert choose_layout(one, 8) == (UNROLLED, "measuring it (only scanned was measured here)")
    assert choose_layout({UNROLLED: one[SCANNED]}, 8_000)[0] == SCANNED
    assert choose_layout({}, SCANNED_UP_TO_TOKENS)[0] == SCANNED
    assert choose_layout({}, SCANNED_UP_TO_TOKENS + 1)[0] == UNROLLED


def test_records_keep_the_fastest_start_and_the_latest_per_token(tmp_path):
    path = tmp_path / "timings.json"
    args = _args()
    record_timing(args, True, 5.0, 0.2, path)
    record_timing(args, True, 1.5, 0.3, path)  # a load from the compilation cache
    record_timing(args, True, 4.0, 0.25, path)
    assert measured_layouts(args, path) == {
        SCANNED: {"start_seconds": 1.5, "seconds_per_token": 0.25, "runs": 3}}
    # Another mode, model or layout is another record.
    record_timing(_args(no_speculation=False), False, 2.0, 0.1, path)
    record_timing(_args(model="smollm2"), False, 2.0, 0.1, path)
    assert measured_layouts(args, path).keys() == {SCANNED}
    assert len(read_timings(path)) == 3
    # Nonsense timings are not recorded.
    record_timing(args, False, float("nan"), 0.1, path)
    record_timing(args, False, 1.0, 0.0, path)
    assert measured_layouts(args, path).keys() == {SCANNED}
    # Nothing left beside the file (no temporary of the atomic writes).
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".layout-timings-")]
    assert [p.name for p in tmp_path.iterdir()] == ["timings.json"]


def test_an_unreadable_or_foreign_file_counts_as_nothing_measured(tmp_path):
    path = tmp_path / "timings.json"
    record_timing(_args(), True, 1.0, 0.1, path)
    (key,) = read_timings(path)  # this request's entry, then damaged in each way below
    assert measured_layouts(_args(), path).keys() == {SCANNED}
    negative = {SCANNED: {"start_seconds": -1, "seconds_per_token": 1}}
    bad_runs = {SCANNED: {"start_seconds": 1, "seconds_per_token": 1, "runs": "x"}}
    for text in ("{cut", "[]", json.dumps({"format": 999, "entries": {}}),
                 json.dumps({"format": 1, "entries": {key: negative}}),
                 json.dumps({"format": 1, "entries": {key: bad_runs}}),
                 json.dumps({"format": 1, "entries": {key: "not a record"}})):
        path.write_text(text)
        assert measured_layouts(_args(), path) == {}
    record_timing(_args(), False, 1.0, 0.1, path)  # a damaged file is rebuilt
    assert measured_layouts(_args(), path).keys() == {UNROLLED}


def test_the_environment_names_the_file_or_turns_the_records_off(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECJAX_LAYOUT_TIMINGS", str(tmp_path / "mine.json"))
    assert timings_path() == tmp_path / "mine.json"
    monkeypatch.setenv("SPECJAX_LAYOUT_TIMINGS", "off")
    assert timings_path() is None
    record_timing(_args(), True, 1.0, 0.1)  # nowhere to write: nothing happens
    assert measured_layouts(_args()) == {}
    monkeypatch.delenv("SPECJAX_LAYOUT_TIMINGS")
    monkeypatch.setenv("SPECJAX_MODEL_CACHE", str(tmp_path / "models"))
    assert timings_path() == tmp_path / "models" / "layout-timings.json"


@pytest.mark.slow  # four runs of the bundled target: ~20 s
def test_two_generate_runs_measure_both_layouts_then_auto_picks_by_them(tmp_path):
    path = tmp_path / "timings.json"
    env = dict(os.environ, SPECJAX_LAYOUT_TIMINGS=str(path))
    run = lambda n: run_cli("generate", "def parse(source):\n    ", "--json", "--no-speculation",
                            "--max-new-tokens", str(n), env=env)
    first = run(8)
    assert first.returncode == 0, first.stderr
    assert "layers scanned (nothing measured here yet" in first.stderr
    second = run(8)
    assert second.returncode == 0, second.stderr
    assert "layers unrolled (measuring it (only scanned" in second.stderr
    assert json.loads(second.stdout)["tokens"] == json.loads(first.stdout)["tokens"]
    entries = read_timings(path)
    (entry,) = entries.values()
    assert entry.keys() == {SCANNED, UNROLLED}
    # From now on the measurements decide (each layout's start measured warm too).
    for n in (4, 300, 300):
        entry = next(iter(read_timings(path).values()))
        expected, why = choose_layout(entry, n)
        out = run(n)
        assert out.returncode == 0, out.stderr
        assert f"layers {expected} ({why.split(':')[0]}" in out.stderr
    runs = {layout: t["runs"] for layout, t in read_timings(path)[next(iter(entries))].items()}
    assert sum(runs.values()) == 5 and min(runs.values()) >= 2
    # An explicit layout is kept (and its run recorded too).
    explicit = run_cli("generate", "x", "--json", "--no-speculation", "--max-new-tokens", "4",
                       "--layers", "scanned", env=env)
    assert explicit.returncode == 0 and "layers scanned (" not in explicit.stderr
