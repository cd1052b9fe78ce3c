"""The measurements an accelerator session owes the project, in one bounded run. It needs
only models it builds (the bundled pair, real-size architectures with pseudo-random
weights): a device call carries no SmolLM2 checkpoint.

0. The roofline at real sizes (`benchmarks/machines/roofline.py`): Llama-3.2-1B and Llama-3.1-8B
   shapes in bfloat16, unrolled and scanned layers, batches 1, 8, 32 and forward widths
   1, 2, 5, 9, 17: seconds per forward against the bytes it must move at the chip's
   bandwidth (its specification, and a copy probe in the same run), v(w) at those sizes,
   and the oracle loop's efficiency (the 1B shape drafting for itself, float32), with the
   compile seconds of each program.
1. The verify-cost curve v(K): one cached forward of K + 1 tokens per row in one-token
   target steps, for K + 1 in {1, 2, 3, 5, 9, 17, 33, 65}, batch 1, on the bundled target
   and SmolLM2-135M, float32 and bfloat16, unrolled against scanned layers (each forward
   timed as a decode loop runs it: `specjax.runtime.timing.forward_timer`).
2. The decode-phase speedup over plain decoding (greedy, batch 1, same run, compile
   excluded) of the draft-model chain, the EAGLE-3 dynamic tree, prompt lookup, lookahead,
   retrieval from the row's own text and layer skipping, on the bundled pair (its shipped draft
   and head); and the costs of
   a published-layout EAGLE-3 head (random weights of the target's width, read by
   `specjax_models.load_drafter`; no hub on the device: a random head is rarely accepted,
   so its decode speedup at tau near 1 is the price of its drafting and verifying).

3. v(n) of a mixture-of-experts target against a dense model of the same active size
   (`benchmarks/decoding/moe.py`: random weights, 16 experts, top 2), beside the model
   `specjax.analysis.moe_verify_cost_ratio` (grouped matmuls read each touched expert once).

Results are written after every section, so a run cut short still leaves what it
measured; `--budget-s` skips what would not fit (recorded as skipped).

    python -m benchmarks.machines.device --out DIR [--budget-s 420]
    python -m benchmarks.machines.device --out DIR --dry-run   # CI-sized: bundled pair, tiny sizes
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import specjax
import specjax_models
from benchmarks.common import machine_record
from benchmarks.decoding.trees import measure
from specjax.drafters import LayerSkip, Lookahead, Retrieval
from specjax.runtime.sharding import DATA_AND_TENSOR, mesh_from_spec
from specjax.runtime.timing import forward_timer, interleaved_medians
from specjax.trees.shapes import DynamicTree

WIDTHS = (1, 2, 3, 5, 9, 17, 33, 65)
DRY_WIDTHS = (1, 2, 3)


class Budget:
    """Seconds left of the run's device time; items that would start past it are skipped."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds
        self.skipped: list[str] = []

    def allows(self, what: str) -> bool:
        if time.monotonic() < self.deadline:
            return True
        self.skipped.append(what)
        print(f"skipped (budget spent): {what}", flush=True)
        return False


def load_models(dry_run: bool, dtype=None, scan_layers: bool = False) -> dict:
    """name -> (target, draft model or drafter, EAGLE-3 head, prompt ids)."""
    tok = specjax_models.ByteTokenizer()
    prompt = next(p for p in specjax_models.bundled_prompts() if p["kind"] == "continue")
    del dry_run  # the bundled pair at every size: real sizes are the roofline's
    return {"bundled": (specjax_models.load_bundled("target", dtype, scan_layers),
                        lambda: specjax_models.load_bundled("draft", dtype, scan_layers),
                        lambda: specjax_models.load_bundled("eagle3"),
                        tok.encode(prompt["text"]))}


# The roofline's grid on a device, and its CI size (the smallest published shape).
ROOFLINE = {"llama-3.2-1b": dict(layouts=("unrolled", "scanned"), batches=(1, 8, 32)),
            "llama-3.1-8b": dict(layouts=("unrolled", "scanned"), batches=(1, 8))}
DRY_ROOFLINE = {"qwen2.5-0.5b": dict(layouts=("unrolled",), batches=(1,))}


def roofline(args, budget: Budget) -> dict:
    """Section 0: rows of `benchmarks.machines.roofline` (forwards, then the oracle loop)."""
    from benchmarks.machines import roofline as rl
    from specjax_models.real_sizes import real_size_config

    rows_path = args.out / "roofline.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    done = rl._done(rows_path)
    dtype = "float32" if args.dry_run else "bfloat16"
    probes = rl.measure_probes(rows_path, done, {dtype, "float32"}, small=args.dry_run)
    widths = (1, 2) if args.dry_run else (1, 2, 5, 9, 17)
    context = 32 if args.dry_run else 256
    grid = DRY_ROOFLINE if args.dry_run else ROOFLINE
    for name, where in grid.items():
        build = rl.random_builder(name)
        for layout in where["layouts"]:
            if not budget.allows(f"roofline {name} {dtype} {layout}"):
                continue
            config = real_size_config(name, dtype, scan_layers=layout == "scanned",
                                      max_seq_len=context + max(widths) + 8)
            rl.measure_forwards(name, config, build, where["batches"], widths, context,
                                args.reps, args.steps, rows_path, done, probes)
    oracle = next(iter(grid))
    if budget.allows(f"oracle loop {oracle}"):
        lm = rl.random_builder(oracle)(real_size_config(
            oracle, "float32", max_seq_len=context + 96 + args.new_tokens))
        rl.measure_oracle(oracle, lm, 4, args.new_tokens, rows_path, done)
        del lm
    rows = {k: v for k, v in done.items() if k != "probes"}
    (args.out / "roofline.md").write_text(rl.markdown(rows, probes, machine_record(),
                                                      "python -m benchmarks.machines.device"))
    return rows


