"""Parallel drafts (PARD) on disk: ours (an orbax checkpoint with `parallel.json`) and the
published Hugging Face layout.

A PARD draft is an ordinary causal LM (Llama or Qwen2 layout: AMD's
PARD-Llama-3.2-1B, PARD-Qwen2.5-0.5B, PARD-DeepSeek-R1-Distill-Qwen-1.5B, ...) whose
`config.json` names its mask token: `pard_token` (an int id), as PARD's training sets
`model.config.pard_token` and its inference reads `draft_config.pard_token`
(AMD-AGI/PARD, pard/pard_train.py and pard/pard_infer.py). Without it, a `mask_token`
in tokenizer_config.json (the Hugging Face tokenizer's own field) found among
tokenizer.json's added tokens names it. `load_parallel_draft` reads
either kind into a `specjax.drafters.ParallelDraft`; `save_parallel_draft` writes ours
(what `specjax train-drafter --method pard` produces, and the bundled pair's
`models/checkpoints/parallel`).
"""

from __future__ import annotations

from pathlib import Path

PARALLEL_FILE = "parallel.json"  # ours: {"mask_id": int, "positions": K trained for}
PARD_KEY = "pard_token"  # the published layout's config.json key


def parallel_settings(path: str | Path) -> dict:
    """`{"mask_id": int, "positions": int or None, "layout": "specjax" | "hf"}` of a
    parallel draft directory; refused by name when it names no mask token."""
    from specjax.runtime.files import read_json

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a directory (a parallel draft is a folder: "
                                f"config.json and the weights)")
    if (path / PARALLEL_FILE).exists():
        settings = read_json(path / PARALLEL_FILE, "write it again with save_parallel_draft")
        layout = "specjax"
    elif (path / "config.json").exists():
        config = read_json(path / "config.json", "download the checkpoint again")
        mask_id = config[PARD_KEY] if PARD_KEY in config else _tokenizer_mask_id(path)
        if mask_id is None:
            raise ValueError(f"{path} is not a parallel draft: its config.json has no "
                             f"{PARD_KEY!r} (a PARD checkpoint names its mask token there), "
                             "its tokenizer_config.json no mask_token, and there is no "
                             f"{PARALLEL_FILE}; an ordinary draft model drafts with "
                             "specjax.DraftModel")
        settings = {"mask_id": mask_id, "positions": None}
        layout = "hf"
    else:
        raise FileNotFoundError(f"{path} has neither {PARALLEL_FILE} nor config.json")
    mask_id = settings.get("mask_id")
    if isinstance(mask_id, list) and mask_id:  # some configs list several unused ids
        mask_id = mask_id[0]
    if isinstance(mask_id, bool) or not isinstance(mask_id, int) or mask_id < 0:
        raise ValueError(f"{path}: the mask token must be an int id >= 0, got {mask_id!r}")
    positions = settings.get("positions")
    return {"mask_id": mask_id, "positions": positions, "layout": layout}


def _tokenizer_mask_id(path: Path):
    """The id of tokenizer_config.json's `mask_token` among tokenizer.json's added tokens
    (a draft that names its mask in the tokenizer rather than in config.json), or None."""
    from specjax.runtime.files import read_json

    if not (path / "tokenizer_config.json").exists():
        return None
    mask = read_json(path / "tokenizer_config.json", "download the tokenizer again").get(
        "mask_token")
    if isinstance(mask, dict):  # an AddedToken written out: {"content": ..., ...}
        mask = mask.get("content")
    if not isinstance(mask, str):
        return None
    if not (path / "tokenizer.json").exists():
        raise ValueError(f"{path}: tokenizer_config.json names the mask token {mask!r} but "
                         "there is no tokenizer.json to find its id in")
    added = read_json(path / "tokenizer.json", "download the tokenizer again").get(
        "added_tokens", [])
    ids = [entry.get("id") for entry in added if entry.get("content") == mask]
    if not ids:
        raise ValueError(f"{path}: the mask token {mask!r} of tokenizer_config.json is not "
                         "among tokenizer.json's added tokens")
    return ids[0]


def save_parallel_draft(lm, config, path: str | Path, *, mask_id: int, positions: int,
                        extra: dict | None = None) -> Path:
    """Write a parallel draft: `save_checkpoint`'s files, then `parallel.json` (last, so
    a killed save leaves no file that calls the folder a parallel draft)."""
    from specjax.runtime.files import write_json_atomically
    from specjax_models.checkpoint import save_checkpoint

    path = save_checkpoint(lm, config, path, extra)
    write_json_atomically(path / PARALLEL_FILE, {"mask_id": int(mask_id),
                                                 "positions": int(positions)})
    return path


def load_parallel_draft(path: str | Path, method: str = "sample", dtype=None):
    """A `specjax.drafters.ParallelDraft` from a directory: ours (`parallel.json`, an orbax
    checkpoint) or a published PARD checkpoint (config.json with `pard_token`,
    safetensors; read by `from_pretrained`)."""
    from specjax.drafters import ParallelDraft

    settings = parallel_settings(path)
    # The mask against the vocabulary config.json gives, before any weight is read.
    declared = _declared_vocab_size(Path(path))
    if declared is not None and settings["mask_id"] >= declared:
        raise ValueError(f"{path}: mask token {settings['mask_id']} is outside the draft's "
                         f"vocabulary [0, {declared}) (config.json's vocab_size); a PARD "
                         f"checkpoint's `{PARD_KEY}` must be one of its ids")
    if settings["layout"] == "specjax":
        from specjax_models.checkpoint import load_checkpoint

        lm = load_checkpoint(path, dtype)
    else:
        from specjax_models.hf import from_pretrained

        lm = from_pretrained(path, dtype)
    if settings["mask_id"] >= lm.vocab_size:
        raise ValueError(f"{path}: mask token {settings['mask_id']} is outside the draft's "
                         f"vocabulary [0, {lm.vocab_size})")
    positions = settings["positions"]
    return ParallelDraft(lm, mask_id=settings["mask_id"], method=method,
                         trained_positions=positions if isinstance(positions, int)
                         and not isinstance(positions, bool) and positions >= 1 else None)


def _declared_vocab_size(path: Path) -> int | None:
    """config.json's vocab_size (ours and the published layout both write one), or None."""
    from specjax.runtime.files import read_json

    if not (path / "config.json").exists():
        return None
    size = read_json(path / "config.json", "download the checkpoint again").get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def trained_positions(path: str | Path) -> int | None:
    """K the draft was trained to predict at once (ours), None when unknown (published)."""
    positions = parallel_settings(path)["positions"]
    return positions if isinstance(positions, int) and not isinstance(positions, bool) \
        else None
