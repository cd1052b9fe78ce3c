"""Kangaroo (`specjax.EarlyExit`) on the bundled pair and SmolLM2-135M-Instruct: the
target's first blocks, a trained one-block adapter and the target's head, next to the
draft model, the EAGLE-3 head, layer skipping and prompt lookup.

1. Costs: a draft step (the exit layer's blocks, the adapter, the head rows) and a draft
   model's / the kept blocks' one-token forward, in one-token target forwards (c), and the
   verify forwards (v), 200 tokens of context, medians.
2. Batch 1, greedy and t=0.7 / top-p 0.9: tokens/s over a kind's requests, compile
   excluded (pass 0 compiles), medians of `--reps` alternating passes, ratios from the
   same run; tau, drafts offered per step, the ideal tau / (K c + v) and the efficiency
   reached (Kangaroo's K: the drafts it actually ran, its loop stopping at the early exit).

    python -m benchmarks.drafters.kangaroo [--models bundled smollm2] [--prompts-per-kind 3]
        [--new-tokens 48] [--reps 2] [--smollm2-adapter DIR (default: the shipped one)]
        [--report-only]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import specjax
import specjax_models
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
from benchmarks.drafters.self_speculation import one_token_ms
from benchmarks.real_prompts import PROMPTS
from specjax.drafters import EarlyExit, LayerSkip
from specjax.drafters.feature_head import init_head_cache
from specjax.runtime.timing import wall_seconds
from specjax_models.heads import load_head_for

NAME = "kangaroo_cpu"
CONTEXT = 200


def adapter_draft_ms(target, adapter: EarlyExit, reps: int = 15) -> float:
    """ms of one Kangaroo draft step: the first `exit_layer` blocks (head=False), the
    adapter over its cache, the LM head rows and a softmax, 200 tokens of context."""
    cache = target.init_cache(1, CACHE_SIZE)
    keys, values = init_head_cache(adapter.config, 1, CACHE_SIZE)
    shallow = tuple(range(adapter.exit_layer))

    @jax.jit
    def step(params, adapter, cache, keys, values):
        slot = jnp.full((1,), CONTEXT, jnp.int32)
        _, stream, cache = target.with_params(params).apply(
            jnp.ones((1, 1), jnp.int32), slot[:, None], cache, slot, layers=shallow,
            head=False)
        out, keys, values = adapter.adapter(stream, slot[:, None], keys, values, slot)
        return jax.nn.softmax(adapter._logits(out[:, 0], target.vocab_size), axis=-1)

    args = (target.params, adapter, cache, keys, values)
    jax.block_until_ready(step(*args))
    return 1e3 * median([wall_seconds(lambda: jax.block_until_ready(step(*args)))[1]
                         for _ in range(reps)])


def bundled_setup(args) -> dict:
    target = specjax_models.load_bundled("target")
    draft = specjax_models.load_bundled("draft")
    tokenizer = specjax_models.ByteTokenizer()
    kinds = sorted({p["kind"] for p in specjax_models.bundled_prompts()})
    requests = {kind: [tokenizer.encode(p["text"]) for p in specjax_models.bundled_prompts()
                       if p["kind"] == kind][:args.prompts_per_kind] for kind in kinds}
    adapter = load_head_for(specjax_models.bundled.bundled_path("kangaroo"), target)
    skip = LayerSkip(skip=(2, 3))
    decoders = {
        "kangaroo (K=4, exit < 0.6)": (adapter, 4, "adapter"),
        "kangaroo (K=4, all drafts)": (adapter.with_stop_below(None), 4, "adapter"),
        "kangaroo (K=6, exit < 0.6)": (adapter, 6, "adapter"),
        "draft model (K=4)": (specjax.DraftModel(draft), 4, "draft"),
        "EAGLE-3 head (K=4)": (load_head_for(specjax_models.bundled.bundled_path("eagle3"),
                                             target), 4, None),
        "layer skip 2,3 (K=4)": (skip, 4, "skip"),
        "prompt lookup (K=4)": (specjax.PromptLookup(), 4, 0.0),
    }
    costs = {"adapter": adapter_draft_ms(target, adapter),
             "draft": one_token_ms(draft, None),
             "skip": one_token_ms(target, skip.kept_layers(target.num_layers))}
    return {"target": target, "requests": requests, "decoders": decoders, "costs_ms": costs,
            "eos": None, "exit_layer": adapter.exit_layer}


def smollm2_setup(args) -> dict:
    from specjax_models import SMOLLM2_DRAFT, SMOLLM2_HEAD, load_layer_draft

    target, tok = smollm2()
    template = lambda text: tok.apply_chat_template([{"role": "user", "content": text}])
    requests = {kind: [template(p) for p in prompts[:args.prompts_per_kind]]
                for kind, prompts in PROMPTS.items()}
    adapter = load_head_for(args.smollm2_adapter, target)
    draft = load_layer_draft(SMOLLM2_DRAFT, target)
    skip = LayerSkip(skip=(13, 14, 15, 17))  # the search's choice (self_speculation_cpu.md)
    decoders = {
        "kangaroo (K=3, exit < 0.6)": (adapter, 3, "adapter"),
        "kangaroo (K=4, exit < 0.6)": (adapter, 4, "adapter"),
        "kangaroo (K=4, exit < 0.4)": (adapter.with_stop_below(0.4), 4, "adapter"),
        "kangaroo (K=3, all drafts)": (adapter.with_stop_below(None), 3, "adapter"),
        "distilled draft (K=3)": (draft, 3, "draft"),
        "EAGLE-3 head (K=3)": (load_head_for(SMOLLM2_HEAD, target), 3, None),
        "layer skip 13,14,15,17 (K=3)": (skip, 3, "skip"),
        "prompt lookup (K=4)": (specjax.PromptLookup(), 4, 0.0),
    }
    costs = {"adapter": adapter_draft_ms(target, adapter),
             "draft": one_token_ms(draft.lm, None),
             "skip": one_token_ms(target, skip.kept_layers(target.num_layers))}
    return {"target": target, "requests": requests, "decoders": decoders, "costs_ms": costs,
            "eos": tok.eos_ids, "exit_layer": adapter.exit_layer}


def measure(model: str, setup: dict, args) -> dict:
    target = setup["target"]
    full_ms = one_token_ms(target, None)
    costs = {kind: ms / full_ms for kind, ms in setup["costs_ms"].items()}
    widths = verify_costs(target, [1, 2, 3, 4, 5, 7], 1)
    print(model, "c:", costs, "verify ms:", widths, flush=True)
    rows = []
    for mode in args.modes:
        sampling = MODES[mode]
        found = setup["decoders"]
        runs = {name: ours(target, {name: (d, k)} if name != "plain" else {}, name, sampling,
                           setup["eos"], args.new_tokens, CACHE_SIZE)
                for name, (d, k, _) in {"plain": (None, 1, None), **found}.items()}
        for kind, ids in setup["requests"].items():
            seconds, tokens, stats = alternating_passes(runs, [[b] for b in ids], args.reps)
            plain_rate = tokens["plain"] / median(seconds["plain"])
            for name in runs:
                rate = tokens[name] / median(seconds[name])
                row = {"model": model, "mode": mode, "kind": kind, "decoder": name,
                       "tokens": tokens[name], "tokens_per_second": rate,
                       "speedup": rate / plain_rate}
                if name != "plain":
                    row.update(stat_row(stats[name], found[name], costs, widths))
                rows.append(row)
                print(json.dumps(row), flush=True)
    return {"costs": costs, "verify_costs_ms": widths, "exit_layer": setup["exit_layer"],
            "rows": rows}


def stat_row(parts, decoder, costs: dict, widths: dict) -> dict:
    drafter, k, cost = decoder
    total = lambda field: sum(int(np.sum(getattr(s, field))) for s in parts)
    forwards, offered = total("target_forwards"), total("proposed")
    row = {"tau": total("emitted") / forwards, "offered": offered / forwards,
           "acceptance": total("accepted") / max(offered, 1)}
    c = costs.get(cost) if isinstance(cost, str) else cost
    if c is not None:
        v = verify_cost(row["offered"], widths)
        # Kangaroo's loop runs until every row has exited: one draft past the offer.
        early_exit = getattr(drafter, "stop_below", None) is not None
        drafted = min(k, row["offered"] + 1) if early_exit else k
        ideal = row["tau"] / (drafted * c + v)
        row.update(c=c, v=v, drafted=drafted, ideal=ideal)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bundled", "smollm2"],
                        choices=["bundled", "smollm2"])
    parser.add_argument("--prompts-per-kind", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--smollm2-adapter", default=str(specjax_models.SMOLLM2_KANGAROO),
                        help="a Kangaroo adapter trained on SmolLM2 (specjax train-drafter "
                             "--model smollm2 --method kangaroo; default: the shipped one)")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if args.report_only:
        write_report(json.loads((RESULTS / f"{NAME}.json").read_text()))
        return
    if "smollm2" in args.models and not (args.smollm2_adapter and Path(
            args.smollm2_adapter, "head.json").exists()):
        parser.error("--models smollm2 needs --smollm2-adapter DIR (a trained adapter)")
    result = {"benchmark": "kangaroo", "machine": machine_record(),
              "args": {k: v for k, v in vars(args).items() if k != "smollm2_adapter"},
              "models": {}}
    for model in args.models:
        setup = (bundled_setup if model == "bundled" else smollm2_setup)(args)
        result["models"][model] = measure(model, setup, args)
    write_report(result)


def write_report(result: dict) -> None:
    args = argparse.Namespace(**result["args"])
    machine = result["machine"]
    command = (f"python -m benchmarks.drafters.kangaroo --models {' '.join(args.models)} "
               f"--prompts-per-kind {args.prompts_per_kind} --new-tokens {args.new_tokens} "
               f"--reps {args.reps}")
    lines = [
        "# Kangaroo (EarlyExit): the target's first blocks, an adapter and its head", "",
        f"`{command}` on {machine.get('cpu_model') or 'this CPU'} ({machine.get('cpu_count')} "
        f"cores). Batch 1, at most {args.new_tokens} new tokens; tokens/s over a kind's "
        "requests, compile excluded, median of alternating passes; speedups from the same "
        "run. tau: tokens per target forward; offered: drafts offered (verified) per step; "
        "c: a draft step in one-token target forwards (Kangaroo: its exit layer's blocks, "
        "the adapter and the head rows; the draft model's forward; LayerSkip's kept "
        "blocks); v: the verify forward of the mean offer; ideal = tau / (drafted x c + v) "
        "(drafted: K, or for Kangaroo's early exit the offer + 1, the step its loop stops "
        "at); efficiency = speedup / ideal. Bundled: the byte-level pair and its shipped "
        "adapter (models/checkpoints/kangaroo), the held-out prompts by kind; SmolLM2: its "
        "held-out chat / rewrite / code prompts (benchmarks/real_prompts.py) through the "
        "chat template, the shipped adapter (models/checkpoints/smollm2_kangaroo, trained by "
        "`specjax train-drafter --model smollm2 --method kangaroo`).", ""]
    fmt = lambda row, key, spec: format(row[key], spec) if row.get(key) is not None else "-"
    for model, part in result["models"].items():
        costs = part["costs"]
        lines += [f"## {model} (exit after {part['exit_layer']} blocks)", "",
                  "c: " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items()) + "; verify ms "
                  "(width: ms) " + ", ".join(f"{w}: {ms:.1f}" for w, ms in
                                             part["verify_costs_ms"].items()), "",
                  "| mode | kind | decoder | tokens/s | vs plain | tau | offered | acceptance "
                  "| c | v | ideal | efficiency |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in part["rows"]:
            ideal = row.get("ideal")
            efficiency = None if ideal is None else row["speedup"] / ideal
            lines.append(
                f"| {row['mode']} | {row['kind']} | {row['decoder']} | "
                f"{row['tokens_per_second']:.1f} | {row['speedup']:.2f}x | "
                f"{fmt(row, 'tau', '.2f')} | {fmt(row, 'offered', '.2f')} | "
                f"{fmt(row, 'acceptance', '.2f')} | {fmt(row, 'c', '.2f')} | "
                f"{fmt(row, 'v', '.2f')} | {fmt(row, 'ideal', '.2f')} | "
                + ("-" if efficiency is None else f"{efficiency:.2f}") + " |")
        lines.append("")
    write_results(NAME, result, "\n".join(lines))


if __name__ == "__main__":
    main()
