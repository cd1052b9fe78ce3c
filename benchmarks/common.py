"""Shared measurement helpers: timing medians and a record of the machine and versions."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def block(x):
    """Wait for every array in a pytree (JAX) so timings include the computation."""
    import jax

    return jax.block_until_ready(x)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median(values) -> float:
    return float(statistics.median(values))


def machine_record() -> dict:
    import jax

    record = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    try:
        import flax

        record["flax"] = flax.__version__
    except ImportError:
        pass
    try:
        record["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                              text=True, check=False).stdout.strip()
    except OSError:
        pass
    return record


def write_results(name: str, payload: dict, markdown: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown)
    print(f"wrote {RESULTS / name}.json and .md")
