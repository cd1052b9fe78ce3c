"""The `specjax` command line.

`specjax demo` is the main job. Until the bundled trained pair exists (issue 4) it runs
on a Llama-shaped model with random weights built on the spot, and says so: the numbers
show the decoder's mechanics and speed, not a trained model's acceptance.
"""

from __future__ import annotations

import argparse
import sys
import time


def _demo(args) -> int:
    import jax
    import numpy as np
    from flax import nnx

    import models
    import specjax

    config = models.TransformerConfig(vocab_size=4096, num_layers=4, d_model=256, num_heads=4,
                                      num_kv_heads=2, d_ff=768, max_seq_len=512)
    print(f"specjax demo: a random-weight Llama-shaped model ({config.num_layers} layers, "
          f"d_model {config.d_model}, vocab {config.vocab_size}); the bundled trained pair "
          "replaces it once it exists.", flush=True)
    lm = specjax.CausalLM.from_nnx(models.Transformer(config, rngs=nnx.Rngs(args.seed)))
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in (12, 7, 20, 3)]
    for name, sampling in [("greedy", specjax.GREEDY),
                           ("sampled (temperature 0.8, top-p 0.95)",
                            specjax.SamplingConfig(temperature=0.8, top_p=0.95))]:
        call = lambda sampling=sampling: specjax.generate(
            lm, prompts, max_new_tokens=args.max_new_tokens, sampling=sampling,
            key=jax.random.key(args.seed))
        start = time.perf_counter()
        jax.block_until_ready(call().tokens)
        first = time.perf_counter() - start
        start = time.perf_counter()
        out = call()
        jax.block_until_ready(out.tokens)
        seconds = time.perf_counter() - start
        total = int(np.asarray(out.lengths).sum())
        print(f"\n{name}: {total} tokens in {seconds:.3f}s = {total / seconds:.0f} tokens/s "
              f"(batch {len(prompts)}; first call incl. compile {first:.1f}s)")
        for row, tokens in enumerate(np.asarray(out.tokens)[:, :12]):
            print(f"  row {row}: {tokens.tolist()} ...")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specjax", description="Exact speculative decoding "
                                     "in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="decode a batch of prompts and print the speed")
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args)
    except (ValueError, TypeError) as error:
        print(f"specjax {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
