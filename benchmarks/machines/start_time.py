"""How long a real model takes to answer from a fresh process, cold (empty compilation and
model caches) and warm (both filled by the cold run), split into phases.

- The command: `specjax generate --model smollm2 "What is the capital of France?"
  --max-new-tokens 16` (its wall time from outside; `--layers auto` scans the layers for
  so short a request), the same with `--layers unrolled`, and `specjax chat` to its first
  streamed byte.
- The layouts' break-even: a 200-token answer (`LONG_QUESTION`) with `--layers scanned`
  and `--layers unrolled` (what `auto` picks for 200), cold and warm.
- The phases, timed inside a fresh process that does what the command does: importing
  specjax, specjax_models and jax; loading the weights (`from_gguf`, layers scanned as the
  command's auto picks); the tokenizer (`gguf_tokenizer`); the first decode call
  (compilation or loading it from the persistent cache, plus the generation); the
  generation alone (a second call).
- `--compare-with REV` runs the command from another git revision too (a temporary
  worktree; e.g. the commit before the model cache), in the same alternation.

    python -m benchmarks.machines.start_time --reps 3 [--compare-with a269827]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import command_line, cpu_model, median, packages_of, write_results

NAME = "start_time_cpu"
ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"
LONG_QUESTION = "Write a long story about a dragon who learns to code."
# (label, extra options, question, max new tokens) of each timed command.
COMMANDS = (("generate", (), QUESTION, 16),
            ("generate --layers unrolled", ("--layers", "unrolled"), QUESTION, 16),
            ("generate 200 tokens --layers scanned", ("--layers", "scanned"), LONG_QUESTION,
             200),
            ("generate 200 tokens --layers unrolled", ("--layers", "unrolled"), LONG_QUESTION,
             200))
PHASES = """
import time
start = time.perf_counter()
import jax, numpy as np
import specjax, specjax_models
marks = {"import": time.perf_counter()}
path = specjax_models.smollm2_path()
target = specjax_models.from_gguf(path, scan_layers=True)
marks["load"] = time.perf_counter()
tokenizer = specjax_models.gguf_tokenizer(path)
marks["tokenizer"] = time.perf_counter()
ids = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}])
run = lambda: specjax.speculative_generate(
    target, specjax.PromptLookup(), [ids], max_new_tokens=16, num_draft_tokens=6,
    sampling=specjax.GREEDY, eos_id=tokenizer.eos_ids)
specjax.enable_compilation_cache()
out = run(); jax.block_until_ready(out.tokens)
marks["first call"] = time.perf_counter()
out = run(); jax.block_until_ready(out.tokens)
marks["generation"] = time.perf_counter()
last, phases = start, {}
for name, mark in marks.items():
    phases[name], last = mark - last, mark
print("PHASES", __import__("json").dumps(phases))
""".replace("QUESTION", repr(QUESTION))


def environment(caches: Path) -> dict:
    return dict(os.environ, SPECJAX_COMPILATION_CACHE=str(caches / "jax"),
                SPECJAX_MODEL_CACHE=str(caches / "models"))


def command_seconds(checkout: Path, caches: Path, pythonpath: str | None, options=(),
                    question: str = QUESTION, max_new_tokens: int = 16) -> float:
    env = environment(caches)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "specjax.cli", "generate", question,
                           "--model", "smollm2", "--max-new-tokens", str(max_new_tokens),
                           "--quiet", *options],
                          cwd=checkout if not pythonpath else tempfile.gettempdir(), env=env,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return seconds


def chat_first_byte(caches: Path) -> float:
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "specjax.cli", "chat", "--max-new-tokens",
                                "16", "--color", "never"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               env=environment(caches), cwd=ROOT)
    process.stdin.write((QUESTION + "\n").encode())
    process.stdin.flush()
    process.stdout.read(1)
    seconds = time.perf_counter() - start
    process.stdin.close()
    process.wait(timeout=600)
    return seconds


def phases(caches: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PHASES], env=environment(caches), cwd=ROOT,
                          capture_output=True, text=True, check=True)
    line = next(line for line in done.stdout.splitlines() if line.startswith("PHASES"))
    return json.loads(line.split(" ", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--compare-with", default=None, metavar="REV",
                        help="a git revision of this repository to time alongside")
    args = parser.parse_args()
    rows: dict[str, list[float]] = {}
    phase_rows: dict[str, list[dict]] = {"cold": [], "warm": []}
    before_path = None
    if args.compare_with:  # the other checkout's packages first on sys.path
        before_path = packages_of(args.compare_with)
    for rep in range(args.reps):
        for build, pythonpath in (("this checkout", None), ("--compare-with", before_path)):
            if build == "--compare-with" and not pythonpath:
                continue
            commands = COMMANDS if build == "this checkout" else COMMANDS[:1]
            for label, options, question, max_new_tokens in commands:
                caches = Path(tempfile.mkdtemp(prefix=f"start-{rep}-"))
                for state in ("cold", "warm"):
                    seconds = command_seconds(ROOT, caches, pythonpath, options, question,
                                              max_new_tokens)
                    rows.setdefault(f"{label}, {state}, {build}", []).append(seconds)
            if build == "this checkout":
                caches = Path(tempfile.mkdtemp(prefix=f"chat-{rep}-"))
                for state in ("cold", "warm"):
                    rows.setdefault(f"chat to first byte, {state}, {build}", []).append(
                        chat_first_byte(caches))
                caches = Path(tempfile.mkdtemp(prefix=f"phases-{rep}-"))
                for state in ("cold", "warm"):
                    phase_rows[state].append(phases(caches))
    lines = [f"# Start time of a real model ({cpu_model() or 'unknown CPU'}, "
             f"{os.cpu_count()} cores)", "",
             f"`{command_line()}`: SmolLM2-135M-Instruct (GGUF Q4_1), `specjax generate "
             f"--model smollm2 \"{QUESTION}\" --max-new-tokens 16`, fresh processes, medians "
             f"of {args.reps}; cold: empty compilation and model caches, warm: the second "
             "run with both.", "", "| run | wall seconds |", "|---|---|"]
    lines += [f"| {name} | {median(values):.2f} |" for name, values in rows.items()]
    lines += ["", "Phases inside a fresh process (seconds, medians):", "",
              "| phase | cold | warm |", "|---|---|---|"]
    for name in phase_rows["cold"][0]:
        cold = median([p[name] for p in phase_rows["cold"]])
        warm = median([p[name] for p in phase_rows["warm"]])
        lines.append(f"| {name} | {cold:.2f} | {warm:.2f} |")
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    write_results(NAME, {"cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
                         "command": command_line(), "runs": rows, "phases": phase_rows},
                  markdown)


if __name__ == "__main__":
    main()
