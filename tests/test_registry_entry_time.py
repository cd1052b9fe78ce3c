"""benchmarks/machines/registry_entry_time.py: one registry entry's chi-square call timed twice."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import subprocess_env

from benchmarks.machines import registry_entry_time

ROOT = Path(__file__).resolve().parents[1]


def test_an_unknown_entry_is_refused_with_the_names(capsys):
    with pytest.raises(SystemExit) as exit_:
        registry_entry_time.main(["no such entry"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no entry 'no such entry'" in err and "draft model, chain, sampled" in err


@pytest.mark.slow  # one 36,256-row decode compiled and run: 10 s
def test_an_entry_is_timed_and_its_pvalues_printed():
    done = subprocess.run([sys.executable, "-m", "benchmarks.machines.registry_entry_time",
                           "prompt lookup, chain", "--calls", "1", "--level", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=subprocess_env())
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("call 0: ") and "p-values [1.0, " in line
    made = line.split("(")[1].split(")")[0]  # "N programs made: trace T s, ..."
    assert int(made.split()[0]) > 0 and float(made.split("backend ")[1].split()[0]) > 0
    pvalues = [float(p) for p in line.split("[")[1].rstrip("]").split(",")]
    assert len(pvalues) == 4 and all(p > 1e-3 for p in pvalues)
