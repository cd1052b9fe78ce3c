"""`specjax train` (next-token training of a bundled-size model) and `specjax distill`
(DistillSpec: a draft trained towards a target's distributions), with the options and
corpus loading that `specjax train-drafter` shares."""

from __future__ import annotations

import sys

from specjax.cli.common import (
    check_dir,
    num_params,
    recorded_command,
    recorded_options,
    say,
    seed_value,
)
from specjax.cli.loading import load_model


def register(sub) -> None:
    """Add the `train` and `distill` commands' parsers to the `specjax` subparsers."""
    tr = sub.add_parser("train", help="next-token training of a bundled-size model",
                        description="Train the bundled target or draft architecture on the "
                        "standard library, with resumable orbax checkpoints.")
    tr.add_argument("--config", choices=["target", "draft"], default="target",
                    help="which bundled architecture (default: %(default)s)")
    add_training_options(tr, steps=4000, lr=3e-3)
    tr.set_defaults(handler=run_train)

    di = sub.add_parser("distill", help="distil a draft towards a target (DistillSpec)",
                        description="Train a draft to match a target's distributions "
                        "(DistillSpec), with resumable orbax checkpoints.")
    di.add_argument("--target", required=True, help="target checkpoint directory")
    di.add_argument("--draft", required=True, help="the draft checkpoint to start from")
    di.add_argument("--divergence", choices=["fkl", "tvd"], default="fkl",
                    help="forward KL or total variation (default: %(default)s)")
    di.add_argument("--temperature", type=float, default=1.0,
                    help="compare the distributions at this temperature "
                         "(default: %(default)s)")
    di.add_argument("--on-policy-fraction", type=float, default=0.0,
                    help="share of steps trained on the draft's own samples "
                         "(default: %(default)s)")
    add_training_options(di, steps=2000, lr=1e-3)
    di.set_defaults(handler=run_distill)


def load_corpus(args):
    import specjax_models.recipes.stdlib_corpus as corpus_lib

    if args.corpus:
        say(f"loading the corpus from {args.corpus}...")
        return corpus_lib.Corpus.load(args.corpus)
    say("building the corpus from this Python's standard library (held-out files split "
         "by name)...")
    return corpus_lib.build_corpus()


def training_config(args):
    from specjax.training import TrainConfig

    return TrainConfig(steps=args.steps, learning_rate=args.learning_rate,
                       warmup_steps=args.warmup_steps, weight_decay=args.weight_decay,
                       checkpoint_every=args.checkpoint_every, eval_every=args.eval_every,
                       log_every=args.log_every)


def _batches(args, corpus):
    import specjax_models.recipes.stdlib_corpus as corpus_lib

    train = lambda step: corpus_lib.sample_windows(corpus.train, args.batch_size,
                                                   args.seq_len + 1, args.seed, step)
    heldout = [corpus_lib.sample_windows(corpus.heldout, args.batch_size, args.seq_len + 1,
                                         10_000 + i, 0) for i in range(args.eval_batches)]
    return train, heldout


def _export(lm, config, out, metadata):
    import specjax_models

    say(f"saving to {out}...")
    specjax_models.save_checkpoint(lm, config, out, extra=metadata)


def run_train(args) -> int:
    train_config = training_config(args)  # refuses bad settings before anything loads
    from pathlib import Path

    from flax import nnx

    import specjax
    import specjax_models
    from specjax.training import train

    configs = {"target": specjax_models.TARGET_CONFIG, "draft": specjax_models.DRAFT_CONFIG}
    config = configs[args.config]
    corpus = load_corpus(args)
    batches, heldout = _batches(args, corpus)
    lm = specjax.CausalLM.from_nnx(specjax_models.Transformer(config, rngs=nnx.Rngs(args.seed)))
    say(f"model: the bundled {args.config} architecture, {num_params(lm) / 1e6:.2f}M params")
    result = train(lm, batches, train_config, checkpoint_dir=Path(args.out) / "run",
                   heldout=heldout, pad_id=specjax_models.ByteTokenizer.pad_id,
                   max_seconds=args.max_seconds)
    steps = result.history[-1]["step"] if result.history else 0
    _export(result.lm, config, args.out, {
        "kind": "train", "config": args.config, "steps_done": steps, "args": recorded_options(args),
        "heldout_loss": result.heldout_loss, "heldout_bits_per_byte":
        result.heldout_bits_per_token, "python": corpus.manifest["python"],
        "train_files": len(corpus.manifest["train_files"]),
        "heldout_files": corpus.manifest["heldout_files"],
        "command": recorded_command(sys.argv[1:])})
    print(f"trained {steps} steps; held-out {result.heldout_bits_per_token:.3f} bits per byte; "
          f"saved to {args.out}")
    return 0


