"""`specjax train-drafter`: Medusa, EAGLE-1, EAGLE-3 and MTP heads trained on a target by
self-distillation (the bundled target, or SmolLM2 on its own chat answers), and SmolLM2's
distilled layer draft."""

from __future__ import annotations

import json
import sys
import time

from specjax.cli.common import (
    CliError,
    check_dir,
    device_line,
    num_params,
    recorded_command,
    recorded_options,
    refuse_target_with_smollm2,
    say,
)
from specjax.cli.loading import load_model, load_smollm2
from specjax.cli.train import add_training_options, load_corpus, training_config

# Per-model defaults of the train-drafter options left unset (bundled, smollm2).
DRAFTER_TRAINING_DEFAULTS = {
    "bundled": {"steps": 1500, "batch_size": 32, "learning_rate": 3e-3, "warmup_steps": 50,
                "checkpoint_every": 250, "eval_every": 250, "log_every": 25, "seq_len": 128,
                "data_temperature": 1.0, "draft_vocab": None},
    "smollm2": {"steps": 600, "batch_size": 16, "learning_rate": 1e-3, "warmup_steps": 30,
                "checkpoint_every": 25, "eval_every": 50, "log_every": 5, "seq_len": 256,
                "data_temperature": 0.7, "draft_vocab": 8192},
}


