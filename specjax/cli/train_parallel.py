"""`specjax train-drafter --method pard / p-eagle`: a draft model adapted into a parallel
draft (PARD), or an EAGLE head adapted into a P-EAGLE head; both draft K tokens in one
forward and train in PARD's packed layout (specjax.training.parallel,
specjax.training.parallel_heads)."""

from __future__ import annotations

import sys
import time

from specjax.cli.common import (
    CliError,
    check_dir,
    device_line,
    num_params,
    recorded_command,
    recorded_options,
    say,
)
from specjax.cli.loading import load_model
from specjax.cli.train import load_corpus, training_config


def train_parallel_drafter(args, drafter_data) -> int:
    """--method pard or p-eagle; `drafter_data(args, target, corpus, out)` gives the
    target's continuations (train, heldout), cached in OUT/data.npz."""
    if args.method == "pard":
        return _train_pard(args, drafter_data)
    return _train_p_eagle(args, drafter_data)


def parallel_settings(args, vocab_size: int, what: str):
    """(mask_id, ParallelTrainConfig) from --mask-id, --positions, --cod-ratio, --cod-min
    and --aligned, checked against a vocabulary of `vocab_size` ids (the `what`'s)."""
    import specjax_models
    from specjax.training.parallel import ParallelTrainConfig
    from specjax_models.bundled import PARALLEL_MASK_ID

    byte_vocabulary = vocab_size == specjax_models.DRAFT_CONFIG.vocab_size
    if args.mask_id is None and not byte_vocabulary:
        raise CliError(f"--mask-id: name the mask token, an id of the {what}'s vocabulary "
                       "that the texts never hold (e.g. an unused special token)")
    mask_id = PARALLEL_MASK_ID if args.mask_id is None else args.mask_id
    try:
        parallel = ParallelTrainConfig(mask_id=mask_id, positions=args.positions,
                                       keep_ratio=args.cod_ratio, min_keep=args.cod_min,
                                       aligned=args.aligned)
    except ValueError as error:
        raise CliError(str(error).replace("keep_ratio", "--cod-ratio")
                       .replace("min_keep", "--cod-min").replace("positions (K)",
                                                                 "--positions")
                       .replace("mask_id", "--mask-id")) from None
    if mask_id >= vocab_size:
        raise CliError(f"--mask-id {mask_id} is outside the {what}'s vocabulary [0, "
                       f"{vocab_size})")
    if byte_vocabulary and mask_id < 256 and not never_in_utf8(mask_id):
        raise CliError(f"--mask-id {mask_id} is the byte {mask_id:#04x}, which UTF-8 text "
                       f"holds ({chr(mask_id)!r} in ASCII): the mask must be an id the texts "
                       f"never hold; on this byte-level vocabulary take a byte UTF-8 never "
                       f"uses (0xc0, 0xc1, 0xf5-0xff: e.g. {PARALLEL_MASK_ID}, the default)"
                       if mask_id < 128 else
                       f"--mask-id {mask_id} is the byte {mask_id:#04x}, which UTF-8 text "
                       "holds (inside multi-byte characters): the mask must be an id the "
                       "texts never hold; on this byte-level vocabulary take a byte UTF-8 "
                       f"never uses (0xc0, 0xc1, 0xf5-0xff: e.g. {PARALLEL_MASK_ID}, the "
                       "default)")
    if args.positions >= args.seq_len - args.prompt_len:
        raise CliError(f"--positions {args.positions} needs continuations longer than that "
                       f"(--seq-len {args.seq_len} - --prompt-len {args.prompt_len})")
    kept = parallel.kept(args.seq_len)
    if min(kept) < 1:
        raise CliError(f"--positions {args.positions}: with --seq-len {args.seq_len} and COD "
                       f"(--cod-ratio {args.cod_ratio}, --cod-min {args.cod_min}) drafts "
                       f"{kept.index(min(kept)) + 1} and later are never trained (no position "
                       "kept); lower --positions or raise --cod-min or --seq-len")
    return mask_id, parallel


def never_in_utf8(byte: int) -> bool:
    """Bytes that no UTF-8 text holds: 0xc0, 0xc1 (overlong leads) and 0xf5-0xff."""
    return byte in (0xC0, 0xC1) or byte >= 0xF5


