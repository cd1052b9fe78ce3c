"""What every command shares: one-line errors, colours, progress lines on stderr, the
streamed text, the sampling options and the compilation cache.

Imports of jax, specjax's decoders and specjax_models sit inside the functions: `--help`
and input errors answer before they load."""

from __future__ import annotations

import os
import sys
import time

from specjax.cli.process import resume_garbage_collection

DRAFT_COLOUR, TARGET_COLOUR, DIM, RESET = "\033[32m", "\033[33m", "\033[2m", "\033[0m"
PROMPT_END_MARKER = " >>> "  # where the prompt ends, when there are no colours to show it
COLOUR_HELP = "colour the streamed text: auto (when stdout is a terminal), always, never"


class CliError(Exception):
    """A user-facing problem: printed as one line, exit status 2."""


SEED_LIMIT = 2**63 - 1  # what jax.random.key, numpy and Python's random all take


def seed_value(text: str) -> int:
    """An argparse type: a PRNG seed, an integer in [0, 2**63 - 1]."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 2**63 - 1]")
    return value


def use_colour(mode: str) -> bool:
    return sys.stdout.isatty() if mode == "auto" else mode == "always"


def painter(colour: bool):
    return (lambda text, code: f"{code}{text}{RESET}") if colour else (lambda text, code: text)


def say(text: str = "") -> None:
    """A progress or summary line on stderr (stdout carries only the generated text)."""
    print(text, file=sys.stderr, flush=True)


def num_params(lm) -> int:
    import jax

    return sum(x.size for x in jax.tree.leaves(lm.params))


def portable_path(text: str, base: str | None = None) -> str:
    """A path as committed files record it: one under `base` (default: the folder the
    command ran in, the repository for the documented commands) relative to it, one
    elsewhere by its last part alone, so that no record names the machine that wrote it
    (its users and scratch folders); anything that is not an absolute path unchanged."""
    if not isinstance(text, str) or not os.path.isabs(text):
        return text
    base = os.path.abspath(base or os.getcwd())
    path = os.path.normpath(text)
    if path == base or path.startswith(base.rstrip(os.sep) + os.sep):
        return os.path.relpath(path, base)
    return os.path.basename(path) or text


def recorded_command(argv: list[str], base: str | None = None) -> str:
    """`specjax ...` as a checkpoint or result records it: shell-quoted, paths portable
    (`portable_path`, also in `--option=/abs/path`)."""
    import shlex

    def portable(argument: str) -> str:
        option, equals, value = argument.partition("=")
        if equals and option.startswith("-"):
            return f"{option}={portable_path(value, base)}"
        return portable_path(argument, base)

    return "specjax " + shlex.join(portable(a) for a in argv)


def recorded_options(args, base: str | None = None) -> dict:
    """The command's options as a checkpoint's metadata records them (JSON values only:
    the handler the parser attached is not an option; paths portable)."""
    return {name: portable_path(value, base) for name, value in vars(args).items()
            if name != "handler"}


def check_dir(path: str | None, option: str) -> None:
    if path is not None and not os.path.isdir(path):
        raise CliError(f"{option} {path} does not exist (expected a checkpoint directory "
                       "written by `specjax train` or `specjax distill`)")


def stream_text(target, drafter, prompt_ids, args, sampling, key, paint, eos_id,
                 cache_size=None, on_token=None, tree=None, decode=None):
    """Print one row's continuation as it is accepted. Returns the final stats, the
    seconds and tokens of the first step (compile + prefill + one step), and the seconds
    of all the later steps."""
    import specjax
    import specjax_models

    decode = decode or specjax_models.ByteTokenizer().stream_decoder()
    stats, first_seconds, first_tokens, start = None, None, 0, time.perf_counter()
    for chunk in specjax.speculative_stream(target, drafter, [prompt_ids],
                                            max_new_tokens=args.max_new_tokens,
                                            num_draft_tokens=None if tree else
                                            args.num_draft_tokens,
                                            sampling=sampling, key=key, eos_id=eos_id,
                                            cache_size=cache_size, tree=tree,
                                            verification=rule_for(args, tree)):
        if first_seconds is None:
            first_seconds = time.perf_counter() - start
            first_tokens = len(chunk.tokens[0])
            resume_garbage_collection()  # compiled: see specjax.cli.process
        for token, drafted in zip(chunk.tokens[0], chunk.from_draft[0], strict=True):
            if on_token is not None:
                on_token(token)
            text = decode([token])
            if text:
                print(paint(text, DRAFT_COLOUR if drafted else TARGET_COLOUR), end="",
                      flush=True)
        stats = chunk.stats or stats
    print(flush=True)
    return stats, first_seconds, first_tokens, time.perf_counter() - start - first_seconds


def device_line() -> str:
    """Where a drafter trained, for its metadata: "cpu (x86_64, 2 cores)"."""
    import platform

    import jax

    return (f"{jax.devices()[0].platform} ({platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores)")


def add_sampling(parser):
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature; 0 is greedy (default: %(default)s)")
    parser.add_argument("--top-k", type=int, default=0,
                        help="keep the k most probable tokens; 0 is off (default: %(default)s)")
    parser.add_argument("--top-p", type=float, default=1.0,
                        help="keep the smallest most-probable set reaching this mass; 1.0 is "
                             "off (default: %(default)s)")
    parser.add_argument("--verification", choices=["block", "traversal", "token", "typical"],
                        default=None,
                        help="how a step decides which drafts to keep: block (block "
                             "verification, chains; exact), traversal (its form for token "
                             "trees, leaf to root; on a chain the same as block; exact), "
                             "token (token-level rejection sampling, the rule of earlier "
                             "releases; exact), typical (Medusa-2's typical acceptance: NOT "
                             "EXACT, the output no longer follows the target) (default: "
                             "block for a chain, traversal for a tree)")
    parser.add_argument("--typical-epsilon", type=float, default=None, metavar="E",
                        help="--verification typical: the hard threshold (default: 0.09)")
    parser.add_argument("--typical-delta", type=float, default=None, metavar="D",
                        help="--verification typical: the entropy-scaled threshold "
                             "(default: 0.3)")


def verification_rule(args):
    """--verification and its parameters as the library's rule (None: the shape's own),
    checked before any model loads (and, but for the typical rule's numbers, before jax
    loads)."""
    typical = {name: value for name, value in (("epsilon", args.typical_epsilon),
                                               ("delta", args.typical_delta))
               if value is not None}
    if args.verification != "typical":
        if typical:
            raise CliError("--typical-epsilon / --typical-delta set the typical rule; add "
                           "--verification typical (which is not exact)")
        return args.verification
    from specjax.verification.typical_acceptance import TypicalAcceptance

    try:
        return TypicalAcceptance(**typical)
    except ValueError:
        raise CliError(f"--typical-epsilon and --typical-delta must be numbers in (0, 1) "
                       f"(Medusa's published setting: 0.09 and 0.3), got "
                       f"{0.09 if args.typical_epsilon is None else args.typical_epsilon} and "
                       f"{0.3 if args.typical_delta is None else args.typical_delta}") from None


def rule_for(args, tree, drafts_own_tree: bool = False):
    """The rule a decoder runs for this proposal shape (`drafts_own_tree`: a drafter that
    builds its own tree, lookahead or retrieval, not loaded yet): --verification block on
    a tree is refused by name."""
    check_rule_fits(args, tree is not None or drafts_own_tree)
    from specjax.verification.rules import resolve_verification

    return resolve_verification(getattr(args, "verification_rule", None), tree)


def check_rule_fits(args, verifies_a_tree: bool) -> None:
    """--verification block on a token tree is refused by name."""
    if getattr(args, "verification_rule", None) == "block" and verifies_a_tree:
        raise CliError("--verification block judges a chain of drafts; this drafter verifies a "
                       "token tree (--dynamic-tree, lookahead, retrieval): pass --verification "
                       "traversal (its tree form) or token, or leave it out (the best exact "
                       "rule for the shape)")


def refuse_target_with_smollm2(args) -> None:
    """--target names the bundled model's checkpoints: not with --model smollm2."""
    if args.model == "smollm2" and args.target:
        raise CliError("--target is for the bundled model's checkpoints; --model smollm2 "
                       "loads SmolLM2 itself")


