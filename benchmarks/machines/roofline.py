"""How far one forward is from the machine's physical limits, at real sizes.

For each model x dtype x layer layout x batch x forward width: the seconds of one cached
forward (`specjax.runtime.timing.forward_timer`: forwards inside one jit, as a decode loop runs
them), the bytes it must move (every weight once, the KV cache it reads, the keys and
values it writes) and its FLOPs (2 per multiply-add of every matmul, attention's QK and
PV over the cache), and the bandwidth and FLOP/s reached, as fractions of the machine's:
on CPU, a copy probe and a matmul probe measured in the same run; on an accelerator, the
same probes and the chip's specification. v(w) = t(w) / t(1) is the verify cost a
speculative step pays for w tokens.

Then the speculative loop's own overhead, apart from acceptance: an oracle drafter (the
target drafting for itself, greedy, in float32, so every draft is accepted and tau =
K + 1) through `specjax.bench.run`, whose measured decode speedup is compared with the
ideal tau / (K c + v) from measured c and v: efficiency = measured / ideal.

The models are `specjax_models.real_sizes` (published architectures, pseudo-random
weights: speed and memory, never quality). Rows go to OUT.jsonl as they are measured
(a killed run continues where it stopped: rows already there are not measured again);
OUT.md is the table.

  python -m benchmarks.machines.roofline --out benchmarks/results/roofline_cpu       # CPU default
  python -m benchmarks.machines.roofline --models llama-3.1-8b --dtypes bfloat16 --batches 1,8,32
  python -m benchmarks.machines.roofline --dry-run --out /tmp/r    # a tiny grid (CI)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

# Accelerators' memory bandwidth (bytes/s) and dense peak (FLOP/s, bfloat16 / float32),
# from their specification sheets (SXM parts).
CHIPS = {"H100": (3.35e12, 989e12, 67e12), "H200": (4.8e12, 989e12, 67e12),
         "A100": (2.0e12, 312e12, 19.5e12), "L4": (0.3e12, 121e12, 30e12),
         "T4": (0.32e12, 65e12, 8.1e12), "V5E": (0.819e12, 197e12, 197e12 / 2)}


def chip_spec(device_kind: str) -> tuple | None:
    """(bandwidth, bf16 peak, f32 peak) of an accelerator by its device kind, or None."""
    kind = device_kind.upper().replace(" ", "")
    for name, spec in CHIPS.items():
        if name in kind:
            return spec
    return None


# ---------------------------------------------------------------- the cost model

def model_costs(config) -> dict:
    """What a forward's bytes and FLOPs are made of, from a config: the parameters' bytes,
    the matmul parameters (every kernel; an untied embedding is a lookup, not a matmul,
    and its LM head is a kernel), and per token the KV cache bytes and attention's
    multiply-adds per cached slot."""
    import jax

    from specjax_models.real_sizes import abstract_params, cache_bytes

    leaves = jax.tree_util.tree_flatten_with_path(abstract_params(config))[0]
    total = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for _, x in leaves)
    matmul = sum(int(np.prod(x.shape)) for path, x in leaves if len(x.shape) >= 2
                 and not ("embed" in jax.tree_util.keystr(path)
                          and not config.tie_embeddings))
    heads = config.num_heads
    qk_dim = (config.qk_nope_head_dim + config.qk_rope_head_dim) if config.kv_lora_rank \
        else config.resolved_head_dim
    v_dim = config.v_head_dim or config.resolved_head_dim
    return {"param_bytes": total, "matmul_params": matmul,
            # per slot of one row: keys, values (or latents) and the slot's position
            "kv_bytes_per_slot": cache_bytes(config, 1, 2) - cache_bytes(config, 1, 1),
            "attention_macs_per_slot": config.num_layers * heads * (qk_dim + v_dim)}


def forward_bytes(costs: dict, batch: int, width: int, context: int) -> int:
    """Bytes one forward must move: every weight once, the cache read (`context` slots per
    row), the new keys and values written."""
    return (costs["param_bytes"] + costs["kv_bytes_per_slot"] * batch * context
            + costs["kv_bytes_per_slot"] * batch * width)


def forward_flops(costs: dict, batch: int, width: int, context: int) -> int:
    """FLOPs of one forward: 2 per multiply-add of the matmuls for every new token, and
    of attention over the cache and the new tokens."""
    tokens = batch * width
    return 2 * tokens * (costs["matmul_params"]
                         + costs["attention_macs_per_slot"] * (context + width))


# ---------------------------------------------------------------- probes

def copy_probe(mib: int = 512, reps: int = 5) -> dict:
    """The machine's memory bandwidth, three ways over `mib` MiB of float32, medians of
    `reps`: a jitted copy-with-scale into its donated input (2 x bytes moved), a jitted
    sum and a matrix-vector product (each reads every byte once). The fastest is the
    bandwidth the table measures against."""
    import jax
    import jax.numpy as jnp

    # The copy writes into its donated input (no fresh pages to fault in per call, which
    # on Linux costs more than the copy itself).
    copy = jax.jit(lambda a: a * 1.0001, donate_argnums=0)
    read = jax.jit(lambda a: jnp.sum(a))
    # A matrix-vector product reads the matrix once, as a decode step reads its weights
    # (and, unlike a reduction, XLA's CPU dot runs on every core).
    stream = jax.jit(lambda a, v: a.reshape(-1, 4096) @ v)
    x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
    vector = jnp.ones((4096,), jnp.float32)
    moved = x.nbytes
    out = {}
    for name in ("copy", "read", "stream"):
        seconds = []
        for rep in range(reps + 1):
            start = time.perf_counter()
            if name == "copy":
                x = jax.block_until_ready(copy(x))
            elif name == "read":
                jax.block_until_ready(read(x))
            else:
                jax.block_until_ready(stream(x, vector))
            if rep:  # the first call compiles
                seconds.append(time.perf_counter() - start)
        out[f"{name}_bytes_per_s"] = (2 if name == "copy" else 1) * moved / float(
            np.median(seconds))
    return out


def matmul_probe(dtype: str, size: int = 2048, reps: int = 5) -> float:
    """The machine's dense FLOP/s in `dtype`: a jitted square matmul, median of `reps`."""
    import jax
    import jax.numpy as jnp

    a = jnp.ones((size, size), dtype)
    f = jax.jit(lambda x: x @ x)
    jax.block_until_ready(f(a))
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(f(a))
        seconds.append(time.perf_counter() - start)
    return 2 * size ** 3 / float(np.median(seconds))


