"""A layer draft: a few of a target's own layers on its embedding, with the rows of its LM
head for a reduced draft vocabulary (`select_layers`), the chosen blocks and the final norm
trained by distillation (`specjax_models.recipes.smollm2_draft` for SmolLM2).

Saved as `draft.json` (config, layers, target) + `draft.npz` (the trained groups and the
draft vocabulary); the embedding and the head rows stay the target's (not saved) and
`load_layer_draft(directory, target)` rebuilds the `specjax.DraftModel(...,
draft_vocab=ids)`. A layer draft adapted into a parallel draft (PARD,
`specjax_models.recipes.smollm2_parallel`) also records its mask token and the K it was
trained for (`draft.json`'s "parallel"), and `load_parallel_layer_draft` rebuilds the
`specjax.ParallelDraft`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

import specjax
from specjax.runtime.files import (
    damaged,
    load_npz,
    read_json,
    save_npz_atomically,
    write_json_atomically,
)
from specjax_models.transformer import select_layers, select_layers_config

REMEDY = "distil the draft again (specjax train-drafter --method draft) or copy a complete one"
# Parameter groups the draft shares with its target: not trained, not saved.
SHARED = ("embed", "lm_head")
DRAFT_VOCAB_KEY = "draft_vocab"


def trained_arrays(draft: specjax.CausalLM) -> dict:
    """The draft's own parameters by flat name ("layers.0.attention.q_proj.kernel", ...)."""
    flat = nnx.to_flat_state(nnx.State(dict(draft.params)))
    return {".".join(str(p) for p in path): np.asarray(leaf.get_value())
            for path, leaf in flat if path[0] not in SHARED}


