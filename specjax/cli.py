"""The `specjax` command line: demo, generate, train, distill.

`specjax demo` is the main job: the bundled byte-level pair (trained on the Python
standard library) continues held-out code with speculative decoding, streaming the text
as it is accepted (accepted draft tokens and target tokens in different colours), then
prints acceptance, mean accepted length, tokens/s and the speedup over plain decoding of
the same target, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

DRAFT_COLOUR, TARGET_COLOUR, DIM, RESET = "\033[32m", "\033[33m", "\033[2m", "\033[0m"


class CliError(Exception):
    """A user-facing problem: printed as one line, exit status 2."""


def _painter(mode: str):
    colour = sys.stdout.isatty() if mode == "auto" else mode == "always"
    return (lambda text, code: f"{code}{text}{RESET}") if colour else (lambda text, code: text)


def _num_params(lm) -> int:
    import jax

    return sum(x.size for x in jax.tree.leaves(lm.params))


def _wall(call):
    import jax

    start = time.perf_counter()
    out = call()
    jax.block_until_ready(out.tokens)
    return out, time.perf_counter() - start


def _load_pair(target_dir: str | None, draft_dir: str | None):
    import specjax_models

    try:
        target = specjax_models.load_checkpoint(target_dir) if target_dir else specjax_models.load_bundled(
            "target")
        draft = specjax_models.load_checkpoint(draft_dir) if draft_dir else specjax_models.load_bundled("draft")
    except FileNotFoundError as error:
        raise CliError(str(error)) from None
    if draft.vocab_size != target.vocab_size:
        raise CliError(f"mismatched pair: draft vocab {draft.vocab_size} vs target vocab "
                       f"{target.vocab_size}; the draft must share the target's tokenizer")
    return target, draft


def _sampling(args):
    import specjax

    return specjax.SamplingConfig(temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p)


def _stream_text(target, draft, prompt_ids, args, sampling, key, paint, eos_id):
    """Print one row's continuation as it is accepted; returns the last chunk's stats."""
    import specjax_models

    import specjax

    decode = specjax_models.ByteTokenizer().stream_decoder()
    stats = None
    for chunk in specjax.speculative_stream(target, draft, [prompt_ids],
                                            max_new_tokens=args.max_new_tokens,
                                            num_draft_tokens=args.num_draft_tokens,
                                            sampling=sampling, key=key, eos_id=eos_id):
        for token, drafted in zip(chunk.tokens[0], chunk.from_draft[0], strict=True):
            text = decode([token])
            if text:
                print(paint(text, DRAFT_COLOUR if drafted else TARGET_COLOUR), end="",
                      flush=True)
        stats = chunk.stats or stats
    print()
    return stats


def _demo(args) -> int:
    import jax
    import numpy as np
    import specjax_models

    import specjax

    paint = _painter(args.color)
    target, draft = _load_pair(None, None)
    tokenizer = specjax_models.ByteTokenizer()
    prompts = [p for p in specjax_models.bundled_prompts() if p["kind"] == "continue"][: args.prompts]
    sampling = specjax.SamplingConfig(temperature=args.temperature)
    key = jax.random.key(args.seed)
    print(f"specjax demo: bundled target ({_num_params(target) / 1e6:.1f}M params) "
          f"and draft ({_num_params(draft) / 1e6:.2f}M), byte-level, trained on "
          f"the Python standard library; K = {args.num_draft_tokens}, "
          f"{'greedy' if sampling.greedy else f'temperature {args.temperature}'}.")
    print(f"Colours: {paint('accepted draft tokens', DRAFT_COLOUR)}, "
          f"{paint('tokens from the target', TARGET_COLOUR)}.\n")
    prompt_ids = [tokenizer.encode(p["text"]) for p in prompts]
    for prompt, ids in zip(prompts, prompt_ids, strict=True):
        tail = prompt["text"][-160:]
        print(paint(f"--- {prompt['file']} (held out) ---", DIM))
        print(paint(tail, DIM), end="", flush=True)
        _stream_text(target, draft, ids, args, sampling, key, paint, None)
        print()

    copy = next(p for p in specjax_models.bundled_prompts() if p["kind"] == "copy")
    lookup = specjax.PromptLookup()
    print(paint(f"--- {copy['file']} (held out), asked to continue a copy of itself; "
                "drafts by prompt lookup (no draft model) ---", DIM))
    print(paint(copy["text"][-160:], DIM), end="", flush=True)
    copy_stats = _stream_text(target, lookup, tokenizer.encode(copy["text"]), args, sampling,
                              key, paint, None)
    print(f"prompt lookup: acceptance rate {copy_stats.acceptance_rate:.2f}, mean accepted "
          f"length {copy_stats.mean_accepted_length:.2f} tokens per target forward\n")

    # Speed, measured in this run: each prompt at batch 1, compile excluded.
    spec_s = plain_s = 0.0
    spec_tokens = plain_tokens = 0
    accepted = proposed = emitted = forwards = 0
    for ids in prompt_ids:
        spec = lambda ids=ids: specjax.speculative_generate(
            target, draft, [ids], max_new_tokens=args.max_new_tokens,
            num_draft_tokens=args.num_draft_tokens, sampling=sampling, key=key)
        plain = lambda ids=ids: specjax.generate(target, [ids], max_new_tokens=args.max_new_tokens,
                                                 sampling=sampling, key=key)
        _wall(spec), _wall(plain)  # compile (once: shapes are bucketed)
        spec_times, plain_times = [], []
        for _ in range(args.reps):  # alternate, keep the medians: these machines are noisy
            out, seconds = _wall(spec)
            spec_times.append(seconds)
            plain_out, seconds = _wall(plain)
            plain_times.append(seconds)
        spec_s += float(np.median(spec_times))
        plain_s += float(np.median(plain_times))
        spec_tokens += int(np.asarray(out.lengths).sum())
        plain_tokens += int(np.asarray(plain_out.lengths).sum())
        stats = out.stats
        accepted += int(stats.accepted.sum())
        proposed += int(stats.proposed.sum())
        emitted += int(stats.emitted.sum())
        forwards += int(stats.target_forwards.sum())
    spec_rate, plain_rate = spec_tokens / spec_s, plain_tokens / plain_s
    print(f"acceptance rate {accepted / max(proposed, 1):.2f}, mean accepted length "
          f"{emitted / max(forwards, 1):.2f} tokens per target forward")
    print(f"speculative {spec_rate:.0f} tokens/s, plain {plain_rate:.0f} tokens/s: "
          f"speedup {spec_rate / plain_rate:.2f}x (batch 1, median of {args.reps} alternating "
          "runs, compile excluded, same run)")
    return 0


def _generate(args) -> int:
    import jax
    import numpy as np
    import specjax_models

    import specjax

    text = args.prompt if args.prompt is not None else sys.stdin.read()
    if not text:
        raise CliError("empty prompt: pass it as an argument or on stdin")
    target, draft = _load_pair(args.target, args.draft)
    tokenizer = specjax_models.ByteTokenizer()
    ids = tokenizer.encode(text)
    sampling = _sampling(args)
    key = jax.random.key(args.seed)
    eos = None if args.no_eos else tokenizer.eos_id
    if args.num_draft_tokens < 1:
        raise CliError(f"--num-draft-tokens must be >= 1, got {args.num_draft_tokens}")
    if args.drafter == "prompt-lookup":
        drafter = specjax.PromptLookup(max_ngram_size=args.max_ngram_size,
                                       min_ngram_size=args.min_ngram_size)
    else:
        drafter = specjax.DraftModel(draft, "greedy" if args.greedy_draft else "sample")
    if args.json:
        if args.no_speculation:
            out, seconds = _wall(lambda: specjax.generate(
                target, [ids], max_new_tokens=args.max_new_tokens, sampling=sampling, key=key,
                eos_id=eos))
            stats = None
        else:
            out, seconds = _wall(lambda: specjax.speculative_generate(
                target, drafter, [ids], max_new_tokens=args.max_new_tokens,
                num_draft_tokens=args.num_draft_tokens, sampling=sampling, key=key,
                eos_id=eos))
            stats = out.stats.as_dict()
        length = int(np.asarray(out.lengths)[0])
        tokens = np.asarray(out.tokens)[0, :length].tolist()
        print(json.dumps({"prompt": text, "text": tokenizer.decode(tokens), "tokens": tokens,
                          "speculative": not args.no_speculation,
                          "seconds_including_compile": seconds, "stats": stats}))
        return 0
    if args.no_speculation:
        out = specjax.generate(target, [ids], max_new_tokens=args.max_new_tokens,
                               sampling=sampling, key=key, eos_id=eos)
        length = int(np.asarray(out.lengths)[0])
        print(text + tokenizer.decode(np.asarray(out.tokens)[0, :length].tolist()))
        return 0
    print(text, end="", flush=True)
    _stream_text(target, drafter, ids, args, sampling, key, _painter(args.color), eos)
    return 0


def _corpus(args):
    import specjax_models.corpus as corpus_lib

    if args.corpus:
        return corpus_lib.Corpus.load(args.corpus)
    return corpus_lib.build_corpus()


def _train_config(args):
    from specjax.training import TrainConfig

    return TrainConfig(steps=args.steps, learning_rate=args.learning_rate,
                       warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
                       checkpoint_every=args.checkpoint_every, eval_every=args.eval_every,
                       log_every=args.log_every)


def _batches(args, corpus):
    import specjax_models.corpus as corpus_lib

    train = lambda step: corpus_lib.sample_windows(corpus.train, args.batch_size,
                                                   args.seq_len + 1, args.seed, step)
    heldout = [corpus_lib.sample_windows(corpus.heldout, args.batch_size, args.seq_len + 1,
                                         10_000 + i, 0) for i in range(args.eval_batches)]
    return train, heldout


def _export(lm, config, out, metadata):
    import specjax_models

    specjax_models.save_checkpoint(lm, config, out, extra=metadata)


def _train(args) -> int:
    from pathlib import Path

    import specjax_models
    from flax import nnx

    import specjax
    from specjax.training import train

    config = {"target": specjax_models.TARGET_CONFIG, "draft": specjax_models.DRAFT_CONFIG}[args.config]
    corpus = _corpus(args)
    batches, heldout = _batches(args, corpus)
    lm = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(args.seed)))
    result = train(lm, batches, _train_config(args), checkpoint_dir=Path(args.out) / "run",
                   heldout=heldout, pad_id=specjax_models.ByteTokenizer.pad_id,
                   max_seconds=args.max_seconds)
    steps = result.history[-1]["step"] if result.history else 0
    _export(result.lm, config, args.out, {
        "kind": "train", "config": args.config, "steps_done": steps, "args": vars(args),
        "heldout_loss": result.heldout_loss, "heldout_bits_per_byte":
        result.heldout_bits_per_token, "python": corpus.manifest["python"],
        "train_files": len(corpus.manifest["train_files"]),
        "heldout_files": corpus.manifest["heldout_files"], "command": " ".join(sys.argv)})
    print(f"trained {steps} steps; held-out {result.heldout_bits_per_token:.3f} bits per byte; "
          f"saved to {args.out}")
    return 0


def _distill(args) -> int:
    from pathlib import Path

    import specjax_models

    from specjax.training import DistillConfig, distill

    target = specjax_models.load_checkpoint(args.target)
    draft = specjax_models.load_checkpoint(args.draft)
    corpus = _corpus(args)
    batches, heldout = _batches(args, corpus)
    result = distill(draft, target, batches, _train_config(args),
                     DistillConfig(divergence=args.divergence, temperature=args.temperature,
                                   on_policy_fraction=args.on_policy_fraction),
                     checkpoint_dir=Path(args.out) / "run", heldout=heldout,
                     pad_id=specjax_models.ByteTokenizer.pad_id, seed=args.seed,
                     max_seconds=args.max_seconds)
    steps = result.history[-1]["step"] if result.history else 0
    _export(result.lm, specjax_models.load_config(args.draft), args.out, {
        "kind": "distill", "steps_done": steps, "args": vars(args),
        "heldout_divergence": result.heldout_loss, "python": corpus.manifest["python"],
        "command": " ".join(sys.argv)})
    print(f"distilled {steps} steps; held-out {args.divergence} {result.heldout_loss:.4f}; "
          f"saved to {args.out}")
    return 0


def _add_sampling(parser):
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0 is greedy (default)")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)


def _add_training(parser, steps, lr):
    parser.add_argument("--out", required=True, help="output directory (resumes if present)")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=lr)
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--checkpoint-every", type=int, default=500)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", default=None,
                        help="a saved corpus directory (default: this Python's stdlib)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="stop early after a checkpoint; rerun to resume")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specjax",
                                     description="Exact speculative decoding in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="the bundled pair continues held-out code, streamed "
                          "and coloured, with acceptance and speedup over plain decoding")
    demo.add_argument("--max-new-tokens", type=int, default=160)
    demo.add_argument("--num-draft-tokens", type=int, default=8)
    demo.add_argument("--temperature", type=float, default=0.0)
    demo.add_argument("--prompts", type=int, default=2)
    demo.add_argument("--reps", type=int, default=3, help="timed repetitions (median)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--color", choices=["auto", "always", "never"], default="auto")

    gen = sub.add_parser("generate", help="continue a prompt (argument or stdin)")
    gen.add_argument("prompt", nargs="?", default=None)
    gen.add_argument("--target", default=None, help="checkpoint dir (default: bundled)")
    gen.add_argument("--draft", default=None, help="checkpoint dir (default: bundled)")
    gen.add_argument("--num-draft-tokens", type=int, default=6)
    _add_sampling(gen)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--max-new-tokens", type=int, default=200)
    gen.add_argument("--greedy-draft", action="store_true",
                     help="draft argmax tokens with one-hot q (exact too)")
    gen.add_argument("--drafter", choices=["model", "prompt-lookup"], default="model",
                     help="the draft model, or n-gram lookup in the prompt and output")
    gen.add_argument("--max-ngram-size", type=int, default=3)
    gen.add_argument("--min-ngram-size", type=int, default=1)
    gen.add_argument("--no-speculation", action="store_true", help="plain decoding")
    gen.add_argument("--no-eos", action="store_true", help="do not stop at EOS")
    gen.add_argument("--json", action="store_true", help="machine-readable output with stats")
    gen.add_argument("--color", choices=["auto", "always", "never"], default="auto")

    tr = sub.add_parser("train", help="next-token training of a bundled-size model")
    tr.add_argument("--config", choices=["target", "draft"], default="target")
    _add_training(tr, steps=4000, lr=3e-3)

    di = sub.add_parser("distill", help="distil a draft towards a target (DistillSpec)")
    di.add_argument("--target", required=True)
    di.add_argument("--draft", required=True, help="the draft to start from")
    di.add_argument("--divergence", choices=["fkl", "tvd"], default="fkl")
    di.add_argument("--temperature", type=float, default=1.0)
    di.add_argument("--on-policy-fraction", type=float, default=0.0)
    _add_training(di, steps=2000, lr=1e-3)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"demo": _demo, "generate": _generate, "train": _train, "distill": _distill}
    try:
        return handlers[args.command](args)
    except (CliError, ValueError, TypeError, FileNotFoundError) as error:
        print(f"specjax {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specjax {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