def verify_costs(args, budget: Budget) -> list[dict]:
    widths = DRY_WIDTHS if args.dry_run else WIDTHS
    rows = []
    for dtype in ("float32", "bfloat16"):
        for layout in ("unrolled", "scan"):
            if not budget.allows(f"v(K) {dtype} {layout}"):
                continue
            models = load_models(args.dry_run, dtype, layout == "scan")
            for name, (target, *_rest) in models.items():
                timers = {width: forward_timer(target, 1, width, cache_slots=256, position=64,
                                               steps=args.steps)
                          for width in widths}
                seconds = interleaved_medians(timers, args.reps)
                for width in widths:
                    rows.append({"model": name, "dtype": dtype, "layout": layout,
                                 "tokens": width, "ms": 1e3 * seconds[width],
                                 "steps": seconds[width] / seconds[1]})
                print(f"v(K) {name} {dtype} {layout}: " + ", ".join(
                    f"{w}:{seconds[w] / seconds[1]:.2f}" for w in widths), flush=True)
    return rows


def decode_speedups(args, budget: Budget) -> list[dict]:
    rows = []
    settings = SimpleNamespace(new_tokens=args.new_tokens, reps=args.reps)
    for name, (target, draft, head, ids) in load_models(args.dry_run).items():
        shapes = {
            "draft model, chain K=4": lambda draft=draft: (
                as_chain_drafter(draft()), 4, None),
            "EAGLE-3, dynamic tree 16": lambda head=head: (
                head().with_method("greedy"), None, DynamicTree(16, 6, 4)),
            "prompt lookup, chain K=4": lambda: (specjax.PromptLookup(min_ngram_size=1), 4,
                                                 None),
            # Model-free trees, wide as an accelerator affords (their own TreeBudget).
            "lookahead W=7 N=4 G=7": lambda: (Lookahead(window=7, ngram=4, guesses=7), None,
                                              None),
            "retrieval, own text, 16 nodes": lambda: (Retrieval(None, min_probability=0.1),
                                                      None, None),
            # Self-speculation: every other inner block skipped (where a forward is memory
            # bound, c is then about half a target step).
            "layer skip, odd inner blocks, chain K=4": lambda target=target: (
                LayerSkip(skip=tuple(range(1, target.num_layers - 1, 2))), 4, None),
            "published EAGLE-3 layout (random), dynamic tree 16": lambda target=target: (
                published_head(target), None, DynamicTree(16, 6, 4)),
            # The sharding path on one device (its plain and speculative tokens/s against
            # the unsharded "draft model, chain K=4" row: no slowdown expected).
            "draft model, chain K=4, target on a one-device mesh": lambda draft=draft, \
                target=target: (as_chain_drafter(draft()), 4, None, specjax_models.shard(
                    target, mesh_from_spec("data=1,model=1"), DATA_AND_TENSOR)),
        }
        for label, make in shapes.items():
            if not budget.allows(f"decode {name} {label}"):
                continue
            drafter, k, tree, *placed = make()
            row = measure(placed[0] if placed else target, drafter, [list(ids)],
                          specjax.GREEDY, settings, k=k, tree=tree)
            rows.append({"model": name, "decoder": label, **row})
            print(f"decode {name}, {label}: {row['decode_speedup']:.2f}x (tau "
                  f"{row['tau']:.2f}, identical to plain: {row['greedy_identical']})",
                  flush=True)
    return rows