def run_distill(args) -> int:
    train_config = training_config(args)
    check_dir(args.target, "--target")
    check_dir(args.draft, "--draft")
    from pathlib import Path

    import specjax_models
    from specjax.training import DistillConfig, distill

    distill_config = DistillConfig(divergence=args.divergence, temperature=args.temperature,
                                   on_policy_fraction=args.on_policy_fraction)
    say("loading the target and the draft...")
    target, draft = load_model(args.target, "target"), load_model(args.draft, "draft")
    corpus = load_corpus(args)
    batches, heldout = _batches(args, corpus)
    result = distill(draft, target, batches, train_config, distill_config,
                     checkpoint_dir=Path(args.out) / "run", heldout=heldout,
                     pad_id=specjax_models.ByteTokenizer.pad_id, seed=args.seed,
                     max_seconds=args.max_seconds)
    steps = result.history[-1]["step"] if result.history else 0
    _export(result.lm, specjax_models.load_config(args.draft), args.out, {
        "kind": "distill", "steps_done": steps, "args": recorded_options(args),
        "heldout_divergence": result.heldout_loss, "python": corpus.manifest["python"],
        "command": recorded_command(sys.argv[1:])})
    unit = {"fkl": "nats per byte (forward KL)", "tvd": "(total variation, 0 to 1)"}
    print(f"distilled {steps} steps; held-out divergence {result.heldout_loss:.4f} "
          f"{unit[args.divergence]}; saved to {args.out}")
    return 0


def add_training_options(parser, steps, lr):
    """The options every training command shares (output, schedule, evaluation, corpus)."""
    add = parser.add_argument
    add("--out", required=True, help="output directory; a run that finds checkpoints there "
        "resumes from the latest")
    add("--steps", type=int, default=steps, help="optimizer steps (default: %(default)s)")
    add("--batch-size", type=int, default=32, help="windows per step (default: %(default)s)")
    add("--seq-len", type=int, default=256, help="tokens (bytes) per window "
        "(default: %(default)s)")
    add("--learning-rate", type=float, default=lr, help="peak AdamW learning rate "
        "(default: %(default)s)")
    add("--warmup-steps", type=int, default=200, help="linear warmup steps, then cosine decay "
        "(default: %(default)s)")
    add("--weight-decay", type=float, default=0.1, help="AdamW weight decay "
        "(default: %(default)s)")
    add("--checkpoint-every", type=int, default=500, help="steps between orbax checkpoints "
        "(default: %(default)s)")
    add("--eval-every", type=int, default=500, help="steps between held-out evaluations "
        "(default: %(default)s)")
    add("--eval-batches", type=int, default=8, help="held-out batches per evaluation "
        "(default: %(default)s)")
    add("--log-every", type=int, default=25, help="steps between progress lines (the first "
        "and last steps always print; default: %(default)s)")
    add("--seed", type=seed_value, default=0, help="seed of the initial weights and the batches "
        "(default: %(default)s)")
    add("--corpus", default=None, help="a saved corpus directory (default: build one from "
        "this Python's standard library)")
    add("--max-seconds", type=float, default=None, help="stop after this many seconds, with "
        "a checkpoint; rerun the same command to resume (default: no limit)")
