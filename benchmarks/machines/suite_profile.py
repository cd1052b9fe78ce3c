"""Where a pytest run's time goes, test module by test module: JAX's tracing, lowering and
XLA compile events counted inside every test process (pytest-xdist's workers included),
beside each module's wall and CPU time.

    SPECJAX_SUITE_PROFILE=/tmp/profile pytest -q -p benchmarks.machines.suite_profile
    python -m benchmarks.machines.suite_profile /tmp/profile      # the table, largest module first

A module's row: its tests' wall and CPU seconds (setup and teardown included), then the
seconds JAX spent tracing (`jaxpr_trace`), lowering to StableHLO (`lowering`) and in XLA's
backend compile (`backend`, with the number of programs), and of those programs the
small ones (backend compile under 0.1 s: mostly operations run one by one outside jit,
each of which compiles a program of its own). Work in subprocesses (the command line's
runs, notebook kernels, the sharded tests' scripts) is in the module's wall time only.
Nothing is recorded without `-p benchmarks.machines.suite_profile`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path

import jax
import pytest

# JAX's events (jax.monitoring) for the three stages of making a program.
STAGES = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lowering",
          "/jax/core/compile/backend_compile_duration": "backend"}
SMALL_PROGRAM_SECONDS = 0.1
OUTPUT_VARIABLE = "SPECJAX_SUITE_PROFILE"
COLUMNS = ("wall", "cpu", "trace", "lowering", "backend", "programs", "small_programs",
           "small_backend")


class CompileEvents:
    """Running sums of JAX's tracing, lowering and compile seconds in this process, from
    `start()` to `stop()`. `snapshot()` is a copy of the sums."""

    def __init__(self):
        self.sums: collections.Counter = collections.Counter()
        self.listening = False

    def _listener(self, event: str, duration: float, **_) -> None:
        stage = STAGES.get(event)
        if stage is None:
            return
        self.sums[stage] += duration
        if stage == "backend":
            self.sums["programs"] += 1
            if duration < SMALL_PROGRAM_SECONDS:
                self.sums["small_programs"] += 1
                self.sums["small_backend"] += duration

    def start(self) -> CompileEvents:
        if not self.listening:
            jax.monitoring.register_event_duration_secs_listener(self._listener)
            self.listening = True
        return self

    def stop(self) -> None:
        if self.listening:
            jax.monitoring.unregister_event_duration_listener(self._listener)
            self.listening = False

    def snapshot(self) -> collections.Counter:
        return collections.Counter(self.sums)


# ------------------------------------------------------------------ the pytest plugin

class ModuleRecorder:
    """What the plugin keeps in one test process: the compile events, and per test module
    the sums of its tests' wall, CPU and compile seconds."""

    def __init__(self):
        self.events = CompileEvents()
        self.modules: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)
        self.folder: Path | None = None

    def configure(self, environ) -> None:
        if not environ.get(OUTPUT_VARIABLE):
            raise pytest.UsageError(
                f"-p benchmarks.machines.suite_profile writes into the folder ${OUTPUT_VARIABLE} "
                f"names; set it, e.g. {OUTPUT_VARIABLE}=/tmp/profile pytest -p "
                "benchmarks.machines.suite_profile")
        self.folder = Path(environ[OUTPUT_VARIABLE])
        self.events.start()

    def add(self, module: str, before: collections.Counter, wall_s: float,
            cpu_s: float) -> None:
        row = self.modules[module]
        row["wall"] += wall_s
        row["cpu"] += cpu_s
        row.update(self.events.snapshot() - before)

    def write(self, name: str) -> Path | None:
        """Stop listening and write one JSON line per module into `folder/name.jsonl`
        (nothing when configure refused)."""
        if self.folder is None:
            return None
        self.events.stop()
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{name}.jsonl"
        with open(path, "w") as out:
            for module, row in self.modules.items():
                out.write(json.dumps({"module": module, **row}) + "\n")
        return path


_recorder = ModuleRecorder()


def pytest_configure(config) -> None:
    _recorder.configure(os.environ)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before, wall, cpu = _recorder.events.snapshot(), time.perf_counter(), os.times()
    yield
    now = os.times()
    _recorder.add(item.nodeid.split("::")[0], before, time.perf_counter() - wall,
                  (now.user + now.system) - (cpu.user + cpu.system))


def pytest_unconfigure(config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _recorder.write(f"{worker}-{os.getpid()}")


# ------------------------------------------------------------------ the table

def summarize(folder: str | Path) -> list[dict]:
    """One row per test module over every process's file in `folder` (a module split
    over several processes adds up), largest wall first, then a "total" row."""
    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    files = sorted(Path(folder).glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no profile in {folder}: run pytest with "
                                f"{OUTPUT_VARIABLE}={folder} -p benchmarks.machines.suite_profile")
    for path in files:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            rows[record.pop("module")].update(record)
    table = [{"module": name, **{c: row[c] for c in COLUMNS}}
             for name, row in sorted(rows.items(), key=lambda item: -item[1]["wall"])]
    total = {c: sum(row[c] for row in table) for c in COLUMNS}
    return table + [{"module": "total", **total}]


def markdown(table: list[dict]) -> str:
    lines = ["| module | wall s | CPU s | trace s | lowering s | backend s (programs) | "
             "small programs (backend s) |", "|---|---|---|---|---|---|---|"]
    for row in table:
        lines.append(f"| {row['module']} | {row['wall']:.1f} | {row['cpu']:.1f} | "
                     f"{row['trace']:.1f} | {row['lowering']:.1f} | {row['backend']:.1f} "
                     f"({row['programs']:.0f}) | {row['small_programs']:.0f} "
                     f"({row['small_backend']:.1f}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help=f"the folder ${OUTPUT_VARIABLE} named for the run")
    parser.add_argument("--top", type=int, default=25, help="modules shown (default 25)")
    args = parser.parse_args(argv)
    try:
        table = summarize(args.folder)
    except FileNotFoundError as error:
        parser.error(str(error))
    print(markdown(table[:-1][:args.top] + table[-1:]))


if __name__ == "__main__":
    main()
