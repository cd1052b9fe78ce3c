"""Parallel drafting against the autoregressive drafter it was adapted from.

Three pairs (`--pair`): `draft`, the bundled draft model (`DraftModel`: K draft forwards
per step) against the bundled parallel draft (`ParallelDraft`, PARD: one forward over at
most 2K tokens); `heads`, the bundled EAGLE-3 head (K head forwards per step: K - 1 in the
propose, one in the commit) against the bundled P-EAGLE head (`ParallelEagle`: one head
forward over the pending pairs and K - 1 placeholders, no commit forward); `smollm2`,
SmolLM2's distilled layer draft against its parallel version, on the evaluation prompts
(`benchmarks/real_prompts.py`, chat template applied).

For greedy and t = 0.7, each batch and K in {2, 4, 6, 8}: tau over the prompts (median
over seeds at t = 0.7), the measured cost `C` of a step's draft block (the drafter's
propose, jitted, against a one-token target forward; a head's commit forward is not in
it), the verify cost `v` (a (K+1)-token target forward, same unit), decode tokens/s of
each drafter and of plain decoding (alternating repetitions, medians, compile excluded),
the speedup, the ideal `tau / (C + v)` and the efficiency reached.

    python -m benchmarks.drafters.parallel_draft [--pair draft|heads|smollm2] [--reps 3]
        [--new-tokens 96] [--batches 1 8] [--prompts N] [--resume]
"""

from __future__ import annotations

import argparse
import dataclasses
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
from specjax.decoding.sampling import sampling_params
from specjax.drafters import DraftContext

NAMES = {"draft": "parallel_draft_cpu", "heads": "p_eagle_cpu",
         "smollm2": "parallel_draft_smollm2_cpu"}
LABELS = {"draft": ("autoregressive draft", "parallel draft"),
          "heads": ("EAGLE-3 head", "P-EAGLE head"),
          "smollm2": ("autoregressive layer draft", "parallel layer draft")}
MODES = {"greedy": specjax.GREEDY, "t=0.7": specjax.SamplingConfig(temperature=0.7)}
KS = (2, 4, 6, 8)


def load_pair(pair: str):
    """(target, autoregressive drafter, parallel drafter, prompts, eos ids)."""
    if pair == "smollm2":
        from benchmarks.real_prompts import PROMPTS

        path = specjax_models.smollm2_path()
        target, tok = specjax_models.from_gguf(path), specjax_models.gguf_tokenizer(path)
        prompts = [tok.apply_chat_template([{"role": "user", "content": p}])
                   for kind in PROMPTS.values() for p in kind]
        return (target, specjax_models.load_layer_draft(specjax_models.SMOLLM2_DRAFT, target),
                specjax_models.load_parallel_layer_draft(specjax_models.SMOLLM2_PARALLEL,
                                                         target), prompts, tok.eos_ids)
    target = specjax_models.load_bundled("target")
    tok = specjax_models.ByteTokenizer()
    prompts = [tok.encode(p["text"]) for p in specjax_models.bundled_prompts()
               if p["kind"] == "continue"]
    if pair == "heads":
        return (target, specjax_models.load_bundled("eagle3"),
                specjax_models.load_bundled("p-eagle"), prompts, None)
    return (target, specjax.DraftModel(specjax_models.load_bundled("draft")),
            specjax_models.load_bundled("parallel"), prompts, None)


def drafters(pair: str, autoregressive, parallel, sampling) -> dict:
    method = "greedy" if sampling.greedy else "sample"
    first, second = LABELS[pair]
    with_method = lambda d: (d.with_method(method) if hasattr(d, "with_method")
                             else dataclasses.replace(d, method=method))
    return {first: with_method(autoregressive), second: with_method(parallel)}


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
    # Models are arguments, not closures: closed over, their weights become program
    # constants (slow to compile; XLA constant-folds SmolLM2's 576 x 49152 head).
    features = None
    if getattr(drafter, "reads_target_features", False):  # the prefill's features
        positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch, width))
        _, features, _ = jax.jit(lambda lm, t: lm.apply(
            t, positions, lm.init_cache(batch, width), jnp.zeros((batch,), jnp.int32),
            feature_layers=drafter.feature_layers))(target, jnp.asarray(tokens[:, :width]))
    with_k = ({"num_draft_tokens": k} if getattr(drafter, "init_takes_draft_tokens", False)
              else {})
    state = jax.jit(lambda d, t, n, f: d.init(t, n, capacity, **with_k,
                                             **({} if f is None else {"features": f})))(
        drafter, jnp.asarray(tokens[:, :width]), lengths, features)
    context = DraftContext(jnp.asarray(tokens), lengths)
    params = sampling_params(sampling, batch)
    propose = jax.jit(lambda d, s, c, key: d.propose(
        s, c, key, num_draft_tokens=k, sampling=params, vocab_size=target.vocab_size))
    block(propose(drafter, state, context, jax.random.key(0)))
    draft_seconds = median([timed(lambda: block(propose(drafter, state, context,
                                                        jax.random.key(1))))
                            for _ in range(reps)])
    cache = target.init_cache(batch, capacity)
    forward = jax.jit(lambda lm, c, t, pos: lm.apply(t, pos, c, lengths - 1)[0])
    times = []
    for width_t in (k + 1, 1):
        new = jnp.zeros((batch, width_t), jnp.int32)
        positions = (lengths - 1)[:, None] + jnp.arange(width_t)[None]
        block(forward(target, cache, new, positions))
        times.append(median([timed(lambda n=new, p=positions: block(forward(target, cache, n,
                                                                            p)))
                             for _ in range(reps)]))
    return draft_seconds, times[0], times[1]


