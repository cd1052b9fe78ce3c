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
import functools
import json
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import specjax
import specjax_models
from benchmarks.common import (
    RESULTS,
    block,
    machine_record,
    median,
    sampling_modes,
    timed,
    transformers_greedy,
    write_results,
)
from benchmarks.decoding.speculative_vs_ar import forward_seconds, step_cost_table
from benchmarks.report import ConfigResult, PeerResult, Roofline, SuiteResult, render
from specjax.decoding.inputs import plan_capacity


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
MODES = sampling_modes()


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
            if sampling.greedy else None, "peak_memory_kind": memory_kind,
            "peak_memory_bytes": memory}


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


def roofline(target, config_bytes_per_token: int, reps: int) -> Roofline:
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
    return Roofline(bytes_per_step=config_bytes_per_token,
                    host_copy_bandwidth_bytes_s=bandwidth,
                    device_copy_bandwidth_bytes_s=device_bandwidth, device=str(device),
                    bandwidth_bytes_s=best, measured_step_s=step,
                    roofline_step_s=config_bytes_per_token / best,
                    fraction_of_roofline=(config_bytes_per_token / best) / step)


def peers(target, draft, prompts, grid) -> list[PeerResult]:
    """transformers plain / assisted / prompt lookup vs ours, greedy, batch 1."""
    import torch

    from benchmarks.hf_reference import to_transformers

    hf_target, hf_draft = to_transformers(target), to_transformers(draft)
    n = grid.new_tokens
    rows = []
    for i, ids in enumerate(prompts[: grid.peer_prompts]):
        inputs = torch.tensor([ids])

        def hf(inputs=inputs, **extra):
            return transformers_greedy(hf_target, inputs, n,
                                       specjax_models.ByteTokenizer.pad_id, **extra)[0].tolist()

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
                    target, specjax.PromptLookup(min_ngram_size=1), [ids], max_new_tokens=n,
                    num_draft_tokens=4, sampling=specjax.GREEDY).tokens))[0].tolist(),
        }
        outputs = {name: call() for name, call in calls.items()}  # warm-up and compile
        reference = outputs["transformers plain"]
        for name, call in calls.items():
            seconds = median([timed(call) for _ in range(max(3, grid.reps // 2))])
            rows.append(PeerResult(prompt=i, decoder=name, tokens_per_s=n / seconds,
                                   identical_to_transformers_plain=outputs[name] == reference))
    return rows


def plot(rows, path_prefix) -> list[str]:
    """Two figures, one panel per drafter and sampling mode (lines: workload and batch),
    titled, with legends below the axes so that they cover no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    rows = [dataclasses.asdict(r) for r in rows]
    panels = sorted({(r["drafter"], r["mode"]) for r in rows})
    groups = {}
    for r in rows:
        groups.setdefault((r["drafter"], r["mode"], r["workload"], r["batch"]), []).append(r)
    fig, axes = plt.subplots(2, len(panels), figsize=(4 * len(panels), 7), squeeze=False,
                             sharex=True)
    for column, (drafter, mode) in enumerate(panels):
        top, bottom = axes[0, column], axes[1, column]
        for (d, m, workload, batch), rs in sorted(groups.items()):
            if (d, m) != (drafter, mode):
                continue
            rs = sorted(rs, key=lambda r: r["k"])
            label = f"{workload}, batch {batch}"
            top.plot([r["k"] for r in rs], [r["decode_speedup"] for r in rs], "o-",
                     label=label)
            bottom.plot([r["k"] for r in rs], [r["mean_accepted_length"] for r in rs], "o-",
                        label=label)
        top.axhline(1.0, color="grey", lw=0.8)
        top.set(title=f"{drafter}, {mode}", ylabel="decode-phase speedup (x)")
        bottom.set(xlabel="K (drafts per step)", ylabel="tau (tokens per target forward)")
        bottom.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1)
    fig.suptitle("Speculative vs plain decoding of the bundled target (same run)")
    fig.tight_layout()
    fig.savefig(f"{path_prefix}_speedup_tau.png", dpi=110, bbox_inches="tight")
    written.append(f"{path_prefix}_speedup_tau.png")
    plt.close(fig)
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False,
                             sharey=True)
    for column, (drafter, mode) in enumerate(panels):
        ax = axes[0, column]
        for (d, m, workload, batch), rs in sorted(groups.items()):
            if (d, m) != (drafter, mode) or batch != 1:
                continue
            longest = max(rs, key=lambda r: r["k"])
            positions = longest["accepted_per_position"]
            ax.plot(range(1, len(positions) + 1), positions, "o-",
                    label=f"{workload}, K={longest['k']}")
        ax.set(title=f"{drafter}, {mode}", xlabel="draft position")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    axes[0, 0].set_ylabel("fraction of steps accepting it")
    fig.suptitle("Acceptance per draft position (batch 1, largest K)")
    fig.tight_layout()
    fig.savefig(f"{path_prefix}_acceptance_per_position.png", dpi=110, bbox_inches="tight")
    written.append(f"{path_prefix}_acceptance_per_position.png")
    plt.close(fig)
    return written


def config_result(target, drafter, prompts, sampling, k, grid, costs_fn, *, workload: str,
                  drafter_name: str, mode: str) -> ConfigResult:
    """`measure` as a typed row; the step costs come from `costs_fn()` (measured once)."""
    return ConfigResult(workload=workload, drafter=drafter_name, mode=mode,
                        **measure(target, drafter, prompts, sampling, k, grid, costs_fn()))


def measure_grid(grid, done: dict, record) -> list[ConfigResult]:
    """Every bundled configuration and the 32k-vocabulary pair; `done` holds results of an
    interrupted run (reused), `record` saves each new one as it finishes."""
    target, draft = specjax_models.load_bundled("target"), specjax_models.load_bundled("draft")
    workloads = bundled_workloads(grid)
    # min 1: as the committed results were measured (the default is now 2).
    drafters = {"draft model": (draft, draft),
                "prompt lookup": (specjax.PromptLookup(min_ngram_size=1), None)}
    rows = []

    def run(key, measure_row):
        if key in done:
            rows.append(done[key])
            return
        row = measure_row()
        rows.append(row)
        record(row)
        print(f"{row.workload:13s} {row.drafter:13s} {row.mode:6s} B={row.batch:<2d} "
              f"K={row.k}: {row.speedup:.2f}x, decode {row.decode_speedup:.2f}x (ideal "
              f"{row.ideal_speedup:.2f}, eff {row.efficiency:.2f}), tau "
              f"{row.mean_accepted_length:.2f}", flush=True)

    for batch in grid.batches:
        costs = {}  # measured on first need: a resumed batch may need none

        def cost_table(name, cost_draft, batch=batch, costs=costs):
            if name not in costs:
                costs[name] = step_cost_table(target, cost_draft, batch, grid.ks, grid.reps,
                                              **BUNDLED_COSTS_AT)
            return costs[name]

        for workload, all_prompts in workloads.items():
            prompts = (all_prompts * batch)[:batch]
            if workload == "copy task" and batch > 1 and grid is QUICK:
                continue  # keep the quick grid under 5 minutes
            for drafter_name, (drafter, cost_draft) in drafters.items():
                for mode_label, sampling in MODES.items():
                    for k in grid.ks:
                        run((workload, drafter_name, mode_label, batch, k), functools.partial(
                            config_result, target, drafter, prompts, sampling, k, grid,
                            functools.partial(cost_table, drafter_name, cost_draft),
                            workload=workload, drafter_name=drafter_name, mode=mode_label))

    big_target, big_draft, _ = large_vocab_pair()
    big_costs = {}

    def big_cost_table():
        if not big_costs:
            big_costs.update(step_cost_table(big_target, big_draft, 1, grid.large_vocab_ks,
                                             grid.reps))
        return big_costs

    big_prompts = [np.random.default_rng(0).integers(0, 32_000, 32).tolist()]
    for mode_label, sampling in MODES.items():
        for k in grid.large_vocab_ks:
            run(("random 32k-vocab pair", "first layer", mode_label, 1, k), functools.partial(
                config_result, big_target, big_draft, big_prompts, sampling, k, grid,
                big_cost_table, workload="random 32k-vocab pair", drafter_name="first layer",
                mode=mode_label))
    return rows


def write_suite(suite: SuiteResult, name: str) -> None:
    plots = plot([r for r in suite.rows if r.workload != "random 32k-vocab pair"],
                 str(RESULTS / name))
    write_results(name, suite.to_json(), render(suite, plots))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the default: under 5 minutes")
    mode.add_argument("--full", action="store_true")
    parser.add_argument("--no-peers", action="store_true", help="skip transformers")
    parser.add_argument("--resume", action="store_true",
                        help="keep the configurations an interrupted run of this mode finished")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild the Markdown report and plots from the committed JSON")
    args = parser.parse_args()
    grid = FULL if args.full else QUICK
    mode_name = "full" if args.full else "quick"
    name = f"suite_{mode_name}_{jax.default_backend()}"
    if args.report_only:
        write_suite(SuiteResult.from_json(json.loads((RESULTS / f"{name}.json").read_text())),
                    name)
        return
    started = time.perf_counter()
    # Every finished configuration is appended here, so a long (--full) run that is
    # interrupted continues with --resume; the file is removed once the report is written.
    progress = RESULTS / f".{name}.partial.jsonl"
    done = {}
    if args.resume and progress.exists():
        for line in progress.read_text().splitlines():
            row = ConfigResult.from_dict(json.loads(line))
            done[row.key] = row
        print(f"resuming: {len(done)} configurations already measured", flush=True)
    else:
        RESULTS.mkdir(parents=True, exist_ok=True)
        progress.write_text("")

    def record(row: ConfigResult):
        with progress.open("a") as file:
            file.write(json.dumps(dataclasses.asdict(row)) + "\n")

    rows = measure_grid(grid, done, record)
    target = specjax_models.load_bundled("target")
    weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(target.params))
    target_config = specjax_models.TARGET_CONFIG
    cache_bytes = 2 * target_config.num_layers * 512 * target_config.num_kv_heads \
        * target_config.resolved_head_dim * 4
    line = roofline(target, weights + cache_bytes, grid.reps)
    peer_rows = [] if args.no_peers else peers(
        target, specjax_models.load_bundled("draft"),
        bundled_workloads(grid)["held-out code"], grid)
    memory_kind, memory = peak_memory_bytes()
    suite = SuiteResult(mode=mode_name, grid=dataclasses.asdict(grid), machine=machine_record(),
                        elapsed_s=time.perf_counter() - started,
                        resumed_configurations=len(done), rows=rows, roofline=line,
                        peers=peer_rows, peak_memory_kind=memory_kind, peak_memory_bytes=memory)
    write_suite(suite, name)
    progress.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
