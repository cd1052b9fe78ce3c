"""Public names that load on first use (PEP 562), shared by `specjax` and `specjax_models`:
`import specjax` costs nothing, the command line answers `--help` before jax loads, and a
program pays only for the modules it touches."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_attributes(package: str, sources: dict[str, str], namespace: dict,
                    modules: dict[str, str] | None = None
                    ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for `package`: a name of `sources` (name -> the module that
    defines it) loads from that module; a name of `modules` (name -> a module's path: a
    public module that lives in a subpackage, `specjax.sharding` in `specjax.runtime`) is
    that module; any other name is tried as a submodule. A loaded value is stored in
    `namespace` (the package's globals), so later reads are plain."""
    modules = modules or {}

    def get(name: str):
        if name in sources:
            value = getattr(importlib.import_module(sources[name]), name)
        elif name in modules:
            value = importlib.import_module(modules[name])
        else:
            try:
                value = importlib.import_module(f"{package}.{name}")
            except ModuleNotFoundError as error:
                if error.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") \
                    from None
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted({*namespace, *namespace.get("__all__", ())})

    return get, names
