"""`--layers auto`: the target's layer layout chosen by what was measured on this machine.

A scanned target (one `lax.scan` over stacked layers) compiles, or loads from the
persistent compilation cache, seconds sooner than an unrolled one; each of its steps is
slower wherever the compiler copies a layer's weights out of the stack before its matmuls
(XLA CPU always does: Qwen2.5-0.5B's 1-token forward 108 ms scanned vs 54 ms unrolled,
benchmarks/results/roofline_cpu.md; no XLA CPU option avoids the copy). Which layout
finishes a request sooner depends on the model, the chip and the request's length, so it
is measured, not assumed:

- every `specjax generate` records, in the model cache's folder (`layout-timings.json`),
  the seconds its first step took (compile or load, prefill) and the seconds per token
  after it, for this model, this machine's devices, the decoding mode and the layout;
- `--layers auto` then picks the layout with the least `start + new_tokens x per_token`
  when both were measured; when one was, it runs the other (so a model's first two runs
  on a machine measure both); when neither was, the rule measured on SmolLM2 on 2 CPU
  cores: scanned up to SCANNED_UP_TO_TOKENS new tokens.

The start recorded is the fastest seen, per-token the latest. A layout's first run
compiles its step, later ones load it from the persistent compilation cache, seconds
sooner: so that a compile is never weighed against a load, a layout run once while the
other ran more is run again before the two are compared.

`--layers scanned|unrolled` overrides the choice (and is recorded too);
`$SPECJAX_LAYOUT_TIMINGS` names another file, or turns the records off
(0 / off / false / no / none: `auto` then follows the SmolLM2 rule, as the test suite does
so that its programs do not depend on the order tests ran in).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV_VAR = "SPECJAX_LAYOUT_TIMINGS"
TIMINGS_FILE = "layout-timings.json"
FORMAT_VERSION = 1
SCANNED, UNROLLED = "scanned", "unrolled"
# Without measurements: scanned up to this many new tokens. Measured warm on SmolLM2 (2
# cores, docs/benchmarks.md): the scanned step loads from the persistent cache ~1.7 s
# sooner (one layer's code instead of 30) and decodes at ~0.75x the unrolled tokens/s, so
# a request shorter than ~170 tokens finishes sooner scanned.
SCANNED_UP_TO_TOKENS = 160


def timings_path() -> Path | None:
    """`$SPECJAX_LAYOUT_TIMINGS` when it names a file, None when it turns the records off,
    else `layout-timings.json` in the model cache's folder."""
    from specjax.runtime.compilation_cache import OFF_VALUES
    from specjax_models.model_cache import default_model_cache_dir

    chosen = os.environ.get(ENV_VAR, "").strip()
    if chosen.lower() in OFF_VALUES:
        return None
    return Path(chosen).expanduser() if chosen else default_model_cache_dir() / TIMINGS_FILE


def model_identity(args) -> str:
    """The target as the command line named it: a checkpoint's resolved path, or the
    bundled / SmolLM2 model."""
    if getattr(args, "hf", None):
        return f"hf:{Path(args.hf).expanduser().resolve()}"
    if getattr(args, "gguf", None):
        return f"gguf:{Path(args.gguf).expanduser().resolve()}"
    if getattr(args, "model", None) == "smollm2":
        return "smollm2"
    return f"bundled:{getattr(args, 'target', None)}"


def machine_identity() -> str:
    """The devices a step runs on: backend, device kind and count."""
    import jax

    devices = jax.devices()
    return f"{jax.default_backend()}:{devices[0].device_kind}:{len(devices)}"


def decoding_mode(args) -> str:
    """What else shapes a step's time: plain, or the drafter and its draft length."""
    if getattr(args, "no_speculation", False):
        return "plain"
    from specjax.cli.choices import drafter_choice

    return (f"speculative:{drafter_choice(args)}:K={getattr(args, 'num_draft_tokens', None)}"
            f":tree={getattr(args, 'tree', None)}:mesh={getattr(args, 'mesh', None)}")


