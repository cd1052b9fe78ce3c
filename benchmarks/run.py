"""The benchmark suite: every drafter against plain decoding and against transformers.

    python -m benchmarks.run --quick     # under 5 minutes on 2 CPU cores
    python -m benchmarks.run --full      # the whole grid (--resume continues a cut run)

Writes `benchmarks/results/suite_<mode>_<backend>.{json,md}` and PNG plots (speedup and
tokens per target forward against K; acceptance per position). For every configuration
(workload, drafter, sampling, batch, K): tokens/s of speculative and of plain decoding
measured in the same run (alternating repetitions, median, compile excluded and reported
apart), the speedup, acceptance alpha (accepted / proposed) and beta (accepted / checked),
tau (tokens per target forward) and target forwards per token, the cost ratio c of a
draft step to a target step and v of a (K+1)-token verify to a 1-token forward, the ideal
speedup batch_tau / (K c + v) (batch_tau: tokens per row per batched step, tau at batch 1),
the efficiency (decode-phase speedup / ideal), the time to the first token, and peak
memory. Plus: transformers' plain, assisted and prompt-lookup `generate` on the same
exported weights and prompts (greedy, batch 1: transformers' assisted generation takes one
row), with a token-identity check;
and a roofline line for plain decoding (bytes a decode step must read / measured memory
bandwidth, against the measured step).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import specjax
import specjax_models
from benchmarks.common import RESULTS, block, machine_record, median, timed, write_results
from benchmarks.speculative_vs_ar import forward_seconds, step_cost_table
from specjax.inputs import plan_capacity


@dataclasses.dataclass(frozen=True)
class Grid:
    batches: tuple
    ks: tuple
    reps: int
    new_tokens: int
    prompts: int
    large_vocab_ks: tuple
    peer_prompts: int


QUICK = Grid(batches=(1, 4), ks=(2, 4, 8), reps=5, new_tokens=64, prompts=4,
             large_vocab_ks=(4,), peer_prompts=1)
FULL = Grid(batches=(1, 4, 16), ks=tuple(range(1, 9)), reps=7, new_tokens=128, prompts=16,
            large_vocab_ks=(2, 4, 6), peer_prompts=3)
MODES = {"greedy": specjax.GREEDY, "t=1": specjax.SamplingConfig(temperature=1.0)}


def peak_memory_bytes() -> tuple[str, int]:
    """Device peak where the backend reports it, else this process's peak RSS."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return "device_peak", int(stats["peak_bytes_in_use"])
    return "process_peak_rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(target, drafter, prompts, sampling, k, grid, step_costs) -> dict:
    """One configuration: speculative vs plain, same prompts, same key.

    Each repetition times, alternating, plain and speculative decoding of `new_tokens`
    tokens and of 1 token (prefill plus one step, the time to first token). The decode
    phase is their difference; its speedup is what tau / (K c + v) predicts, while the
    end-to-end speedup also pays the prefill, the same for both decoders but the draft's.
    Both calls share one compiled function (`max_new_tokens` is traced, the cache pinned).
    """
    key = jax.random.key(0)
    lengths = np.array([len(p) for p in prompts])
    slots = plan_capacity(lengths, grid.new_tokens, target.max_seq_len,
                                          extra_slots=k + 1)

    def spec(new_tokens):
        return specjax.speculative_generate(target, drafter, prompts, max_new_tokens=new_tokens,
                                            num_draft_tokens=k, sampling=sampling, key=key,
                                            cache_size=slots)

    def plain(new_tokens):
        return specjax.generate(target, prompts, max_new_tokens=new_tokens, sampling=sampling,
                                key=key, cache_size=slots)

    start = time.perf_counter()
    out = spec(grid.new_tokens)
    block(out.tokens)
    spec_compile = time.perf_counter() - start
    start = time.perf_counter()
    plain_out = plain(grid.new_tokens)
    block(plain_out.tokens)
    plain_compile = time.perf_counter() - start
    first = spec(1)  # deterministic: the same first step as the full run's
    block(first.tokens), block(plain(1).tokens)
    # Tokens that the full run's first speculative step produced (its accepted drafts plus
    # one per row, before the 1-token run cut them): the decode phase (full minus first
    # call) makes the rest. Plain decoding's first step makes one token per row.
    first_step_tokens = int(np.minimum(np.asarray(first.stats.accepted) + 1,
                                       grid.new_tokens).sum())
    spec_t, plain_t, spec_first, plain_first = [], [], [], []
    for _ in range(grid.reps):
        plain_t.append(timed(lambda: block(plain(grid.new_tokens).tokens)))
        spec_t.append(timed(lambda: block(spec(grid.new_tokens).tokens)))
        plain_first.append(timed(lambda: block(plain(1).tokens)))
        spec_first.append(timed(lambda: block(spec(1).tokens)))
    s = out.stats
    tokens = int(np.asarray(out.lengths).sum())
    plain_tokens = int(np.asarray(plain_out.lengths).sum())
    speedup = (tokens / median(spec_t)) / (plain_tokens / median(plain_t))
    rows = len(prompts)
    spec_decode = median(spec_t) - median(spec_first)
    plain_decode = median(plain_t) - median(plain_first)
    spec_decode_rate = (tokens - first_step_tokens) / spec_decode
    plain_decode_rate = (plain_tokens - rows) / plain_decode
    decode_speedup = spec_decode_rate / plain_decode_rate
    c = step_costs["draft"] / step_costs["target"] if step_costs.get("draft") else 0.0
    v = step_costs[k + 1] / step_costs["target"]
    # A batch steps until its slowest row is done: per row, the batch advances
    # tokens / (rows x steps) per target forward, less than the rows' mean tau. The ideal
    # uses what the batch achieved, so efficiency measures the machine, not the stragglers.
    batch_tau = tokens / (rows * max(s.num_steps, 1))
    ideal = batch_tau / (k * c + v)
    memory_kind, memory = peak_memory_bytes()
    return {"k": k, "batch": rows, "tokens": tokens, "cache_slots": slots,
            "spec_tokens_per_s": tokens / median(spec_t),
            "plain_tokens_per_s": plain_tokens / median(plain_t), "speedup": speedup,
            "spec_first_token_s": median(spec_first),
            "plain_first_token_s": median(plain_first),
            "spec_decode_tokens_per_s": spec_decode_rate,
            "plain_decode_tokens_per_s": plain_decode_rate,
            "decode_speedup": decode_speedup,
            "acceptance_rate": s.acceptance_rate, "position_acceptance_rate":
            s.position_acceptance_rate, "mean_accepted_length": s.mean_accepted_length,
            "target_forwards_per_token": float(s.target_forwards.sum() / max(tokens, 1)),
            "accepted_per_position": s.accepted_per_position.tolist(),
            "num_steps": s.num_steps, "batch_tokens_per_step": batch_tau,
            "cost_ratio_c": c, "verify_cost_ratio_v": v, "ideal_speedup": ideal,
            "efficiency": decode_speedup / ideal, "spec_compile_s": spec_compile,
            "plain_compile_s": plain_compile, "spec_times_s": spec_t, "plain_times_s": plain_t,
            "spec_first_token_times_s": spec_first, "plain_first_token_times_s": plain_first,
            "greedy_identical_to_plain": bool(np.array_equal(out.tokens, plain_out.tokens))
            if sampling.greedy else None, memory_kind: memory}


