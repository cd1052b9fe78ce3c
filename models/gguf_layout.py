"""What a GGUF file's header promises, checked against the file before anything reads it.

A GGUF file is a header (magic "GGUF", version, tensor and metadata counts), the metadata
key/value pairs, a table of tensors (name, dimensions, type, offset), then the tensor data
from an aligned start. A download cut short, a file that is not GGUF, or a damaged header
would otherwise surface as a bare reshape or struct error deep inside the `gguf` reader;
here each is a ValueError that names the file, what was expected and what was found.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
# Value type -> struct format of a scalar (GGUFValueType: 8 is a string, 9 an array).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
REDOWNLOAD = "download it again"


@dataclasses.dataclass(frozen=True)
class TensorExtent:
    name: str
    type_code: int
    shape: tuple[int, ...]
    start: int  # absolute byte offset of its data
    size: int  # bytes


class _Cursor:
    """Reads little-endian fields from a file, refusing to run past its end."""

    def __init__(self, path: Path, handle, file_size: int):
        self.path, self.handle, self.file_size = path, handle, file_size

    def read(self, count: int, what: str) -> bytes:
        self._need(count, what)
        return self.handle.read(count)

    def skip(self, count: int, what: str) -> None:
        self._need(count, what)
        self.handle.seek(count, 1)

    def _need(self, count: int, what: str) -> None:
        position = self.handle.tell()
        if count > self.file_size - position:
            raise ValueError(f"{self.path} is truncated: its header ends inside {what} (at "
                             f"byte {position}, {count} more bytes needed, the file has "
                             f"{self.file_size}); {REDOWNLOAD}")

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.scalar("<Q", what)
        data = self.read(length, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{self.path} is damaged: {what} is not UTF-8 text; "
                             f"{REDOWNLOAD}") from None

    def value(self, kind: int, what: str):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind], what)
        if kind == _STRING:
            return self.string(what)
        if kind == _ARRAY:
            item_kind, count = self.scalar("<I", what), self.scalar("<Q", what)
            if item_kind in _SCALARS:  # skip the items: only their size matters here
                self.skip(count * struct.calcsize(_SCALARS[item_kind]), what)
            elif item_kind == _STRING:  # token lists: tens of thousands, skipped
                for _ in range(count):
                    self.skip(self.scalar("<Q", what), what)
            else:
                for _ in range(count):
                    self.value(item_kind, what)
            return None
        raise ValueError(f"{self.path} is damaged: {what} has value type {kind}, which GGUF "
                         f"does not define; {REDOWNLOAD}")


def check_gguf_layout(path: str | Path) -> list[TensorExtent]:
    """Every tensor's byte extent, after checking that the file is GGUF, that its header
    and tensor table are whole, that every tensor type exists, and that the file holds
    every byte the table promises. Raises ValueError naming what is wrong."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    file_size = path.stat().st_size
    with open(path, "rb") as handle:
        cursor = _Cursor(path, handle, file_size)
        magic = handle.read(4)
        if len(magic) < len(MAGIC) and MAGIC.startswith(magic):
            raise ValueError(f"{path} is truncated: {file_size} bytes, less than a GGUF "
                             f"header; {REDOWNLOAD}")
        if magic != MAGIC:
            raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, a GGUF "
                             f"file with {MAGIC!r} (a file of another format, or an error "
                             "page saved in its place?)")
        version = cursor.scalar("<I", "the version")
        if version not in SUPPORTED_VERSIONS:
            raise ValueError(f"{path} is GGUF version {version}; supported: "
                             f"{', '.join(map(str, SUPPORTED_VERSIONS))} (a damaged header, "
                             "or a file newer than the gguf package)")
        tensor_count = cursor.scalar("<Q", "the tensor count")
        kv_count = cursor.scalar("<Q", "the metadata count")
        # Each entry takes at least 8 bytes: larger counts are damage, not a big file.
        if (tensor_count + kv_count) * 8 > file_size:
            raise ValueError(f"{path} is truncated or damaged: its header claims "
                             f"{tensor_count} tensors and {kv_count} metadata entries, more "
                             f"than its {file_size} bytes can hold; {REDOWNLOAD}")
        alignment = DEFAULT_ALIGNMENT
        for index in range(kv_count):
            key = cursor.string(f"metadata entry {index}'s key")
            value = cursor.value(cursor.scalar("<I", f"metadata {key!r}'s type"),
                                 f"metadata {key!r}")
            if key == "general.alignment":
                alignment = int(value)
        table = []
        for index in range(tensor_count):
            name = cursor.string(f"tensor {index}'s name")
            dims = cursor.scalar("<I", f"tensor {name!r}'s dimension count")
            if not 1 <= dims <= MAX_DIMS:
                raise ValueError(f"{path} is damaged: tensor {name!r} has {dims} dimensions "
                                 f"(GGUF allows 1 to {MAX_DIMS}); {REDOWNLOAD}")
            shape = tuple(cursor.scalar("<Q", f"tensor {name!r}'s shape") for _ in range(dims))
            type_code = cursor.scalar("<I", f"tensor {name!r}'s type")
            offset = cursor.scalar("<Q", f"tensor {name!r}'s offset")
            table.append((name, shape, type_code, offset))
        data_start = -(-handle.tell() // alignment) * alignment
    extents = []
    for name, shape, type_code, offset in table:
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_code)]
        except (ValueError, KeyError):
            raise ValueError(f"{path} is damaged: tensor {name!r} has type code {type_code}, "
                             f"which GGUF does not define; {REDOWNLOAD}") from None
        elements = 1
        for dim in shape:
            elements *= dim
        if elements % block:
            raise ValueError(f"{path} is damaged: tensor {name!r} of shape {shape} does not "
                             f"fill whole {block}-element blocks of its type; {REDOWNLOAD}")
        extents.append(TensorExtent(name, type_code, shape, data_start + offset,
                                    elements // block * block_bytes))
    if extents:
        last = max(extents, key=lambda extent: extent.start + extent.size)
        needed = last.start + last.size
        if needed > file_size:
            raise ValueError(f"{path} is truncated: expected {needed} bytes (tensor "
                             f"{last.name!r} ends there), found {file_size}; {REDOWNLOAD}")
    return extents