def _train_pard(args, drafter_data) -> int:
    """train-drafter --method pard: the draft adapted into a parallel draft
    (specjax.training.parallel) on the target's continuations, labelled with the target's
    top-k probabilities, cached once per run."""
    from pathlib import Path

    import specjax_models
    from specjax.training.parallel import cached_labels, train_parallel

    check_dir(args.target, "--target")
    check_dir(args.draft, "--draft")
    train_config = training_config(args)
    draft_config = (specjax_models.load_config(args.draft) if args.draft
                    else specjax_models.DRAFT_CONFIG)
    mask_id, parallel = parallel_settings(args, draft_config.vocab_size, "draft")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say("loading the target and the draft...")
    target = load_model(args.target, "target")
    # The packed layout's slots attend in one block (a loop over blocks has dynamic bounds,
    # which reverse-mode differentiation cannot take); the parameters are unchanged.
    slots = sum(parallel.kept(args.seq_len))
    block = max(256, slots)
    draft = specjax_models.with_attention_blocks(load_model(args.draft, "draft"),
                                                 block_size=block, query_block=block)
    if draft.vocab_size != target.vocab_size:
        raise CliError(f"the draft's vocabulary ({draft.vocab_size}) is not the target's "
                       f"({target.vocab_size}): a parallel draft shares its target's "
                       "tokenizer")
    corpus = load_corpus(args)
    started = time.perf_counter()
    train, heldout = drafter_data(args, target, corpus, out)
    say("the target's top-16 probabilities at every position (one forward per 64 rows)...")
    data = cached_labels(target, train, prompt_len=args.prompt_len, top_k=16)
    held_all = cached_labels(target, heldout, prompt_len=args.prompt_len, top_k=16)
    held = [{key: value[i * args.batch_size:(i + 1) * args.batch_size]
             for key, value in held_all.items()} for i in range(args.eval_batches)]
    data_seconds = time.perf_counter() - started
    say(f"adapting the draft ({num_params(draft) / 1e6:.2f}M params) into a parallel draft: "
        f"{args.positions} drafts per forward, mask id {mask_id}, COD {args.cod_ratio} "
        f"(min {args.cod_min}){', aligned' if args.aligned else ''}")
    started = time.perf_counter()
    try:
        result = train_parallel(draft, data, train_config, parallel,
                                batch_size=args.batch_size, checkpoint_dir=out / "run",
                                heldout=held, seed=args.seed, max_seconds=args.max_seconds)
    except ValueError as error:
        raise CliError(str(error)) from None
    seconds = time.perf_counter() - started
    steps = result.history[-1]["step"] if result.history else 0
    last_eval = next((h for h in reversed(result.history) if "heldout_loss" in h), {})
    acceptance = {k: v for k, v in last_eval.items()
                  if k.startswith("acceptance@") or k == "expected_accepted"}
    specjax_models.save_parallel_draft(
        result.lm, draft_config, out, mask_id=mask_id, positions=args.positions, extra={
            "kind": "train-drafter", "method": "pard", "steps_done": steps,
            "args": recorded_options(args), "heldout_loss": result.heldout_loss,
            "heldout_acceptance": acceptance, "train_sequences": int(len(train)),
            "data_seconds_this_run": round(data_seconds, 1),
            "train_seconds_this_run": round(seconds, 1), "device": device_line(),
            "command": recorded_command(sys.argv[1:])})
    shown = ", ".join(f"{k} {v:.3f}" for k, v in acceptance.items())
    print(f"trained {steps} steps; held-out expected acceptance at t=1 per offset: {shown}; "
          f"saved to {out}")
    return 0


