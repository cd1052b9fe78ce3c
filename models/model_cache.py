"""A per-user cache of converted models and built tokenizers, so a second start skips the
conversion: a GGUF file's dequantisation (5 s for SmolLM2 on 2 cores), a tokenizer built
from GGUF metadata (3 s), a Hugging Face checkpoint's transposes and casts.

Where: `$SPECJAX_MODEL_CACHE`, else `$XDG_CACHE_HOME/specjax/models`
(`~/.cache/specjax/models`), beside the compilation cache; `SPECJAX_MODEL_CACHE=off`
(or `cache=False`, or the command line's `--no-model-cache`) turns it off.

An entry is keyed by its source files' sizes, modification times and a hash of their
first MiB (the header), and by the conversion's options (the dtype); it holds the weights
in the requested dtype as safetensors, the model's config, and `entry.json` with every
file's size and CRC-32, written last. An entry whose files do not match their record (a
disk error, a half-copied cache) is removed and rebuilt, never used. An entry is built in
a temporary folder and renamed into place when complete, so concurrent writers cannot
leave a half-written one (the first rename wins; the other copy is discarded). A model's
entry is written by a background thread, so a first load costs no more than converting:
the disk writes overlap what follows (compiling).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
import shutil
import tempfile
import threading
import warnings
import weakref
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

import specjax
from specjax.runtime.compilation_cache import OFF_VALUES
from specjax_models.safetensors_layout import tensor_views

ENV_VAR = "SPECJAX_MODEL_CACHE"
FORMAT_VERSION = 1
HEADER_BYTES = 1 << 20  # the part of a source file hashed into its key
ENTRY = "entry.json"
WEIGHTS = "weights.safetensors"


def default_model_cache_dir() -> Path:
    chosen = os.environ.get(ENV_VAR, "").strip()
    if chosen and chosen.lower() not in OFF_VALUES:
        return Path(chosen).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specjax" / "models"


def model_cache_enabled(cache: bool | None) -> bool:
    """`cache` when given, else on unless `$SPECJAX_MODEL_CACHE` is 0 / off / false / no."""
    if cache is not None:
        return bool(cache)
    return os.environ.get(ENV_VAR, "").strip().lower() not in OFF_VALUES


def source_key(kind: str, sources: list[Path], options: dict) -> str:
    """What identifies a conversion: each source's size, modification time and first MiB,
    the options, and this cache's format."""
    digest = hashlib.sha256(f"{kind}:{FORMAT_VERSION}:{sorted(options.items())}".encode())
    for source in sources:
        stat = source.stat()
        digest.update(f"{source.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        with open(source, "rb") as handle:
            digest.update(handle.read(HEADER_BYTES))
    return digest.hexdigest()[:32]


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def _verified(folder: Path, mapped: tuple[str, ...] = ()) -> dict[str, mmap.mmap] | None:
    """The entry's files named in `mapped`, memory-mapped, when the entry's record is whole
    and every file matches its size and CRC-32 (the mapped ones are read once, for the
    check, and the caller reads them from the page cache without a copy); else None, and
    the damaged entry is removed (so the caller rebuilds it)."""
    maps: dict[str, mmap.mmap] = {}
    try:
        record = json.loads((folder / ENTRY).read_text())
        files = record["files"]
        good = record.get("format") == FORMAT_VERSION and set(mapped) <= set(files)
        for name, meta in files.items():
            if not good:
                break
            path = folder / name
            if name in mapped:
                with open(path, "rb") as handle:
                    maps[name] = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
                content = maps[name]
                good = len(content) == meta["size"] and zlib.crc32(content) == meta["crc32"]
            else:
                good = path.stat().st_size == meta["size"] and _crc32(path) == meta["crc32"]
    except (OSError, ValueError, KeyError, TypeError):
        good = False
    if not good:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    return maps


def _publish(folder: Path, write: Callable[[Path], None]) -> None:
    """Build an entry in a temporary folder beside `folder`, record its files, then rename
    it into place (atomic; if another process got there first, its entry is kept)."""
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        write(staging)
        files = {p.name: {"size": p.stat().st_size, "crc32": _crc32(p)}
                 for p in sorted(staging.iterdir())}
        (staging / ENTRY).write_text(json.dumps({"format": FORMAT_VERSION,
                                                 "files": files}, indent=1))
        try:
            os.rename(staging, folder)
        except OSError:  # an entry appeared meanwhile (another process): keep that one
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# Entries being written by background threads, by folder (see `cached_model`).
_WRITING: dict[Path, threading.Thread] = {}


def wait_for_writes() -> None:
    """Block until every entry this process is writing is on disk (or given up)."""
    for thread in list(_WRITING.values()):
        thread.join()


def _write_in_background(folder: Path, write: Callable[[Path], None]) -> None:
    """Publish the entry from a thread, so a first load does not wait for the disk: the
    caller goes on (compiling, typically) while the weights are written. The thread is not
    a daemon, so the process finishes the entry before it exits."""
    def publish() -> None:
        try:
            _publish(folder, write)
        except OSError as error:  # a full or read-only disk: run without caching
            warnings.warn(f"specjax: model cache entry not written ({error})", stacklevel=2)
        finally:
            _WRITING.pop(folder, None)

    thread = threading.Thread(target=publish, name=f"specjax-cache-{folder.name}")
    _WRITING[folder] = thread
    thread.start()


def cached_model(kind: str, sources: list[Path], options: dict, build: Callable,
                 scan_layers: bool, cache: bool | None,
                 placement: Callable | None = None) -> specjax.CausalLM:
    """The model `build(scan_layers, placement)` converts (returning `(CausalLM,
    TransformerConfig)`), from the cache when an intact entry exists, else built, returned
    at once and stored by a background thread. `placement` (see `ParamFiller`) puts each
    parameter on its devices as it is read."""
    from specjax_models.transformer import TransformerConfig

    if not model_cache_enabled(cache):
        return build(scan_layers, placement)[0]
    folder = default_model_cache_dir() / f"{kind}-{source_key(kind, sources, options)}"
    pending = _WRITING.get(folder)
    if pending is not None:  # this process is still writing it
        pending.join()
    # A folder without its record is a half-copied or damaged entry: `_verified` removes
    # it, so this start rebuilds it (an entry is renamed into place with its record).
    maps = _verified(folder, mapped=(WEIGHTS,)) if folder.exists() else None
    if maps is not None:
        fields = json.loads((folder / "config.json").read_text())
        config = TransformerConfig(**dict(fields, scan_layers=False))
        lm = _build(tensor_views(folder / WEIGHTS, maps[WEIGHTS]), config, scan_layers,
                    placement)
        remember_fingerprint_beside(lm, folder, scan_layers)
        return lm
    lm, config = build(scan_layers, placement)
    remember_fingerprint_beside(lm, folder, scan_layers)

    def write(staging: Path) -> None:
        from flax import nnx
        from safetensors.numpy import save_file

        from specjax_models.transformer import per_layer_params

        flat = {".".join(str(p) for p in key): np.asarray(leaf.get_value())
                for key, leaf in nnx.to_flat_state(lm.params)}
        save_file(per_layer_params(flat), str(staging / WEIGHTS))
        (staging / "config.json").write_text(json.dumps(dataclasses.asdict(config)))

    _write_in_background(folder, write)
    return lm


def fingerprint_file(folder: Path, scan_layers: bool) -> Path:
    """Where an entry keeps its weights' content digest (`specjax.runtime.fingerprints`), per
    layer layout (the digest covers the parameter tree's paths)."""
    return folder / f"params-{'scanned' if scan_layers else 'unrolled'}.blake2b"


def remember_fingerprint_beside(lm: specjax.CausalLM, folder: Path, scan_layers: bool) -> None:
    """Give `lm` a provider of its content digest: read from beside the cache entry, else
    computed (once) and written there, so a later process (a resumed benchmark) does not
    read every weight again. The file is not part of the entry's record: a missing or
    unreadable one is computed again, never trusted blindly (40 hex characters or
    nothing)."""
    from specjax.runtime.fingerprints import hash_arrays, remember

    model = weakref.ref(lm)

    def provide() -> str:
        path = fingerprint_file(folder, scan_layers)
        try:
            stored = path.read_text().strip()
            if len(stored) == 40 and all(c in "0123456789abcdef" for c in stored):
                return stored
        except OSError:
            pass
        value = hash_arrays(model().params)
        pending = _WRITING.get(folder)
        if pending is not None:
            pending.join()
        if folder.is_dir():
            try:
                from specjax.runtime.files import atomic_path

                with atomic_path(path) as staging:
                    staging.write_text(value + "\n")
            except OSError:  # a read-only cache: computed again next time
                pass
        return value

    remember(lm, provide)


def _build(arrays: dict, config, scan_layers: bool, placement=None) -> specjax.CausalLM:
    from flax import nnx

    from specjax_models.transformer import ParamFiller, abstract_transformer

    config = dataclasses.replace(config, scan_layers=bool(scan_layers))
    abstract = abstract_transformer(config)
    graphdef, abstract_params = nnx.split(abstract, nnx.Param)
    filler = ParamFiller(abstract_params, config.storage_dtype,
                         placement and placement.for_model(config))
    for name, _ in filler.targets():
        filler.set(name, arrays[name])
    return specjax.CausalLM.from_nnx(nnx.merge(graphdef, filler.state()))


def cached_tokenizer(kind: str, sources: list[Path], build: Callable, cache: bool | None):
    """The `HFTokenizer` `build()` makes, from the cache when an intact entry exists."""
    from specjax_models.hf_tokenizer import HFTokenizer

    if not model_cache_enabled(cache):
        return build()
    folder = default_model_cache_dir() / f"{kind}-{source_key(kind, sources, {})}"
    if folder.exists() and _verified(folder) is not None:
        from tokenizers import Tokenizer

        meta = json.loads((folder / "tokenizer_meta.json").read_text())
        return HFTokenizer(Tokenizer.from_file(str(folder / "tokenizer.json")), **meta)
    tokenizer = build()

    def write(staging: Path) -> None:
        tokenizer._tokenizer.save(str(staging / "tokenizer.json"))
        (staging / "tokenizer_meta.json").write_text(json.dumps({
            "eos_ids": tokenizer.eos_ids, "bos_id": tokenizer.bos_id,
            "pad_id": tokenizer.pad_id, "chat_template": tokenizer.chat_template,
            "special_tokens": tokenizer._special}))

    try:
        _publish(folder, write)
    except OSError as error:
        warnings.warn(f"specjax: tokenizer cache entry not written ({error})", stacklevel=2)
    return tokenizer
