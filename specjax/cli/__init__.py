"""The `specjax` command line: demo, generate, chat, bench, train, distill,
train-drafter, datastore.

This is the users' layer (DESIGN.md section 2): the one part of the specjax package that
imports the model package `specjax_models`, and nothing else in specjax imports it
(tests/test_layers.py checks both). One module per command or family defines its
arguments beside its handler (`register(subparsers)` sets `handler`); what they share,
loading, painting and errors, lives in `common` and `loading`. Imports of jax, the
decoders and the models sit inside the handlers on purpose: `--help` and input errors
answer before they load.
"""

from __future__ import annotations

import argparse
import os
import sys

from specjax.cli import bench, chat, datastore, demo, generate, train, train_drafter
from specjax.cli.common import CliError, compilation_cache
from specjax.cli.process import QUICK_COMMANDS, exit_now, pause_garbage_collection

__all__ = ["CliError", "build_parser", "main", "run"]

# In `specjax --help` order.
COMMANDS = (demo, generate, chat, bench, train, train_drafter, datastore)


class Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line (exit status 2), as every other
    refusal of the command line is."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specjax",
                                     description="Exact speculative decoding in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    for command in sub.choices.values():
        command.add_argument("--no-compilation-cache", action="store_true",
                             help="do not keep compiled programs on disk (by default they "
                                  "go to $SPECJAX_COMPILATION_CACHE or ~/.cache/specjax/jax, "
                                  "so a second run starts without compiling; "
                                  "SPECJAX_COMPILATION_CACHE=off turns it off too)")
        command.add_argument("--no-model-cache", action="store_true",
                             help="convert real checkpoints (GGUF weights and tokenizers) "
                                  "afresh instead of keeping them converted on disk (by "
                                  "default in $SPECJAX_MODEL_CACHE or "
                                  "~/.cache/specjax/models; SPECJAX_MODEL_CACHE=off turns it "
                                  "off too)")
    return parser


def main(argv: list[str] | None = None) -> int:
    command = "?"
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exited:  # --help (0), or a usage error already printed (2)
            return exited.code if isinstance(exited.code, int) else 2
        command = args.command
        compilation_cache(args)
        if args.no_model_cache:  # read by specjax_models.model_cache when a model loads
            os.environ["SPECJAX_MODEL_CACHE"] = "off"
        return args.handler(args)
    except BrokenPipeError:  # `specjax generate ... | head`
        return 0
    except (CliError, ValueError, TypeError, OverflowError, OSError) as error:
        # A user's file or value (a missing or unwritable path, a folder where a file was
        # expected, a damaged file, a bad setting): one line, never a traceback.
        print(f"specjax {command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(flush=True)
        print(f"specjax {command}: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The `specjax` script: `main()` on the command line's arguments; the one-shot
    decoding commands start with garbage collection paused and end without the
    interpreter's teardown (`specjax.cli.process` says why)."""
    argv = sys.argv[1:]
    quick = bool(argv) and argv[0] in QUICK_COMMANDS
    if quick:
        pause_garbage_collection()
    code = main(argv)
    if quick:
        exit_now(code)
    sys.exit(code)