def _train_p_eagle(args, drafter_data) -> int:
    """train-drafter --method p-eagle: an EAGLE head (--draft HEAD_DIR, default the bundled
    target's EAGLE-3 head) given a placeholder and trained to draft --positions tokens per
    head forward, the target run in each step (specjax.training.parallel_heads)."""
    from pathlib import Path

    import specjax_models
    from specjax.drafters.head_files import load_head
    from specjax.runtime.files import read_json, write_json_atomically
    from specjax.training import train_parallel_head, with_placeholder
    from specjax_models.heads import load_head_for

    check_dir(args.target, "--target")
    check_dir(args.draft, "--draft")
    if args.target and not args.draft:
        raise CliError("--method p-eagle adapts an EAGLE head of the target: with --target, "
                       "pass --draft HEAD_DIR (a head trained on it: specjax train-drafter "
                       "--method eagle3 --target ...)")
    head_dir = Path(args.draft) if args.draft else specjax_models.bundled.bundled_path("eagle3")
    try:  # the head's files, read as the loaders read them (before the target loads)
        kind, fields, _ = load_head(head_dir)
    except (FileNotFoundError, ValueError) as error:
        raise CliError(f"--draft {head_dir}: {error}") from None
    head_kind = fields.get("kind")
    if kind != "eagle" or head_kind not in ("eagle1", "eagle3"):
        raise CliError(f"--draft {head_dir}: a P-EAGLE head starts from an EAGLE-1 or EAGLE-3 "
                       f"head; this one is {head_kind or kind!r}")
    train_config = training_config(args)
    try:
        target_config = (specjax_models.load_config(args.target) if args.target
                         else specjax_models.TARGET_CONFIG)
    except (FileNotFoundError, ValueError) as error:
        raise CliError(f"--target {args.target}: {error}") from None
    mask_id, parallel = parallel_settings(args, target_config.vocab_size, "target")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    say("loading the target and the head...")
    target = load_model(args.target, "target")
    try:
        head = load_head_for(head_dir, target)
    except (FileNotFoundError, ValueError) as error:
        raise CliError(f"--draft {head_dir}: {error}") from None
    if head.config.mask_id is not None and head.config.mask_id != mask_id:
        raise CliError(f"--draft {head_dir} is a P-EAGLE head with mask id "
                       f"{head.config.mask_id}; pass --mask-id {head.config.mask_id}")
    if head.config.mask_id is None:
        head = with_placeholder(head, mask_id)
    corpus = load_corpus(args)
    started = time.perf_counter()
    train, heldout = drafter_data(args, target, corpus, out)
    data_seconds = time.perf_counter() - started
    held = [heldout[i * args.batch_size:(i + 1) * args.batch_size]
            for i in range(args.eval_batches)]
    say(f"adapting the {head.config.kind} head ({num_params(head) / 1e6:.2f}M params) into a "
        f"P-EAGLE head: {args.positions} drafts per head forward, mask id {mask_id}, COD "
        f"{args.cod_ratio} (min {args.cod_min}){', aligned' if args.aligned else ''}")
    started = time.perf_counter()
    try:
        result = train_parallel_head(head, target, train, train_config, parallel,
                                     batch_size=args.batch_size, checkpoint_dir=out / "run",
                                     heldout=held, seed=args.seed,
                                     max_seconds=args.max_seconds)
    except ValueError as error:
        raise CliError(str(error)) from None
    seconds = time.perf_counter() - started
    steps = result.history[-1]["step"] if result.history else 0
    last_eval = next((h for h in reversed(result.history) if "heldout_loss" in h), {})
    acceptance = {k: v for k, v in last_eval.items()
                  if k.startswith("acceptance@") or k == "expected_accepted"}
    result.lm.save(out)
    earlier = (read_json(out / "metadata.json", "delete it to start its totals afresh")
               if (out / "metadata.json").exists() else {})
    write_json_atomically(out / "metadata.json", {
        "kind": "train-drafter", "method": "p-eagle", "steps_done": steps,
        "adapted_from": str(head_dir), "positions": args.positions, "mask_id": mask_id,
        "args": recorded_options(args), "heldout_loss": result.heldout_loss,
        "heldout_acceptance": acceptance, "train_sequences": int(len(train)),
        "data_seconds_this_run": round(data_seconds, 1),
        "train_seconds_this_run": round(seconds, 1),
        "train_seconds_total": round(earlier.get("train_seconds_total", 0.0) + seconds, 1),
        "device": device_line(), "command": recorded_command(sys.argv[1:])})
    shown = ", ".join(f"{k} {v:.3f}" for k, v in acceptance.items())
    print(f"trained {steps} steps; held-out expected acceptance at t=1 per offset: {shown}; "
          f"saved to {out}")
    return 0