def measure_probes(rows_path: Path, done: dict, dtypes, small: bool = False) -> dict:
    """The limits to measure against, once per results file: the bandwidth probes and
    the matmul peak of each dtype (on an accelerator, the chip's specification where it
    is known, the probes beside it); kept as the file's "probes" row."""
    import jax

    probes = done.get("probes") or {"key": "probes", **copy_probe(64 if small else 1024)}
    for dtype in dtypes:
        probes.setdefault(f"peak_{dtype}", matmul_probe(dtype, 256 if small else 4096))
    device = jax.devices()[0]
    spec = chip_spec(getattr(device, "device_kind", "")) if device.platform != "cpu" else None
    measured = max(("copy", "read", "stream"), key=lambda n: probes[f"{n}_bytes_per_s"])
    probes["bandwidth"], probes["bandwidth_source"] = (
        (spec[0], f"{device.device_kind}'s specification") if spec
        else (probes[f"{measured}_bytes_per_s"], f"the {measured} probe, the fastest"))
    if spec:
        probes["peak_bfloat16"], probes["peak_float32"] = spec[1], spec[2]
    if "probes" not in done:
        _append(rows_path, probes)
        done["probes"] = probes
    return probes


# ---------------------------------------------------------------- measuring

def _done(path: Path) -> dict:
    rows = {}
    if path.exists():
        for line in path.read_text().split("\n"):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line a killed run was writing
            rows[row["key"]] = row
    return rows


def _append(path: Path, row: dict) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(row) + "\n")


