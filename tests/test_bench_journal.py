"""specjax.bench.journal: a benchmark's journal survives a kill at any byte (a torn line is
dropped and reported, every complete record before and after it is read, a resumed run
appends after the last complete record), and a journal of another run is refused naming
what differs."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import specjax.bench.runner as bench
from specjax import PromptLookup
from specjax.bench.journal import Journal, read_journal
from specjax.bench.prompts import BenchPrompt
from specjax.bench.runner import BenchMethod

HEADER = {"fingerprint": "f", "parts": {"target": "t", "prompts": "p"}}
RECORDS = [{"unit": "0", "record": {"plain": {"tokens": 3}}},
           {"method": "lookup", "costs": {"draft_seconds": 0.5}},
           {"unit": "1", "record": {"plain": {"tokens": 4, "text": "\u2028 é"}}},
           {"unit": "2", "record": {"plain": {"tokens": 5}}}]


def _journal(path: Path) -> list[int]:
    """A whole journal at `path`; the byte offsets where each line ends (after its
    newline)."""
    journal = Journal(path)
    journal.start(HEADER)
    for record in RECORDS:
        journal.append(record)
    data = path.read_bytes()
    return [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]


def test_a_journal_cut_at_any_byte_keeps_every_complete_record(tmp_path):
    path = tmp_path / "run.journal.jsonl"
    ends = _journal(path)
    data = path.read_bytes()
    for cut in range(len(data) + 1):
        path.write_bytes(data[:cut])
        contents = read_journal(path)
        whole = sum(end <= cut for end in ends)  # complete lines, the header first
        assert (contents.header == HEADER) == (whole >= 1), cut
        kept = RECORDS[:max(whole - 1, 0)]
        assert contents.units == {r["unit"]: r["record"] for r in kept if "unit" in r}, cut
        assert contents.costs == {r["method"]: r["costs"] for r in kept if "method" in r}
        assert contents.complete_bytes == (ends[whole - 1] if whole else 0)
        torn = cut > contents.complete_bytes
        assert any("cut off" in note for note in contents.dropped) == torn, cut


def test_a_resumed_journal_appends_after_its_last_complete_record(tmp_path):
    path = tmp_path / "run.journal.jsonl"
    ends = _journal(path)
    path.write_bytes(path.read_bytes()[:ends[2] + 7])  # killed while writing unit 1
    notes = []
    journal = Journal(path)
    units, costs = journal.resume(HEADER, notes.append)
    assert set(units) == {"0"} and set(costs) == {"lookup"}
    assert len(notes) == 1 and "cut off" in notes[0] and str(path) in notes[0]
    journal.append(RECORDS[2])
    journal.append(RECORDS[3])
    again = read_journal(path)  # a second resume reads every record, drops nothing
    assert set(again.units) == {"0", "1", "2"} and again.dropped == []


def test_a_record_an_older_writer_appended_onto_a_torn_line_is_read(tmp_path):
    path = tmp_path / "run.journal.jsonl"
    lines = [json.dumps(HEADER), json.dumps(RECORDS[0]),
             json.dumps(RECORDS[2])[:15] + json.dumps(RECORDS[3]), json.dumps(RECORDS[1])]
    path.write_text("\n".join(lines) + "\n")
    contents = read_journal(path)
    assert set(contents.units) == {"0", "2"} and set(contents.costs) == {"lookup"}
    assert contents.dropped == ["line 3 was damaged by a kill (the whole record at its end "
                                "was read)"]


@pytest.mark.parametrize("content", [b"", b'{"fingerprint": "ab', b"\n"])
def test_a_journal_with_no_complete_header_starts_afresh_and_says_so(tmp_path, content):
    path = tmp_path / "run.journal.jsonl"
    path.write_bytes(content)
    notes = []
    assert Journal(path).resume(HEADER, notes.append) == ({}, {})
    assert len(notes) == 1 and str(path) in notes[0] and "afresh" in notes[0]
    assert json.loads(path.read_text()) == HEADER


def test_another_runs_journal_is_refused_naming_what_differs(tmp_path):
    path = tmp_path / "run.journal.jsonl"
    _journal(path)
    other = {"fingerprint": "g", "parts": {"target": "t", "prompts": "q"}}
    with pytest.raises(ValueError, match=r"its prompts differs .*delete it"):
        Journal(path).resume(other, print)


PROMPTS = [BenchPrompt((1, 2, 3, 4, 1, 2), "copy", "p0"), BenchPrompt((7, 7), "copy", "p1"),
           BenchPrompt((30, 2, 5, 9), "other", "p2")]
METHODS = [BenchMethod("lookup", PromptLookup(), num_draft_tokens=2)]


def test_resuming_twice_measures_nothing_again_and_counts_compiles_once(tiny_lm, tmp_path,
                                                                        monkeypatch):
    path = tmp_path / "run.journal.jsonl"
    first = bench.run(tiny_lm, METHODS, PROMPTS, max_new_tokens=6, reps=1, cost_reps=1,
                      journal=path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 9])  # killed while writing the last unit
    measured, seen = [], []
    real = bench.measure_unit
    monkeypatch.setattr(bench, "measure_unit", lambda *a: measured.append(a[2]) or real(*a))
    for _ in range(2):
        again = bench.run(tiny_lm, METHODS, PROMPTS, max_new_tokens=6, reps=1, cost_reps=1,
                          journal=path, resume=True, log=seen.append,
                          progress=lambda done, total, _: seen.append((done, total)))
    assert [[p.name for p in unit] for unit in measured] == [["p2"]]  # once, not twice
    assert seen[0].startswith("specjax bench: the journal") and "cut off" in seen[0]
    # Progress: the resumed units once, then each unit measured; the second resume: once.
    assert seen[1:] == [(2, 3), (3, 3), (3, 3)]
    for method in ("plain", "lookup"):
        for category in ("copy", "other", "overall"):
            before, after = first.row(method, category), again.row(method, category)
            assert after["compile_seconds"] == before["compile_seconds"]
            assert after["tokens"] == before["tokens"] and after["tau"] == before["tau"]


def test_the_fingerprint_covers_the_weights_and_the_drafters(tiny_lm, random_draft,
                                                             close_draft, tmp_path):
    path = tmp_path / "run.journal.jsonl"
    draft = [BenchMethod("draft", specjax_draft(close_draft), num_draft_tokens=2)]
    bench.run(tiny_lm, draft, PROMPTS[:1], max_new_tokens=3, reps=1, cost_reps=1,
              journal=path)
    # Another model of the same shapes (a fine-tune of the same architecture).
    with pytest.raises(ValueError, match="its target differs"):
        bench.run(random_draft, draft, PROMPTS[:1], max_new_tokens=3, reps=1, journal=path,
                  resume=True)
    other = [BenchMethod("draft", specjax_draft(random_draft), num_draft_tokens=2)]
    with pytest.raises(ValueError, match="its drafters differs"):
        bench.run(tiny_lm, other, PROMPTS[:1], max_new_tokens=3, reps=1, journal=path,
                  resume=True)
    with pytest.raises(ValueError, match="its methods differs"):
        bench.run(tiny_lm, [BenchMethod("draft", specjax_draft(close_draft),
                                        num_draft_tokens=2, verification="token")],
                  PROMPTS[:1], max_new_tokens=3, reps=1, journal=path, resume=True)


def specjax_draft(lm):
    from specjax import DraftModel

    return DraftModel(lm, "sample")


# A bench run in a process of its own, on a model it builds (tiny_lm's shapes and seed):
# killed with SIGKILL, resumed, it must come to the table an uninterrupted run makes.
SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    from conftest import build_lm
    import specjax.bench.runner as bench
    from specjax import PromptLookup
    from specjax.bench.runner import BenchMethod
    from specjax.bench.prompts import BenchPrompt
    prompts = [BenchPrompt((1, 2, 3, 4, 1, 2), "copy", "p0"), BenchPrompt((7, 7), "copy", "p1"),
               BenchPrompt((30, 2, 5, 9), "other", "p2"), BenchPrompt((5, 6, 5), "other", "p3")]
    report = bench.run(build_lm(0), [BenchMethod("lookup", PromptLookup(), num_draft_tokens=2)],
                       prompts, max_new_tokens=8, reps=1, cost_reps=1, journal=sys.argv[1],
                       resume=sys.argv[2] == "resume", log=print)
    keys = ("method", "category", "prompts", "tokens", "tau", "acceptance", "exact",
            "verification", "nodes_per_step")
    print("TABLE", json.dumps([{{k: r[k] for k in keys}} for r in report.rows]))
""")


