"""Greedy autoregressive tokens/s: specjax.generate vs transformers' generate, same weights.

A ~20M-parameter Llama-shaped model with random weights, batch 1 and 8, 128 new tokens
after a 32-token prompt. Our weights are copied into a LlamaForCausalLM so both decoders
run the very same model, and the generated tokens are checked to be identical. Timings
alternate between the two, median of --reps repetitions, compile time reported apart.

    python -m benchmarks.decoding.ar_vs_transformers [--reps 5] [--new-tokens 128]
"""

from __future__ import annotations

import argparse

import numpy as np
from flax import nnx

import specjax
import specjax_models
from benchmarks.common import (
    greedy_against_transformers,
    machine_record,
    write_results,
)
from benchmarks.hf_reference import to_transformers

CONFIG = specjax_models.TransformerConfig(vocab_size=16_000, num_layers=6, d_model=384, num_heads=6,
                                  num_kv_heads=2, d_ff=1024, max_seq_len=512)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()

    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = specjax_models.Transformer(CONFIG, rngs=nnx.Rngs(0))
    lm = specjax.CausalLM.from_nnx(model)
    hf = to_transformers(model)
    num_params = specjax_models.count_params(model)
    rng = np.random.default_rng(0)
    rows = []
    for batch in args.batches:
        prompts = rng.integers(0, CONFIG.vocab_size, (batch, args.prompt_len)).astype(np.int32)
        row = greedy_against_transformers(lm, hf, prompts, args.new_tokens, args.reps)
        row.update(new_tokens=args.new_tokens, prompt_len=args.prompt_len)
        identical = row["identical_tokens"]
        rows.append(row)
        print(f"batch {batch}: specjax {row['specjax_tokens_per_s']:.0f} tok/s, transformers "
              f"{row['transformers_tokens_per_s']:.0f} tok/s, ratio {row['ratio']:.2f}, "
              f"identical tokens: {identical}", flush=True)

    import transformers

    machine = machine_record() | {"torch": torch.__version__,
                                  "transformers": transformers.__version__,
                                  "torch_threads": torch.get_num_threads()}
    payload = {"benchmark": "ar_vs_transformers", "config": CONFIG.__dict__,
               "num_params": num_params, "reps": args.reps, "machine": machine, "rows": rows}
    lines = [
        "# Greedy AR decoding: specjax.generate vs transformers generate (same weights)",
        "",
        f"Model: Llama-shaped, {num_params / 1e6:.1f}M parameters, float32, random weights. "
        f"Prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, median of "
        f"{args.reps} alternating repetitions, compile excluded.",
        f"Machine: {machine['processor']}, {machine['cpu_count']} CPUs, jax "
        f"{machine['jax']} ({machine['jax_backend']}), torch {machine['torch']}, transformers "
        f"{machine['transformers']}.",
        "",
        "| batch | specjax tok/s | transformers tok/s | ratio | identical tokens | "
        "first call incl. compile (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['specjax_tokens_per_s']:.0f} | "
                     f"{r['transformers_tokens_per_s']:.0f} | {r['ratio']:.2f} | "
                     f"{r['identical_tokens']} | {r['specjax_first_call_s_incl_compile']:.1f} |")
    lines += ["", "Command: `python -m benchmarks.decoding.ar_vs_transformers --reps "
              f"{args.reps}`", ""]
    write_results("ar_vs_transformers", payload, "\n".join(lines))


if __name__ == "__main__":
    main()