def published_head(target):
    """An EAGLE-3 head in the speculators layout, random weights of the target's width and
    vocabulary (a Llama-style block: width / 64 heads, a third as many KV heads, an MLP of
    8/3 the width), written to a temporary folder and read back by load_drafter."""
    import tempfile

    from specjax_models.published_layouts import SyntheticShape, write_synthetic_drafter

    vocab, width = specjax_models.embedding_and_head(target)[0].shape
    heads = max(1, int(width) // 64)
    shape = SyntheticShape(d_model=int(width), vocab_size=int(vocab),
                           num_layers=target.num_layers, num_heads=heads,
                           num_kv_heads=heads // 3 if heads % 3 == 0 else heads,
                           d_ff=8 * int(width) // 3, draft_vocab_size=min(int(vocab), 32000))
    directory = write_synthetic_drafter(tempfile.mkdtemp(prefix="published-"),
                                        "eagle3-speculators", shape, scale=0.02)
    return specjax_models.load_drafter(directory, target, method="greedy")


def moe_verify_costs(args, budget: Budget) -> list[dict]:
    import dataclasses

    from benchmarks.decoding.moe import DENSE, MOE, verify_rows

    if not budget.allows("v(n) mixture of experts"):
        return []
    configs = {"moe": MOE, "dense": DENSE}
    if args.dry_run:
        small = dict(vocab_size=512, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2)
        configs = {name: dataclasses.replace(config, **small)
                   for name, config in configs.items()}
    return verify_rows(args, DRY_WIDTHS if args.dry_run else WIDTHS[:-1], configs)


def as_chain_drafter(draft):
    """A CausalLM draft as a greedy-drafting DraftModel; a drafter as it is."""
    return specjax.DraftModel(draft, "greedy") if isinstance(draft, specjax.CausalLM) else draft


def write(out: Path, payload: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "device.json").write_text(json.dumps(payload, indent=2) + "\n")
    lines = ["# Device run", "", f"`{payload['machine']['command']}` on "
             f"{', '.join(payload['machine']['devices'])} (jax {payload['machine']['jax']}, "
             f"backend {payload['machine']['jax_backend']}).", ""]
    if payload.get("roofline"):
        lines += ["The roofline at real sizes (forwards against the chip's bandwidth, v(w), "
                  "the oracle loop's efficiency): `roofline.md` beside this file.", ""]
    if payload["verify"]:
        lines += ["## Verify cost v(K): a forward of K + 1 tokens in one-token steps "
                  "(batch 1, 64 tokens of context)", ""]
        groups = {}
        for r in payload["verify"]:
            groups.setdefault((r["model"], r["dtype"], r["layout"]), {})[r["tokens"]] = r
        widths = sorted({r["tokens"] for r in payload["verify"]})
        lines += ["| model | dtype | layout | 1-token ms | " + " | ".join(
            f"K+1={w}" for w in widths) + " |", "|---|---|---|---|" + "---|" * len(widths)]
        for (model, dtype, layout), by_width in groups.items():
            lines.append(f"| {model} | {dtype} | {layout} | {by_width[1]['ms']:.3f} | "
                         + " | ".join(f"{by_width[w]['steps']:.2f}" if w in by_width else "-"
                                      for w in widths) + " |")
    if payload["decode"]:
        lines += ["", "## Decode-phase speedup over plain decoding (greedy, batch 1)", "",
                  "| model | decoder | decode speedup | end to end | tau | identical |",
                  "|---|---|---|---|---|---|"]
        for r in payload["decode"]:
            lines.append(f"| {r['model']} | {r['decoder']} | {r['decode_speedup']:.2f} | "
                         f"{r['speedup']:.2f} | {r['tau']:.2f} | {r['greedy_identical']} |")
    if payload.get("moe"):
        lines += ["", "## v(n) of a mixture of experts (16 experts, top 2) and a dense model of "
                  "its active size (`benchmarks/decoding/moe.py`)", "",
                  "| n | MoE v(n) | model v(n) | dense v(n) | MoE ms | dense ms |",
                  "|---|---|---|---|---|---|"]
        moe = {r["tokens"]: r for r in payload["moe"] if r["model"] == "moe"}
        dense = {r["tokens"]: r for r in payload["moe"] if r["model"] == "dense"}
        for n in sorted(moe):
            lines.append(f"| {n} | {moe[n]['steps']:.2f} | {moe[n]['model_steps']:.2f} | "
                         f"{dense[n]['steps']:.2f} | {moe[n]['ms']:.3f} | "
                         f"{dense[n]['ms']:.3f} |")
    if payload["skipped"]:
        lines += ["", "Skipped (time budget): " + "; ".join(payload["skipped"])]
    (out / "device.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--dry-run", action="store_true",
                        help="CI-sized: the bundled pair only, 3 widths, few tokens")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="start nothing new after this many seconds (default 420)")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--new-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    args.reps = args.reps or (1 if args.dry_run else 5)
    args.steps = args.steps or (2 if args.dry_run else 16)
    args.new_tokens = args.new_tokens or (12 if args.dry_run else 96)
    budget = Budget(args.budget_s)
    payload = {"machine": machine_record(), "args": {k: str(v) for k, v in vars(args).items()},
               "roofline": {}, "verify": [], "decode": [], "moe": [],
               "skipped": budget.skipped}
    started = time.monotonic()
    payload["roofline"] = roofline(args, budget)
    write(args.out, payload)
    payload["moe"] = moe_verify_costs(args, budget)
    write(args.out, payload)
    payload["decode"] = decode_speedups(args, budget)
    write(args.out, payload)
    payload["verify"] = verify_costs(args, budget)
    payload["seconds"] = time.monotonic() - started
    write(args.out, payload)
    print(f"wrote {args.out}/device.json and device.md in {payload['seconds']:.0f} s",
          flush=True)
    if budget.skipped:
        print(f"skipped: {budget.skipped}", flush=True)


if __name__ == "__main__":
    main()
