"""benchmarks/machines/suite_profile.py: JAX's compile events counted per test module, and the
table over every process's file."""

import json

import jax
import jax.numpy as jnp
import pytest

from benchmarks.machines import suite_profile


def test_compile_events_count_the_programs_made_between_start_and_stop():
    events = suite_profile.CompileEvents().start()
    try:
        jax.jit(lambda x: x * 3 + 1)(jnp.arange(7))
    finally:
        events.stop()
    counted = events.snapshot()
    assert counted["programs"] >= 1 and counted["backend"] > 0
    assert counted["trace"] > 0 and counted["lowering"] > 0
    assert counted["small_programs"] <= counted["programs"]
    jax.jit(lambda x: x - 2)(jnp.arange(9))  # after stop: not counted
    assert events.snapshot() == counted
    events.stop()  # stopping twice is harmless


def test_a_recorder_writes_each_modules_sums_and_the_table_adds_processes(tmp_path):
    recorder = suite_profile.ModuleRecorder()
    recorder.configure({suite_profile.OUTPUT_VARIABLE: str(tmp_path)})
    before = recorder.events.snapshot()
    jax.jit(lambda x: x * 5)(jnp.arange(11))
    recorder.add("tests/test_a.py", before, wall_s=2.0, cpu_s=1.5)
    recorder.write("gw0-1")
    assert not recorder.events.listening
    row = dict.fromkeys(suite_profile.COLUMNS, 1.0)
    (tmp_path / "gw1-2.jsonl").write_text(
        json.dumps({"module": "tests/test_a.py", **row}) + "\n"
        + json.dumps({"module": "tests/test_b.py", **row, "wall": 5.0}))
    table = suite_profile.summarize(tmp_path)
    assert [r["module"] for r in table] == ["tests/test_b.py", "tests/test_a.py", "total"]
    assert table[1]["wall"] == 3.0 and table[1]["cpu"] == 2.5
    assert table[1]["programs"] >= 2 and table[-1]["wall"] == 8.0
    assert "| tests/test_b.py | 5.0 |" in suite_profile.markdown(table)


def test_an_empty_folder_or_no_folder_is_refused_by_name(tmp_path):
    with pytest.raises(FileNotFoundError, match="no profile in"):
        suite_profile.summarize(tmp_path)
    recorder = suite_profile.ModuleRecorder()
    with pytest.raises(pytest.UsageError, match="SPECJAX_SUITE_PROFILE"):
        recorder.configure({})
    assert recorder.write("main-1") is None and not recorder.events.listening
