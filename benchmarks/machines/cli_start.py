"""How long the command line takes to answer before any decoding: `specjax --help`, an
option refused before the library is needed (`--max-new-tokens 0`) and one the library
validates (`--temperature -1`, which loads the sampling module and so jax). Each is a
fresh `python -m specjax.cli` process; medians of alternating runs.

`--compare-with REV` times the same commands from another revision of this repository (a
temporary worktree, run in that folder so that `python -m` imports its package) in the
same alternation, e.g. the commit before the command line became a package with lazy
imports:

        python -m benchmarks.machines.cli_start --reps 9 --compare-with a269827
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from benchmarks.common import checkout_of, command_line, cpu_model, median, write_results

NAME = "cli_start_cpu"
COMMANDS = {
    "specjax --help": ["--help"],
    "refused before the library (--max-new-tokens 0)": ["generate", "x", "--max-new-tokens",
                                                        "0"],
    "refused by the library (--temperature -1)": ["generate", "x", "--temperature", "-1"],
}


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wall(argv: list[str], checkout: str) -> float:
    """Seconds of one `python -m specjax.cli ARGV` run in `checkout` (`-m` puts the working
    directory first on sys.path, so it runs that checkout's package)."""
    env = dict(os.environ, SPECJAX_COMPILATION_CACHE="off")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "specjax.cli", *argv], env=env, cwd=checkout,
                   capture_output=True, check=False)
    return time.perf_counter() - start


def revision(checkout: str) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout,
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() or "not a git checkout"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--compare-with", default=None, metavar="REV",
                        help="a git revision of this repository to time alongside")
    args = parser.parse_args()
    builds = {f"this checkout ({revision(ROOT)})": ROOT}
    if args.compare_with:
        other = str(checkout_of(args.compare_with))
        builds[f"--compare-with ({revision(other)})"] = other
    times = {(build, name): [] for build in builds for name in COMMANDS}
    for _ in range(args.reps):
        for name, argv in COMMANDS.items():
            for build, path in builds.items():
                times[(build, name)].append(wall(argv, path))
    rows = [{"command": name, "build": build, "median_seconds": median(values),
             "seconds": values} for (build, name), values in times.items()]
    lines = [f"# Command-line start ({cpu_model() or 'unknown CPU'}, {os.cpu_count()} cores)",
             "", f"`{command_line()}`; a fresh process per run, median of {args.reps} "
             "alternating runs.", "", "| command | " + " | ".join(builds) + " |",
             "|---|" + "---|" * len(builds)]
    for name in COMMANDS:
        cells = [f"{median(times[(build, name)]):.2f} s" for build in builds]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    write_results(NAME, {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
                         "command": command_line(), "compare_with": args.compare_with,
                         "rows": rows}, markdown)


if __name__ == "__main__":
    main()
