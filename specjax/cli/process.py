"""What the one-shot decoding commands (`generate`, `chat`, `demo`) do to their own process
to start and to end quickly.

- Python's cyclic garbage collector is paused until the first decode step has run:
  tracing a decoder allocates hundreds of thousands of small objects, and every
  collection walks all of them (measured on 2 cores: 10% of a warm `specjax generate`).
  Then the survivors (modules, jaxprs, compiled programs) are frozen out of later
  collections and collection resumes, so a long chat collects as usual.
- After the command the process exits without tearing the interpreter down: freeing
  jax's executables and half a gigabyte of weights object by object took 0.6 s of a
  3-second answer. Output is flushed and every non-daemon thread (the model cache's
  background writer) is joined first; nothing else of the commands' work runs at exit.

`main()` (what tests and notebooks call) does neither; only the `specjax` script does.
"""

from __future__ import annotations

import gc
import os
import sys
import threading

# The commands whose process `run()` starts and ends this way.
QUICK_COMMANDS = ("generate", "chat", "demo")

_paused = False


def pause_garbage_collection() -> None:
    """Stop cyclic collection until `resume_garbage_collection()` (no-op when it is
    already off)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_garbage_collection() -> None:
    """Freeze what survived the start (it lives as long as the process) and collect
    again; only undoes `pause_garbage_collection()`, never the caller's own settings."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()


def exit_now(code: int) -> None:
    """Flush output, wait for non-daemon threads, then end the process with `code`
    without the interpreter's teardown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or a closed stream
            pass
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    os._exit(code)
