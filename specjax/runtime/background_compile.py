"""Compiling the program that runs next while the current one compiles and runs.

A decode request runs two programs in turn: the prefill, then the decode step (or loop).
Called one after the other, each is traced, lowered and compiled (or loaded from the
persistent cache) only when the previous one has finished. The step only needs the
shapes of the prefill's output, so it can be lowered and compiled in a background thread
while the main thread prefills. XLA compiles and loads with Python's lock released, so
on two cores the two overlap: a warm `specjax generate` on SmolLM2 loads a 1.4 s step
program beside a 0.6 s prefill program.

`jit(f).lower(...).compile()` fills the same in-memory caches that a later `f(...)`
call with arguments of those shapes and placements reads, so that call neither traces nor
compiles. The placement is part of the key: the prefill's outputs are committed to the
device of its committed arguments (a loaded model's weights), and a program lowered on
shapes without that placement is another program, which the foreground call would compile
again (`placed_as_outputs`).
When the background compilation fails, its error is dropped: the later call compiles in
the foreground and raises the error there, with the caller's traceback.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

import jax

from specjax.runtime.sharding import committed_shardings

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


def placed_as_outputs(shapes, args):
    """`shapes` (`jax.ShapeDtypeStruct`s of a jitted call's outputs, from its `eval_shape`)
    with the placement the call's outputs will have, for lowering the program that takes
    them; None where that placement cannot be known before the call. A jitted call's
    outputs are committed when one of its arguments is: on one device they are then that
    device's, and with no committed argument they stay unplaced, as the shapes are. On a
    mesh the compiler chooses the outputs' layouts: None, and the caller compiles nothing
    ahead (a program lowered for other layouts would never be used)."""
    devices = frozenset().union(*committed_shardings(args))
    if not devices:
        return shapes
    if len(devices) > 1:
        return None
    sharding = jax.sharding.SingleDeviceSharding(next(iter(devices)))
    return jax.tree.map(lambda shape: jax.ShapeDtypeStruct(shape.shape, shape.dtype,
                                                           sharding=sharding,
                                                           weak_type=shape.weak_type),
                        shapes)
