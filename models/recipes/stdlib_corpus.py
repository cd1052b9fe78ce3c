"""The training corpus of the bundled models: the Python standard library's own sources.

Every machine with Python has it. Files are split into train and held-out by a hash of
their path relative to the standard library (about 1 file in 20 is held out), so the
split does not depend on the machine. `build_corpus` records the Python version and the
exact file list; the held-out prompts used by the demo and the benchmarks are shipped in
`models/bundled/prompts.json`, so results do not depend on the user's Python.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
import sysconfig
from pathlib import Path

import numpy as np

from specjax.runtime.files import atomic_path, damaged, read_json, write_json_atomically
from specjax_models.tokenizer import BOS_ID, EOS_ID

EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests",
                 "idle_test", "lib2to3", "ensurepip"}
HELDOUT_EVERY = 20


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[str]:
    """Sorted paths (relative to the stdlib root) of its .py files, tests excluded."""
    root = Path(root or stdlib_root())
    files = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if EXCLUDED_DIRS.isdisjoint(relative.parts[:-1]):
            files.append(relative.as_posix())
    return sorted(files)


def is_heldout(relative_path: str) -> bool:
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "little") % HELDOUT_EVERY == 0


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Token streams (uint16; documents as BOS bytes EOS, concatenated) and a manifest."""

    train: np.ndarray
    heldout: np.ndarray
    manifest: dict

    def save(self, directory: Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)  # the corpus is a folder it makes
        for name, stream in (("train.npy", self.train), ("heldout.npy", self.heldout)):
            with atomic_path(directory / name) as temporary, open(temporary, "wb") as handle:
                np.save(handle, stream)
        write_json_atomically(directory / "manifest.json", self.manifest)  # last: complete

    @classmethod
    def load(cls, directory: Path) -> Corpus:
        directory = Path(directory)
        if not (directory / "manifest.json").exists():
            raise FileNotFoundError(f"no corpus in {directory}: build one with "
                                    "specjax_models.recipes.stdlib_corpus.build_corpus().save(directory)")
        streams = []
        for name in ("train.npy", "heldout.npy"):
            try:
                streams.append(np.load(directory / name, allow_pickle=False))
            except (OSError, ValueError, EOFError) as error:
                raise damaged(directory / name, f"cannot be read ({error})",
                              "build the corpus again") from None
        return cls(*streams, read_json(directory / "manifest.json", "build the corpus again"))


def _encode_documents(root: Path, files: list[str]) -> np.ndarray:
    pieces = []
    for name in files:
        data = np.frombuffer((root / name).read_bytes(), np.uint8).astype(np.uint16)
        pieces += [np.array([BOS_ID], np.uint16), data, np.array([EOS_ID], np.uint16)]
    return np.concatenate(pieces) if pieces else np.zeros((0,), np.uint16)


def build_corpus(root: Path | None = None, max_files: int | None = None) -> Corpus:
    """Read the standard library at `root` (default: this Python's) into a Corpus."""
    root = Path(root or stdlib_root())
    files = stdlib_files(root)[:max_files]
    heldout = [f for f in files if is_heldout(f)]
    train = [f for f in files if not is_heldout(f)]
    manifest = {"python": sys.version.split()[0], "root": str(root),
                "train_files": train, "heldout_files": heldout}
    return Corpus(_encode_documents(root, train), _encode_documents(root, heldout), manifest)


def sample_windows(stream: np.ndarray, batch: int, length: int, seed: int,
                   step: int) -> np.ndarray:
    """`[batch, length]` int32 windows at random offsets; a pure function of (seed, step),
    so a resumed run sees exactly the batches it would have seen."""
    if stream.shape[0] <= length:
        raise ValueError(f"the token stream ({stream.shape[0]} tokens) is shorter than one "
                         f"window ({length}); use a larger corpus or a shorter seq_len")
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, stream.shape[0] - length, size=batch)
    return np.stack([stream[s: s + length] for s in starts]).astype(np.int32)


def make_prompts(root: Path | None = None, count: int = 16, prompt_bytes: int = 320,
                 copy_bytes: int = 256) -> list[dict]:
    """Held-out prompts for the demo and benchmarks (shipped in models/checkpoints/).

    "continue": up to `prompt_bytes` of a held-out file from its first top-level `def` or
    `class`, cut after a line end. "copy": a `copy_bytes` chunk of the same file, a blank
    line, then the chunk's first third again: continuing it well means copying.
    """
    root = Path(root or stdlib_root())
    prompts = []
    for name in [f for f in stdlib_files(root) if is_heldout(f)]:
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        start = min((i for i in (text.find("\ndef "), text.find("\nclass ")) if i >= 0),
                    default=-1)
        if start < 0 or len(text) - start < 2 * prompt_bytes:
            continue
        window = text[start + 1: start + 1 + prompt_bytes]
        window = window[: window.rfind("\n") + 1]
        chunk = text[start + 1: start + 1 + copy_bytes]
        chunk = chunk[: chunk.rfind("\n") + 1]
        prompts.append({"file": name, "kind": "continue", "text": window})
        prompts.append({"file": name, "kind": "copy",
                        "text": chunk + "\n" + chunk[: len(chunk) // 3]})
        if len(prompts) >= 2 * count:
            break
    return prompts