def _entry_key(args) -> str:
    return f"{model_identity(args)}|{machine_identity()}|{decoding_mode(args)}"


def read_timings(path: Path | None = None) -> dict:
    """The recorded timings ({} when there are none, or the file is unreadable: it is a
    cache, rebuilt by the next runs)."""
    path = timings_path() if path is None else path
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def _valid(timing) -> bool:
    return (isinstance(timing, dict)
            and all(isinstance(timing.get(name), (int, float)) and timing[name] >= 0
                    for name in ("start_seconds", "seconds_per_token"))
            and isinstance(timing.get("runs", 1), int) and timing.get("runs", 1) >= 1)


def measured_layouts(args, path: Path | None = None) -> dict[str, dict]:
    """{layout: {"start_seconds", "seconds_per_token"}} recorded for this request's model,
    machine and mode."""
    entries = read_timings(path)
    entry = entries.get(_entry_key(args), {}) if entries else {}
    if not isinstance(entry, dict):
        return {}
    return {layout: timing for layout, timing in entry.items()
            if layout in (SCANNED, UNROLLED) and _valid(timing)}


def choose_layout(measured: dict[str, dict], new_tokens: int) -> tuple[str, str]:
    """(layout, why) for a request of `new_tokens` given the `measured` timings."""
    if len(measured) == 2:
        runs = {layout: int(t.get("runs", 1)) for layout, t in measured.items()}
        once = [layout for layout, count in runs.items() if count == 1]
        if len(once) == 1:  # its start was a compile, the other's a load: measure it warm
            return once[0], (f"measuring it again (its one run here compiled; the "
                             f"other's {runs[next(iter(set(runs) - set(once)))]} runs "
                             "loaded from the cache)")
        totals = {layout: t["start_seconds"] + new_tokens * t["seconds_per_token"]
                  for layout, t in measured.items()}
        best = min(totals, key=lambda layout: (totals[layout], layout != UNROLLED))
        return best, (f"measured here: {new_tokens} tokens take ~{totals[SCANNED]:.1f} s "
                      f"scanned, ~{totals[UNROLLED]:.1f} s unrolled")
    if len(measured) == 1:
        other = UNROLLED if SCANNED in measured else SCANNED
        return other, f"measuring it (only {next(iter(measured))} was measured here)"
    layout = SCANNED if new_tokens <= SCANNED_UP_TO_TOKENS else UNROLLED
    return layout, (f"nothing measured here yet: scanned up to {SCANNED_UP_TO_TOKENS} new "
                    "tokens")


def auto_layout(args) -> tuple[str, str]:
    return choose_layout(measured_layouts(args), args.max_new_tokens)


def record_timing(args, scanned: bool, start_seconds: float, seconds_per_token: float,
                  path: Path | None = None) -> None:
    """Remember one run's timings for `--layers auto` (a cache: a write that fails is
    skipped; the file is replaced whole, so a concurrent reader never sees half of it)."""
    if not (start_seconds >= 0 and seconds_per_token > 0):
        return
    path = timings_path() if path is None else path
    if path is None:
        return
    entries = read_timings(path)
    key = _entry_key(args)
    entry = entries.get(key) if isinstance(entries.get(key), dict) else {}
    layout = SCANNED if scanned else UNROLLED
    previous = entry.get(layout)
    start = (min(start_seconds, previous["start_seconds"]) if _valid(previous)
             else start_seconds)
    runs = int(previous.get("runs", 1)) + 1 if _valid(previous) else 1
    entry[layout] = {"start_seconds": start, "seconds_per_token": seconds_per_token,
                     "runs": runs}
    entries[key] = entry
    from specjax.runtime.files import write_json_atomically

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomically(path, {"format": FORMAT_VERSION, "entries": entries})
    except OSError:
        return
