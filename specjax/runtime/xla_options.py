"""XLA compiler options for the decoders compiled inside a block (`specjax.compiler_options`).

    with specjax.compiler_options(xla_backend_optimization_level=1):
        out = specjax.speculative_generate(target, drafter, prompts, ...)

Every decoder program (`generate`'s prefill and loop, `speculative_generate`'s, the
stepped and streamed `compiled_step`) is compiled with the options in force where it is
called: XLA's debug options by name, as `XLA_FLAGS` spells them without the dashes, or
the build options `jax.jit(compiler_options=...)` takes. A process-wide `XLA_FLAGS`
applies to every program of the process; a block applies to these programs, and only
where it is open. A program compiled under other options is another program (compiled
once per set of options, then taken from jit's cache; the persistent compilation cache
keys it by its options too). An unknown option name is refused by XLA when the program
compiles.

Why: a process that compiles many programs and runs each briefly (a test suite) is best
served by a low optimisation level, `--xla_backend_optimization_level=0` (a third less
compile time on CPU), but a decoder over thousands of rows then runs several times
slower (the top-p cut-off of a 36,256-row warp: 234 ms per call at level 0, 30 ms at
level 2, on 2 CPU cores): `specjax.testing`'s chi-square harness compiles its many-row
token-tree decoders at level 1 on CPU whatever the process asked for.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator

import jax

_IN_FORCE: contextvars.ContextVar[tuple[tuple[str, object], ...]] = contextvars.ContextVar(
    "specjax_compiler_options", default=())


@contextlib.contextmanager
def compiler_options(**options) -> Iterator[None]:
    """Compile the decoders called inside the block with these XLA options (nested blocks
    add to, and override, the outer ones)."""
    merged = dict(_IN_FORCE.get())
    merged.update(options)
    token = _IN_FORCE.set(tuple(sorted(merged.items())))
    try:
        yield
    finally:
        _IN_FORCE.reset(token)


def options_in_force() -> dict[str, object]:
    """The options of the innermost open `compiler_options` block ({} outside any)."""
    return dict(_IN_FORCE.get())


class OptionedJit:
    """`jax.jit(fun, **jit_kwargs)` once per set of compiler options: a call (and `lower`,
    `eval_shape`, `trace`, ...) goes to the program compiled with the options in force."""

    def __init__(self, fun: Callable, **jit_kwargs):
        self._fun = fun
        self._jit_kwargs = jit_kwargs
        self._jitted = {(): jax.jit(fun, **jit_kwargs)}
        functools.update_wrapper(self, fun)

    def current(self):
        """The jitted function for the options in force."""
        options = _IN_FORCE.get()
        jitted = self._jitted.get(options)
        if jitted is None:
            jitted = jax.jit(self._fun, compiler_options=dict(options), **self._jit_kwargs)
            self._jitted[options] = jitted
        return jitted

    def __call__(self, *args, **kwargs):
        return self.current()(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_fun", "_jit_kwargs", "_jitted"):
            raise AttributeError(name)
        return getattr(self.current(), name)


def options_jit(**jit_kwargs) -> Callable[[Callable], OptionedJit]:
    """`functools.partial(jax.jit, **jit_kwargs)` for a decoder program that honours
    `compiler_options` blocks."""
    return lambda fun: OptionedJit(fun, **jit_kwargs)
