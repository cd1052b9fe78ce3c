"""What a safetensors file's header promises, checked against the file before it is read.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each
tensor to its dtype, shape and `data_offsets` (begin, end) within the data that follows,
then the data. A download cut short or a damaged header would otherwise surface as a bare
error from the safetensors library; here each is a ValueError naming the file, the
tensor, what was expected and what was found. Sharded checkpoints list their files in
`model.safetensors.index.json`, checked the same way.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

# safetensors dtype -> bytes per element.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8,
               "F64": 8}
# safetensors dtype -> numpy dtype, for the ones `tensor_views` maps.
NUMPY_DTYPES = {"BOOL": np.dtype(bool), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
                "I16": np.dtype("<i2"), "U16": np.dtype("<u2"), "F16": np.dtype("<f2"),
                "BF16": np.dtype(ml_dtypes.bfloat16), "I32": np.dtype("<i4"),
                "U32": np.dtype("<u4"), "F32": np.dtype("<f4"), "I64": np.dtype("<i8"),
                "U64": np.dtype("<u8"), "F64": np.dtype("<f8")}
MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit
REDOWNLOAD = "download it again"


def check_safetensors(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """`{tensor name: (dtype, shape)}` of a safetensors file, after checking its header and
    that the file holds every byte the header promises."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    file_size = path.stat().st_size
    with open(path, "rb") as handle:
        if file_size < 8:
            raise ValueError(f"{path} is truncated: {file_size} bytes, less than a "
                             f"safetensors header; {REDOWNLOAD}")
        (header_bytes,) = struct.unpack("<Q", handle.read(8))
        _check_header_length(path, header_bytes, file_size)
        raw = handle.read(header_bytes)
    layout = _layout(path, raw, header_bytes, file_size)
    return {name: (dtype, shape) for name, (dtype, shape, _, _) in layout.items()}


def tensor_views(path: str | Path, data) -> dict[str, np.ndarray]:
    """`{tensor name: array}` of the safetensors file `path` whose bytes are `data` (any
    buffer, e.g. an `mmap` of the file): each array is a view into `data`, nothing is
    copied; the header is checked as `check_safetensors` checks it."""
    path = Path(path)
    view = memoryview(data)
    if len(view) < 8:
        raise ValueError(f"{path} is truncated: {len(view)} bytes, less than a safetensors "
                         f"header; {REDOWNLOAD}")
    (header_bytes,) = struct.unpack("<Q", view[:8])
    _check_header_length(path, header_bytes, len(view))
    layout = _layout(path, bytes(view[8:8 + header_bytes]), header_bytes, len(view))
    arrays = {}
    for name, (dtype, shape, begin, end) in layout.items():
        if dtype not in NUMPY_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} holds {dtype}, which has no numpy "
                             "dtype here")
        start = 8 + header_bytes + begin
        arrays[name] = np.frombuffer(view[start:8 + header_bytes + end],
                                     dtype=NUMPY_DTYPES[dtype]).reshape(shape)
    return arrays


def _check_header_length(path: Path, header_bytes: int, file_size: int) -> None:
    if header_bytes > MAX_HEADER_BYTES:
        raise ValueError(f"{path} is not a safetensors file (its first 8 bytes give a "
                         f"{header_bytes}-byte header); {REDOWNLOAD}")
    if 8 + header_bytes > file_size:
        raise ValueError(f"{path} is truncated: its header alone needs "
                         f"{8 + header_bytes} bytes, the file has {file_size}; "
                         f"{REDOWNLOAD}")


def _layout(path: Path, raw: bytes, header_bytes: int, file_size: int
            ) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """`{name: (dtype, shape, begin, end)}` from a header, every entry checked."""
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is damaged: its header is not JSON ({error}); "
                         f"{REDOWNLOAD}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is damaged: its header is not a JSON object; {REDOWNLOAD}")
    tensors, data_end = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = entry["dtype"], tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{path} is damaged: the header entry of {name!r} is {entry!r} "
                             "(expected dtype, shape, data_offsets)") from None
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"{path} is damaged: tensor {name!r} has dtype {dtype!r}, "
                             "which safetensors does not define")
        elements = 1
        for dim in shape:
            elements *= dim
        if end - begin != elements * DTYPE_BYTES[dtype] or begin < 0:
            raise ValueError(f"{path} is damaged: tensor {name!r} ({dtype}, shape {shape}) "
                             f"needs {elements * DTYPE_BYTES[dtype]} bytes but its offsets "
                             f"span {end - begin}; {REDOWNLOAD}")
        tensors[name] = (dtype, shape, begin, end)
        data_end = max(data_end, end)
    needed = 8 + header_bytes + data_end
    if needed > file_size:
        raise ValueError(f"{path} is truncated: expected {needed} bytes, found {file_size}; "
                         f"{REDOWNLOAD}")
    return tensors


def checkpoint_files(directory: Path) -> dict[str, str]:
    """`{tensor name: file name}` of a single-file or sharded safetensors checkpoint, every
    file checked (`check_safetensors`) and every tensor the index lists found in its file."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            weight_map = {str(k): str(v) for k, v in dict(weight_map).items()}
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
                ValueError) as error:
            raise ValueError(f"{index} is damaged: expected JSON with a weight_map object "
                             f"({type(error).__name__}: {error}); {REDOWNLOAD}") from None
        for file_name in sorted(set(weight_map.values())):
            if not (directory / file_name).is_file():
                raise FileNotFoundError(f"{directory} lacks the shard {file_name} that "
                                        f"{index.name} lists (an interrupted download?); "
                                        f"{REDOWNLOAD}")
            held = check_safetensors(directory / file_name)
            absent = sorted(name for name, f in weight_map.items()
                            if f == file_name and name not in held)
            if absent:
                raise ValueError(f"{directory / file_name} lacks {absent[:3]}, which "
                                 f"{index.name} places there; {REDOWNLOAD}")
        return weight_map
    single = directory / "model.safetensors"
    if single.exists():
        return {name: single.name for name in check_safetensors(single)}
    raise FileNotFoundError(f"{directory} has no model.safetensors or "
                            "model.safetensors.index.json (only safetensors checkpoints are "
                            "supported)")