def compilation_cache(args) -> None:
    """JAX's persistent compilation cache, unless the option or the environment turns it
    off. Before jax is imported (the usual case) it is set up for jax to read when it
    loads, so a command that refuses its input never loads jax."""
    from specjax.runtime.compilation_cache import (
        cache_for_next_jax_import,
        cache_turned_off_by_env,
        enable_compilation_cache,
    )

    if not (args.no_compilation_cache or cache_turned_off_by_env()):
        enable = enable_compilation_cache if "jax" in sys.modules else cache_for_next_jax_import
        try:
            enable()
        except ValueError as error:  # an unusable folder: run without the cache
            say(f"specjax: compilation cache off ({error})")


def add_colour_option(parser) -> None:
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                        help=COLOUR_HELP)


def add_prompt_lookup_options(parser) -> None:
    parser.add_argument("--max-ngram-size", type=int, default=3,
                        help="prompt lookup: longest n-gram matched (default: %(default)s)")
    parser.add_argument("--min-ngram-size", type=int, default=2,
                        help="prompt lookup: shortest n-gram matched (default: %(default)s)")


def add_model_free_options(parser) -> None:
    parser.add_argument("--lookahead", default="5,4,5", metavar="W,N,G",
                        help="--drafter lookahead: the Jacobi window's columns W, the n-gram "
                             "size N and the n-grams verified per step G (default: "
                             "%(default)s: (W + G)(N - 1) nodes per target forward)")
    parser.add_argument("--datastore", default=None, metavar="FILE",
                        help="--drafter retrieval: a datastore from `specjax datastore build` "
                             "(default with --model smollm2: its shipped datastore of SmolLM2's "
                             "own answers; else none: each row's own text only)")


