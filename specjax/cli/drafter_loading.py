"""Checks and loaders of the drafters that are not a draft model or a feature head:
parallel drafts (PARD: ours, published, SmolLM2's parallel layer draft), model-free
drafters (lookahead, retrieval) and self-speculation (the target skipping blocks)."""

from __future__ import annotations

import os
from pathlib import Path

from specjax.cli.choices import MODEL_FREE_CHOICES, PARALLEL, SELF_CHOICES, drafter_choice
from specjax.cli.common import CliError


def check_parallel_options(args) -> None:
    """--drafter parallel: --draft DIR must be a parallel draft (PARD's `pard_token`, ours,
    or a parallel layer draft of SmolLM2), and a target other than the bundled pair and
    SmolLM2 needs one."""
    if drafter_choice(args) != PARALLEL:
        return
    if args.draft and Path(args.draft, "draft.json").exists():  # a layer draft
        from specjax_models.layer_draft import parallel_layer_settings

        try:
            settings = parallel_layer_settings(args.draft)
        except ValueError as error:
            raise CliError(f"--draft {args.draft}: {error}") from None
        if settings is None:
            raise CliError(f"--draft {args.draft} is an autoregressive layer draft: run it with "
                           "--drafter model, or adapt it (specjax train-drafter --model "
                           "smollm2 --method pard --draft DIR --out OUT)")
    elif args.draft:
        from specjax_models.parallel_drafts import parallel_settings

        try:
            parallel_settings(args.draft)
        except (ValueError, FileNotFoundError) as error:
            raise CliError(f"--draft {args.draft}: {error}") from None
    elif args.model == "smollm2" and not args.target and not getattr(args, "hf", None):
        if smollm2_parallel() is None:
            raise CliError("this checkout has no SmolLM2 parallel draft "
                           "(models/checkpoints/smollm2_parallel): pass --draft DIR, or train "
                           "one (specjax train-drafter --model smollm2 --method pard --out DIR)")
    elif args.model != "bundled" or args.target or getattr(args, "hf", None):
        raise CliError("--drafter parallel: only the bundled pair and SmolLM2 ship a parallel "
                       "draft; pass --draft DIR with one for this target (a published PARD "
                       "checkpoint, or `specjax train-drafter --method pard --draft DRAFT "
                       "--out DIR`)")


def smollm2_parallel():
    """The shipped SmolLM2 parallel layer draft's directory, or None when absent."""
    from specjax_models import SMOLLM2_PARALLEL

    return SMOLLM2_PARALLEL if (SMOLLM2_PARALLEL / "draft.json").exists() else None


def load_parallel(args, target, sampling):
    """The parallel draft of --draft DIR, else the shipped one of the bundled pair or
    SmolLM2, checked against the target."""
    import specjax_models

    method = "greedy" if args.greedy_draft else "sample"
    directory = args.draft or (smollm2_parallel() if args.model == "smollm2" else None)
    try:
        if directory is not None and Path(directory, "draft.json").exists():
            drafter = specjax_models.load_parallel_layer_draft(directory, target, method)
        elif directory is not None:
            drafter = specjax_models.load_parallel_draft(directory, method)
        else:
            drafter = specjax_models.load_bundled("parallel", draft_method=method)
        drafter.check(target, sampling)
    except (ValueError, FileNotFoundError) as error:
        raise CliError(f"--drafter parallel: {error}") from None
    return drafter


def parse_skip(text: str):
    """`--skip 4,6,8` as a tuple of block indices, or "auto"."""
    if text.strip() == "auto":
        return "auto"
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise CliError(f"--skip takes block indices (0-based, comma-separated, e.g. 4,6,8) or "
                       f"auto, got {text!r}")
    skip = tuple(int(p) for p in parts)
    if len(set(skip)) != len(skip):
        raise CliError(f"--skip repeats a block: {text!r}")
    return skip