def measure_forwards(name, config, build, batches, widths, context, reps, steps, rows_path,
                     done, probes) -> None:
    """One model's forwards over batches x widths (rows appended as measured); `config`
    its TransformerConfig, `build(config)` makes it (once, when a row is missing)."""
    from specjax.runtime.timing import forward_timer, interleaved_medians

    costs = model_costs(config)
    dtype, layout = config.param_dtype, "scanned" if config.scan_layers else "unrolled"
    slots = context + max(widths) + 2
    lm = None
    for batch in batches:
        keys = {w: f"{name}/{dtype}/{layout}/b{batch}/w{w}/c{context}" for w in widths}
        if all(k in done for k in keys.values()):
            continue
        lm = lm or build(config)
        started = time.perf_counter()
        timers = {w: forward_timer(lm, batch, w, cache_slots=slots, position=context,
                                   steps=steps) for w in widths}
        compile_s = time.perf_counter() - started
        seconds = interleaved_medians(timers, reps)
        for w in widths:
            moved = forward_bytes(costs, batch, w, context)
            flops = forward_flops(costs, batch, w, context)
            row = {"key": keys[w], "model": name, "dtype": dtype, "layout": layout,
                   "batch": batch, "width": w, "context": context, "seconds": seconds[w],
                   "v": seconds[w] / seconds[1], "bytes": moved, "flops": flops,
                   "bandwidth_fraction": moved / seconds[w] / probes["bandwidth"],
                   "flops_fraction": flops / seconds[w] / probes[f"peak_{dtype}"],
                   "bound_seconds": max(moved / probes["bandwidth"],
                                        flops / probes[f"peak_{dtype}"]),
                   "compile_seconds_all_widths": compile_s}
            row["limit_fraction"] = row["bound_seconds"] / seconds[w]
            _append(rows_path, row)
            done[row["key"]] = row
            print(f"{row['key']}: {seconds[w] * 1e3:.1f} ms, {row['limit_fraction']:.0%} of "
                  f"the limit (bandwidth {row['bandwidth_fraction']:.0%}, FLOP/s "
                  f"{row['flops_fraction']:.0%}), v {row['v']:.2f}", flush=True)


def measure_oracle(name, lm, k, new_tokens, rows_path, done) -> None:
    """The speculative loop's overhead: the target drafting for itself (greedy, every
    draft accepted) through `specjax.bench.run`, its speedup against the ideal."""
    import specjax
    from specjax.bench.prompts import BenchPrompt
    from specjax.bench.runner import BenchMethod, run

    dtype = str(jax_dtype_of(lm))
    key = f"oracle/{name}/{dtype}/k{k}/n{new_tokens}"
    if key in done:
        return
    prompts = [BenchPrompt(tuple(int(t) for t in np.arange(3, 35) * 7919 % lm.vocab_size),
                           "oracle", "p0")]
    report = run(lm, [BenchMethod("oracle", specjax.DraftModel(lm, "greedy"),
                                  num_draft_tokens=k)], prompts, max_new_tokens=new_tokens,
                 reps=3, cost_reps=3)
    r = report.row("oracle")
    row = {"key": key, "model": name, "dtype": dtype, "k": k, "new_tokens": new_tokens,
           "speedup": r["speedup"], "tau": r["tau"], "c": r["draft_cost"],
           "v": r["verify_cost"], "ideal": r["ideal_speedup"], "efficiency": r["efficiency"],
           "plain_tokens_per_s": report.row("plain")["tokens_per_second"],
           "exact": r["exact"]}
    _append(rows_path, row)
    done[key] = row
    print(f"{key}: speedup {row['speedup']:.2f}x, ideal {row['ideal']:.2f}x, efficiency "
          f"{row['efficiency']:.0%} (tau {row['tau']:.2f}, c {row['c']:.3f}, v {row['v']:.2f})",
          flush=True)


def jax_dtype_of(lm):
    import jax

    return jax.tree.leaves(lm.params)[0].dtype


def random_builder(name: str):
    """`build(config)` for a real-size model: its pseudo-random weights (the last one
    built is released before the next, for memory)."""
    import gc

    from specjax_models.real_sizes import random_model

    def build(config):
        gc.collect()
        return random_model(name, config.param_dtype, scan_layers=config.scan_layers,
                            max_seq_len=config.max_seq_len)

    return build


