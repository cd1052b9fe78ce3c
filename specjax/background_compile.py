"""Compiling the program that runs next while the current one compiles and runs.

A decode request runs two programs in turn: the prefill, then the decode step (or loop).
Called one after the other, each is traced, lowered and compiled (or loaded from the
persistent cache) only when the previous one has finished. The step only needs the
shapes of the prefill's output, so it can be lowered and compiled in a background thread
while the main thread prefills. XLA compiles and loads with Python's lock released, so
on two cores the two overlap: a warm `specjax generate` on SmolLM2 loads a 1.4 s step
program beside a 0.6 s prefill program.

`jit(f).lower(...).compile()` fills the same in-memory caches that a later `f(...)`
call with arguments of those shapes reads, so that call neither traces nor compiles.
When the background compilation fails, its error is dropped: the later call compiles in
the foreground and raises the error there, with the caller's traceback.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

Result = TypeVar("Result")


def while_compiling(compile_next: Callable[[], object] | None,
                    run: Callable[[], Result]) -> Result:
    """`run()`, with `compile_next()` (which lowers and compiles the program that runs
    after it) in a background thread meanwhile; returns `run()`'s result once both have
    finished. `compile_next=None` just runs `run()`."""
    if compile_next is None:
        return run()

    def compile_quietly() -> None:
        try:
            compile_next()
        except Exception:  # noqa: BLE001 - the foreground call reports it (see above)
            pass

    # The thread runs in a copy of this context: the compiler options in force here
    # (`specjax.compiler_options`) choose the program it compiles.
    context = contextvars.copy_context()
    worker = threading.Thread(target=context.run, args=(compile_quietly,),
                              name="specjax-compile", daemon=True)
    worker.start()
    try:
        return run()
    finally:
        worker.join()