def save_layer_draft(directory: str | Path, draft: specjax.CausalLM, target_config, layers,
                     draft_vocab, *, parallel: dict | None = None) -> None:
    """`draft.json` and `draft.npz` (float32) in `directory`; the shared embedding and head
    rows are rebuilt from the target on load. `parallel`: {"mask_id", "positions"} of a
    parallel draft."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = {"layers": [int(i) for i in layers],
            "config": dataclasses.asdict(select_layers_config(target_config, layers,
                                                              draft_vocab)),
            "target_config": dataclasses.asdict(target_config)}
    if parallel is not None:
        meta["parallel"] = {"mask_id": int(parallel["mask_id"]),
                            "positions": int(parallel["positions"])}
    arrays = {name: value.astype(np.float32) for name, value in trained_arrays(draft).items()}
    # Each file atomically, the archive first: a killed save leaves no draft.json that
    # points at a half-written archive.
    save_npz_atomically(directory / "draft.npz", **arrays,
                        **{DRAFT_VOCAB_KEY: np.asarray(draft_vocab, np.int32)})
    write_json_atomically(directory / "draft.json", meta)


def _saved_array(arrays: dict, path: tuple, num_layers: int) -> np.ndarray | None:
    """The saved array of parameter `path` (popped from `arrays`). The file names each
    layer's arrays (`layers.0.attention.q_proj.kernel`); on a target with scanned layers
    the draft's are stacked (`layers.attention.q_proj.kernel`, [L, ...]): those are
    stacked from the per-layer arrays."""
    name = ".".join(str(p) for p in path)
    if path[0] != "layers" or isinstance(path[1], int):
        return arrays.pop(name, None)
    rest = ".".join(str(p) for p in path[1:])
    parts = [arrays.pop(f"layers.{i}.{rest}", None) for i in range(num_layers)]
    if any(part is None for part in parts) or len({part.shape for part in parts}) != 1:
        return None
    return np.stack(parts)


def load_layer_draft(directory: str | Path, target: specjax.CausalLM,
                     method: str = "sample") -> specjax.DraftModel:
    """The draft saved in `directory` on `target` (the model it was distilled from), as a
    `specjax.DraftModel` with its draft vocabulary."""
    lm, draft_vocab, _ = _load(directory, target)
    return specjax.DraftModel(lm, method, draft_vocab=draft_vocab)


def load_parallel_layer_draft(directory: str | Path, target: specjax.CausalLM,
                              method: str = "sample") -> specjax.ParallelDraft:
    """The parallel layer draft saved in `directory` on `target`, as a
    `specjax.ParallelDraft` with its mask token and draft vocabulary."""
    lm, draft_vocab, meta = _load(directory, target)
    parallel = meta.get("parallel")
    if parallel is None:
        raise ValueError(f"{directory} is an autoregressive layer draft (its draft.json has no "
                         "\"parallel\" entry): load it with load_layer_draft, or adapt it with "
                         "`specjax train-drafter --model smollm2 --method pard`")
    mask_id = parallel.get("mask_id") if isinstance(parallel, dict) else None
    if isinstance(mask_id, bool) or not isinstance(mask_id, int) or \
            not 0 <= mask_id < target.vocab_size:
        raise damaged(Path(directory) / "draft.json", f"gives the mask id {mask_id!r}, "
                      f"expected an id of the target's {target.vocab_size}", REMEDY)
    return specjax.ParallelDraft(lm, mask_id=mask_id, method=method, draft_vocab=draft_vocab)


def parallel_layer_settings(directory: str | Path) -> dict | None:
    """draft.json's "parallel" entry ({"mask_id", "positions"}), None for an
    autoregressive layer draft (or no layer draft)."""
    path = Path(directory) / "draft.json"
    if not path.exists():
        return None
    meta = read_json(path, REMEDY)
    return meta.get("parallel") if isinstance(meta, dict) else None


def _load(directory: str | Path, target: specjax.CausalLM):
    """(lm, draft_vocab, draft.json) of the layer draft in `directory` on `target`."""
    directory = Path(directory)
    if not (directory / "draft.json").exists() or not (directory / "draft.npz").exists():
        raise FileNotFoundError(f"no distilled draft at {directory} (expected draft.json and "
                                "draft.npz, as `specjax train-drafter --method draft` writes)")
    meta = read_json(directory / "draft.json", REMEDY)
    arrays = load_npz(directory / "draft.npz", REMEDY)
    layers = meta.get("layers")
    if not isinstance(layers, list) or not all(isinstance(i, int) for i in layers):
        raise damaged(directory / "draft.json", f"gives layers {layers!r}, expected a list of "
                      "target layer indices", REMEDY)
    draft_vocab = arrays.pop(DRAFT_VOCAB_KEY, None)
    if draft_vocab is None or draft_vocab.ndim != 1 or \
            not np.issubdtype(draft_vocab.dtype, np.integer):
        raise damaged(directory / "draft.npz", "lacks its draft vocabulary (an int array "
                      f"{DRAFT_VOCAB_KEY!r})", REMEDY)
    if draft_vocab.size and (draft_vocab.min() < 0 or draft_vocab.max() >= target.vocab_size):
        raise ValueError(f"{directory}: the draft vocabulary holds ids outside this "
                         f"target's vocabulary of {target.vocab_size}: load it onto the "
                         "target it was distilled from")
    draft = select_layers(target, tuple(layers), draft_vocab)
    flat = nnx.to_flat_state(nnx.State(dict(draft.params)))
    updated = []
    for path, leaf in flat:
        name = ".".join(str(p) for p in path)
        if path[0] not in SHARED:
            saved = _saved_array(arrays, path, len(layers))
            if saved is None or saved.shape != leaf.get_value().shape:
                raise ValueError(f"{directory} does not fit this target: its {name} is "
                                 f"{None if saved is None else saved.shape}, the target's "
                                 f"layers give {leaf.get_value().shape}")
            if not np.issubdtype(saved.dtype, np.floating):
                raise damaged(directory / "draft.npz", f"array {name} holds {saved.dtype}, "
                              "expected floats", REMEDY)
            leaf = leaf.replace(jnp.asarray(saved, leaf.get_value().dtype))
        updated.append((path, leaf))
    if arrays:
        raise ValueError(f"{directory} holds parameters this draft has no place for: "
                         f"{sorted(arrays)[:4]}")
    params = type(draft.params)(dict(nnx.from_flat_state(updated)))
    return draft.with_params(params), draft_vocab, meta
