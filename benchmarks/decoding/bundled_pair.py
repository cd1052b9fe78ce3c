"""Acceptance and speedup of a byte-level pair on the held-out prompts.

For each draft (e.g. before and after distillation), sampling mode (greedy, temperature
1) and K: acceptance rate, per-position acceptance, mean accepted length on all held-out
"continue" prompts in one batch, and (unless --no-timing) tokens/s of speculative vs
plain decoding of the same target at batch 1 on the first --timing-prompts prompts,
alternating repetitions, median, compile excluded.

    python -m benchmarks.decoding.bundled_pair [--target DIR] [--draft NAME=DIR ...] [--ks 2 4 6 8]
"""

from __future__ import annotations

import argparse
import functools

import jax
import numpy as np

import specjax
import specjax_models
from benchmarks.common import (
    block,
    machine_record,
    median,
    sampling_modes,
    timed,
    write_results,
)

MODES = sampling_modes()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="checkpoint dir (default: bundled)")
    parser.add_argument("--draft", action="append", default=None,
                        help="NAME=DIR (repeatable; default: the bundled draft)")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--timing-prompts", type=int, default=2)
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()

    target = (specjax_models.load_checkpoint(args.target) if args.target
              else specjax_models.load_bundled("target"))
    drafts = {}
    for spec in args.draft or ["bundled=" + str(specjax_models.bundled.bundled_path("draft"))]:
        name, _, path = spec.partition("=")
        drafts[name] = specjax_models.load_checkpoint(path)
    tokenizer = specjax_models.ByteTokenizer()
    prompts = [tokenizer.encode(p["text"]) for p in specjax_models.bundled_prompts()
               if p["kind"] == "continue"]
    key = jax.random.key(0)
    rows = []
    for mode in args.modes:
        sampling = MODES[mode]
        plain_times = {}
        for draft_name, draft in drafts.items():
            for k in args.ks:
                out = specjax.speculative_generate(target, draft, prompts,
                                                   max_new_tokens=args.max_new_tokens,
                                                   num_draft_tokens=k, sampling=sampling, key=key)
                s = out.stats
                row = {"draft": draft_name, "mode": mode, "k": k,
                       "acceptance_rate": s.acceptance_rate,
                       "position_acceptance_rate": s.position_acceptance_rate,
                       "mean_accepted_length": s.mean_accepted_length,
                       "accepted_per_position": s.accepted_per_position.tolist(),
                       "batch": len(prompts)}
                if not args.no_timing:
                    spec_t, plain_t, tokens = [], [], 0
                    for i, ids in enumerate(prompts[: args.timing_prompts]):
                        spec = functools.partial(
                            specjax.speculative_generate, target, draft, [ids],
                            max_new_tokens=args.max_new_tokens, num_draft_tokens=k,
                            sampling=sampling, key=key)
                        plain = functools.partial(specjax.generate, target, [ids],
                                                  max_new_tokens=args.max_new_tokens,
                                                  sampling=sampling, key=key)
                        block(spec().tokens), block(plain().tokens)
                        tokens += int(np.asarray(spec().lengths).sum())
                        st, pt = [], []
                        for _ in range(args.reps):
                            pt.append(timed(lambda plain=plain: block(plain().tokens)))
                            st.append(timed(lambda spec=spec: block(spec().tokens)))
                        spec_t.append(median(st))
                        plain_t.append(plain_times.setdefault(i, median(pt)))
                    row["spec_tokens_per_s"] = tokens / sum(spec_t)
                    row["plain_tokens_per_s"] = tokens / sum(plain_t)
                    row["speedup"] = sum(plain_t) / sum(spec_t)
                rows.append(row)
                print(" ".join(f"{k_}={v:.3f}" if isinstance(v, float) else f"{k_}={v}"
                               for k_, v in row.items() if k_ != "accepted_per_position"),
                      flush=True)

    machine = machine_record()
    lines = ["# Bundled pair: acceptance and speedup on held-out prompts", "",
             f"{len(prompts)} held-out 'continue' prompts, {args.max_new_tokens} new tokens. "
             "Acceptance over all prompts in one batch; speed at batch 1 on the first "
             f"{args.timing_prompts} prompts, median of {args.reps} alternating repetitions, "
             "compile excluded. alpha = accepted / proposed, beta = accepted / checked, "
             "tau = tokens per target forward.",
             f"Machine: {machine['processor']}, {machine['cpu_count']} CPUs, devices "
             f"{machine['devices']}, jax {machine['jax']}.", "",
             "| draft | mode | K | alpha | beta | tau | spec tok/s | plain tok/s | speedup |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        timing = (f"{r['spec_tokens_per_s']:.0f} | {r['plain_tokens_per_s']:.0f} | "
                  f"{r['speedup']:.2f}") if "speedup" in r else "- | - | -"
        lines.append(f"| {r['draft']} | {r['mode']} | {r['k']} | {r['acceptance_rate']:.3f} | "
                     f"{r['position_acceptance_rate']:.3f} | {r['mean_accepted_length']:.2f} | "
                     f"{timing} |")
    lines += ["", f"Command: `{machine['command']}`", ""]
    name = args.name or f"bundled_pair_{jax.default_backend()}"
    write_results(name, {"benchmark": "bundled_pair", "machine": machine, "rows": rows},
                  "\n".join(lines))


if __name__ == "__main__":
    main()