def check_self_speculation_options(args, has_tree: bool) -> None:
    """--skip only with --drafter layer-skip (which needs it); --adaptive-length for chains
    (`has_tree`: --dynamic-tree was given)."""
    choice = drafter_choice(args)
    skip = getattr(args, "skip", None)
    if choice in SELF_CHOICES and skip is None:
        raise CliError("--drafter layer-skip needs --skip LAYERS (the blocks to skip, e.g. "
                       "4,6,8,10) or --skip auto (measure candidates on this prompt)")
    if skip is not None:
        if choice not in SELF_CHOICES:
            raise CliError("--skip needs --drafter layer-skip")
        if parse_skip(skip) == "auto" and getattr(args, "command", None) != "generate":
            raise CliError("--skip auto searches on a generate prompt; in chat pass the "
                           "blocks (find them once with specjax generate --drafter "
                           "layer-skip --skip auto)")
    if getattr(args, "adapt", False) and (args.no_speculation or choice != "model"):
        raise CliError("--adapt trains the chat's draft model: it needs --drafter model "
                       "(SmolLM2's shipped distilled draft, or --draft DIR) and speculation")
    if getattr(args, "adaptive_length", False):
        if args.no_speculation or has_tree or choice in MODEL_FREE_CHOICES:
            raise CliError("--adaptive-length sets the length of a chain of drafts: not with "
                           "--no-speculation, --dynamic-tree, lookahead or retrieval")


def parse_lookahead(text: str):
    """`--lookahead W,N,G` as a `Lookahead` drafter."""
    from specjax.drafters import Lookahead

    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise CliError(f"--lookahead takes W,N,G (three integers: window columns, n-gram "
                       f"size, n-grams verified; e.g. 5,4,5), got {text!r}")
    window, ngram, guesses = (int(p) for p in parts)
    try:
        return Lookahead(window=window, ngram=ngram, guesses=guesses)
    except ValueError as error:
        raise CliError(f"--lookahead: {error}") from None


def check_model_free_options(args) -> None:
    """--lookahead and --datastore: well formed, and only with their drafter."""
    choice = drafter_choice(args)
    datastore = getattr(args, "datastore", None)
    if datastore is not None:
        if choice != "retrieval":
            raise CliError("--datastore needs --drafter retrieval")
        if not os.path.isfile(datastore):
            raise CliError(f"--datastore {datastore} does not exist (build one with "
                           "`specjax datastore build --tokenizer ... FILES --out FILE`)")
    if choice == "lookahead":
        parse_lookahead(args.lookahead)


def default_datastore(args) -> str | None:
    """--datastore, else SmolLM2's shipped datastore for --model smollm2 (when present)."""
    if args.datastore is not None:
        return args.datastore
    from specjax_models import SMOLLM2_DATASTORE

    return str(SMOLLM2_DATASTORE) if (args.model == "smollm2"
                                      and SMOLLM2_DATASTORE.exists()) else None


def load_model_free(args, choice: str, target, sampling):
    """The lookahead or retrieval drafter the options describe, checked against target."""
    if choice == "lookahead":
        return parse_lookahead(args.lookahead)
    from specjax.drafters import Retrieval
    from specjax.drafters.datastore import Datastore

    path = default_datastore(args)
    try:
        drafter = Retrieval(None if path is None else Datastore.load(path))
        drafter.check(target, sampling)
    except (ValueError, FileNotFoundError) as error:
        raise CliError(f"--datastore {path}: {error}") from None
    return drafter


def layer_skip(args, skip, target, sampling):
    """`LayerSkip(skip)` on `target`, its refusals as the option's."""
    from specjax.drafters import LayerSkip

    try:
        drafter = LayerSkip(skip=skip, method="greedy" if args.greedy_draft else "sample")
        drafter.check(target, sampling)
    except ValueError as error:
        raise CliError(f"--skip {args.skip}: {error}") from None
    return drafter