def markdown(rows: dict, probes: dict, machine: dict, command: str) -> str:
    forwards = [r for r in rows.values() if "width" in r]
    oracles = [r for r in rows.values() if "efficiency" in r]
    lines = ["# Roofline: real sizes against the machine's limits\n",
             f"`{command}` on {machine.get('cpu_model') or machine.get('processor')} "
             f"({machine.get('cpu_count')} cores, {machine.get('jax_backend')}, jax "
             f"{machine.get('jax')}). Probes in the same run: copy "
             f"{probes['copy_bytes_per_s'] / 1e9:.1f} GB/s, read "
             f"{probes['read_bytes_per_s'] / 1e9:.1f} GB/s, matrix-vector stream "
             f"{probes['stream_bytes_per_s'] / 1e9:.1f} GB/s (the bandwidth used below: "
             f"{probes['bandwidth'] / 1e9:.1f} GB/s, {probes['bandwidth_source']}), matmul "
             + ", ".join(f"{k[5:]} {v / 1e9:.0f} GFLOP/s" for k, v in probes.items()
                         if k.startswith("peak_")) + ". Weights are pseudo-random "
             "(specjax_models.real_sizes): speed and memory only. seconds: one cached "
             "forward at `context` slots, median of alternating repetitions, compile apart; "
             "bytes: weights + KV read + KV written; limit: max(bytes / bandwidth, FLOPs / "
             "peak) over the seconds; v: the forward over the same batch's 1-token one.\n",
             "| model | dtype | layout | batch | width | ms | GB moved | GFLOP | bandwidth "
             "| FLOP/s | of the limit | v |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(forwards, key=lambda r: (r["model"], r["dtype"], r["layout"], r["batch"],
                                             r["width"])):
        lines.append(f"| {r['model']} | {r['dtype']} | {r['layout']} | {r['batch']} | "
                     f"{r['width']} | {r['seconds'] * 1e3:.1f} | {r['bytes'] / 1e9:.2f} | "
                     f"{r['flops'] / 1e9:.1f} | {r['bandwidth_fraction']:.0%} | "
                     f"{r['flops_fraction']:.0%} | {r['limit_fraction']:.0%} | "
                     f"{r['v']:.2f} |")
    if oracles:
        lines += ["", "The speculative loop's own overhead: the target drafting for itself "
                  "(greedy, every draft accepted), `specjax.bench.run`, decode phase, batch 1:",
                  "", "| model | dtype | K | new tokens | speedup | tau | c | v | ideal | "
                  "efficiency | plain tokens/s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in oracles:
            lines.append(f"| {r['model']} | {r['dtype']} | {r['k']} | {r['new_tokens']} | "
                         f"{r['speedup']:.2f}x | {r['tau']:.2f} | {r['c']:.3f} | "
                         f"{r['v']:.2f} | {r['ideal']:.2f}x | {r['efficiency']:.0%} | "
                         f"{r['plain_tokens_per_s']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen2.5-0.5b,llama-3.2-1b")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--layouts", default="unrolled,scanned")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--widths", default="1,2,5,9,17")
    parser.add_argument("--context", type=int, default=256,
                        help="cache slots in use before the forward (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4,
                        help="forwards per timed call, inside one jit (default: %(default)s)")
    parser.add_argument("--oracle-k", type=int, default=4)
    parser.add_argument("--oracle-tokens", type=int, default=32)
    parser.add_argument("--no-oracle", action="store_true")
    parser.add_argument("--dry-run", action="store_true",
                        help="a tiny grid on the smallest model (CI)")
    parser.add_argument("--out", default="benchmarks/results/roofline_cpu")
    args = parser.parse_args(argv)

    from benchmarks.common import command_line, machine_record

    split = lambda text: [x.strip() for x in text.split(",") if x.strip()]
    models, dtypes, layouts = split(args.models), split(args.dtypes), split(args.layouts)
    batches, widths = [int(x) for x in split(args.batches)], [int(x) for x in
                                                              split(args.widths)]
    if args.dry_run:
        models, dtypes, layouts, batches, widths = (["qwen2.5-0.5b"], ["float32"],
                                                    ["unrolled"], [1], [1, 2])
        args.context, args.reps, args.steps, args.oracle_tokens = 32, 1, 1, 8
    if 1 not in widths:
        widths = [1, *widths]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows_path = out.with_suffix(".jsonl")
    done = _done(rows_path)
    probes = measure_probes(rows_path, done, dtypes, small=args.dry_run)
    from specjax_models.real_sizes import real_size_config

    slots = args.context + max(widths) + 8
    for name in models:
        build = random_builder(name)
        for dtype in dtypes:
            for layout in layouts:
                config = real_size_config(name, dtype, scan_layers=layout == "scanned",
                                          max_seq_len=slots)
                measure_forwards(name, config, build, batches, widths, args.context,
                                 args.reps, args.steps, rows_path, done, probes)
            if not args.no_oracle and dtype == "float32":
                key = f"oracle/{name}/float32/k{args.oracle_k}/n{args.oracle_tokens}"
                if key not in done:
                    lm = build(real_size_config(name, dtype, max_seq_len=slots + 64
                                                + args.oracle_tokens))
                    measure_oracle(name, lm, args.oracle_k, args.oracle_tokens, rows_path,
                                   done)
                    del lm
    rows = {k: v for k, v in done.items() if k != "probes"}
    text = markdown(rows, probes, machine_record(), command_line())
    out.with_suffix(".md").write_text(text)
    print(f"wrote {rows_path} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