def register(sub) -> None:
    """Add the `train-drafter` command's parser to the `specjax` subparsers."""
    td = sub.add_parser("train-drafter", help="train Medusa / EAGLE / EAGLE-3 / MTP heads "
                        "on a target by self-distillation",
                        description="Train a feature drafter on the target's own "
                        "continuations of corpus prompts (generated once, cached in "
                        "OUT/data.npz), the target frozen inside each step; resumable orbax "
                        "checkpoints, held-out expected acceptance per draft depth. With "
                        "--model smollm2: an EAGLE-3 head (--method eagle3) or a distilled "
                        "layer draft (--method draft) on SmolLM2's answers, its outputs "
                        "cached once. Options left unset take per-model defaults: bundled "
                        "--steps 1500 --batch-size 32 --learning-rate 3e-3 --seq-len 128 "
                        "--checkpoint-every 250 --eval-every 250; smollm2 --steps 600 "
                        "--batch-size 16 --learning-rate 1e-3 --seq-len 256 "
                        "--checkpoint-every 25 --eval-every 50.")
    td.add_argument("--method", choices=["medusa", "eagle", "eagle3", "mtp", "kangaroo",
                                         "draft", "pard", "p-eagle"],
                    required=True,
                    help="medusa: heads on the last hidden state; eagle: EAGLE-1 (feature "
                         "regression); eagle3: EAGLE-3 (three fused layers, training-time "
                         "test); mtp: a DeepSeek-V3 MTP module reused recursively; kangaroo: "
                         "an adapter over the target's first --exit-layer blocks (Kangaroo "
                         "early exit, drafted with specjax.drafters.EarlyExit); draft "
                         "(smollm2): a small draft model of some of the target's layers "
                         "(--draft-layers), distilled on the same cached answers; pard: a "
                         "draft model (--draft, default the bundled draft) adapted into a "
                         "parallel draft that proposes --positions drafts in one forward "
                         "(PARD, with conditional drop tokens), on the target's "
                         "continuations and its cached top-k probabilities; p-eagle: an "
                         "EAGLE head (--draft HEAD_DIR, default the bundled EAGLE-3 head) "
                         "adapted into a P-EAGLE head that drafts --positions tokens in one "
                         "head forward from learned placeholders, in the same packed layout "
                         "(COD, --aligned), the target run in each step")
    td.add_argument("--exit-layer", type=int, default=2,
                    help="--method kangaroo: the adapter reads the stream after the target's "
                         "first N blocks; each draft runs those N blocks, the adapter and the "
                         "LM head (default: %(default)s, Kangaroo's)")
    td.add_argument("--draft-layers", default="0,1",
                    help="--method draft: the target layers the draft starts from, run in "
                         "this order (default: %(default)s)")
    td.add_argument("--draft", default=None,
                    help="--method pard: the draft model to adapt (a checkpoint directory; "
                         "default: the bundled draft); --method p-eagle: the EAGLE-1 or "
                         "EAGLE-3 head to adapt (a head directory; default: the bundled "
                         "target's EAGLE-3 head)")
    td.add_argument("--positions", type=int, default=8,
                    help="--method pard / p-eagle: drafts predicted at once, the largest K it is "
                         "trained for (default: %(default)s)")
    td.add_argument("--mask-id", type=int, default=None,
                    help="--method pard / p-eagle: the mask token, an id the texts never hold "
                         "(default: 255 for the bundled byte vocabulary, 0xFF never occurs "
                         "in UTF-8)")
    td.add_argument("--cod-ratio", type=float, default=0.5,
                    help="--method pard / p-eagle: conditional drop tokens, mask copy c keeps "
                         "this**c "
                         "of the positions (1 keeps all; default: %(default)s)")
    td.add_argument("--cod-min", type=float, default=0.1,
                    help="--method pard / p-eagle: ... and at least this fraction (default: "
                         "%(default)s)")
    td.add_argument("--aligned", action="store_true",
                    help="--method pard / p-eagle: weight each offset by the chance it is "
                         "reached "
                         "(PARD-2's target-aligned training, our reading)")
    td.add_argument("--model", choices=["bundled", "smollm2"], default="bundled",
                    help="bundled: the byte-level target (or --target); smollm2: "
                         "SmolLM2-135M-Instruct (eagle3 or draft), trained on its own answers "
                         "to chat and rewrite prompts written for this project, its outputs "
                         "cached once in --work (default: %(default)s)")
    td.add_argument("--target", default=None,
                    help="target checkpoint directory (default: the bundled target)")
    td.add_argument("--work", default=None,
                    help="smollm2: where the answers and cached target outputs go "
                         "(default: OUT/work; reused by a rerun)")
    td.add_argument("--chat-prompts", type=int, default=768,
                    help="smollm2: chat prompts the target answers; a rerun with more "
                         "adds to --work, reusing what is there (default: %(default)s)")
    td.add_argument("--rewrite-prompts", type=int, default=256,
                    help="smollm2: rewrite prompts quoting its first answers "
                         "(default: %(default)s)")
    td.add_argument("--sequences", type=int, default=2048,
                    help="training continuations to generate (default: %(default)s)")
    td.add_argument("--prompt-len", type=int, default=32,
                    help="corpus tokens before each continuation (default: %(default)s)")
    td.add_argument("--data-temperature", type=float, default=None,
                    help="the target samples its continuations at this temperature "
                         "(default: 1.0 bundled, 0.7 smollm2)")
    td.add_argument("--unroll", type=int, default=None,
                    help="training-time-test steps for eagle3 / mtp (default: 4)")
    td.add_argument("--medusa-heads", type=int, default=4,
                    help="Medusa heads (drafting depth; default: %(default)s)")
    td.add_argument("--draft-vocab", type=int, default=None,
                    help="EAGLE-3's reduced draft vocabulary: score only the N most frequent "
                         "ids of the generated data (cheaper draft forwards for a large "
                         "vocabulary; other ids get draft probability 0; default: all for "
                         "bundled, 8192 for smollm2)")
    add_training_options(td, steps=1500, lr=3e-3)
    # Unset options take per-model defaults (DRAFTER_TRAINING_DEFAULTS); seq_len is the
    # bundled windows' length or SmolLM2's prompt + answer rows.
    td.set_defaults(seq_len=None, eval_batches=2, steps=None, batch_size=None,
                    learning_rate=None, warmup_steps=None, checkpoint_every=None,
                    eval_every=None, log_every=None)
    for action in td._actions:  # help shows each model's default, not the None above
        if action.dest in DRAFTER_TRAINING_DEFAULTS["bundled"] and action.help and \
                "%(default)s" in action.help:
            shown = ", ".join(f"{value} {model}" for model, value in
                              ((m, d[action.dest]) for m, d in
                               DRAFTER_TRAINING_DEFAULTS.items()))
            action.help = action.help.replace("%(default)s", shown)
    td.set_defaults(handler=run)


