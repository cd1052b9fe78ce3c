"""Speculative decoding vs plain decoding, measured in the same run, next to the analytical
expectation.

For each sampling mode (greedy, temperature 1), batch size and K: tokens/s of
`speculative_generate` and of `generate` (alternating repetitions, median, compile
excluded and reported apart), acceptance rate alpha (accepted / proposed), per-position
acceptance beta (accepted / checked), mean accepted length tau and the analytical tau
(1 - beta^(K+1)) / (1 - beta), the cost ratio c of a draft step to a target step, the
cost ratio v of a (K+1)-token verify forward to a 1-token forward, the ideal speedup
tau / (K c + v) for the measured tau, and the efficiency measured / ideal.

Pairs:
  truncated: a Llama-shaped target with random weights; the draft is a copy of its first
    layers (same embeddings, final norm and head). Random weights have near-uniform
    next-token distributions, so greedy acceptance is near 0 and sampled acceptance
    reflects only the overlap of two high-entropy distributions: this pair measures the
    machinery's costs, not a trained pair's acceptance.

    python -m benchmarks.decoding.speculative_vs_ar [--pair truncated] [--reps 5] [--quick]
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import numpy as np
from flax import nnx

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
from specjax import analysis
from specjax.runtime.timing import forward_timer, step_costs


def truncated_pair(seed: int = 0, draft_layers: int = 1):
    config = specjax_models.TransformerConfig(vocab_size=4096, num_layers=8, d_model=512,
                                              num_heads=8, num_kv_heads=4, d_ff=1408,
                                              max_seq_len=1024)
    model = specjax_models.Transformer(config, rngs=nnx.Rngs(seed))
    draft = specjax_models.first_layers(model, draft_layers)
    count = specjax_models.count_params
    description = (f"random-weight target ({count(model) / 1e6:.1f}M params, "
                   f"{config.num_layers} layers, vocab {config.vocab_size}); draft = its first "
                   f"{draft_layers} layer(s) ({count(draft) / 1e6:.1f}M params)")

    def prompts(batch, rng):
        return rng.integers(0, config.vocab_size, (batch, 32)).astype(np.int32)

    return (specjax.CausalLM.from_nnx(model), specjax.CausalLM.from_nnx(draft), prompts,
            description)


PAIRS = {"truncated": truncated_pair}


def forward_seconds(lm, batch: int, num_tokens: int, reps: int, **where) -> float:
    """Median over `reps` (at least 5) of `forward_timer`'s per-forward seconds."""
    timer = forward_timer(lm, batch, num_tokens, **where)
    return median([timer() for _ in range(max(reps, 5))])


