"""What makes a training run resumable: orbax checkpoints of (params, optimizer state) at
a step, and the metrics history beside them (one JSON line per logged step)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import orbax.checkpoint as ocp

HISTORY_FILE = "history.jsonl"


def checkpoint_manager(directory: Path, keep: int = 2) -> ocp.CheckpointManager:
    """An orbax manager keeping the latest `keep` checkpoints under `directory`."""
    return ocp.CheckpointManager(Path(directory).absolute(),
                                 options=ocp.CheckpointManagerOptions(max_to_keep=keep,
                                                                      create=True))


def restore_latest(manager: ocp.CheckpointManager, params, opt_state):
    """`(params, opt_state, step)` from the latest checkpoint, or None when there is none."""
    latest = manager.latest_step()
    if latest is None:
        return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                            {"params": params, "opt_state": opt_state})
    restored = manager.restore(latest, args=ocp.args.StandardRestore(abstract))
    return restored["params"], restored["opt_state"], latest


def save(manager: ocp.CheckpointManager, step: int, params, opt_state) -> None:
    manager.save(step, args=ocp.args.StandardSave({"params": params, "opt_state": opt_state}))


def read_history(directory: Path, up_to_step: int) -> list[dict]:
    """The logged entries up to `up_to_step` (later ones belong to an unsaved stretch)."""
    history_file = Path(directory) / HISTORY_FILE
    if not history_file.exists():
        return []
    entries = map(json.loads, history_file.read_text().splitlines())
    return [entry for entry in entries if entry["step"] <= up_to_step]


def append_history(directory: Path, entry: dict) -> None:
    with open(Path(directory) / HISTORY_FILE, "a") as f:
        f.write(json.dumps(entry) + "\n")
