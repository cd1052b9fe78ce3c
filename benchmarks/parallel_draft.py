"""Parallel drafting (PARD) against the autoregressive draft it was adapted from, on the
bundled pair.

For greedy and t = 0.7, batch 1 and 8, K in {2, 4, 6, 8}, the bundled draft model
(`DraftModel`: K draft forwards per step) and the bundled parallel draft
(`ParallelDraft`: one forward over at most 2K tokens): tau over the held-out prompts, the
measured draft cost of a whole step's block `C` (the drafter's propose, jitted, against a
one-token target forward), the verify cost `v` (a (K+1)-token target forward, same unit),
decode tokens/s of each drafter and of plain decoding (alternating repetitions, medians,
compile excluded), the speedup, the ideal `tau / (C + v)` and the efficiency reached.

    python -m benchmarks.parallel_draft [--reps 3] [--new-tokens 96] [--resume]
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import specjax
import specjax_models
from benchmarks.common import (
    RESULTS,
    alternating_times,
    block,
    machine_record,
    median,
    timed,
    write_results,
)
from specjax.drafters import DraftContext
from specjax.sampling import sampling_params

NAME = "parallel_draft_cpu"
MODES = {"greedy": specjax.GREEDY, "t=0.7": specjax.SamplingConfig(temperature=0.7)}
KS = (2, 4, 6, 8)
BATCHES = (1, 8)


def drafters(draft, parallel, sampling) -> dict:
    method = "greedy" if sampling.greedy else "sample"
    return {"autoregressive draft": specjax.DraftModel(draft, method),
            "parallel draft": parallel.with_method(method)}


def step_costs(target, drafter, prompts, k, sampling, reps) -> tuple[float, float, float]:
    """(seconds of one propose, of a (K+1)-token verify forward, of a one-token target
    forward), at this batch, after the prompts: medians, compile excluded."""
    batch = len(prompts)
    width = max(map(len, prompts))
    capacity = width + 2 * k + 8
    tokens = np.zeros((batch, capacity), np.int32)
    for row, prompt in enumerate(prompts):
        tokens[row, :len(prompt)] = prompt
    lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
    state = jax.jit(drafter.init, static_argnums=2)(jnp.asarray(tokens[:, :width]), lengths,
                                                    capacity)
    context = DraftContext(jnp.asarray(tokens), lengths)
    params = sampling_params(sampling, batch)
    propose = jax.jit(lambda s, c, key: drafter.propose(
        s, c, key, num_draft_tokens=k, sampling=params, vocab_size=target.vocab_size))
    block(propose(state, context, jax.random.key(0)))
    draft_seconds = median([timed(lambda: block(propose(state, context, jax.random.key(1))))
                            for _ in range(reps)])
    cache = target.init_cache(batch, capacity)
    forward = jax.jit(lambda c, t, pos: target.apply(t, pos, c, lengths - 1)[0])
    times = []
    for width_t in (k + 1, 1):
        new = jnp.zeros((batch, width_t), jnp.int32)
        positions = (lengths - 1)[:, None] + jnp.arange(width_t)[None]
        block(forward(cache, new, positions))
        times.append(median([timed(lambda n=new, p=positions: block(forward(cache, n, p)))
                             for _ in range(reps)]))
    return draft_seconds, times[0], times[1]


def measure(target, drafter, k, sampling, held_out, batch, args, plain_rate) -> dict:
    taus = [specjax.speculative_generate(
        target, drafter, held_out, max_new_tokens=args.new_tokens, num_draft_tokens=k,
        sampling=sampling, key=jax.random.key(seed)).stats.mean_accepted_length
        for seed in range(1 if sampling.greedy else args.seeds)]
    prompts = held_out[:batch]
    call = lambda: specjax.speculative_generate(
        target, drafter, prompts, max_new_tokens=args.new_tokens, num_draft_tokens=k,
        sampling=sampling, key=jax.random.key(0))
    out = call()  # compile
    seconds = alternating_times({"spec": call}, args.reps)["spec"]
    tokens = int(np.asarray(out.lengths).sum())
    draft_s, verify_s, one_s = step_costs(target, drafter, prompts, k, sampling, args.reps)
    tau = median(taus)
    c_block, v = draft_s / one_s, verify_s / one_s
    speedup = tokens / median(seconds) / plain_rate
    ideal = tau / (c_block + v)
    return {"tau": tau, "tau_spread": [min(taus), max(taus)], "seconds": seconds,
            "tokens_per_second": tokens / median(seconds), "block_cost": c_block,
            "verify_cost": v, "speedup": speedup, "ideal_speedup": ideal,
            "efficiency": speedup / ideal}


def write_report(record: dict) -> None:
    machine = record["machine"]
    lines = ["# Parallel drafting (PARD) against the autoregressive draft", "",
             f"{record['command']} on {machine['cpu_model']} ({machine['cpu_count']} cores), "
             f"commit {machine.get('git_commit', '?')[:10]}. Bundled pair; tau over every "
             "held-out prompt (median over seeds at t = 0.7 [min, max]); decode tokens/s at "
             "the batch shown (median of repetitions, compile excluded), speedup over plain "
             "decoding of the same prompts; C: one step's whole draft block, v: the "
             "(K+1)-token verify, both in one-token target forwards; ideal tau / (C + v). "
             + record.get("note", ""), "",
             "| sampling | batch | K | drafter | tau | C | v | tokens/s | speedup | ideal | "
             "efficiency |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in record["rows"]:
        spread = (f" [{row['tau_spread'][0]:.2f}, {row['tau_spread'][1]:.2f}]"
                  if row["tau_spread"][0] != row["tau_spread"][1] else "")
        lines.append(f"| {row['mode']} | {row['batch']} | {row['k']} | {row['drafter']} | "
                     f"{row['tau']:.2f}{spread} | {row['block_cost']:.2f} | "
                     f"{row['verify_cost']:.2f} | {row['tokens_per_second']:.1f} | "
                     f"{row['speedup']:.2f}x | {row['ideal_speedup']:.2f}x | "
                     f"{100 * row['efficiency']:.0f}% |")
    best = {}
    for row in record["rows"]:
        key = (row["mode"], row["batch"], row["drafter"])
        if key not in best or row["speedup"] > best[key]["speedup"]:
            best[key] = row
    lines += ["", "Best K per drafter (speedup over plain decoding):", "",
              "| sampling | batch | autoregressive draft | parallel draft | ratio |",
              "|---|---|---|---|---|"]
    for mode in MODES:
        for batch in BATCHES:
            ar, par = (best.get((mode, batch, d)) for d in ("autoregressive draft",
                                                            "parallel draft"))
            if ar and par:
                lines.append(f"| {mode} | {batch} | {ar['speedup']:.2f}x (K={ar['k']}) | "
                             f"{par['speedup']:.2f}x (K={par['k']}) | "
                             f"{par['speedup'] / ar['speedup']:.2f} |")
    write_results(NAME, record, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of an earlier run and measure the rest")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    record = {"machine": machine_record(), "rows": [], "plain": {},
              "command": f"`python -m benchmarks.parallel_draft --reps {args.reps} --seeds "
                         f"{args.seeds} --new-tokens {args.new_tokens}`", "note": args.note}
    if args.resume and (RESULTS / f"{NAME}.json").exists():
        kept = json.loads((RESULTS / f"{NAME}.json").read_text())
        record.update({k: v for k, v in kept.items() if k in ("rows", "plain")})
    target, draft = specjax_models.load_bundled("target"), specjax_models.load_bundled("draft")
    parallel = specjax_models.load_bundled("parallel")
    tok = specjax_models.ByteTokenizer()
    held_out = [tok.encode(p["text"]) for p in specjax_models.bundled_prompts()
                if p["kind"] == "continue"]
    done = {(r["mode"], r["batch"], r["k"], r["drafter"]) for r in record["rows"]}
    for mode, sampling in MODES.items():
        for batch in BATCHES:
            plain_key = f"{mode}, batch {batch}"
            if plain_key not in record["plain"]:
                plain = lambda b=batch, s=sampling: specjax.generate(
                    target, held_out[:b], max_new_tokens=args.new_tokens, sampling=s,
                    key=jax.random.key(0))
                tokens = int(np.asarray(plain().lengths).sum())  # and compile
                record["plain"][plain_key] = tokens / median(
                    alternating_times({"plain": plain}, args.reps)["plain"])
            for k in KS:
                for label, drafter in drafters(draft, parallel, sampling).items():
                    if (mode, batch, k, label) in done:
                        continue
                    row = measure(target, drafter, k, sampling, held_out, batch, args,
                                  record["plain"][plain_key])
                    row.update(mode=mode, batch=batch, k=k, drafter=label)
                    record["rows"].append(row)
                    write_report(record)
                    jax.clear_caches()
                    print(f"{mode:7s} B={batch} K={k} {label:22s} tau {row['tau']:.2f} C "
                          f"{row['block_cost']:.2f} v {row['verify_cost']:.2f} speedup "
                          f"{row['speedup']:.2f}x (ideal {row['ideal_speedup']:.2f}x)",
                          flush=True)
    write_report(record)


if __name__ == "__main__":
    main()