def step_cost_table(target, draft, batch, ks, reps, **where) -> dict:
    """`specjax.runtime.timing.step_costs` with twice the rounds (these figures carry the
    report)."""
    return step_costs(target, draft, batch, ks, 2 * max(reps, 5), **where)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="truncated")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--quick", action="store_true", help="1 batch size, K=4, 3 reps")
    parser.add_argument("--name", default=None, help="results file name")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.ks, args.reps = [1], [4], 3

    target, draft, make_prompts, description = PAIRS[args.pair]()
    print(description, flush=True)
    rng = np.random.default_rng(0)
    samplings = sampling_modes()
    rows = []
    for batch in args.batches:
        prompts = make_prompts(batch, rng)
        costs = step_cost_table(target, draft, batch, args.ks, args.reps)
        cost_ratio = costs["draft"] / costs["target"]
        for mode, sampling in samplings.items():
            key = jax.random.key(0)
            plain = functools.partial(specjax.generate, target, prompts,
                                      max_new_tokens=args.new_tokens, sampling=sampling, key=key)
            start = time.perf_counter()
            block(plain().tokens)
            ar_compile = time.perf_counter() - start
            for k in args.ks:
                verify_ratio = costs[k + 1] / costs["target"]
                spec = functools.partial(specjax.speculative_generate, target, draft, prompts,
                                         max_new_tokens=args.new_tokens, num_draft_tokens=k,
                                         sampling=sampling, key=key)
                start = time.perf_counter()
                out = spec()
                block(out.tokens)
                spec_compile = time.perf_counter() - start
                ar_times, spec_times = [], []
                for _ in range(args.reps):
                    ar_times.append(timed(lambda plain=plain: block(plain().tokens)))
                    spec_times.append(timed(lambda spec=spec: block(spec().tokens)))
                generated = int(np.asarray(out.lengths).sum())
                alpha = out.stats.acceptance_rate
                beta = out.stats.position_acceptance_rate
                tau = out.stats.mean_accepted_length
                tau_model = analysis.expected_tokens_per_forward(beta, k)
                ideal = tau / (k * cost_ratio + verify_ratio)
                measured = median(ar_times) / median(spec_times)
                row = {
                    "mode": mode, "batch": batch, "k": k, "new_tokens": args.new_tokens,
                    "ar_tokens_per_s": generated / median(ar_times),
                    "spec_tokens_per_s": generated / median(spec_times),
                    "speedup": measured, "acceptance_rate": alpha,
                    "position_acceptance_rate": beta,
                    "mean_accepted_length": tau, "analytical_tau": tau_model,
                    "accepted_per_position": out.stats.accepted_per_position.tolist(),
                    "cost_ratio_c": cost_ratio, "verify_cost_ratio_v": verify_ratio,
                    "ideal_speedup": ideal, "efficiency": measured / ideal,
                    "ar_compile_s": ar_compile, "spec_compile_s": spec_compile,
                    "ar_times_s": ar_times, "spec_times_s": spec_times,
                }
                rows.append(row)
                print(f"{mode:6s} B={batch:<2d} K={k}: speedup {measured:.2f}x, alpha "
                      f"{alpha:.3f}, beta {beta:.3f}, tau {tau:.2f} (model {tau_model:.2f}), "
                      f"c {cost_ratio:.2f}, v {verify_ratio:.2f}, ideal {ideal:.2f}x, "
                      f"efficiency {measured / ideal:.2f}", flush=True)

    machine = machine_record()
    name = args.name or f"speculative_vs_ar_{args.pair}_{jax.default_backend()}"
    lines = [
        f"# Speculative vs plain decoding ({args.pair} pair, {jax.default_backend()})", "",
        f"Pair: {description}.", "",
        f"{args.new_tokens} new tokens per row, median of {args.reps} alternating "
        "repetitions, compile excluded (reported in the JSON). alpha = accepted / proposed "
        "drafts; beta = accepted / checked drafts (checked: up to the first rejection), the "
        "per-position rate of the i.i.d. model; tau = emitted tokens per target forward (cut "
        "at max_new_tokens); analytical tau = (1 - beta^(K+1)) / (1 - beta); c = draft step / "
        "target step; v = (K+1)-token verify forward / 1-token forward; ideal = tau / (K c + "
        "v); efficiency = speedup / ideal.",
        f"Machine: {machine['processor']}, {machine['cpu_count']} CPUs, devices "
        f"{machine['devices']}, jax {machine['jax']}.", "",
        "| mode | batch | K | AR tok/s | spec tok/s | speedup | alpha | beta | tau | "
        "analytical tau | c | v | ideal | efficiency |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['batch']} | {r['k']} | {r['ar_tokens_per_s']:.0f} | "
            f"{r['spec_tokens_per_s']:.0f} | {r['speedup']:.2f} | {r['acceptance_rate']:.3f} | "
            f"{r['position_acceptance_rate']:.3f} | "
            f"{r['mean_accepted_length']:.2f} | {r['analytical_tau']:.2f} | "
            f"{r['cost_ratio_c']:.2f} | {r['verify_cost_ratio_v']:.2f} | "
            f"{r['ideal_speedup']:.2f} | {r['efficiency']:.2f} |")
    lines += ["", f"Command: `{machine['command']}`", ""]
    write_results(name, {"benchmark": "speculative_vs_ar", "pair": args.pair,
                         "description": description, "machine": machine, "rows": rows},
                  "\n".join(lines))


if __name__ == "__main__":
    main()
