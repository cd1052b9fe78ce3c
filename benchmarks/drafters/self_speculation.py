"""Self-speculation on a real model: SmolLM2-135M-Instruct drafting for itself with blocks
skipped (LayerSkip, the set found by `specjax.layer_search.search_skip_layers`), and the
per-row adaptive draft length (AdaptiveLength: transformers' heuristic and the expected-
speed schedule, given this run's measured costs) against the best fixed K, next to the
distilled draft, the EAGLE-3 head and prompt lookup.

1. The search: calibration prompts from the training templates
   (`specjax_models.recipes.smollm2_prompts.chat_prompts`, none of them an evaluation
   prompt), greedy, K = 4; every candidate's measured tokens/s and acceptance.
2. Costs: a one-token forward of the kept blocks (c, in one-token target forwards) and
   the verify forwards (v), 200 tokens of context, medians.
3. Held-out prompts (`benchmarks/real_prompts.py`: chat, rewrite, code) through the chat
   template, batch 1, greedy and t=0.7 / top-p 0.9: tokens/s over a kind's requests,
   compile excluded (pass 0 compiles), medians of `--reps` alternating passes; tau, drafts
   offered per step, the ideal tau / (K c + v) and the efficiency reached.

    python -m benchmarks.drafters.self_speculation [--prompts-per-kind 3] [--new-tokens 48]
        [--reps 2] [--modes greedy ...] [--report-only]
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import specjax
from benchmarks.common import (
    RESULTS,
    alternating_passes,
    machine_record,
    median,
    smollm2,
    write_results,
)
from benchmarks.drafters.model_free import CACHE_SIZE, MODES, verify_cost, verify_costs
from benchmarks.drafters.real import ours
from benchmarks.real_prompts import PROMPTS
from specjax.drafters import AdaptiveLength, LayerSkip
from specjax.drafters.layer_search import search_skip_layers
from specjax.runtime.timing import wall_seconds

NAME = "self_speculation_cpu"


def one_token_ms(target, layers, reps: int = 15) -> float:
    """ms of a one-token forward running `layers` (None: all), 200 tokens of context."""
    cache, context = target.init_cache(1, CACHE_SIZE), 200

    @jax.jit
    def forward(params, cache):
        return target.with_params(params).apply(
            jnp.ones((1, 1), jnp.int32), jnp.full((1, 1), context, jnp.int32), cache,
            jnp.full((1,), context, jnp.int32), layers=layers)[0]

    jax.block_until_ready(forward(target.params, cache))
    return 1e3 * median([wall_seconds(lambda: jax.block_until_ready(
        forward(target.params, cache)))[1] for _ in range(reps)])


def decoders(target, skip) -> dict:
    """name -> (drafter, K, draft cost kind): "skip", "draft", "head" or None (model-free)."""
    from specjax_models import SMOLLM2_DRAFT, SMOLLM2_HEAD, load_layer_draft
    from specjax_models.heads import load_head_for

    layer_skip = LayerSkip(skip=skip)
    draft = load_layer_draft(SMOLLM2_DRAFT, target)
    return {
        "layer skip (K=2)": (layer_skip, 2, "skip"),
        "layer skip (K=3)": (layer_skip, 3, "skip"),
        "layer skip (K=4)": (layer_skip, 4, "skip"),
        "layer skip, heuristic length (K<=6)": (AdaptiveLength(layer_skip), 6, "skip"),
        "distilled draft (K=2)": (draft, 2, "draft"),
        "distilled draft (K=3)": (draft, 3, "draft"),
        "distilled draft (K=4)": (draft, 4, "draft"),
        "distilled draft, heuristic length (K<=6)": (AdaptiveLength(draft), 6, "draft"),
        "EAGLE-3 head (K=3)": (load_head_for(SMOLLM2_HEAD, target), 3, "head"),
        "prompt lookup (K=4)": (specjax.PromptLookup(), 4, None),
    }


def expected_speed_decoders(found: dict, costs: dict, verify_ms: dict) -> dict:
    """The expected-speed schedule over LayerSkip and the distilled draft, given this run's
    c and v_L (a verify of L drafts, L = 0..6, in one-token forwards; a wider verify is
    taken to cost at least what a narrower one measured, the measurements being noisy)."""
    ms = {int(width): value for width, value in verify_ms.items()}
    verify = tuple(max(value for width, value in ms.items() if width <= drafts + 1) / ms[1]
                   for drafts in range(7))
    return {f"{label}, expected-speed length (K<=6)": (
        AdaptiveLength(found[f"{label} (K=2)"][0], schedule="expected_speed",
                       draft_cost=costs[kind], verify_costs=verify), 6, kind)
        for label, kind in (("layer skip", "skip"), ("distilled draft", "draft"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts-per-kind", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--calibration-prompts", type=int, default=8)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if args.report_only:
        write_report(json.loads((RESULTS / f"{NAME}.json").read_text()))
        return
    from specjax_models.recipes.smollm2_prompts import chat_prompts

    target, tok = smollm2()
    template = lambda text: tok.apply_chat_template([{"role": "user", "content": text}])
    calibration = [template(p) for p in chat_prompts(args.calibration_prompts, seed=7)]
    search = search_skip_layers(target, calibration, num_draft_tokens=4, max_new_tokens=32,
                                reps=args.reps)
    print("search:", search, flush=True)
    skip = search.best.skip
    found = decoders(target, skip)
    full_ms = one_token_ms(target, None)
    costs = {"skip": one_token_ms(target, LayerSkip(skip=skip).kept_layers(
        target.num_layers)) / full_ms}
    draft_lm = found["distilled draft (K=3)"][0].lm
    costs["draft"] = one_token_ms(draft_lm, None) / full_ms
    costs["head"] = None  # not a CausalLM: its c is not split out here
    widths = verify_costs(target, [1, 2, 3, 4, 5, 6, 7], 1)
    print("c:", costs, "verify ms:", widths, flush=True)
    found.update(expected_speed_decoders(found, costs, widths))
    requests = {kind: [template(p) for p in prompts[:args.prompts_per_kind]]
                for kind, prompts in PROMPTS.items()}
    rows = []
    for mode in args.modes:
        sampling = MODES[mode]
        runs = {name: ours(target, {name: (d, k)} if name != "plain" else {}, name, sampling,
                           tok.eos_ids, args.new_tokens, CACHE_SIZE)
                for name, (d, k, _) in {"plain": (None, 1, None), **found}.items()}
        for kind, ids in requests.items():
            seconds, tokens, stats = alternating_passes(runs, [[b] for b in ids], args.reps)
            plain_rate = tokens["plain"] / median(seconds["plain"])
            for name in runs:
                rate = tokens[name] / median(seconds[name])
                row = {"mode": mode, "kind": kind, "decoder": name, "tokens": tokens[name],
                       "tokens_per_second": rate, "speedup": rate / plain_rate}
                if name != "plain":
                    parts = stats[name]
                    forwards = sum(int(np.sum(s.target_forwards)) for s in parts)
                    emitted = sum(int(np.sum(s.emitted)) for s in parts)
                    offered = sum(int(np.sum(s.proposed)) for s in parts)
                    accepted = sum(int(np.sum(s.accepted)) for s in parts)
                    row.update(tau=emitted / forwards, offered=offered / forwards,
                               acceptance=accepted / max(offered, 1))
                    c = costs.get(found[name][2]) if found[name][2] else 0.0
                    if c is not None:
                        v = verify_cost(row["offered"], widths)
                        # The draft loop runs the offered drafts (AdaptiveLength stops it);
                        # a fixed chain drafts K whatever it offers.
                        drafted = (row["offered"] if isinstance(found[name][0], AdaptiveLength)
                                   else found[name][1])
                        ideal = row["tau"] / (drafted * c + v)
                        row.update(c=c, v=v, ideal=ideal, efficiency=row["speedup"] / ideal)
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {"benchmark": "self_speculation", "machine": machine_record(), "args": vars(args),
              "search": {"plain_tokens_per_second": search.plain_tokens_per_second,
                         "influence": [None if np.isnan(x) else float(x)
                                       for x in search.influence],
                         "candidates": [vars(c) | {"skip": list(c.skip)}
                                        for c in search.candidates],
                         "chosen": list(skip)},
              "costs": costs, "verify_costs_ms": widths, "rows": rows}
    write_report(result)


def write_report(result: dict) -> None:
    args = argparse.Namespace(**result["args"])
    machine = result["machine"]
    search = result["search"]
    command = (f"python -m benchmarks.drafters.self_speculation --prompts-per-kind "
               f"{args.prompts_per_kind} --new-tokens {args.new_tokens} --reps {args.reps}")
    lines = [
        "# Self-speculation on SmolLM2-135M-Instruct: layer skipping and adaptive draft "
        "length", "",
        f"`{command}` on {machine.get('cpu_model') or 'this CPU'} ({machine.get('cpu_count')} "
        "cores). Batch 1, held-out prompts (benchmarks/real_prompts.py) through the chat "
        f"template, at most {args.new_tokens} new tokens, stopping at the end of turn; "
        "tokens/s over a kind's requests, compile excluded, median of alternating passes; "
        "speedups from the same run. tau: tokens per target forward; offered: drafts "
        "offered (verified) per step; c: a draft forward in one-token target forwards "
        "(LayerSkip: the kept blocks; the distilled draft: its 2 layers and reduced head); "
        "v: the verify forward of the mean offer; ideal = tau / (K c + v) (K: the drafts "
        "drafted per step, the mean offer for the adaptive length, whose draft loop stops "
        "there); efficiency = speedup / ideal.", "",
        f"## The search ({len(search['candidates'])} candidates on "
        f"{args.calibration_prompts} training-template prompts, greedy, K = 4)", "",
        f"Plain decoding {search['plain_tokens_per_second']:.1f} tokens/s. Block influence "
        "(1 - cos between a block's input and output stream; the last block is not a "
        "candidate): " + ", ".join(f"{i}: {x:.3f}" for i, x in enumerate(search["influence"])
                                   if x is not None), "",
        "| skipped blocks | count | tokens/s | vs plain | tau | acceptance |",
        "|---|---|---|---|---|---|"]
    for c in search["candidates"]:
        lines.append(f"| {','.join(map(str, c['skip']))} | {len(c['skip'])} | "
                     f"{c['tokens_per_second']:.1f} | "
                     f"{c['tokens_per_second'] / search['plain_tokens_per_second']:.2f}x | "
                     f"{c['tokens_per_forward']:.2f} | {c['acceptance_rate']:.2f} |")
    costs = result["costs"]
    lines += ["", f"Chosen: skip {','.join(map(str, search['chosen']))}. c (LayerSkip) = "
              f"{costs['skip']:.2f}, c (distilled draft) = {costs['draft']:.2f}; verify ms "
              "(width: ms) " + ", ".join(f"{w}: {ms:.1f}" for w, ms in
                                         result["verify_costs_ms"].items()), "",
              "## Decoding held-out prompts", "",
              "| mode | kind | decoder | tokens/s | vs plain | tau | offered | acceptance | "
              "c | v | ideal | efficiency |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda row, key, spec: format(row[key], spec) if row.get(key) is not None else "-"
    for row in result["rows"]:
        lines.append(
            f"| {row['mode']} | {row['kind']} | {row['decoder']} | "
            f"{row['tokens_per_second']:.1f} | {row['speedup']:.2f}x | {fmt(row, 'tau', '.2f')} "
            f"| {fmt(row, 'offered', '.2f')} | {fmt(row, 'acceptance', '.2f')} | "
            f"{fmt(row, 'c', '.2f')} | {fmt(row, 'v', '.2f')} | {fmt(row, 'ideal', '.2f')} | "
            f"{fmt(row, 'efficiency', '.2f')} |")
    lines += adaptive_summary(result["rows"])
    write_results(NAME, result, "\n".join(lines) + "\n")


def adaptive_summary(rows: list[dict]) -> list[str]:
    """Each adaptive schedule against the best fixed K of the same drafter, same run."""
    lines = ["", "## Adaptive draft length against the best fixed K (same run)", "",
             "| mode | kind | drafter | best fixed K | heuristic | expected speed |",
             "|---|---|---|---|---|---|"]
    speed = {(r["mode"], r["kind"], r["decoder"]): r["speedup"] for r in rows}
    for mode, kind in dict.fromkeys((r["mode"], r["kind"]) for r in rows):
        for label in ("layer skip", "distilled draft"):
            fixed = {k: speed.get((mode, kind, f"{label} (K={k})")) for k in (2, 3, 4)}
            if None in fixed.values():
                continue
            best_k = max(fixed, key=fixed.get)
            cells = []
            for schedule in ("heuristic length", "expected-speed length"):
                value = speed.get((mode, kind, f"{label}, {schedule} (K<=6)"))
                cells.append("-" if value is None else
                             f"{value:.2f}x ({value / fixed[best_k] - 1:+.0%})")
            lines.append(f"| {mode} | {kind} | {label} | K={best_k}: {fixed[best_k]:.2f}x | "
                         + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    main()