def measure(target, drafter, k, sampling, held_out, batch, args, plain_rate,
            eos_ids) -> dict:
    taus = [specjax.speculative_generate(
        target, drafter, held_out, max_new_tokens=args.new_tokens, num_draft_tokens=k,
        sampling=sampling, key=jax.random.key(seed), eos_id=eos_ids).stats.mean_accepted_length
        for seed in range(1 if sampling.greedy else args.seeds)]
    prompts = held_out[:batch]
    call = lambda: specjax.speculative_generate(
        target, drafter, prompts, max_new_tokens=args.new_tokens, num_draft_tokens=k,
        sampling=sampling, key=jax.random.key(0), eos_id=eos_ids)
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


TITLES = {"draft": "Parallel drafting (PARD) against the autoregressive draft",
          "heads": "P-EAGLE against the autoregressive EAGLE-3 head",
          "smollm2": "SmolLM2: the parallel layer draft (PARD) against the autoregressive one"}
WHAT = {"draft": "Bundled pair", "heads": "Bundled target and its heads",
        "smollm2": "SmolLM2-135M-Instruct on the evaluation prompts"}


def write_report(record: dict, pair: str) -> None:
    machine = record["machine"]
    lines = [f"# {TITLES[pair]}", "",
             f"{record['command']} on {machine['cpu_model']} ({machine['cpu_count']} cores), "
             f"commit {machine.get('git_commit', '?')[:10]}. {WHAT[pair]}; tau over every "
             "prompt (median over seeds at t = 0.7 [min, max]); decode tokens/s at "
             "the batch shown (median of repetitions, compile excluded), speedup over plain "
             "decoding of the same prompts; C: one step's whole draft block (the propose; "
             "a head's commit forward is not in it), v: the (K+1)-token verify, both in "
             "one-token target forwards; ideal tau / (C + v). " + record.get("note", ""), "",
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
    first, second = LABELS[pair]
    lines += ["", "Best K per drafter (speedup over plain decoding):", "",
              f"| sampling | batch | {first} | {second} | ratio |", "|---|---|---|---|---|"]
    batches = sorted({row["batch"] for row in record["rows"]})
    for mode in MODES:
        for batch in batches:
            ar, par = (best.get((mode, batch, d)) for d in (first, second))
            if ar and par:
                lines.append(f"| {mode} | {batch} | {ar['speedup']:.2f}x (K={ar['k']}) | "
                             f"{par['speedup']:.2f}x (K={par['k']}) | "
                             f"{par['speedup'] / ar['speedup']:.2f} |")
    same_k = [(ar, par) for ar in record["rows"] for par in record["rows"]
              if ar["drafter"] == first and par["drafter"] == second
              and (ar["mode"], ar["batch"], ar["k"]) == (par["mode"], par["batch"], par["k"])]
    if same_k:
        wins = sum(par["speedup"] > ar["speedup"] for ar, par in same_k)
        lines += ["", f"At the same K, sampling and batch the {second} is faster in {wins} of "
                  f"{len(same_k)} rows."]
    write_results(NAMES[pair], record, "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(NAMES), default="draft")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompts", type=int, default=None,
                        help="the first N prompts only (default: all)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of an earlier run and measure the rest")
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    name = NAMES[args.pair]
    command = (f"`python -m benchmarks.drafters.parallel_draft --pair {args.pair} --reps "
               f"{args.reps} "
               f"--seeds {args.seeds} --new-tokens {args.new_tokens} --batches "
               f"{' '.join(map(str, args.batches))}"
               + (f" --prompts {args.prompts}" if args.prompts else "") + "`")
    record = {"machine": machine_record(), "rows": [], "plain": {}, "command": command,
              "note": args.note}
    if args.resume and (RESULTS / f"{name}.json").exists():
        kept = json.loads((RESULTS / f"{name}.json").read_text())
        record.update({k: v for k, v in kept.items() if k in ("rows", "plain")})
    target, autoregressive, parallel, held_out, eos_ids = load_pair(args.pair)
    held_out = held_out[:args.prompts] if args.prompts else held_out
    done = {(r["mode"], r["batch"], r["k"], r["drafter"]) for r in record["rows"]}
    for mode, sampling in MODES.items():
        for batch in args.batches:
            plain_key = f"{mode}, batch {batch}"
            if plain_key not in record["plain"]:
                plain = lambda b=batch, s=sampling: specjax.generate(
                    target, held_out[:b], max_new_tokens=args.new_tokens, sampling=s,
                    key=jax.random.key(0), eos_id=eos_ids)
                tokens = int(np.asarray(plain().lengths).sum())  # and compile
                record["plain"][plain_key] = tokens / median(
                    alternating_times({"plain": plain}, args.reps)["plain"])
            for k in KS:
                for label, drafter in drafters(args.pair, autoregressive, parallel,
                                               sampling).items():
                    if (mode, batch, k, label) in done:
                        continue
                    row = measure(target, drafter, k, sampling, held_out, batch, args,
                                  record["plain"][plain_key], eos_ids)
                    row.update(mode=mode, batch=batch, k=k, drafter=label)
                    record["rows"].append(row)
                    write_report(record, args.pair)
                    jax.clear_caches()
                    print(f"{mode:7s} B={batch} K={k} {label:26s} tau {row['tau']:.2f} C "
                          f"{row['block_cost']:.2f} v {row['verify_cost']:.2f} speedup "
                          f"{row['speedup']:.2f}x (ideal {row['ideal_speedup']:.2f}x)",
                          flush=True)
    write_report(record, args.pair)


if __name__ == "__main__":
    main()
