"""Files that survive a kill and bad files that are refused by name.

Writes go to a temporary name in the same folder, are flushed to disk, then renamed over
the final name (`os.replace` is atomic on POSIX and Windows): a process killed at any
moment leaves either the old file or the new one, never half of one, and at most a
`.NAME.tmp-*` file that the next write replaces. Reads of the small files a run depends
on (JSON settings, NumPy archives) turn every way they can be damaged into a ValueError
that names the file, says what was wrong and what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np


def _creation_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0o666 less the process's umask (read
    without changing it where Linux reports it; elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def writable_destination(path: str | os.PathLike) -> Path:
    """The file a write to `path` replaces: `path` itself, or the file a symlink at `path`
    points to (written through, as `open` does, so the link stays a link). A directory or
    a missing parent folder is refused by name, as `open(path, "w")` refuses it."""
    path = Path(path)
    destination = Path(os.path.realpath(path)) if path.is_symlink() else path
    if destination.is_dir():
        raise IsADirectoryError(f"{path} is a directory: give the path of a file inside it "
                                "(or another name)")
    if not destination.parent.is_dir():
        what = "is not a folder" if destination.parent.exists() else "does not exist"
        raise FileNotFoundError(f"cannot write {path}: its folder {destination.parent} "
                                f"{what}; create it first or choose another path")
    return destination


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `path`; when the block ends without an error, the
    file written there is flushed to disk and renamed to `path` (else it is removed).

    For the caller it behaves like `open(path, "w")`: any name or suffix, a new file gets
    the umask's mode and an overwritten one keeps its own, a symlink is written through,
    and a directory or a missing folder is refused by name before anything is written."""
    destination = writable_destination(path)
    try:
        mode = destination.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = _creation_mode()
    # The destination's suffix too: a writer given the temporary path (np.save) keeps it.
    handle, temporary = tempfile.mkstemp(prefix=f".{destination.name}.tmp-",
                                         dir=destination.parent, suffix=destination.suffix)
    os.close(handle)
    temporary = Path(temporary)
    try:
        yield temporary
        with open(temporary, "rb+") as written:
            os.fsync(written.fileno())
        os.chmod(temporary, mode)  # mkstemp's 0600 would hide the file from other users
        os.replace(temporary, destination)
    finally:
        temporary.unlink(missing_ok=True)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as temporary:
        temporary.write_text(text)


def write_json_atomically(path: str | os.PathLike, value, indent: int | None = 1) -> None:
    write_text_atomically(path, json.dumps(value, indent=indent) + "\n")


def save_npz_atomically(path: str | os.PathLike, **arrays) -> None:
    """`np.savez` of `arrays` to exactly `path`, atomically, whatever its suffix (numpy
    would append `.npz` to a name without it, so the archive goes through a file object)."""
    with atomic_path(path) as temporary, open(temporary, "wb") as handle:
        np.savez(handle, **arrays)


def damaged(path: str | os.PathLike, problem: str, remedy: str) -> ValueError:
    """The error for a file that exists but cannot be used: its name, what is wrong, and
    what to do about it."""
    return ValueError(f"{path}: {problem}; {remedy}")


def read_json(path: str | os.PathLike, remedy: str = "write it again") -> dict:
    """A JSON object from `path`; a missing file is FileNotFoundError, a damaged one (cut
    short, not JSON, not an object) a ValueError that names it."""
    path = Path(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise damaged(path, "is not text (expected a JSON object)", remedy) from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        ends_early = error.pos >= len(text.rstrip()) or error.msg.startswith("Unterminated")
        cut = " (it ends early: cut short?)" if ends_early else ""
        raise damaged(path, f"is not valid JSON at line {error.lineno}, column "
                      f"{error.colno}: {error.msg}{cut}", remedy) from None
    if not isinstance(value, dict):
        raise damaged(path, f"holds a JSON {type(value).__name__}, expected an object",
                      remedy)
    return value


def load_npz(path: str | os.PathLike, remedy: str = "write it again") -> dict[str, np.ndarray]:
    """Every array of a NumPy `.npz` archive, read now (the archive is closed on return);
    a damaged archive (cut short, not a zip, an unreadable member) is a ValueError that
    names it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as error:
        size = path.stat().st_size
        raise damaged(path, f"is not a readable NumPy archive ({size} bytes; "
                      f"{type(error).__name__}: {error}); it was probably cut short",
                      remedy) from None


def check_arrays(path: str | os.PathLike, arrays: dict[str, np.ndarray],
                 expected: dict[str, tuple[int, ...]], remedy: str,
                 floating: Callable[[str], bool] = lambda name: True) -> None:
    """Refuse, by name, an archive whose arrays are not exactly `expected` (name -> shape):
    a missing or extra name, another shape, or an array that should hold floats and does
    not."""
    missing = sorted(set(expected) - set(arrays))
    extra = sorted(set(arrays) - set(expected))
    if missing:
        raise damaged(path, f"lacks {missing[:4]}{' ...' if len(missing) > 4 else ''} "
                      f"(found {sorted(arrays)[:4]} ...)", remedy)
    if extra:
        raise damaged(path, f"holds arrays this model has no place for: {extra[:4]}", remedy)
    for name, shape in expected.items():
        array = arrays[name]
        if tuple(array.shape) != tuple(shape):
            raise damaged(path, f"array {name} has shape {tuple(array.shape)}, expected "
                          f"{tuple(shape)}", remedy)
        if floating(name) and not np.issubdtype(array.dtype, np.floating):
            raise damaged(path, f"array {name} holds {array.dtype}, expected floats", remedy)
