"""Feature drafters (Medusa, EAGLE-1, EAGLE-3, MTP heads) against the draft model and
prompt lookup, on the bundled target and its held-out prompts.

For greedy and temperature 1, batch 1 and 4: tau (tokens per target forward), acceptance
per draft position, the speedup over plain decoding in the same run (decode phase and end
to end, medians of alternating repetitions, compile excluded), the draft cost per step in
one-token target steps (the measured speculative step time / plain step time, less the
separately measured verify cost v: drafting plus acceptance bookkeeping). The heads are the shipped
ones (`models/checkpoints/<method>`; their training cost is read from their metadata).

    python -m benchmarks.drafters.feature_drafters [--reps 3] [--new-tokens 96] [--resume]
    python -m benchmarks.drafters.feature_drafters --tau-only   # adds the larger shapes' tau

`--tau-only` measures tau alone (greedy, all held-out prompts; no timing) for longer
chains and 64-node trees, so that "the draft model's best chain" is not limited to the
timed shapes.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

import specjax
import specjax_models
from benchmarks.common import RESULTS, machine_record, sampling_modes, write_results
from benchmarks.decoding.trees import measure
from specjax.runtime.timing import forward_timer, interleaved_medians
from specjax.trees.shapes import DynamicTree

HEADS = ("medusa", "eagle", "eagle3", "mtp")
LABELS = {"medusa": "Medusa", "eagle": "EAGLE-1", "eagle3": "EAGLE-3", "mtp": "MTP"}


def drafter_rows(heads: dict, draft, sampling) -> dict:
    """label -> (drafter, K or None, tree or None)."""
    method = "greedy" if sampling.greedy else "sample"
    rows = {"draft model, chain K=6": (specjax.DraftModel(draft, method), 6, None),
            "draft model, chain K=8": (specjax.DraftModel(draft, method), 8, None),
            "draft model, dynamic 32": (specjax.DraftModel(draft), None,
                                        DynamicTree(32, 8, 4)),
            "prompt lookup, chain K=8": (specjax.PromptLookup(min_ngram_size=1), 8, None)}
    for name, head in heads.items():
        label = LABELS[name]
        if name == "medusa":
            rows[f"{label}, chain K={head.num_heads}"] = (head, head.num_heads, None)
            rows[f"{label}, dynamic 16"] = (head, None, DynamicTree(16, head.num_heads, 4))
            continue
        head = head.with_method(method)
        rows[f"{label}, chain K=4"] = (head, 4, None)
        if name == "eagle3":
            rows[f"{label}, chain K=6"] = (head, 6, None)
            rows[f"{label}, dynamic 16"] = (head, None, DynamicTree(16, 6, 4))
            rows[f"{label}, dynamic 32"] = (head, None, DynamicTree(32, 8, 4))
    return rows


def training_cost(name: str) -> str:
    path = specjax_models.bundled.bundled_path(name) / "metadata.json"
    if not path.exists():
        return "-"
    meta = json.loads(path.read_text())
    args = meta["args"]
    return (f"{meta['steps_done']} steps x {args['batch_size']} x {args['seq_len']} tokens "
            f"({meta.get('train_seconds_total', meta['train_seconds_this_run']) / 60:.0f} "
            f"min, {meta['device']})")


TAU_ONLY = {  # label -> (drafter name, K, tree)
    "draft model, chain K=10": ("draft", 10, None),
    "draft model, chain K=12": ("draft", 12, None),
    "draft model, chain K=16": ("draft", 16, None),
    "draft model, dynamic 64 (depth 8, top-4)": ("draft", None, DynamicTree(64, 8, 4)),
    "draft model, dynamic 64 (depth 10, top-6)": ("draft", None, DynamicTree(64, 10, 6)),
    "EAGLE-3, chain K=10": ("eagle3", 10, None),
    "EAGLE-3, dynamic 64 (depth 8, top-4)": ("eagle3", None, DynamicTree(64, 8, 4)),
    "EAGLE-3, dynamic 64 (depth 10, top-6)": ("eagle3", None, DynamicTree(64, 10, 6)),
}


def measure_tau_only(target, draft, heads, held_out, new_tokens) -> dict:
    taus = {}
    for label, (name, k, tree) in TAU_ONLY.items():
        drafter = specjax.DraftModel(draft, "greedy") if name == "draft" else heads[name]
        out = specjax.speculative_generate(target, drafter, held_out, max_new_tokens=new_tokens,
                                           num_draft_tokens=k, sampling=specjax.GREEDY,
                                           key=jax.random.key(2), tree=tree)
        taus[label] = out.stats.mean_accepted_length
        print(f"tau only: {label}: {taus[label]:.2f}", flush=True)
        jax.clear_caches()
    return taus


def write_report(args, rows: list[dict], costs: dict, tau_only: dict | None = None) -> None:
    order = list(dict.fromkeys(r["drafter"] for r in rows))
    rows = sorted(rows, key=lambda r: (r["mode"] != "greedy", r["batch"],
                                       order.index(r["drafter"])))
    lines = ["# Feature drafters on the bundled target", "",
             f"`python -m benchmarks.drafters.feature_drafters --reps {args.reps} --new-tokens "
             f"{args.new_tokens}`. The bundled target continues held-out prompts; drafters: "
             "the bundled draft model, prompt lookup, and the shipped heads (Medusa: 4 heads "
             "on the last hidden state; EAGLE-1: one layer over the final feature; EAGLE-3: "
             "one layer over three fused layers, trained with training-time test; MTP: one "
             "DeepSeek-V3 module reused recursively). Dynamic N: an EAGLE-2 tree of N nodes "
             "grown per row (top-4 expansion). Speedups against plain decoding in the same "
             f"run, medians of {args.reps} alternating repetitions, compile excluded.", "",
             "tau: tokens per target forward (timed run); tau, all: over all held-out "
             "prompts at once; acceptance per position: share of steps whose accepted path "
             "holds node j (chains: draft j). v: the 1 + N token verify forward in one-token "
             "target steps (measured apart); draft cost: a speculative step's measured time "
             "in plain steps (tau / decode speedup) less v, i.e. drafting plus acceptance "
             "bookkeeping.", "",
             "| mode | batch | drafter | tau | tau, all | acceptance per position | v | "
             "draft cost | decode speedup | end to end |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per_position = ", ".join(f"{x:.2f}" for x in r["accepted_per_position"][:8])
        lines.append(f"| {r['mode']} | {r['batch']} | {r['drafter']} | {r['tau']:.2f} | "
                     f"{r['tau_all_prompts']:.2f} | {per_position} | {r['v']:.2f} | "
                     f"{r['draft_cost']:.2f} | {r['decode_speedup']:.2f}x | "
                     f"{r['speedup']:.2f}x |")
    if tau_only:
        lines += ["", "Tau only (greedy, all held-out prompts, no timing; `--tau-only`), "
                  "longer chains and 64-node trees:", "", "| drafter | tau, all |",
                  "|---|---|"]
        lines += [f"| {label} | {tau:.2f} |" for label, tau in tau_only.items()]
    lines += ["", "Training cost of the shipped heads (`models/recipes/train_heads.sh`): "
              + "; ".join(f"{LABELS[n]}: {training_cost(n)}" for n in HEADS) + "."]
    greedy = [r for r in rows if r["mode"] == "greedy" and r["batch"] == 1]
    if greedy and tau_only:
        chains = {r["drafter"]: r["tau_all_prompts"] for r in greedy
                  if r["drafter"].startswith("draft model, chain")}
        chains.update({k: v for k, v in tau_only.items() if k.startswith("draft model, chain")})
        eagle3_trees = {r["drafter"]: r["tau_all_prompts"] for r in greedy
                        if r["drafter"].startswith("EAGLE-3, dynamic")}
        eagle3_trees.update({k: v for k, v in tau_only.items()
                             if k.startswith("EAGLE-3, dynamic")})
        drafts_trees = {k: v for k, v in tau_only.items() if k.startswith("draft model, dyn")}
        chain_label = max(chains, key=chains.get)
        tree_label = max(eagle3_trees, key=eagle3_trees.get)
        ratio = eagle3_trees[tree_label] / chains[chain_label]
        same = tree_label.replace("EAGLE-3", "draft model")
        lines += ["", f"Greedy, over all held-out prompts, every shape measured: the best "
                  f"EAGLE-3 tree ({tree_label}) reaches tau {eagle3_trees[tree_label]:.2f} "
                  f"against {chains[chain_label]:.2f} for the draft model's best chain "
                  f"({chain_label}): {ratio:.2f}x (goal >= 1.3x: "
                  f"{'met' if ratio >= 1.3 else 'not met'})"
                  + (f"; the draft model with the same tree reaches "
                     f"{drafts_trees[same]:.2f}." if same in drafts_trees else ".")]
    if greedy:
        best_chain = max((r for r in greedy if r["drafter"].startswith("draft model, chain")),
                         key=lambda r: r["tau_all_prompts"], default=None)
        eagle3_tree = max((r for r in greedy if r["drafter"].startswith("EAGLE-3, dynamic")),
                          key=lambda r: r["tau_all_prompts"], default=None)
        fastest = max(greedy, key=lambda r: r["decode_speedup"])
        if best_chain and eagle3_tree and not tau_only:
            ratio = eagle3_tree["tau_all_prompts"] / best_chain["tau_all_prompts"]
            lines += ["", f"Greedy, batch 1, timed shapes: EAGLE-3 with a dynamic tree "
                      f"({eagle3_tree['drafter']}) reaches tau "
                      f"{eagle3_tree['tau_all_prompts']:.2f} over all held-out prompts "
                      f"against {best_chain['tau_all_prompts']:.2f} for the draft model's "
                      f"best chain ({best_chain['drafter']}): {ratio:.2f}x (goal >= 1.3x: "
                      f"{'met' if ratio >= 1.3 else 'not met'})."]
        lines += ["", f"Greedy, batch 1: the highest decode-phase speedup is "
                  f"{fastest['drafter']}'s, {fastest['decode_speedup']:.2f}x (goal: EAGLE-3's: "
                  f"{'met' if fastest['drafter'].startswith('EAGLE-3') else 'not met'})."]
    payload = {"benchmark": "feature_drafters", "machine": machine_record(), "args": vars(args),
               "verify_costs": {str(b): {str(w): c for w, c in cs.items()}
                                for b, cs in costs.items()}, "rows": rows,
               "tau_only": tau_only or {}}
    write_results(args.name, payload, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--name", default="feature_drafters_cpu")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of an earlier run of the same name")
    parser.add_argument("--tau-only", action="store_true",
                        help="keep the earlier rows and add the tau-only shapes")
    args = parser.parse_args()
    earlier = {}
    if (args.resume or args.tau_only) and (RESULTS / f"{args.name}.json").exists():
        earlier = json.loads((RESULTS / f"{args.name}.json").read_text())
    target, draft = specjax_models.load_bundled("target"), specjax_models.load_bundled("draft")
    heads = {name: specjax_models.load_bundled(name) for name in HEADS
             if (specjax_models.bundled.bundled_path(name) / "head.npz").exists()}
    tok = specjax_models.ByteTokenizer()
    held_out = [tok.encode(p["text"]) for p in specjax_models.bundled_prompts()
                if p["kind"] == "continue"]
    if args.tau_only:
        saved = {int(b): {int(w): c for w, c in cs.items()}
                 for b, cs in earlier.get("verify_costs", {}).items()}
        tau_only = measure_tau_only(target, draft, heads, held_out, args.new_tokens)
        write_report(argparse.Namespace(**earlier.get("args", vars(args))),
                     earlier.get("rows", []), saved, tau_only)
        return
    widths = [5, 7, 9, 17, 33]
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
    done = {(r["mode"], r["batch"], r["drafter"]) for r in rows}
    for mode, sampling in sampling_modes().items():
        for batch in args.batches:
            prompts = held_out[:batch]
            for label, (drafter, k, tree) in drafter_rows(heads, draft, sampling).items():
                if (mode, batch, label) in done:
                    continue
                row = measure(target, drafter, prompts, sampling, args, k=k, tree=tree)
                out = specjax.speculative_generate(
                    target, drafter, held_out, max_new_tokens=args.new_tokens,
                    num_draft_tokens=k, sampling=sampling, key=jax.random.key(2), tree=tree)
                row["tau_all_prompts"] = out.stats.mean_accepted_length
                row["accepted_per_position"] = np.asarray(
                    out.stats.accepted_per_position).tolist()
                v = costs[batch][row["nodes"] + 1]
                # A speculative step takes tau / decode_speedup plain steps (both measured).
                step_cost = row["tau"] / row["decode_speedup"]
                row.update(mode=mode, batch=batch, drafter=label, v=v,
                           draft_cost=step_cost - v)
                rows.append(row)
                write_report(args, rows, costs, earlier.get("tau_only"))
                jax.clear_caches()
                print(f"{mode:6s} B={batch} {label:28s}: tau {row['tau']:.2f} "
                      f"({row['tau_all_prompts']:.2f} all), decode "
                      f"{row['decode_speedup']:.2f}x, draft cost {row['draft_cost']:.2f}, "
                      f"v {v:.2f}", flush=True)
    write_report(args, rows, costs, earlier.get("tau_only"))


if __name__ == "__main__":
    main()
