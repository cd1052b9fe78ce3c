"""The `specjax` command line.

`specjax demo` is the main job. Until the bundled trained pair exists it runs on a
Llama-shaped target with random weights built on the spot, drafted by its own first
layer, and says so: the numbers show the decoder's mechanics and speed, not a trained
pair's acceptance.
"""

from __future__ import annotations

import argparse
import sys
import time

DRAFT_COLOUR, TARGET_COLOUR, RESET = "\033[32m", "\033[33m", "\033[0m"


def _timed(call):
    import jax

    start = time.perf_counter()
    out = call()
    jax.block_until_ready(out.tokens)
    return out, time.perf_counter() - start


def _demo(args) -> int:
    import jax
    import numpy as np
    from flax import nnx

    import models
    import specjax

    colour = sys.stdout.isatty() if args.color == "auto" else args.color == "always"
    paint = (lambda text, code: f"{code}{text}{RESET}") if colour else (lambda text, code: text)
    config = models.TransformerConfig(vocab_size=4096, num_layers=8, d_model=512, num_heads=8,
                                      num_kv_heads=4, d_ff=1408, max_seq_len=1024)
    model = models.Transformer(config, rngs=nnx.Rngs(args.seed))
    target = specjax.CausalLM.from_nnx(model)
    draft = specjax.CausalLM.from_nnx(models.first_layers(model, 1))
    print(f"specjax demo: target = a random-weight Llama-shaped model "
          f"({models.count_params(model) / 1e6:.1f}M parameters, {config.num_layers} layers, "
          f"vocab {config.vocab_size}); draft = its first layer. Random weights have no text "
          "to show, so tokens are ids; the bundled trained pair replaces this pair once it "
          "exists.", flush=True)
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in (24, 9, 17, 30)]
    sampling = specjax.SamplingConfig(temperature=args.temperature)
    key = jax.random.key(args.seed)
    common = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, key=key)

    print(f"\nrow 0, streamed ({paint('accepted draft tokens', DRAFT_COLOUR)}, "
          f"{paint('tokens from the target', TARGET_COLOUR)}):")
    for chunk in specjax.speculative_stream(target, draft, prompts,
                                            num_draft_tokens=args.num_draft_tokens, **common):
        for token, drafted in zip(chunk.tokens[0], chunk.from_draft[0], strict=True):
            print(paint(str(token), DRAFT_COLOUR if drafted else TARGET_COLOUR), end=" ",
                  flush=True)
    print()

    spec_call = lambda: specjax.speculative_generate(
        target, draft, prompts, num_draft_tokens=args.num_draft_tokens, **common)
    plain_call = lambda: specjax.generate(target, prompts, **common)
    _, spec_first = _timed(spec_call)
    _, plain_first = _timed(plain_call)
    spec_out, spec_s = _timed(spec_call)
    plain_out, plain_s = _timed(plain_call)
    stats = spec_out.stats
    spec_tokens = int(np.asarray(spec_out.lengths).sum())
    plain_tokens = int(np.asarray(plain_out.lengths).sum())
    print(f"\nbatch {len(prompts)}, K = {args.num_draft_tokens}, temperature "
          f"{args.temperature}:")
    print(f"  acceptance rate {stats.acceptance_rate:.2f} (per checked position "
          f"{stats.position_acceptance_rate:.2f}), mean accepted length "
          f"{stats.mean_accepted_length:.2f} tokens per target forward")
    print(f"  speculative {spec_tokens / spec_s:.0f} tokens/s, plain {plain_tokens / plain_s:.0f} "
          f"tokens/s: speedup {plain_s / spec_s * spec_tokens / plain_tokens:.2f}x "
          f"(compile excluded: first calls took {spec_first:.1f}s and {plain_first:.1f}s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specjax", description="Exact speculative decoding "
                                     "in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="speculative decoding of a batch of prompts, streamed, "
                          "with acceptance and speedup over plain decoding")
    demo.add_argument("--max-new-tokens", type=int, default=48)
    demo.add_argument("--num-draft-tokens", type=int, default=4)
    demo.add_argument("--temperature", type=float, default=1.0)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--color", choices=["auto", "always", "never"], default="auto")
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