def _bench_process(journal: Path, mode: str) -> subprocess.Popen:
    script = SCRIPT.format(tests=str(Path(__file__).parent))
    return subprocess.Popen([sys.executable, "-c", script, str(journal), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _table(process: subprocess.Popen) -> list:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    return json.loads(next(line for line in out.splitlines() if line.startswith("TABLE"))[5:])


@pytest.mark.slow  # five processes, each compiling its decoders
def test_a_run_killed_at_several_points_resumes_to_the_uninterrupted_table(tmp_path):
    whole = _table(_bench_process(tmp_path / "whole.jsonl", "fresh"))
    journal = tmp_path / "killed.jsonl"
    mode = "fresh"
    for lines in (1, 3, 5):  # after the header, after a unit and costs, mid-run
        process = _bench_process(journal, mode)
        deadline = time.monotonic() + 300
        while (not journal.exists() or journal.read_bytes().count(b"\n") < lines) and \
                process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        # A kill inside a write: a torn record after the last whole line.
        with open(journal, "ab") as torn:
            torn.write(b'{"unit": "3", "record": {"plain": {"compile_se')
        mode = "resume"
    assert _table(_bench_process(journal, "resume")) == whole
    contents = read_journal(journal)
    assert contents.dropped == [] and set(contents.units) == {"0", "1", "2", "3"}
