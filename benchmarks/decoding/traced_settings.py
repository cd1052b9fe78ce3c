"""Sampling settings as traced data against settings compiled in as constants, and what
the persistent compilation cache saves a second process.

1. Decode step time. For each model (the bundled pair; SmolLM2-135M with a 2-layer
   self-draft), decoder (plain `generate`; a draft-model chain, K = 3), setting (greedy;
   t = 0.7 / top-p 0.9) and batch (1, 8): the decode loop compiled the way the library
   runs it now (settings are `SamplingParams` arguments; top-k and top-p behind a
   `lax.cond`) and the way it ran before (settings folded into the program as
   constants, one compile per setting), in one process, alternating, median of `--reps`.
   Greedy is the same trace-time fast path in both (a control for noise).
2. Compile time: the first call's wall time minus a later call's, per mode.
3. The persistent cache: `specjax generate --model smollm2` (and the bundled model) in a
   new process with an empty cache folder, then again; the CLI's own `compile_seconds`.

    python -m benchmarks.decoding.traced_settings [--new-tokens 32] [--reps 5] [--skip-cli]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

import specjax
import specjax_models
from benchmarks.common import machine_record, median, write_results
from specjax.decoding.autoregressive import _decode_loop, _init_state, decode_step
from specjax.decoding.sampling import sampling_params
from specjax.decoding.speculative_loop import _speculative_loop, init_speculative_state
from specjax.decoding.step import compile_key, speculative_step
from specjax.runtime.timing import wall_seconds

NAME = "traced_settings_cpu"
SETTINGS = {"greedy": specjax.GREEDY,
            "t=0.7 top-p 0.9": specjax.SamplingConfig(temperature=0.7, top_p=0.9)}
NUM_DRAFT = 3


@functools.partial(jax.jit, static_argnames=("sampling",), donate_argnames=("state",))
def _static_decode_loop(lm, state, max_new_tokens, eos_ids, *, sampling):
    """The plain decode loop as it was compiled before: `sampling` a static
    `SamplingConfig`, its values constants of the program."""
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done),
                              lambda s: decode_step(lm, s, max_new_tokens, eos_ids, sampling),
                              state)


@functools.partial(jax.jit, static_argnames=("config",), donate_argnames=("state",))
def _static_speculative_loop(target, drafter, state, config):
    """The speculative loop as it was compiled before (`speculative_step` without
    `sampling=` folds `config.sampling` into the program)."""
    return jax.lax.while_loop(lambda s: ~jnp.all(s.done),
                              lambda s: speculative_step(target, drafter, s, config), state)


def _models(skip_smollm2: bool) -> dict:
    out = {}
    tok = specjax_models.ByteTokenizer()
    prompt = next(p for p in specjax_models.bundled_prompts() if p["kind"] == "continue")
    out["bundled pair"] = (specjax_models.load_bundled("target"),
                           specjax_models.load_bundled("draft"), tok.encode(prompt["text"]))
    if not skip_smollm2:
        try:
            path = specjax_models.smollm2_path()
        except FileNotFoundError as error:
            print(f"skipping SmolLM2: {error}")
            return out
        target = specjax_models.from_gguf(path)
        ids = specjax_models.gguf_tokenizer(path).apply_chat_template(
            [{"role": "user", "content": "Explain in two sentences why the sky is blue."}])
        out["SmolLM2-135M, 2-layer self-draft"] = (
            target, specjax_models.first_layers(target, 2), ids)
    return out


def _runner(decoder: str, mode: str, target, draft, ids, batch: int, sampling, new_tokens: int):
    """A function that builds a fresh state (untimed) and returns `(run, steps)`: `run()`
    runs the compiled decode loop of that mode."""
    prompts = [list(ids)] * batch
    key = jax.random.key(0)
    eos = jnp.full((1,), -1, jnp.int32)
    if decoder == "plain":
        from specjax.decoding.inputs import prepare_batch, running_rows

        packed, capacity, _ = prepare_batch(target, prompts, None, new_tokens, sampling, None)
        params = sampling_params(sampling, batch)

        def prepare():
            state = _init_state(target, jnp.asarray(packed.tokens), jnp.asarray(packed.lengths),
                                key, jnp.int32(0), running_rows(packed), capacity=capacity)
            jax.block_until_ready(state)
            if mode == "traced":
                run = lambda: _decode_loop(target, state, jnp.int32(new_tokens), eos, params)
            else:
                run = lambda: _static_decode_loop(target, state, jnp.int32(new_tokens), eos,
                                                  sampling=sampling)
            return run, lambda out: new_tokens
        return prepare
    config = specjax.SpeculativeConfig(num_draft_tokens=NUM_DRAFT, sampling=sampling)
    params = sampling_params(sampling, batch)

    def prepare():
        state, drafter = init_speculative_state(target, draft, prompts,
                                                max_new_tokens=new_tokens,
                                                num_draft_tokens=NUM_DRAFT, sampling=sampling,
                                                key=key)
        jax.block_until_ready(state)
        if mode == "traced":
            run = lambda: _speculative_loop(target, drafter, state, compile_key(config, params),
                                            params, drafter_type=type(drafter))
        else:
            run = lambda: _static_speculative_loop(target, drafter, state, config)
        return run, lambda out: int(out.num_steps)
    return prepare


def step_times(models: dict, new_tokens: int, reps: int) -> list[dict]:
    rows = []
    for model_name, (target, draft, ids) in models.items():
        for decoder in ("plain", "chain K=3"):
            for setting, sampling in SETTINGS.items():
                for batch in (1, 8):
                    prepares = {mode: _runner(decoder, mode, target, draft, ids, batch,
                                              sampling, new_tokens)
                                for mode in ("traced", "static")}
                    first, times, steps = {}, {m: [] for m in prepares}, {}
                    for mode, prepare in prepares.items():
                        run, count = prepare()
                        out, first[mode] = wall_seconds(run)
                        steps[mode] = count(out)
                    for _ in range(reps):  # alternate the modes
                        for mode, prepare in prepares.items():
                            run, count = prepare()
                            out, seconds = wall_seconds(run)
                            times[mode].append(seconds / max(count(out), 1))
                    row = {"model": model_name, "decoder": decoder, "setting": setting,
                           "batch": batch, "steps": steps}
                    for mode in prepares:
                        step = median(times[mode])
                        row[f"{mode}_step_ms"] = 1e3 * step
                        row[f"{mode}_compile_s"] = first[mode] - step * steps[mode]
                    row["traced_over_static"] = row["traced_step_ms"] / row["static_step_ms"]
                    rows.append(row)
                    print(f"{model_name}, {decoder}, {setting}, batch {batch}: traced "
                          f"{row['traced_step_ms']:.2f} ms/step, static "
                          f"{row['static_step_ms']:.2f} ({row['traced_over_static']:.3f}x); "
                          f"compile {row['traced_compile_s']:.1f} / "
                          f"{row['static_compile_s']:.1f} s", flush=True)
    return rows


def cli_cache_runs(skip_smollm2: bool) -> list[dict]:
    """Two `specjax generate` processes sharing one empty cache folder: the CLI's own
    compile_seconds, first and second."""
    rows = []
    commands = {"bundled pair, draft model K=4": ["generate", "def parse(source):\n    ", "--json",
                                      "--max-new-tokens", "32"]}
    if not skip_smollm2:
        commands["SmolLM2, prompt lookup (its default)"] = [
            "generate", "Why is the sky blue?", "--model", "smollm2", "--json",
            "--max-new-tokens", "32"]
    for name, args in commands.items():
        with tempfile.TemporaryDirectory() as folder:
            env = dict(os.environ, SPECJAX_COMPILATION_CACHE=folder)
            runs = []
            for _ in range(2):
                done = subprocess.run([sys.executable, "-m", "specjax.cli", *args],
                                      capture_output=True, text=True, env=env, timeout=900)
                if done.returncode != 0:
                    raise RuntimeError(f"specjax {' '.join(args)} failed: {done.stderr}")
                runs.append(json.loads(done.stdout))
            entries = sum(1 for _ in os.scandir(folder))
        first, second = (r["compile_seconds"] for r in runs)
        rows.append({"command": name, "first_compile_s": first, "second_compile_s": second,
                     "ratio": second / first, "cache_entries": entries,
                     "same_tokens": runs[0]["tokens"] == runs[1]["tokens"]})
        print(f"{name}: compile {first:.1f} s, then {second:.1f} s ({second / first:.0%}); "
              f"{entries} cache entries", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--skip-cli", action="store_true")
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--name", default=NAME)
    args = parser.parse_args()
    rows = step_times(_models(args.skip_smollm2), args.new_tokens, args.reps)
    cli_rows = [] if args.skip_cli else cli_cache_runs(args.skip_smollm2)
    machine = machine_record()
    lines = ["# Sampling settings as data: step time, compile time, persistent cache", "",
             f"`{machine['command']}` on {machine['cpu_model']} ({machine['cpu_count']} "
             f"cores), jax {machine['jax']}. Decode phase: the compiled loop after prefill, "
             f"{args.new_tokens} new tokens, ms per loop step (a speculative step verifies "
             f"K+1 = {NUM_DRAFT + 1} tokens), median of {args.reps} alternating runs. "
             "traced = settings as `SamplingParams` arguments (the library now; one compile "
             "for every setting); static = settings folded in as constants (before: one "
             "compile per setting). Greedy is the same fast path in both: its ratio is the "
             "noise.", "",
             "| model | decoder | setting | batch | traced ms/step | static ms/step | "
             "traced / static | compile traced / static (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['decoder']} | {r['setting']} | {r['batch']} | "
                     f"{r['traced_step_ms']:.2f} | {r['static_step_ms']:.2f} | "
                     f"{r['traced_over_static']:.3f} | {r['traced_compile_s']:.1f} / "
                     f"{r['static_compile_s']:.1f} |")
    sampled = [r["traced_over_static"] for r in rows if r["setting"] != "greedy"]
    greedy = [r["traced_over_static"] for r in rows if r["setting"] == "greedy"]
    if sampled:
        lines += ["", f"Sampled rows: traced / static median {np.median(sampled):.3f} "
                  f"(range {min(sampled):.3f}-{max(sampled):.3f}); greedy control: median "
                  f"{np.median(greedy):.3f} (range {min(greedy):.3f}-{max(greedy):.3f})."]
    if cli_rows:
        lines += ["", "## Persistent compilation cache: a second process", "",
                  "Two `specjax generate ... --json` processes, one empty cache folder "
                  "(`SPECJAX_COMPILATION_CACHE`); `compile_seconds` as the CLI reports it.", "",
                  "| command | first compile (s) | second compile (s) | second / first | "
                  "cache entries | same tokens |", "|---|---|---|---|---|---|"]
        for r in cli_rows:
            lines.append(f"| {r['command']} | {r['first_compile_s']:.2f} | "
                         f"{r['second_compile_s']:.2f} | {r['ratio']:.0%} | "
                         f"{r['cache_entries']} | {r['same_tokens']} |")
    write_results(args.name, {"benchmark": "traced_settings", "machine": machine,
                              "args": vars(args), "rows": rows, "cli_cache": cli_rows},
                  "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
