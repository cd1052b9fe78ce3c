"""The weight files of a published drafter (specjax_models.published_drafters): its
safetensors files (single, sharded, or any `*.safetensors`, headers checked against their
sizes, a tensor read when taken) or pickled PyTorch files read with torch where it is
installed (`weights_only=True`), else refused with the one-line conversion. Tensors are
taken by name and checked against the shape the drafter needs; one left unused in the
drafter's part of the checkpoint is an error naming its file."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np

from specjax_models.safetensors_layout import check_safetensors

REMEDY = "download the drafter again"
_BIN_NAMES = ("pytorch_model.bin", "medusa_lm_head.pt", "model.pt")


def read_weights(directory: str | Path) -> PublishedWeights:
    """The tensors of `directory`'s weight files, by name: its safetensors files (headers
    checked against their sizes; a tensor is read when taken, so a target checkpoint's MTP
    module is read without its blocks), else pickled PyTorch files read with torch."""
    directory = Path(directory)
    files = sorted(directory.glob("*.safetensors"))
    if files:
        file_of = {}
        for path in files:
            for name in check_safetensors(path):
                file_of[name] = path.name
        return PublishedWeights(directory, None, file_of)
    pickled = [directory / name for name in _BIN_NAMES if (directory / name).is_file()]
    pickled += sorted(directory.glob("pytorch_model-*.bin"))
    if not pickled:
        raise FileNotFoundError(f"{directory} holds no drafter weights (expected "
                                "*.safetensors, pytorch_model.bin or medusa_lm_head.pt)")
    try:
        import torch
    except ImportError:
        path = pickled[0]
        raise ValueError(
            f"{path} is a pickled PyTorch file and torch is not installed; install torch, "
            f"or convert it once where torch is: python -c \"import torch, safetensors.torch "
            f"as s; w = torch.load('{path}', weights_only=True); s.save_file({{k: "
            f"v.contiguous().clone() for k, v in w.items()}}, '{path.with_suffix('')}"
            f".safetensors')\"") from None
    arrays, file_of = {}, {}
    for path in pickled:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch raises many types for a damaged pickle
            raise ValueError(f"{path} cannot be read as PyTorch weights ({type(error).__name__}"
                             f": {error}); {REMEDY}") from None
        for name, tensor in state.items():
            tensor = tensor.detach()
            arrays[name] = (tensor.float() if tensor.dtype == torch.bfloat16 else
                            tensor).numpy()
            file_of[name] = path.name
    return PublishedWeights(directory, arrays, file_of)


class PublishedWeights:
    """The checkpoint's tensors, taken by name (read from their safetensors file on
    demand, or from `arrays` already loaded); what is left unused in the drafter's part of
    the checkpoint is an error (a key this loader has no place for)."""

    def __init__(self, directory: Path, arrays: dict | None, file_of: dict[str, str]):
        self.directory, self.arrays, self.file_of = directory, arrays, file_of
        self.names = set(file_of)
        self.used: set[str] = set()
        self.float_dtype = np.dtype(np.float32)  # what floating tensors are cast to

    def has(self, name: str) -> bool:
        return name in self.names

    def read_raw(self, name: str) -> np.ndarray:
        """The tensor as the file holds it (numpy, no cast), marked used."""
        array = self._read(name)
        self.used.add(name)
        return array

    def _read(self, name: str) -> np.ndarray:
        if self.arrays is not None:
            return np.asarray(self.arrays[name])
        from safetensors import safe_open

        with safe_open(self.directory / self.file_of[name], framework="numpy") as handle:
            return handle.get_tensor(name)

    def take(self, name: str, shape: tuple | None = None, transpose: bool = False,
             host_dtype=None):
        """The tensor (checked against `shape`), transposed if asked: a jax array of the
        drafter's float dtype, converted as it is read so that the host holds one
        checkpoint tensor at a time; with `host_dtype`, a numpy array of that dtype (the
        id maps)."""
        if name not in self.names:
            raise ValueError(f"{self.directory}: the drafter's weights lack {name!r}; "
                             f"{self._neighbours(name)}: the checkpoint holds another "
                             "layout of this drafter, or was saved without this tensor (a "
                             "conversion that drops it): use the checkpoint as published")
        array = self._read(name)
        if shape is not None and tuple(array.shape) != tuple(shape):
            raise ValueError(f"{self.directory / self.file_of[name]}: tensor {name!r} has "
                             f"shape {tuple(array.shape)}, expected {tuple(shape)} for this "
                             f"target and config.json; {REMEDY}")
        self.used.add(name)
        if host_dtype is not None:
            return array.astype(host_dtype)
        on_device = jnp.asarray(array)
        del array
        return (on_device.T if transpose else on_device).astype(self.float_dtype)

    def _neighbours(self, name: str) -> str:
        """What the weights hold beside a missing tensor: the names that share its longest
        prefix (its module: model.layers.61.*, not the target's other tensors)."""
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:cut]) + "."
            near = sorted(n for n in self.names if n.startswith(prefix))
            if near:
                more = f" and {len(near) - 8} more" if len(near) > 8 else ""
                return f"{prefix}* holds {', '.join(near[:8])}{more}"
        return f"no tensor shares its prefix (the weights hold {len(self.names)} tensors)"

    def ignore(self, *names: str) -> None:
        self.used.update(n for n in names if n in self.names)

    def finish(self, prefix: str = "") -> None:
        """Refuse any tensor under `prefix` that was not taken or ignored."""
        unused = sorted(n for n in self.names - self.used if n.startswith(prefix))
        if unused:
            name = unused[0]
            raise ValueError(f"{self.directory / self.file_of[name]}: tensor {name!r} has no "
                             f"place in this drafter ({len(unused)} unused: {unused[:4]}); "
                             "its config.json asks for a variant this loader does not support")