def config_key(row) -> tuple:
    return (row["workload"], row["drafter"], row["mode"], row["batch"], row["k"])


# Where the bundled workloads decode: ~300-token held-out prompts in 512-slot caches.
BUNDLED_COSTS_AT = {"cache_slots": 512, "position": 320}


def bundled_workloads(grid):
    tok = specjax_models.ByteTokenizer()
    prompts = specjax_models.bundled_prompts()
    plain = [tok.encode(p["text"]) for p in prompts if p["kind"] == "continue"]
    copy = [tok.encode(p["text"]) for p in prompts if p["kind"] == "copy"]
    return {"held-out code": plain, "copy task": copy}


def large_vocab_pair():
    """Random Llama shapes with a 32k vocabulary; the draft is the target's first layer."""
    config = specjax_models.TransformerConfig(vocab_size=32_000, num_layers=4, d_model=512,
                                      num_heads=8, num_kv_heads=4, d_ff=1408, max_seq_len=1024)
    model = specjax_models.Transformer(config, rngs=nnx.Rngs(0))
    target = specjax.CausalLM.from_nnx(model)
    draft = specjax.CausalLM.from_nnx(specjax_models.first_layers(model, 1))
    return target, draft, config


def roofline(target, config_bytes_per_token: int, reps: int) -> dict:
    """Plain decode step time vs (weights + KV cache read) / measured copy bandwidth."""
    src = np.ones(64 * 1024 * 1024 // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    seconds = median([timed(lambda: np.copyto(dst, src)) for _ in range(5)])
    bandwidth = 2 * src.nbytes / seconds  # read + write
    device = jax.devices()[0]
    on_device = jnp.ones(src.shape, jnp.float32)
    copy = jax.jit(lambda x: x * 1.0)
    block(copy(on_device))
    device_seconds = median([timed(lambda: block(copy(on_device))) for _ in range(5)])
    device_bandwidth = 2 * src.nbytes / device_seconds
    step = forward_seconds(target, 1, 1, reps, **BUNDLED_COSTS_AT)
    # On a CPU the weights live in host memory: the better of the two copies is the bound.
    best = device_bandwidth if jax.default_backend() != "cpu" else max(bandwidth,
                                                                       device_bandwidth)
    return {"bytes_per_step": config_bytes_per_token, "host_copy_bandwidth_bytes_s": bandwidth,
            "device_copy_bandwidth_bytes_s": device_bandwidth, "device": str(device),
            "bandwidth_bytes_s": best, "measured_step_s": step,
            "roofline_step_s": config_bytes_per_token / best,
            "fraction_of_roofline": (config_bytes_per_token / best) / step}


def peers(target, draft, prompts, grid) -> list[dict]:
    """transformers plain / assisted / prompt lookup vs ours, greedy, batch 1."""
    import torch

    from benchmarks.hf_reference import to_transformers

    hf_target, hf_draft = to_transformers(target), to_transformers(draft)
    n = grid.new_tokens
    rows = []
    for i, ids in enumerate(prompts[: grid.peer_prompts]):
        inputs = torch.tensor([ids])

        def hf(inputs=inputs, ids=ids, **extra):
            with torch.no_grad():
                out = hf_target.generate(inputs, attention_mask=torch.ones_like(inputs),
                                         max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                         pad_token_id=specjax_models.ByteTokenizer.pad_id,
                                         eos_token_id=None, **extra)
            return out[0, len(ids):].tolist()

        calls = {
            "transformers plain": lambda: hf(),
            "transformers assisted (draft model)": lambda: hf(assistant_model=hf_draft),
            "transformers prompt lookup": lambda: hf(prompt_lookup_num_tokens=4),
            "specjax plain": lambda ids=ids: np.asarray(block(specjax.generate(
                target, [ids], max_new_tokens=n, sampling=specjax.GREEDY).tokens))[0].tolist(),
            "specjax draft model K=8": lambda ids=ids: np.asarray(block(
                specjax.speculative_generate(
                    target, draft, [ids], max_new_tokens=n, num_draft_tokens=8,
                    sampling=specjax.GREEDY).tokens))[0].tolist(),
            "specjax prompt lookup K=4": lambda ids=ids: np.asarray(block(
                specjax.speculative_generate(
                    target, specjax.PromptLookup(), [ids], max_new_tokens=n,
                    num_draft_tokens=4, sampling=specjax.GREEDY).tokens))[0].tolist(),
        }
        outputs = {name: call() for name, call in calls.items()}  # warm-up and compile
        reference = outputs["transformers plain"]
        for name, call in calls.items():
            seconds = median([timed(call) for _ in range(max(3, grid.reps // 2))])
            rows.append({"prompt": i, "decoder": name, "tokens_per_s": n / seconds,
                         "identical_to_transformers_plain": outputs[name] == reference})
    return rows


def plot(rows, path_prefix) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    groups = {}
    for r in rows:
        groups.setdefault((r["workload"], r["drafter"], r["mode"], r["batch"]), []).append(r)
    for (workload, drafter, mode, batch), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["k"])
        label = f"{drafter}, {mode}, B={batch} ({workload})"
        axes[0].plot([r["k"] for r in rs], [r["decode_speedup"] for r in rs], "o-", label=label)
        axes[1].plot([r["k"] for r in rs], [r["mean_accepted_length"] for r in rs], "o-",
                     label=label)
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set(xlabel="K", ylabel="decode-phase speedup over plain decoding")
    axes[1].set(xlabel="K", ylabel="tokens per target forward")
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(f"{path_prefix}_speedup_tau.png", dpi=110)
    written.append(f"{path_prefix}_speedup_tau.png")
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for (workload, drafter, mode, batch), rs in sorted(groups.items()):
        if batch != 1:
            continue
        longest = max(rs, key=lambda r: r["k"])
        positions = longest["accepted_per_position"]
        ax.plot(range(1, len(positions) + 1), positions, "o-",
                label=f"{drafter}, {mode} ({workload})")
    ax.set(xlabel="draft position", ylabel="fraction of steps accepting it",
           title="Acceptance per position (batch 1, largest K)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(f"{path_prefix}_acceptance_per_position.png", dpi=110)
    written.append(f"{path_prefix}_acceptance_per_position.png")
    plt.close(fig)
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the default: under 5 minutes")
    mode.add_argument("--full", action="store_true")
    parser.add_argument("--no-peers", action="store_true", help="skip transformers")
    parser.add_argument("--resume", action="store_true",
                        help="keep the configurations an interrupted run of this mode finished")
    args = parser.parse_args()
    grid = FULL if args.full else QUICK
    mode_name = "full" if args.full else "quick"
    started = time.perf_counter()
    name = f"suite_{mode_name}_{jax.default_backend()}"
    # Every finished configuration is appended here, so a long (--full) run that is
    # interrupted continues with --resume; the file is removed once the report is written.
    progress = RESULTS / f".{name}.partial.jsonl"
    done = {}
    if args.resume and progress.exists():
        for line in progress.read_text().splitlines():
            row = json.loads(line)
            done[config_key(row)] = row
        print(f"resuming: {len(done)} configurations already measured", flush=True)
    else:
        RESULTS.mkdir(parents=True, exist_ok=True)
        progress.write_text("")
    target, draft = specjax_models.load_bundled("target"), specjax_models.load_bundled("draft")
    workloads = bundled_workloads(grid)
    drafters = {"draft model": (draft, draft), "prompt lookup": (specjax.PromptLookup(), None)}
    rows = []

    def record(row):
        rows.append(row)
        with progress.open("a") as file:
            file.write(json.dumps(row) + "\n")

    for batch in grid.batches:
        costs = None  # measured on first need: a resumed batch may need none
        for workload, all_prompts in workloads.items():
            prompts = (all_prompts * batch)[:batch] if batch > len(all_prompts) \
                else all_prompts[:batch]
            for drafter_name, (drafter, _) in drafters.items():
                if workload == "copy task" and batch > 1 and grid is QUICK:
                    continue  # keep the quick grid under 5 minutes
                for mode_label, sampling in MODES.items():
                    for k in grid.ks:
                        key = (workload, drafter_name, mode_label, batch, k)
                        if key in done:
                            rows.append(done[key])
                            continue
                        if costs is None:
                            costs = {name: step_cost_table(target, cost_draft, batch, grid.ks,
                                                           grid.reps, **BUNDLED_COSTS_AT)
                                     for name, (_, cost_draft) in drafters.items()}
                        row = measure(target, drafter, prompts, sampling, k, grid,
                                      costs[drafter_name])
                        row.update(workload=workload, drafter=drafter_name, mode=mode_label)
                        record(row)
                        print(f"{workload:13s} {drafter_name:13s} {mode_label:6s} B={batch:<2d} "
                              f"K={k}: {row['speedup']:.2f}x, decode {row['decode_speedup']:.2f}x "
                              f"(ideal {row['ideal_speedup']:.2f}, "
                              f"eff {row['efficiency']:.2f}), tau "
                              f"{row['mean_accepted_length']:.2f}", flush=True)

    big_target, big_draft, big_config = large_vocab_pair()
    big_costs = None
    big_prompts = [np.random.default_rng(0).integers(0, 32_000, 32).tolist()]
    for mode_label, sampling in MODES.items():
        for k in grid.large_vocab_ks:
            key = ("random 32k-vocab pair", "first layer", mode_label, 1, k)
            if key in done:
                rows.append(done[key])
                continue
            if big_costs is None:
                big_costs = step_cost_table(big_target, big_draft, 1, grid.large_vocab_ks,
                                            grid.reps)
            row = measure(big_target, big_draft, big_prompts, sampling, k, grid, big_costs)
            row.update(workload="random 32k-vocab pair", drafter="first layer", mode=mode_label)
            record(row)
            print(f"32k vocab {mode_label} K={k}: {row['speedup']:.2f}x, decode "
                  f"{row['decode_speedup']:.2f}x, v "
                  f"{row['verify_cost_ratio_v']:.2f}", flush=True)

    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(target.params))
    target_config = specjax_models.TARGET_CONFIG
    cache_bytes = 2 * target_config.num_layers * 512 * target_config.num_kv_heads \
        * target_config.resolved_head_dim * 4
    line = roofline(target, weights + cache_bytes, grid.reps)
    peer_rows = [] if args.no_peers else peers(target, draft, workloads["held-out code"], grid)
    elapsed = time.perf_counter() - started

    backend = jax.default_backend()
    pngs = plot([r for r in rows if r["workload"] != "random 32k-vocab pair"],
                str(RESULTS / name))
    machine = machine_record()
    lines = [f"# Benchmark suite ({mode_name}, {backend})", "",
             f"Command: `{machine['command']}` ({elapsed:.0f} s"
             + (f"; {len(done)} configurations from the interrupted run" if done else "")
             + "). Machine: "
             f"{machine['processor']}, {machine['cpu_count']} CPUs, devices "
             f"{machine['devices']}, jax {machine['jax']}. Seed 0. Bundled pair (4.9M target, "
             "0.46M distilled draft) on held-out prompts; medians of "
             f"{grid.reps} alternating repetitions; {grid.new_tokens} new tokens per row; "
             "compile excluded (JSON: `spec_compile_s`, `plain_compile_s`).", "",
             "Columns: tokens/s and `speedup` end to end (prefill included); `1st token` = "
             "the time to the first token, spec / plain (prefill + one step); `decode` = "
             "the speedup of the decode phase (end to end minus first token), the figure "
             "that the ideal predicts and that the efficiency compares with. tau = tokens per "
             "target forward of a row while it runs; `batch tau` = tokens per row per "
             "batched step (a batch runs until its slowest row is done), which the ideal "
             "`batch tau / (K c + v)` uses; the two are equal at batch 1.",
             "",
             "| workload | drafter | mode | B | K | spec tok/s | plain tok/s | speedup | decode "
             "| 1st token ms | alpha | beta | tau | batch tau | fwd/token | c | v | ideal | eff. |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['drafter']} | {r['mode']} | {r['batch']} | {r['k']} | "
            f"{r['spec_tokens_per_s']:.0f} | {r['plain_tokens_per_s']:.0f} | "
            f"{r['speedup']:.2f} | {r['decode_speedup']:.2f} | "
            f"{r['spec_first_token_s'] * 1e3:.0f} / {r['plain_first_token_s'] * 1e3:.0f} | "
            f"{r['acceptance_rate']:.3f} | "
            f"{r['position_acceptance_rate']:.3f} | {r['mean_accepted_length']:.2f} | "
            f"{r['batch_tokens_per_step']:.2f} | "
            f"{r['target_forwards_per_token']:.3f} | {r['cost_ratio_c']:.3f} | "
            f"{r['verify_cost_ratio_v']:.2f} | {r['ideal_speedup']:.2f} | "
            f"{r['efficiency']:.2f} |")
    b1 = [r for r in rows if r["workload"] == "held-out code" and r["drafter"] == "draft model"
          and r["mode"] == "greedy" and r["batch"] == 1]
    best = max(b1, key=lambda r: r["decode_speedup"])
    best_total = max(b1, key=lambda r: r["speedup"])
    lines += ["", "## Goals", "",
              f"- Bundled pair, greedy, batch 1: best decode-phase speedup "
              f"{best['decode_speedup']:.2f}x at K={best['k']} (goal >= 2x: "
              f"{'met' if best['decode_speedup'] >= 2 else 'NOT met'}); end to end, prefill "
              f"included, {best_total['speedup']:.2f}x at K={best_total['k']}; efficiency "
              f"{best['efficiency']:.2f} (goal >= 0.8: "
              f"{'met' if best['efficiency'] >= 0.8 else 'NOT met'}).",
              f"- Verify cost on this backend: v = {best['verify_cost_ratio_v']:.2f} for "
              f"K+1 = {best['k'] + 1} tokens; the ideal speedup tau / (K c + v) is "
              f"{best['ideal_speedup']:.2f}x, so v, not acceptance, is what limits a CPU."]
    big_batch = [r for r in rows if r["batch"] == max(grid.batches)
                 and r["drafter"] == "draft model" and r["mode"] == "greedy"]
    if big_batch:
        top = max(big_batch, key=lambda r: r["decode_speedup"])
        verdict = ("speculation still helps" if top["decode_speedup"] > 1 else
                   "speculation does not help here")
        lines.append(
            f"- Batch {top['batch']}: best decode speedup {top['decode_speedup']:.2f}x "
            f"(K={top['k']}, {top['speedup']:.2f}x end to end): {verdict}. Why: the ideal "
            f"there is {top['ideal_speedup']:.2f}x, from v = {top['verify_cost_ratio_v']:.2f} "
            f"(a batch of {top['batch']} x {top['k'] + 1} verify rows costs more next to a "
            f"{top['batch']}-row step) and a batch tau of {top['batch_tokens_per_step']:.2f} "
            f"against a per-row tau of {top['mean_accepted_length']:.2f} (the batch steps "
            "until its slowest row is done).")
    if peer_rows:
        lines += ["", "## transformers on the same weights (greedy, batch 1)", "",
                  "| prompt | decoder | tok/s | identical to transformers plain |",
                  "|---|---|---|---|"]
        for r in peer_rows:
            lines.append(f"| {r['prompt']} | {r['decoder']} | {r['tokens_per_s']:.0f} | "
                         f"{r['identical_to_transformers_plain']} |")
        by = {}
        for r in peer_rows:
            by.setdefault(r["decoder"], []).append(r["tokens_per_s"])
        ratio = np.mean(by["specjax draft model K=8"]) / np.mean(
            by["transformers assisted (draft model)"])
        lines.append(f"\nspecjax draft-model decoding / transformers assisted generation: "
                     f"{ratio:.2f}x tokens/s (goal >= 2x: {'met' if ratio >= 2 else 'NOT met'}).")
    floor, step = line["roofline_step_s"], line["measured_step_s"]
    memory_kind, memory = peak_memory_bytes()
    lines += ["", "## Roofline of plain decoding (batch 1)", "",
              f"A decode step reads {line['bytes_per_step'] / 1e6:.1f} MB (weights + a "
              f"512-slot cache); measured copy bandwidth "
              f"{line['device_copy_bandwidth_bytes_s'] / 1e9:.1f} GB/s (jax) / "
              f"{line['host_copy_bandwidth_bytes_s'] / 1e9:.1f} GB/s (numpy); "
              f"{line['bandwidth_bytes_s'] / 1e9:.1f} GB/s gives a "
              f"{floor * 1e3:.2f} ms floor; the measured step is {step * 1e3:.2f} ms "
              f"(the step runs at {floor / step:.0%} of the bandwidth roofline)."
              + (" The step beats the DRAM floor: this model's weights fit in the CPU's "
                 "caches, so decoding here is bound by compute and dispatch, not by memory "
                 "bandwidth — one reason a multi-token verify is not free on this machine."
                 if floor > step else ""), "",
              f"Peak memory ({memory_kind}): {memory / 1e9:.2f} GB.", "",
              "Plots: " + ", ".join(f"`{p.split('/')[-1]}`" for p in pngs), ""]
    write_results(name, {"benchmark": "suite", "mode": mode_name, "grid": dataclasses.asdict(
        grid), "seed": 0, "machine": machine, "elapsed_s": elapsed,
        "resumed_configurations": len(done), "rows": rows, "roofline": line,
        "peers": peer_rows}, "\n".join(lines))
    progress.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
