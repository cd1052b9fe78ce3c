"""The live progress line of training runs (one plain line per update when not a tty)."""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress bar with live metrics (a plain line per update when not a tty)."""

    def __init__(self, total: int, start: int, label: str, stream=sys.stderr, enabled=True):
        self.total, self.label, self.stream, self.enabled = total, label, stream, enabled
        self.start_step, self.start_time = start, time.perf_counter()
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def note(self, text: str) -> None:
        """A phase line (compiling, resuming, ...), on its own line."""
        if self.enabled:
            self.stream.write(f"{self.label}: {text}\n")
            self.stream.flush()

    def update(self, step: int, **metrics) -> None:
        if not self.enabled:
            return
        done = step / self.total
        rate = (step - self.start_step) / max(time.perf_counter() - self.start_time, 1e-9)
        bar = "#" * int(24 * done) + "." * (24 - int(24 * done))
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        line = f"{self.label} [{bar}] {step}/{self.total} {shown} {rate:.2f} step/s"
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()