def _drafter_data(args, target, corpus, out):
    """Self-distillation data: corpus prompts continued by the target (cached in
    OUT/data.npz, so a resumed run reuses it)."""
    import jax

    import specjax_models.recipes.stdlib_corpus as corpus_lib
    from specjax.runtime.files import load_npz, save_npz_atomically
    from specjax.training import self_distillation_data

    path = out / "data.npz"
    wanted = {"sequences": args.sequences, "prompt_len": args.prompt_len,
              "seq_len": args.seq_len, "seed": args.seed,
              "data_temperature": args.data_temperature}
    if path.exists():  # written atomically: complete, or damaged by something else
        saved = load_npz(path, "delete it, and the next run generates the data again")
        if set(saved) != {"train", "heldout", "settings"}:
            raise CliError(f"{path} is not data this command wrote (it holds "
                           f"{sorted(saved)}); use another --out or delete it")
        if json.loads(str(saved["settings"])) == wanted:
            say(f"reusing the generated data in {path}")
            return saved["train"], saved["heldout"]
        raise CliError(f"{path} was generated with other settings; use another --out or "
                       "delete it")
    new_tokens = args.seq_len - args.prompt_len
    if new_tokens < 1:
        raise CliError(f"--seq-len ({args.seq_len}) must exceed --prompt-len "
                       f"({args.prompt_len})")
    heldout_rows = args.eval_batches * args.batch_size
    key = jax.random.key(args.seed)
    shown = lambda done, total: say(f"  generated {done}/{total} continuations")
    say(f"generating {args.sequences} + {heldout_rows} held-out continuations of "
         f"{new_tokens} tokens with the target (temperature {args.data_temperature})...")
    prompts = corpus_lib.sample_windows(corpus.train, args.sequences, args.prompt_len,
                                        args.seed, 0)
    train = self_distillation_data(target, prompts, new_tokens, key=key,
                                   temperature=args.data_temperature, progress=shown)
    held_prompts = corpus_lib.sample_windows(corpus.heldout, heldout_rows, args.prompt_len,
                                             10_000 + args.seed, 0)
    heldout = self_distillation_data(target, held_prompts, new_tokens,
                                     key=jax.random.fold_in(key, 1),
                                     temperature=args.data_temperature)
    save_npz_atomically(path, train=train, heldout=heldout, settings=json.dumps(wanted))
    return train, heldout


def run(args) -> int:
    for name, value in DRAFTER_TRAINING_DEFAULTS[args.model].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.model == "smollm2":
        return _train_chat_drafter(args)
    if args.method == "draft":
        raise CliError("--method draft distils a layer draft of SmolLM2 (--model smollm2); "
                       "the bundled pair's draft model is distilled with `specjax distill`")
    if args.method in ("pard", "p-eagle"):
        from specjax.cli.train_parallel import train_parallel_drafter

        return train_parallel_drafter(args, _drafter_data)
    if args.draft is not None:
        raise CliError("--draft is the draft model --method pard adapts (or the head "
                       "--method p-eagle adapts)")
    train_config = training_config(args)
    check_dir(args.target, "--target")
    from pathlib import Path

    import specjax_models
    from specjax.runtime.files import read_json, write_json_atomically
    from specjax.training import HeadTrainConfig, train_head
    from specjax_models.heads import create_head

    head_config = HeadTrainConfig(method=args.method, unroll=args.unroll)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # the drafter's folder: data.npz goes first
    say("loading the target...")
    target = load_model(args.target, "target")
    target_config = (specjax_models.load_config(args.target) if args.target
                     else specjax_models.TARGET_CONFIG)
    if args.method == "kangaroo" and not 0 <= args.exit_layer < target_config.num_layers:
        raise CliError(f"--exit-layer {args.exit_layer}: the target has "
                       f"{target_config.num_layers} blocks; the adapter reads the stream "
                       f"entering one of them (0 to {target_config.num_layers - 1})")
    corpus = load_corpus(args)
    started = time.perf_counter()
    train, heldout = _drafter_data(args, target, corpus, out)
    data_seconds = time.perf_counter() - started
    draft_vocab = None
    if args.draft_vocab is not None:
        from specjax.drafters.eagle import most_frequent_tokens

        if args.method == "medusa" or args.draft_vocab < 1:
            raise CliError("--draft-vocab takes a positive size, for eagle / eagle3 / mtp / "
                           "kangaroo")
        draft_vocab = most_frequent_tokens(train, args.draft_vocab)
        say(f"draft vocabulary: the {len(draft_vocab)} most frequent ids of the data")
    drafter = create_head(args.method, target, target_config, seed=args.seed,
                          medusa_heads=args.medusa_heads, draft_vocab=draft_vocab,
                          exit_layer=args.exit_layer)
    say(f"training a {args.method} drafter ({num_params(drafter) / 1e6:.2f}M params; the "
         "target's embedding and LM head are shared and frozen)")
    held = [heldout[i * args.batch_size:(i + 1) * args.batch_size]
            for i in range(args.eval_batches)]
    started = time.perf_counter()
    result = train_head(drafter, target, train, train_config, head_config,
                        batch_size=args.batch_size, checkpoint_dir=out / "run", heldout=held,
                        seed=args.seed, max_seconds=args.max_seconds)
    steps = result.history[-1]["step"] if result.history else 0
    last_eval = next((h for h in reversed(result.history) if "heldout_loss" in h), {})
    acceptance = {k: v for k, v in last_eval.items() if k.startswith("acceptance@")}
    result.lm.save(out)


    seconds = time.perf_counter() - started
    earlier = (read_json(out / "metadata.json", "delete it to start its totals afresh")
               if (out / "metadata.json").exists() else {})
    write_json_atomically(out / "metadata.json", {
        "kind": "train-drafter", "method": args.method, "steps_done": steps,
        "args": recorded_options(args), "heldout_loss": result.heldout_loss,
        "heldout_acceptance": acceptance, "train_sequences": int(len(train)),
        "data_seconds_this_run": round(data_seconds, 1),
        "train_seconds_this_run": round(seconds, 1),
        "train_seconds_total": round(earlier.get("train_seconds_total", earlier.get(
            "train_seconds_this_run", 0.0)) + seconds, 1),
        "device": device_line(),
        "command": recorded_command(sys.argv[1:])})
    shown = ", ".join(f"{k} {v:.3f}" for k, v in acceptance.items())
    print(f"trained {steps} steps; held-out expected acceptance at t=1: {shown}; saved to "
          f"{out}")
    return 0


