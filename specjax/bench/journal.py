"""The journal of a benchmark run (`specjax.bench.run`): append-only JSON lines that survive
a kill at any byte.

Line 1 is the header: the run's fingerprint and the digest of each part of it (target,
drafters, methods, prompts, settings), so that a journal of another run is refused with
what differs. Every later line is one finished unit (`{"unit": ..., "record": ...}`) or one
method's measured costs (`{"method": ..., "costs": ...}`), written whole, flushed and
fsynced before the run goes on.

A process killed while appending leaves a torn last line (no newline): reading drops it,
reports it, and the next append starts at the end of the last complete line (the file is
cut back there first), so a journal resumed any number of times stays one readable record
of every unit measured. A line that does not parse in the middle of a journal (written by
an older specjax that appended onto a torn line) is recovered where a whole record ends
it, else dropped and reported; every complete record before and after it is read. A journal
without a complete header holds nothing measured: the run starts afresh and says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

RECORD_KEYS = ("unit", "method")


@dataclasses.dataclass
class JournalContents:
    """What a journal holds: finished units by index (as strings), costs by method, the
    header (None when the journal has no complete first line), the byte length of its
    complete lines (where the next append starts) and what was dropped, in words."""

    units: dict
    costs: dict
    header: dict | None
    complete_bytes: int
    dropped: list[str]


def _record_in(line: str) -> dict | None:
    """A whole record at the end of a damaged line (an older writer's append onto a torn
    line), or None."""
    for start in range(1, len(line)):
        if line[start] != "{":
            continue
        try:
            entry = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and any(k in entry for k in RECORD_KEYS):
            return entry
    return None


def read_journal(path: Path) -> JournalContents:
    """Everything complete in the journal at `path` (see the module docstring)."""
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1  # bytes up to and including the last newline
    dropped = []
    if complete < len(data):
        dropped.append(f"its last line ({len(data) - complete} bytes) was cut off by a kill "
                       "while it was written")
    lines = data[:complete].decode("utf-8", errors="replace").split("\n")[:-1]
    header = None
    if lines:
        try:
            first = json.loads(lines[0])
            header = first if isinstance(first, dict) and "fingerprint" in first else None
        except json.JSONDecodeError:
            header = None
        if header is None:
            dropped.append("its first line is not a journal header")
    units, costs = {}, {}
    for number, line in enumerate(lines[1:] if header is not None else [], 2):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            entry = _record_in(line)
            dropped.append(f"line {number} was damaged by a kill"
                           + (" (the whole record at its end was read)" if entry else ""))
        if not isinstance(entry, dict):
            continue
        if "unit" in entry and "record" in entry:
            units[str(entry["unit"])] = entry["record"]
        elif "method" in entry and "costs" in entry:
            costs[entry["method"]] = entry["costs"]
    return JournalContents(units, costs, header, complete, dropped)


class Journal:
    """An open journal: `start` (a new run) or `resume` (continue the one at `path`), then
    `append` per finished unit or method's costs."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def start(self, header: dict) -> None:
        """A new journal holding only `header` (replacing any file at the path)."""
        with open(self.path, "w") as journal:
            journal.write(json.dumps(header) + "\n")
            journal.flush()
            os.fsync(journal.fileno())

    def resume(self, header: dict, log: Callable[[str], None]) -> tuple[dict, dict]:
        """The units and costs of the journal at the path when its header matches
        `header`, the file cut back to its last complete line so appends follow it; a
        missing or empty journal, or one without a complete header, starts afresh (said
        through `log`). A journal of another run is refused, naming what differs."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            log(f"specjax bench: the journal {self.path} is "
                f"{'empty' if self.path.exists() else 'missing'}: nothing to resume, starting "
                "afresh")
            self.start(header)
            return {}, {}
        contents = read_journal(self.path)
        if contents.header is None:
            log(f"specjax bench: the journal {self.path} has no complete first line (the run "
                "was killed before it recorded anything): starting afresh")
            self.start(header)
            return {}, {}
        if contents.header.get("fingerprint") != header["fingerprint"]:
            theirs = contents.header.get("parts", {})
            differ = [name for name, digest in header["parts"].items()
                      if theirs.get(name) != digest]
            raise ValueError(
                f"the journal {self.path} was written by a different run (its "
                f"{', '.join(differ) or 'fingerprint'} differ{'s' if len(differ) == 1 else ''}"
                " from this run's); delete it, or run without resume to start afresh")
        for note in contents.dropped:
            log(f"specjax bench: the journal {self.path}: {note}; the complete records "
                "before and after it are kept")
        if contents.complete_bytes < self.path.stat().st_size:
            os.truncate(self.path, contents.complete_bytes)
        return contents.units, contents.costs

    def append(self, entry: dict) -> None:
        with open(self.path, "a") as journal:
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            os.fsync(journal.fileno())
