"""Prompt lookup on the bundled target: specjax vs plain decoding vs transformers'
`prompt_lookup_num_tokens`, same weights (copied into LlamaForCausalLM), same prompts.

Two tasks from the shipped held-out prompts: "copy" (a held-out chunk, then the start of
the same chunk again: continuing it well means copying) and "plain" (held-out code to
continue). Greedy. Acceptance over all 16 prompts of a task in one batch; speed at batch
1 (transformers' prompt lookup is batch-size-1 only) on the first --timing-prompts
prompts, median of --reps alternating repetitions, compile and warm-up excluded. The
greedy tokens of all four decoders are compared.

    python -m benchmarks.drafters.prompt_lookup [--ks 4 10] [--reps 3]
"""

from __future__ import annotations

import argparse
import functools

import numpy as np

import specjax
import specjax_models
from benchmarks.common import (
    block,
    machine_record,
    median,
    timed,
    transformers_greedy,
    write_results,
)
from benchmarks.hf_reference import to_transformers

TASKS = {"copy": "copy", "plain": "continue"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 10])
    parser.add_argument("--max-ngram-size", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timing-prompts", type=int, default=3)
    parser.add_argument("--name", default="prompt_lookup_cpu")
    args = parser.parse_args()

    import torch

    target = specjax_models.load_bundled("target")
    hf = to_transformers(target)
    tokenizer = specjax_models.ByteTokenizer()
    n = args.max_new_tokens
    rows = []
    for task, kind in TASKS.items():
        prompts = [tokenizer.encode(p["text"]) for p in specjax_models.bundled_prompts()
                   if p["kind"] == kind]
        plain_calls = [functools.partial(specjax.generate, target, [ids], max_new_tokens=n,
                                         sampling=specjax.GREEDY) for ids in prompts]
        hf_inputs = [torch.tensor([ids]) for ids in prompts]

        def hf_call(i, k=None, hf_inputs=hf_inputs, prompts=prompts):
            extra = {} if k is None else {"prompt_lookup_num_tokens": k,
                                          "max_matching_ngram_size": args.max_ngram_size}
            return transformers_greedy(hf, hf_inputs[i], n, specjax_models.ByteTokenizer.pad_id,
                                       **extra)[0].tolist()

        timed_prompts = range(min(args.timing_prompts, len(prompts)))
        plain_t, hf_plain_t, hf_plain_tokens = {}, {}, {}
        for i in timed_prompts:
            block(plain_calls[i]().tokens)
            hf_plain_tokens[i] = hf_call(i)
            plain_t[i] = median([timed(lambda call=plain_calls[i]: block(call().tokens))
                                 for _ in range(args.reps)])
            hf_plain_t[i] = median([timed(lambda i=i: hf_call(i)) for _ in range(args.reps)])
        for k in args.ks:
            # min 1: as the committed results were measured (the default is now 2).
            lookup = specjax.PromptLookup(max_ngram_size=args.max_ngram_size,
                                          min_ngram_size=1)
            batched = specjax.speculative_generate(target, lookup, prompts, max_new_tokens=n,
                                                   num_draft_tokens=k, sampling=specjax.GREEDY)
            plain_all = specjax.generate(target, prompts, max_new_tokens=n,
                                         sampling=specjax.GREEDY)
            spec_t, hf_t, same_ours, same_hf = {}, {}, 0, 0
            for i in timed_prompts:
                call = functools.partial(specjax.speculative_generate, target, lookup,
                                         [prompts[i]], max_new_tokens=n, num_draft_tokens=k,
                                         sampling=specjax.GREEDY)
                ours = np.asarray(block(call().tokens))[0].tolist()
                theirs = hf_call(i, k)
                same_ours += ours == np.asarray(plain_calls[i]().tokens)[0].tolist()
                same_hf += ours == theirs == hf_plain_tokens[i]
                spec_t[i] = median([timed(lambda call=call: block(call().tokens))
                                    for _ in range(args.reps)])
                hf_t[i] = median([timed(lambda i=i, k=k: hf_call(i, k))
                                  for _ in range(args.reps)])
            tokens = n * len(spec_t)
            s = batched.stats
            row = {
                "task": task, "k": k, "max_ngram_size": args.max_ngram_size,
                "acceptance_rate": s.acceptance_rate,
                "position_acceptance_rate": s.position_acceptance_rate,
                "mean_accepted_length": s.mean_accepted_length,
                "batched_equals_plain": bool(np.array_equal(batched.tokens, plain_all.tokens)),
                "specjax_lookup_tok_s": tokens / sum(spec_t.values()),
                "specjax_plain_tok_s": tokens / sum(plain_t.values()),
                "hf_lookup_tok_s": tokens / sum(hf_t.values()),
                "hf_plain_tok_s": tokens / sum(hf_plain_t.values()),
                "timed_prompts": len(spec_t),
                "identical_to_plain": f"{same_ours}/{len(spec_t)}",
                "identical_to_transformers": f"{same_hf}/{len(spec_t)}",
            }
            row["speedup_vs_our_plain"] = row["specjax_lookup_tok_s"] / row["specjax_plain_tok_s"]
            row["hf_speedup_vs_hf_plain"] = row["hf_lookup_tok_s"] / row["hf_plain_tok_s"]
            row["ours_vs_hf_lookup"] = row["specjax_lookup_tok_s"] / row["hf_lookup_tok_s"]
            rows.append(row)
            print({key: (round(v, 3) if isinstance(v, float) else v) for key, v in row.items()},
                  flush=True)

    import transformers

    machine = machine_record() | {"torch": torch.__version__,
                                  "transformers": transformers.__version__}
    lines = [
        "# Prompt lookup on the bundled target: specjax vs transformers, same weights", "",
        f"Greedy, {n} new tokens. Acceptance over the 16 prompts of a task in one batch; "
        f"tokens/s at batch 1 over the first {args.timing_prompts} prompts, median of "
        f"{args.reps} repetitions, compile and warm-up excluded. max n-gram size "
        f"{args.max_ngram_size} for both (transformers copies the first occurrence, specjax "
        "the most recent one). 'identical' compares the greedy tokens of the lookup decoder "
        "with plain decoding (ours) and with both transformers decoders.",
        f"Machine: {machine['processor']}, {machine['cpu_count']} CPUs, jax {machine['jax']}, "
        f"torch {machine['torch']}, transformers {machine['transformers']}.", "",
        "| task | K | alpha | beta | tau | specjax lookup tok/s | specjax plain tok/s | "
        "speedup | transformers lookup tok/s | transformers plain tok/s | their speedup | "
        "ours / theirs (lookup) | identical (ours / transformers) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['k']} | {r['acceptance_rate']:.3f} | "
            f"{r['position_acceptance_rate']:.3f} | {r['mean_accepted_length']:.2f} | "
            f"{r['specjax_lookup_tok_s']:.0f} | {r['specjax_plain_tok_s']:.0f} | "
            f"{r['speedup_vs_our_plain']:.2f} | {r['hf_lookup_tok_s']:.0f} | "
            f"{r['hf_plain_tok_s']:.0f} | {r['hf_speedup_vs_hf_plain']:.2f} | "
            f"{r['ours_vs_hf_lookup']:.1f} | {r['identical_to_plain']} / "
            f"{r['identical_to_transformers']} |")
    lines += ["", f"Command: `{machine['command']}`", ""]
    write_results(args.name, {"benchmark": "prompt_lookup", "machine": machine, "rows": rows},
                  "\n".join(lines))


if __name__ == "__main__":
    main()
