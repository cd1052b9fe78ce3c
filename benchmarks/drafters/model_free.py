"""Model-free drafting on a real model: lookahead (Jacobi) decoding and retrieval (REST /
SuffixDecoding) on SmolLM2-135M-Instruct, against our plain decoding, prompt lookup and
the drafters trained for SmolLM2.

Held-out prompts (`benchmarks/real_prompts.py`: chat, rewrite, code; none is among the
prompts whose answers fill the shipped datastore, `models/checkpoints/
smollm2_datastore.npz`), through the chat template, stopping at the end of turn; greedy
and t=0.7 / top-p 0.9; batch 1 (the first `--prompts-per-kind` of a kind, one at a time)
and batch 8 (a kind's 8 prompts at once). Tokens/s over all requests of a kind, compile
excluded (a warm-up pass compiles every shape first; every request uses one cache size),
medians of `--reps` alternating passes; ratios come from the same run.

Per decoder: tau (tokens per target forward), nodes verified per step, and the ideal
speedup tau / (K c + v): c = 0 for model-free drafters (no draft forward), v = the
measured cost of their average verify forward in one-token forwards (a step that
verifies N nodes costs forward(N + 1) / forward(1), a one-token step 1), so the
efficiency reached is the measured speedup over that ideal.

    python -m benchmarks.drafters.model_free [--prompts-per-kind 3] [--new-tokens 48] [--reps 2]
        [--batches 1 8] [--modes greedy ...] [--skip NAME ...]
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
from benchmarks.drafters.real import ours
from benchmarks.real_prompts import PROMPTS
from specjax.drafters import Lookahead, Retrieval
from specjax.drafters.datastore import Datastore
from specjax.runtime.timing import wall_seconds

MODES = {"greedy": specjax.GREEDY,
         "t=0.7 top-p 0.9": specjax.SamplingConfig(temperature=0.7, top_p=0.9)}
CACHE_SIZE = 512
K = 4  # prompt lookup
TRAINED_K = 3


def drafters(target, skip) -> dict:
    """name -> (drafter, num_draft_tokens or None for a drafter's own tree)."""
    from specjax_models import SMOLLM2_DATASTORE, SMOLLM2_DRAFT, SMOLLM2_HEAD, load_layer_draft
    from specjax_models.heads import load_head_for

    store = Datastore.load(SMOLLM2_DATASTORE)
    found = {
        "prompt lookup (K=4)": (specjax.PromptLookup(), K),
        "lookahead (W=5, N=4, G=5)": (Lookahead(window=5, ngram=4, guesses=5), None),
        "lookahead (W=3, N=3, G=3)": (Lookahead(window=3, ngram=3, guesses=3), None),
        "retrieval (datastore + own text)": (Retrieval(store), None),
        "retrieval (datastore + own text, min_probability 0.1)": (
            Retrieval(store, min_probability=0.1), None),
        "retrieval (own text only)": (Retrieval(None), None),
        f"EAGLE-3 head (K={TRAINED_K})": (load_head_for(SMOLLM2_HEAD, target), TRAINED_K),
        f"distilled 2-layer draft (K={TRAINED_K})": (load_layer_draft(SMOLLM2_DRAFT, target),
                                                     TRAINED_K),
    }
    return {name: value for name, value in found.items() if name not in skip}


def verify_costs(target, widths, batch: int, reps: int = 15) -> dict:
    """{width: ms} of one target forward over `width` new tokens after a 200-token
    context, batch `batch`, on a CACHE_SIZE cache (compile excluded, median)."""
    cache = target.init_cache(batch, CACHE_SIZE)
    context = 200

    @jax.jit
    def forward(params, tokens, cache):
        positions = context + jnp.broadcast_to(
            jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        return target.with_params(params).apply(tokens, positions, cache,
                                                jnp.full((batch,), context, jnp.int32))[0]

    costs = {}
    for width in sorted(set(widths)):
        tokens = jnp.ones((batch, width), jnp.int32)
        jax.block_until_ready(forward(target.params, tokens, cache))
        costs[width] = 1e3 * median([wall_seconds(lambda t=tokens: jax.block_until_ready(
            forward(target.params, t, cache)))[1] for _ in range(reps)])
    return costs


def verify_cost(nodes_per_step: float, costs: dict) -> float:
    """The mean verify cost of a step in one-token forwards, at the mean width: exact for
    a fixed tree (lookahead) and for a mix of one-token and K-draft steps (prompt lookup:
    the cost is linear between the two), an upper bound for retrieval's graded widths
    (the cost is concave in the width)."""
    widths = sorted(int(w) for w in costs)
    ms = [costs[w] if w in costs else costs[str(w)] for w in widths]
    return float(np.interp(nodes_per_step + 1, widths, ms) / ms[0])


def add_ideal(row: dict, costs: dict) -> None:
    if "nodes_per_step" in row and row.get("model_free"):
        v = verify_cost(row["nodes_per_step"], costs)
        row.update(verify_cost=v, ideal=row["tau"] / v,
                   efficiency=row["speedup"] / (row["tau"] / v))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts-per-kind", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--skip", nargs="*", default=[])
    parser.add_argument("--name", default="model_free_cpu")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report of an earlier run from its JSON")
    args = parser.parse_args()
    if args.report_only:
        earlier = json.loads((RESULTS / f"{args.name}.json").read_text())
        costs = {int(b): {int(w): ms for w, ms in c.items()}
                 for b, c in earlier["verify_costs_ms"].items()}
        for row in earlier["rows"]:
            row["model_free"] = row.get("model_free", "verify_cost" in row)
            add_ideal(row, costs[row["batch"]])
        write_report(argparse.Namespace(**earlier["args"]), earlier["rows"], costs)
        return
    target, tok = smollm2()
    found = drafters(target, args.skip)
    nodes = {name: (k if k is not None else drafter.proposal_tree.num_nodes)
             for name, (drafter, k) in found.items()}
    requests = {kind: [tok.apply_chat_template([{"role": "user", "content": p}])
                       for p in prompts] for kind, prompts in PROMPTS.items()}
    costs = {batch: verify_costs(target, [1, 2, 3, 5, 9] + [n + 1 for n in nodes.values()],
                                 batch)
             for batch in args.batches}
    print("verify costs (ms):", costs, flush=True)
    rows = []
    for mode in args.modes:
        sampling = MODES[mode]
        decoders = {name: ours(target, found, name, sampling, tok.eos_ids, args.new_tokens,
                               CACHE_SIZE) for name in ["plain", *found]}
        for batch_size in args.batches:
            for kind, every in requests.items():
                ids = every[:args.prompts_per_kind] if batch_size == 1 else every
                batches = [ids[i:i + batch_size] for i in range(0, len(ids), batch_size)]
                seconds, tokens, stats = alternating_passes(decoders, batches, args.reps)
                plain_rate = tokens["plain"] / median(seconds["plain"])
                for name in decoders:
                    rate = tokens[name] / median(seconds[name])
                    row = {"mode": mode, "batch": batch_size, "kind": kind, "decoder": name,
                           "tokens": tokens[name], "tokens_per_second": rate,
                           "speedup": rate / plain_rate}
                    if name != "plain":
                        parts = stats[name]
                        forwards = sum(int(np.sum(s.target_forwards)) for s in parts)
                        emitted = sum(int(np.sum(s.emitted)) for s in parts)
                        proposed = sum(int(np.sum(s.proposed)) for s in parts)
                        row.update(tau=emitted / forwards, nodes_per_step=proposed / forwards,
                                   model_free=found[name][1] is None
                                   or name.startswith("prompt lookup"))
                        add_ideal(row, costs[batch_size])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    write_report(args, rows, costs)


def write_report(args, rows, costs) -> None:
    skip = "".join(f" '{s}'" for s in args.skip)
    command = ("python -m benchmarks.drafters.model_free --prompts-per-kind "
               f"{args.prompts_per_kind} "
               f"--new-tokens {args.new_tokens} --reps {args.reps} --batches "
               f"{' '.join(map(str, args.batches))}" + (f" --skip{skip}" if skip else "")
               + ("" if args.name == "model_free_cpu" else f" --name {args.name}"))
    machine = machine_record()
    lines = [
        "# Model-free drafting on SmolLM2-135M-Instruct: lookahead and retrieval", "",
        f"`{command}` on {machine.get('cpu_model') or 'this CPU'} "
        f"({machine.get('cpu_count')} cores). Held-out prompts "
        "(benchmarks/real_prompts.py) through the chat template, at most "
        f"{args.new_tokens} new tokens, stopping at the end of turn; batch 1: "
        f"{args.prompts_per_kind} prompts per kind one at a time, batch 8: a kind's 8 "
        "prompts at once. Tokens/s over all requests of a kind, compile excluded, median "
        "of alternating passes; speedups from the same run. The datastore is "
        "models/checkpoints/smollm2_datastore.npz (SmolLM2's greedy answers to 512 "
        "training chat prompts and 128 rewrite prompts; none of the evaluation prompts). "
        "tau: tokens per target forward; nodes: drafts verified per step (one-token steps "
        "count 0); ideal = tau / v, v the measured cost of a verify forward of the mean "
        "width in one-token forwards (model-free: no draft cost; exact for lookahead's "
        "fixed tree and prompt lookup's mix of one-token and K-draft steps, an upper bound "
        "for retrieval's graded widths); efficiency = speedup / ideal.", "",
        "Verify forward cost (ms, 200 tokens of context): "
        + "; ".join(f"batch {b}: " + ", ".join(f"{w} tok {ms:.1f}" for w, ms in c.items())
                    for b, c in costs.items()), "",
        "| mode | batch | kind | decoder | tokens/s | vs plain | tau | nodes | v | ideal "
        "| efficiency |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda row, key, spec: format(row[key], spec) if key in row else "-"
    for row in rows:
        lines.append(
            f"| {row['mode']} | {row['batch']} | {row['kind']} | {row['decoder']} | "
            f"{row['tokens_per_second']:.1f} | {row['speedup']:.2f}x | {fmt(row, 'tau', '.2f')}"
            f" | {fmt(row, 'nodes_per_step', '.1f')} | {fmt(row, 'verify_cost', '.2f')} | "
            f"{fmt(row, 'ideal', '.2f')} | {fmt(row, 'efficiency', '.2f')} |")
    write_results(args.name, {"benchmark": "model_free", "machine": machine,
                              "args": vars(args), "verify_costs_ms": costs, "rows": rows},
                  "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