def _draft_layers(text: str) -> tuple[int, ...]:
    """--draft-layers "0,1" -> (0, 1)."""
    try:
        layers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise CliError(f"--draft-layers takes target layer indices separated by commas "
                       f"(e.g. 0,1), got {text!r}") from None
    if any(layer < 0 for layer in layers):
        raise CliError(f"--draft-layers takes layer indices >= 0, got {text!r}")
    return layers


def _train_chat_drafter(args) -> int:
    """train-drafter --model smollm2: an EAGLE-3 head from SmolLM2's own chat answers,
    the target's outputs cached once (specjax_models.recipes.smollm2_head)."""
    if args.method not in ("eagle3", "kangaroo", "draft", "pard"):
        raise CliError(f"--model smollm2 trains an EAGLE-3 head (--method eagle3), a Kangaroo "
                       f"adapter (--method kangaroo), a distilled layer draft (--method "
                       f"draft) or its parallel version (--method pard); {args.method} heads "
                       f"train on the bundled target only")
    layers = _draft_layers(args.draft_layers)
    refuse_target_with_smollm2(args)
    for name in ("chat_prompts", "rewrite_prompts"):
        if getattr(args, name) < 0:
            raise CliError(f"--{name.replace('_', '-')} must be >= 0")
    if args.chat_prompts < 1 or args.rewrite_prompts > args.chat_prompts:
        raise CliError("--chat-prompts must be >= 1 and --rewrite-prompts at most "
                       "--chat-prompts (each rewrite quotes a first answer)")
    if args.draft_vocab is not None and args.draft_vocab < 1:
        raise CliError("--draft-vocab takes a positive size")
    from pathlib import Path

    import specjax_models
    from specjax.drafters import eagle3_feature_layers
    from specjax.runtime.files import write_json_atomically
    from specjax_models.recipes.smollm2_draft import train_chat_draft, write_draft_card
    from specjax_models.recipes.smollm2_head import (
        ChatDataConfig,
        prepare_chat_data,
        train_chat_head,
        write_model_card,
    )

    out = Path(args.out)
    work = Path(args.work) if args.work else out / "work"
    try:  # checked before SmolLM2 loads
        data_config = ChatDataConfig(chat=args.chat_prompts, rewrite=args.rewrite_prompts,
                                     length=args.seq_len, temperature=args.data_temperature,
                                     seed=args.seed)
    except ValueError as error:
        raise CliError(str(error).replace("temperature", "--data-temperature")
                       .replace("length", "--seq-len")) from None
    if args.method == "kangaroo":  # checked against the cached layers before SmolLM2 loads
        from specjax.drafters import eagle3_feature_layers as cached_layers

        try:
            depth = specjax_models.gguf_config(specjax_models.smollm2_path()).num_layers
        except (FileNotFoundError, ImportError):
            depth = None  # load_smollm2 says what to install
        if depth is not None and args.exit_layer not in cached_layers(depth):
            raise CliError(f"--exit-layer {args.exit_layer}: --model smollm2 caches the "
                           f"streams entering layers {list(cached_layers(depth))} once for "
                           "every head it trains; a Kangaroo adapter exits at one of them")
    if args.method == "draft":  # the layers checked against SmolLM2's depth before it loads
        from specjax_models import select_layers_config

        try:
            select_layers_config(specjax_models.gguf_config(specjax_models.smollm2_path()),
                                 layers)
        except ValueError as error:
            raise CliError(f"--draft-layers: {error}") from None
        except (FileNotFoundError, ImportError):
            pass  # load_smollm2 says what to install
    parallel = None
    if args.method == "pard":  # checked before SmolLM2 loads
        from specjax.cli.train_parallel import parallel_settings
        from specjax_models.layer_draft import parallel_layer_settings

        check_dir(args.draft, "--draft")
        start = args.draft or specjax_models.SMOLLM2_DRAFT
        if not (Path(start) / "draft.json").exists():
            raise CliError(f"--draft {start}: no layer draft there (draft.json); train one with "
                           "`specjax train-drafter --model smollm2 --method draft`")
        if parallel_layer_settings(start) is not None:
            raise CliError(f"--draft {start} is a parallel draft already; start from an "
                           "autoregressive layer draft")
        if args.mask_id is None:
            args.mask_id = specjax_models.SMOLLM2_MASK_ID
        try:
            vocab_size = specjax_models.gguf_config(specjax_models.smollm2_path()).vocab_size
        except (FileNotFoundError, ImportError):
            load_smollm2()  # says what to install
            raise
        _, parallel = parallel_settings(args, vocab_size, "target")
    target, tokenizer = load_smollm2()
    target_config = specjax_models.gguf_config(specjax_models.smollm2_path())
    say(f"answers and target outputs (resumable, in {work}/chunks; progress in "
         f"{work}/log.txt)...")
    started = time.perf_counter()
    try:
        prepare_chat_data(target, tokenizer, work,
                          eagle3_feature_layers(target_config.num_layers), data_config)
    except ValueError as error:  # e.g. a work directory made with other settings
        raise CliError(str(error)) from None
    data_seconds = time.perf_counter() - started
    try:
        if args.method == "pard":
            from specjax_models.recipes.smollm2_parallel import train_chat_parallel_draft

            say(f"adapting the layer draft in {start} into a parallel draft: "
                f"{args.positions} drafts per forward, mask id {args.mask_id}, COD "
                f"{args.cod_ratio} (min {args.cod_min})")
            metadata = train_chat_parallel_draft(
                target, target_config, work, out, parallel=parallel,
                train_config=training_config(args), start=start, batch_size=args.batch_size,
                heldout_rows=args.eval_batches * args.batch_size, seed=args.seed,
                max_seconds=args.max_seconds)
        elif args.method == "draft":
            say(f"training a layer draft from SmolLM2's layers {list(layers)} (draft "
                 f"vocabulary {args.draft_vocab}; the target's embedding and head rows "
                 "shared and frozen)")
            metadata = train_chat_draft(target, target_config, work, out, layers=layers,
                                        train_config=training_config(args),
                                        draft_vocab=args.draft_vocab,
                                        batch_size=args.batch_size,
                                        heldout_rows=args.eval_batches * args.batch_size,
                                        seed=args.seed, max_seconds=args.max_seconds)
        else:
            name = "an EAGLE-3 head" if args.method == "eagle3" else (
                f"a Kangaroo adapter after {args.exit_layer} blocks")
            say(f"training {name} (draft vocabulary {args.draft_vocab or 'full'}; the "
                 "target's embedding and LM head shared and frozen)")
            metadata = train_chat_head(target, target_config, work, out,
                                       train_config=training_config(args),
                                       draft_vocab=args.draft_vocab or None,
                                       batch_size=args.batch_size,
                                       heldout_rows=args.eval_batches * args.batch_size,
                                       unroll=args.unroll or 4, seed=args.seed,
                                       max_seconds=args.max_seconds, method=args.method,
                                       exit_layer=args.exit_layer)
    except ValueError as error:  # e.g. layers beyond SmolLM2's 30
        raise CliError(str(error)) from None
    metadata.update({
        "data_seconds_this_run": round(data_seconds, 1),
        "device": device_line(),
        "command": recorded_command(sys.argv[1:])})
    write_json_atomically(out / "metadata.json", metadata)
    if args.method == "pard":
        from specjax_models.recipes.smollm2_parallel import write_parallel_card

        write_parallel_card(out, work)
    else:
        (write_draft_card if args.method == "draft" else write_model_card)(out, work)
    last = metadata["last_eval"] or {}
    shown = ", ".join(f"{k} {v:.3f}" for k, v in last.items() if k.startswith("acceptance@"))
    print(f"trained {metadata['steps_done']} steps; held-out expected acceptance at t=1 "
          f"(over the target's top-32 mass): {shown or 'not evaluated yet'}; saved to {out}")
    return 0
