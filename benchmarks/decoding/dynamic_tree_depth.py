"""EAGLE-2 dynamic trees grown by one `lax.scan` over depths (this checkout) against one
unrolled expansion per depth (`--compare-with REV`): compile seconds and decode time by
depth, in the same run.

For each drafter (the bundled EAGLE head, the bundled draft model) and depth (2, 4, 6,
8; top_k 4, 16 nodes kept), a fresh process per build decodes the bundled target's prompts
(greedy, `--new-tokens`): the first call's seconds (compile and run) and the median of
`--reps` later calls, alternating builds over `--rounds` processes (medians).

    python -m benchmarks.decoding.dynamic_tree_depth [--compare-with 94c96de] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks.common import (
    command_line,
    cpu_model,
    median,
    packages_of,
    probe_result,
    write_results,
)

DEPTHS = (2, 4, 6, 8)

PROBE = """
import json, statistics, sys, time
import jax
import specjax, specjax_models
from specjax_models.bundled import bundled_path
from specjax_models.heads import load_head_for
reps, new_tokens, depths = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
target = specjax_models.load_bundled("target")
drafters = {"EAGLE head": load_head_for(bundled_path("eagle"), target),
            "draft model": specjax.DraftModel(specjax_models.load_bundled("draft"))}
prompts = [list(b"def parse(source, filename):\\n    "), list(b"import os\\nimport sys\\n")]
rows = []
for name, drafter in drafters.items():
    for depth in depths:
        tree = specjax.DynamicTree(num_nodes=16, max_depth=depth, top_k=4)
        run = lambda: jax.block_until_ready(specjax.speculative_generate(
            target, drafter, prompts, max_new_tokens=new_tokens, tree=tree,
            sampling=specjax.GREEDY))
        start = time.perf_counter(); out = run(); first = time.perf_counter() - start
        times = []
        for _ in range(reps):
            start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
        steady = statistics.median(times)
        rows.append({"drafter": name, "depth": depth, "first_s": first, "steady_s": steady,
                     "compile_s": first - steady, "tau": out.stats.mean_accepted_length,
                     "tokens": out.tokens.tolist()})
print("RESULT", json.dumps(rows))
"""


def probe(pythonpath: str | None, reps: int, new_tokens: int) -> list[dict]:
    return probe_result(PROBE, [str(reps), str(new_tokens), json.dumps(DEPTHS)], pythonpath)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare-with", default="94c96de",
                        help="a git revision whose dynamic trees unroll their depths")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--name", default="dynamic_tree_depth_cpu")
    args = parser.parse_args()
    builds = {"scan": None, f"unrolled ({args.compare_with})": packages_of(args.compare_with)}
    runs: dict = {build: [] for build in builds}
    for round_ in range(args.rounds):
        for build, pythonpath in builds.items():
            runs[build].append(probe(pythonpath, args.reps, args.new_tokens))
            print(build, "round", round_, "done", flush=True)
    scan, unrolled = builds
    lines = ["# EAGLE-2 dynamic trees: depths as one scan against one expansion per depth", "",
             f"`{command_line()}` on {cpu_model()} ({os.cpu_count()} cores), compilation "
             f"cache off, fresh processes, {args.rounds} alternating rounds (medians). "
             f"Bundled target, 2 prompts, greedy, {args.new_tokens} new tokens, DynamicTree("
             f"num_nodes=16, top_k=4). compile = the first call minus the median of "
             f"{args.reps} later calls (prefill and decode programs together); decode = "
             "that median.", "",
             "| drafter | depth | compile s, scan | compile s, unrolled | decode ms, scan | "
             "decode ms, unrolled | scan / unrolled decode | tau | same tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, row in enumerate(runs[scan][0]):
        pick = lambda build, key, i=i: median([r[i][key] for r in runs[build]])
        same = all(r[i]["tokens"] == runs[unrolled][0][i]["tokens"] for r in runs[scan])
        lines.append(f"| {row['drafter']} | {row['depth']} | {pick(scan, 'compile_s'):.2f} | "
                     f"{pick(unrolled, 'compile_s'):.2f} | {1e3 * pick(scan, 'steady_s'):.1f} | "
                     f"{1e3 * pick(unrolled, 'steady_s'):.1f} | "
                     f"{pick(scan, 'steady_s') / pick(unrolled, 'steady_s'):.2f} | "
                     f"{row['tau']:.2f} | {'yes' if same else 'NO'} |")
    lines.append("")
    write_results(args.name, {"runs": runs, "rounds": args.rounds, "reps": args.reps,
                              "new_tokens": args.new_tokens, "command": command_line(),
                              "cpu": cpu_model()}, "\n".join(lines))


if __name__ == "__main__":
    main()
