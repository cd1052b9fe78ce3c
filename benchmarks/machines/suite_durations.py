"""The test suite in CPU-seconds of tests, per module: pytest's `--durations=0` lines summed
(setup, call and teardown of every test), for the unit suite and the slow set of a
`PYTEST_ADDOPTS=--durations=0 bash .ci/run` log, two logs side by side (before, after).

A test's duration is the wall time of its worker process while it ran; with one worker per
core (the suite's `-n auto --maxprocesses=4` on 2 cores) their sum is the suite's CPU time
spent in tests, which does not depend on how the workers shared the machine, as the wall
clock of the whole run does.

    python -m benchmarks.machines.suite_durations BEFORE.log AFTER.log --labels 94c96de HEAD \\
        [--top 25]
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(tests/[^:\s]+)::")
HEADER = re.compile(r"=+ slowest durations =+")
SUMMARY = re.compile(r"^=*\s*((?:\d+ [a-z]+, )*\d+ (?:passed|failed)[^\n]*?) in ([0-9.]+)s",
                     re.M)


def runs_of(log: str) -> list[dict]:
    """Each pytest run of the log (unit, then slow): seconds per module, and its summary."""
    parts = HEADER.split(log)[1:]
    runs = []
    for part in parts:
        per_module: dict[str, float] = defaultdict(float)
        for line in part.splitlines():
            match = LINE.match(line)
            if match:
                per_module[match.group(3)] += float(match.group(1))
        summary = SUMMARY.search(part)
        runs.append({"modules": dict(per_module),
                     "summary": summary.group(1) if summary else "?",
                     "wall": float(summary.group(2)) if summary else float("nan")})
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--labels", nargs=2, default=("before", "after"))
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    logs = [runs_of(path.read_text()) for path in (args.before, args.after)]
    before, after = args.labels
    lines = []
    for index, name in enumerate(("unit suite (`pytest -q`)", "slow set (`pytest -q -m slow`)")):
        if any(len(runs) <= index for runs in logs):
            continue
        old, new = (runs[index] for runs in logs)
        total_old, total_new = sum(old["modules"].values()), sum(new["modules"].values())
        lines += [f"### {name}", "",
                  f"{before}: {old['summary']}, wall {old['wall']:.0f} s, tests' seconds "
                  f"summed {total_old:.0f} s; {after}: {new['summary']}, wall "
                  f"{new['wall']:.0f} s, summed {total_new:.0f} s "
                  f"({total_new / total_old:.2f}x).", "",
                  f"| module | {before} s | {after} s | change s |", "|---|---|---|---|"]
        modules = set(old["modules"]) | set(new["modules"])
        ranked = sorted(modules, key=lambda m: -max(old["modules"].get(m, 0),
                                                   new["modules"].get(m, 0)))
        for module in ranked[:args.top]:
            a, b = old["modules"].get(module, 0.0), new["modules"].get(module, 0.0)
            lines.append(f"| {module} | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
        rest = ranked[args.top:]
        if rest:
            a = sum(old["modules"].get(m, 0.0) for m in rest)
            b = sum(new["modules"].get(m, 0.0) for m in rest)
            lines.append(f"| {len(rest)} other modules | {a:.1f} | {b:.1f} | {b - a:+.1f} |")
        lines.append("")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