def add_self_speculation_options(parser) -> None:
    parser.add_argument("--skip", default=None, metavar="LAYERS",
                        help="--drafter layer-skip: the target's blocks to skip while it drafts "
                             "for itself, e.g. 4,6,8,10 (0-based), or auto: measure candidate "
                             "sets on this prompt first and use the fastest (generate only)")
    parser.add_argument("--adaptive-length", action="store_true",
                        help="chains: each row's draft length follows its acceptance (+2 "
                             "after a fully accepted block, -1 after a rejection, up to "
                             "--num-draft-tokens)")


def add_layers_option(parser) -> None:
    from specjax.cli.layouts import SCANNED_UP_TO_TOKENS

    parser.add_argument("--layers", choices=("auto", "scanned", "unrolled"), default="auto",
                        help="the target's layer layout: scanned (one lax.scan over stacked "
                             "layers: a compiled step a fraction the size, loaded or compiled "
                             "seconds sooner, each step slower where the compiler copies "
                             "the layers' weights, as XLA CPU does) or unrolled; auto: the "
                             "one this machine measured faster for the request's length "
                             "(the first two runs of a model measure both; before that, "
                             f"scanned up to {SCANNED_UP_TO_TOKENS} new tokens) "
                             "(default: %(default)s)")


def scan_layers(args) -> bool:
    """Whether --layers (and, for auto, what this machine measured: specjax.cli.layouts)
    asks for scanned target layers. The choice and its reason are kept on `args`
    (`layers_chosen`, `layers_reason`) for the command to report and record."""
    layout = getattr(args, "layers", "unrolled")
    reason = "--layers"
    if layout == "auto":
        from specjax.cli.layouts import auto_layout

        layout, reason = auto_layout(args)
    args.layers_chosen, args.layers_reason = layout, reason
    return layout == "scanned"


def add_prefill_chunk_option(parser) -> None:
    parser.add_argument("--prefill-chunk", type=int, default=None, metavar="N",
                        help="prefill prompts longer than N tokens in chunks of N (bounded "
                             "memory for long prompts; default: the model's, 512)")
