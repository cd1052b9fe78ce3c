"""What makes a training run resumable: orbax checkpoints of (params, optimizer state) at
a step, and the metrics history beside them (one JSON line per logged step).

A run killed at any moment resumes as if uninterrupted: orbax writes each checkpoint under
a temporary name and renames it when complete (a checkpoint a kill interrupted is never
restored), the batch of step s is a pure function of (seed, s), and the history is cut
back to the restored step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from specjax.runtime.files import damaged, write_text_atomically

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
    """The logged entries up to `up_to_step`, the step a resumed run restarts from, and the
    history file cut back to them (atomically): later entries belong to a stretch whose
    checkpoint was never completed, which the resumed run logs again. A last line cut
    short by a kill is dropped; a damaged line before it is a ValueError naming the file."""
    history_file = Path(directory) / HISTORY_FILE
    if not history_file.exists():
        return []
    lines = history_file.read_text().splitlines()
    entries = []
    for number, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):  # the write a kill interrupted
                break
            raise damaged(history_file, f"line {number} is not JSON",
                          "delete the file (the run's metrics history) to continue") from None
        if entry["step"] <= up_to_step:
            entries.append(entry)
    write_text_atomically(history_file, "".join(json.dumps(e) + "\n" for e in entries))
    return entries


def append_history(directory: Path, entry: dict) -> None:
    """One JSON line, written with a single call and flushed to disk: a kill leaves at
    most the last line cut short, which `read_history` drops."""
    with open(Path(directory) / HISTORY_FILE, "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())
