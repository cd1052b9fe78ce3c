"""JAX's persistent compilation cache, in a per-user folder.

A decoder compiles once per shape; the persistent cache keeps the compiled programs on
disk, so a new process (a second `specjax generate`, a restarted notebook kernel) loads
them instead of compiling again. The command line turns it on by default; notebooks call
`specjax.enable_compilation_cache()`.

The folder is trusted code: JAX runs what it finds there, so it is created private to the
user (mode 0700) and never shared.

A damaged entry (a disk error, a copy cut short) heals: JAX warns and recompiles when it
cannot read one but never writes over it (its cache skips keys it holds), so every later
run would pay the compile again; `repair_damaged_entries` removes an entry that fails to
load, and the program just compiled is written in its place.
"""

from __future__ import annotations

import os
from pathlib import Path

# Set to a folder to put the cache there; to one of OFF_VALUES to turn the command line's
# cache off.
ENV_VAR = "SPECJAX_COMPILATION_CACHE"
OFF_VALUES = ("0", "off", "false", "no", "none")
# Programs that compile faster than this are not worth a disk round trip.
MIN_COMPILE_SECS = 0.2


def default_cache_dir() -> Path:
    """`$SPECJAX_COMPILATION_CACHE` when it names a folder, else
    `$XDG_CACHE_HOME/specjax/jax` (`~/.cache/specjax/jax` by default)."""
    chosen = os.environ.get(ENV_VAR, "").strip()
    if chosen and chosen.lower() not in OFF_VALUES:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specjax" / "jax"


def cache_turned_off_by_env() -> bool:
    """True when `$SPECJAX_COMPILATION_CACHE` is 0 / off / false / no / none."""
    return os.environ.get(ENV_VAR, "").strip().lower() in OFF_VALUES


def check_min_compile_secs(value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"min_compile_secs must be a number >= 0, got {value!r}")


def prepare_cache_folder(path: str | os.PathLike | None = None) -> Path:
    """The cache folder (`path`, default `default_cache_dir()`), created private to the
    user; a clear ValueError when it cannot be a folder."""
    folder = Path(default_cache_dir() if path is None else path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"the compilation cache folder {folder} is a file; pass a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as error:
        raise ValueError(f"cannot create the compilation cache folder {folder}: {error}; "
                         f"pass another path, or set {ENV_VAR}=off") from error
    return folder


def repair_damaged_entries() -> bool:
    """Make JAX remove a persistent-cache entry that it fails to read, so the program it
    compiles instead is written there again (JAX's own cache never overwrites a key it
    holds). Idempotent; called by every decoder's module and `enable_compilation_cache`.
    Returns False where this JAX has no hook for it (the entry then stays until removed by
    hand)."""
    try:
        from jax._src import compilation_cache as jax_cache
    except ImportError:
        return False
    read = getattr(jax_cache, "get_executable_and_time", None)
    if read is None:
        return False
    if getattr(read, "repairs_damaged_entries", False):
        return True

    def get_executable_and_time(cache_key, *args, **kwargs):
        try:
            return read(cache_key, *args, **kwargs)
        except getattr(jax_cache, "CacheVerificationError", ()):
            raise  # not damage: JAX's check that a read is allowed, kept as it is
        except Exception:
            _remove_entry(getattr(jax_cache, "_cache", None), cache_key)
            raise  # JAX warns, compiles, and now writes the entry afresh

    get_executable_and_time.repairs_damaged_entries = True
    jax_cache.get_executable_and_time = get_executable_and_time
    return True


def _remove_entry(cache, cache_key: str) -> None:
    """Delete the files of `cache_key` in JAX's file cache (`<key>-cache`, `<key>-atime`)."""
    folder = getattr(cache, "path", None)
    if folder is None or not cache_key:
        return
    for suffix in ("-cache", "-atime"):
        try:
            (Path(str(folder)) / f"{cache_key}{suffix}").unlink(missing_ok=True)
        except OSError:
            pass  # a read-only cache: JAX keeps warning, nothing worse


def cache_for_next_jax_import(path: str | os.PathLike | None = None, *,
                              min_compile_secs: float = MIN_COMPILE_SECS) -> Path:
    """The persistent cache for a process that has not imported jax yet: JAX reads these
    settings from the environment when it loads, so the caller (the command line) pays
    for jax only once it compiles. Children of this process inherit the cache."""
    check_min_compile_secs(min_compile_secs)
    folder = prepare_cache_folder(path)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(folder)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(float(min_compile_secs))
    return folder


def enable_compilation_cache(path: str | os.PathLike | None = None, *,
                             min_compile_secs: float = MIN_COMPILE_SECS) -> Path:
    """Turn on JAX's persistent compilation cache in `path` (default: `default_cache_dir()`)
    and return the folder.

    Programs whose compilation took at least `min_compile_secs` are written there; later
    processes with the same JAX version, backend and program load them instead of
    compiling. Takes effect for compilations after the call, even when some already ran.
    """
    check_min_compile_secs(min_compile_secs)
    folder = prepare_cache_folder(path)
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    repair_damaged_entries()
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_secs))
    # JAX decides once per process whether the cache is in use (at the first compile):
    # reset that decision so the folder applies from now on.
    compilation_cache.reset_cache()
    return folder
