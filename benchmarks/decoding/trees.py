"""Token trees against chains on the bundled pair.

For greedy and temperature 1, batch 1 and 4: a chain of K in {4, 8}; static trees of 16,
32 and 64 nodes (best-first under a fixed geometric rank prior 0.5, 0.25, ..., the same
for every pair, as Medusa/EAGLE-1 ship fixed trees); Sequoia trees of the same sizes,
optimal for the pair's measured per-rank acceptance vector; EAGLE-2 dynamic trees of the
same budgets (top-4 expansion, depth <= 8), grown per row. Reports tau (tokens per
target forward), nodes verified per step, the verify cost v of the 1 + N token forward in
one-token target steps, the speedup over plain decoding in the same run (end to end and
decode phase, medians of alternating repetitions, compile excluded) and tau / v, the
speedup a free draft would allow.

    python -m benchmarks.decoding.trees [--reps 3] [--new-tokens 64] [--resume]

Results are rewritten after every row; `--resume` keeps the rows (and the measured verify
costs and rank vectors) of an earlier run and measures only the missing ones.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

import specjax
import specjax_models
from benchmarks.common import RESULTS, machine_record, median, sampling_modes, write_results
from specjax.decoding.inputs import plan_capacity
from specjax.decoding.speculative_loop import drafters_tree
from specjax.runtime.timing import forward_timer, interleaved_medians, wall_seconds
from specjax.trees.shapes import DynamicTree, TreeShape

GEOMETRIC_PRIOR = [0.5 ** (r + 1) for r in range(8)]
SIZES = (16, 32, 64)
MAX_DEPTH = 8
DYNAMIC_TOP_K = 4


def decode(target, drafter, prompts, sampling, capacity, new_tokens, *, k=None, tree=None):
    if drafter is None:
        return lambda: specjax.generate(target, prompts, max_new_tokens=new_tokens,
                                        sampling=sampling, key=jax.random.key(0),
                                        cache_size=capacity)
    return lambda: specjax.speculative_generate(
        target, drafter, prompts, max_new_tokens=new_tokens, num_draft_tokens=k,
        sampling=sampling, key=jax.random.key(0), cache_size=capacity, tree=tree)


def measure(target, drafter, prompts, sampling, args, *, k=None, tree=None) -> dict:
    """Speculative vs plain, alternating; the decode phase excludes each first step."""
    tree = drafters_tree(drafter, tree)
    nodes = tree.num_nodes if tree is not None else k
    lengths = np.array([len(p) for p in prompts])
    capacity = plan_capacity(lengths, args.new_tokens, target.max_seq_len,
                             extra_slots=nodes + 1)
    calls = {"spec": decode(target, drafter, prompts, sampling, capacity, args.new_tokens,
                            k=k, tree=tree),
             "plain": decode(target, None, prompts, sampling, capacity, args.new_tokens),
             "spec_first": decode(target, drafter, prompts, sampling, capacity, 1, k=k,
                                  tree=tree),
             "plain_first": decode(target, None, prompts, sampling, capacity, 1)}
    outputs = {name: call() for name, call in calls.items()}  # compile
    times = {name: [] for name in calls}
    for _ in range(args.reps):
        for name, call in calls.items():
            outputs[name], seconds = wall_seconds(call)
            times[name].append(seconds)
    t = {name: median(values) for name, values in times.items()}
    out, first = outputs["spec"], outputs["spec_first"]
    tokens = int(np.asarray(out.lengths).sum())
    first_tokens = int(np.minimum(np.asarray(first.stats.accepted) + 1, args.new_tokens).sum())
    spec_rate = (tokens - first_tokens) / (t["spec"] - t["spec_first"])
    plain_rate = (tokens - len(prompts)) / (t["plain"] - t["plain_first"])
    return {"nodes": nodes, "tau": out.stats.mean_accepted_length,
            "acceptance_rate": out.stats.acceptance_rate,
            "speedup": t["plain"] / t["spec"], "decode_speedup": spec_rate / plain_rate,
            "greedy_identical": bool(np.array_equal(out.tokens, outputs["plain"].tokens))
            if sampling.greedy else None}


KINDS = ("chain", "static", "Sequoia", "dynamic")


def write_report(args, rows: list[dict], vectors: dict, costs: dict, num_prompts: int) -> None:
    rows = sorted(rows, key=lambda r: (r["mode"] != "greedy", r["batch"],
                                       KINDS.index(r["shape"].split()[0]), r["nodes"]))
    lines = ["# Token trees against chains (bundled pair)", "",
             f"`python -m benchmarks.decoding.trees --reps {args.reps} --new-tokens "
             f"{args.new_tokens}`. "
             "Held-out prompts, drafts by the bundled draft (deterministic top-k children "
             "when greedy, sampled without replacement at t=1); static trees: best-first "
             "under a fixed geometric rank prior; Sequoia: optimal for the measured rank "
             "vector (depth <= 8); dynamic: EAGLE-2 trees grown per row and step (top-4 "
             "expansion by cumulative draft log-probability, depth <= 8, best N kept; "
             "always top-k children, so deterministic at t=1 too). Speedups against plain "
             "decoding in the same run, medians "
             f"of {args.reps} alternating repetitions, compile excluded.", "",
             "Measured rank acceptance (fraction of steps whose accepted child had rank r, "
             "8-ary one-level tree): "
             + "; ".join(f"{m}: {np.round(v, 3).tolist()}" for m, v in vectors.items()), "",
             "tau: tokens per target forward in the timed run (batch 1 is one prompt, one "
             f"trajectory); `tau, all`: over all {num_prompts} held-out prompts at once; the "
             "Sequoia-model tau is what the rank model predicts for the tree.", "",
             "| mode | batch | shape | nodes | depth | tau | tau, all | Sequoia-model tau | "
             "v (1+N) | tau / v | decode speedup | end to end |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        predicted = "-" if r["predicted_tau"] is None else f"{r['predicted_tau']:.2f}"
        lines.append(f"| {r['mode']} | {r['batch']} | {r['shape']} | {r['nodes']} | "
                     f"{r['depth']} | {r['tau']:.2f} | {r['tau_all_prompts']:.2f} | {predicted} | "
                     f"{r['v']:.2f} | "
                     f"{r['tau'] / r['v']:.2f} | {r['decode_speedup']:.2f}x | "
                     f"{r['speedup']:.2f}x |")
    payload = {"benchmark": "trees", "machine": machine_record(), "args": vars(args),
               "rank_acceptance": {m: np.asarray(v).tolist() for m, v in vectors.items()},
               "verify_costs": {str(b): {str(w): c for w, c in cs.items()}
                                for b, cs in costs.items()},
               "rows": rows}
    greedy_1 = [r for r in rows if r["mode"] == "greedy" and r["batch"] == 1]
    chains = [r for r in greedy_1 if r["shape"].startswith("chain")]
    trees = [r for r in greedy_1 if not r["shape"].startswith("chain")]
    if not chains or not trees:  # a partial run: the rows so far
        write_results(args.name, payload, "\n".join(lines) + "\n")
        return
    best_chain = max(chains, key=lambda r: r["tau_all_prompts"])
    best_tree = max(trees, key=lambda r: r["tau_all_prompts"])
    by_kind = {kind: max((r for r in trees if r["shape"].startswith(kind)),
                         key=lambda r: r["tau_all_prompts"], default=None)
               for kind in KINDS[1:]}
    lines += ["", "Greedy, batch 1, best of each kind over all held-out prompts: "
              + "; ".join(f"{kind} {r['shape'].split()[1]} nodes: tau "
                          f"{r['tau_all_prompts']:.2f}, decode {r['decode_speedup']:.2f}x"
                          for kind, r in by_kind.items() if r is not None) + "."]
    ratio = best_tree["tau_all_prompts"] / best_chain["tau_all_prompts"]
    lines += ["", f"Greedy, over all held-out prompts: the best tree ({best_tree['shape']}) "
              f"reaches tau {best_tree['tau_all_prompts']:.2f} against "
              f"{best_chain['tau_all_prompts']:.2f} for the best chain "
              f"({best_chain['shape']}): {ratio:.2f}x (goal >= 1.3x: "
              f"{'met' if ratio >= 1.3 else 'not met'}). Its verify costs v = "
              f"{best_tree['v']:.2f} one-token steps here against {best_chain['v']:.2f} for "
              f"the chain, so its decode speedup (batch 1) is "
              f"{best_tree['decode_speedup']:.2f}x against "
              f"{best_chain['decode_speedup']:.2f}x: on this CPU the wider verify "
              + ("eats the gain." if best_tree["decode_speedup"] <= best_chain["decode_speedup"]
                 else "does not eat all of the gain.")]
    write_results(args.name, payload, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--name", default="trees_cpu")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of an earlier run of the same name")
    args = parser.parse_args()
    earlier = {}
    if args.resume and (RESULTS / f"{args.name}.json").exists():
        earlier = json.loads((RESULTS / f"{args.name}.json").read_text())
    target, draft = specjax_models.load_bundled("target"), specjax_models.load_bundled("draft")
    tok = specjax_models.ByteTokenizer()
    held_out = [tok.encode(p["text"]) for p in specjax_models.bundled_prompts()
                if p["kind"] == "continue"]
    # v for every verify width, at the runs' cache size and position, in alternation.
    widths = sorted({5, 9} | {n + 1 for n in SIZES})
    costs = {int(b): {int(w): c for w, c in cs.items()}
             for b, cs in earlier.get("verify_costs", {}).items()}
    for batch in args.batches:
        if batch in costs:
            continue
        timers = {"step": forward_timer(target, batch, 1, cache_slots=512, position=320)}
        timers.update({w: forward_timer(target, batch, w, cache_slots=512, position=320)
                       for w in widths})
        measured = interleaved_medians(timers, args.reps)
        costs[batch] = {w: measured[w] / measured["step"] for w in widths}
    rows = earlier.get("rows", [])
    vectors = {m: np.asarray(v) for m, v in earlier.get("rank_acceptance", {}).items()}
    done = {(r["mode"], r["batch"], r["shape"]) for r in rows}
    for mode, sampling in sampling_modes().items():
        method = "greedy" if sampling.greedy else "sample"
        if mode not in vectors:
            vectors[mode] = specjax.analysis.measure_rank_acceptance(
                target, draft, held_out[4:12], sampling, num_ranks=8, max_new_tokens=64,
                key=jax.random.key(1), method=method)
        analysis_vector = vectors[mode]
        print(f"{mode}: rank acceptance {np.round(analysis_vector, 3).tolist()}", flush=True)
        shapes = {f"chain K={k}": ("chain", k, None) for k in (4, 8)}
        for size in SIZES:
            shapes[f"static {size}"] = ("tree", None,
                                        TreeShape.sequoia(GEOMETRIC_PRIOR, size, MAX_DEPTH))
            shapes[f"Sequoia {size}"] = ("tree", None,
                                         TreeShape.sequoia(analysis_vector, size, MAX_DEPTH))
            shapes[f"dynamic {size}"] = ("tree", None,
                                         DynamicTree(size, MAX_DEPTH, DYNAMIC_TOP_K))
        for batch in args.batches:
            prompts = held_out[:batch]
            for label, (_, k, tree) in shapes.items():
                if (mode, batch, label) in done:
                    continue
                drafter = specjax.DraftModel(draft, method)
                row = measure(target, drafter, prompts, sampling, args, k=k, tree=tree)
                # tau over all held-out prompts at once (a batch-1 run is one trajectory).
                row["tau_all_prompts"] = specjax.speculative_generate(
                    target, drafter, held_out, max_new_tokens=args.new_tokens,
                    num_draft_tokens=k, sampling=sampling, key=jax.random.key(2),
                    tree=tree).stats.mean_accepted_length
                width = row["nodes"] + 1
                row.update(mode=mode, batch=batch, shape=label,
                           depth=tree.max_depth if tree else k,
                           v=costs[batch].get(width),
                           predicted_tau=1 + tree.expected_accepted_length(analysis_vector)
                           if isinstance(tree, TreeShape) else None)
                rows.append(row)
                write_report(args, rows, vectors, costs, len(held_out))
                # Dozens of shapes compile here; dropping the executables between them keeps
                # the process under the machine's memory-map limit.
                jax.clear_caches()
                print(f"{mode:6s} B={batch} {label:12s}: tau {row['tau']:.2f} "
                      f"({row['tau_all_prompts']:.2f} over all prompts), decode "
                      f"{row['decode_speedup']:.2f}x, end to end {row['speedup']:.2f}x, "
                      f"v {row['v']:.2f}", flush=True)
    write_report(args, rows, vectors, costs, len(held_out))


if __name__ == "__main__":
    main()
