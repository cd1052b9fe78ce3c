"""Typed results of the benchmark suite and the report built from them.

Every sentence of the report is computed from the rows (no hand-written claims), so a
rerun on another machine says what that machine measured. `SuiteResult.from_json` reads a
committed JSON back, so `python -m benchmarks.run --report-only` rebuilds the Markdown and
the plots without measuring again.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ConfigResult:
    """One configuration (workload, drafter, mode, batch, K): speculative vs plain decoding
    of the same prompts with the same key, measured in the same run."""

    workload: str
    drafter: str
    mode: str
    batch: int
    k: int
    tokens: int
    cache_slots: int
    spec_tokens_per_s: float
    plain_tokens_per_s: float
    speedup: float
    spec_first_token_s: float
    plain_first_token_s: float
    spec_decode_tokens_per_s: float
    plain_decode_tokens_per_s: float
    decode_speedup: float
    acceptance_rate: float
    position_acceptance_rate: float
    mean_accepted_length: float
    target_forwards_per_token: float
    accepted_per_position: list
    num_steps: int
    batch_tokens_per_step: float
    cost_ratio_c: float
    verify_cost_ratio_v: float
    ideal_speedup: float
    efficiency: float
    spec_compile_s: float
    plain_compile_s: float
    spec_times_s: list
    plain_times_s: list
    spec_first_token_times_s: list
    plain_first_token_times_s: list
    greedy_identical_to_plain: bool | None
    peak_memory_kind: str
    peak_memory_bytes: int

    @property
    def key(self) -> tuple:
        return (self.workload, self.drafter, self.mode, self.batch, self.k)

    @classmethod
    def from_dict(cls, row: dict) -> ConfigResult:
        row = dict(row)
        for kind in ("process_peak_rss", "device_peak"):  # the older JSON layout
            if kind in row:
                row["peak_memory_kind"], row["peak_memory_bytes"] = kind, row.pop(kind)
        return cls(**row)


@dataclasses.dataclass(frozen=True)
class PeerResult:
    """transformers or specjax on the same weights and prompt (greedy, batch 1)."""

    prompt: int
    decoder: str
    tokens_per_s: float
    identical_to_transformers_plain: bool


@dataclasses.dataclass(frozen=True)
class Roofline:
    """Plain decoding's step against (bytes a step reads) / (measured copy bandwidth)."""

    bytes_per_step: int
    host_copy_bandwidth_bytes_s: float
    device_copy_bandwidth_bytes_s: float
    device: str
    bandwidth_bytes_s: float
    measured_step_s: float
    roofline_step_s: float
    fraction_of_roofline: float


@dataclasses.dataclass(frozen=True)
class SuiteResult:
    mode: str
    grid: dict
    machine: dict
    elapsed_s: float
    resumed_configurations: int
    rows: list[ConfigResult]
    roofline: Roofline
    peers: list[PeerResult]
    peak_memory_kind: str
    peak_memory_bytes: int
    seed: int = 0

    def to_json(self) -> dict:
        return {"benchmark": "suite", **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> SuiteResult:
        rows = [ConfigResult.from_dict(r) for r in data["rows"]]
        last = rows[-1] if rows else None
        return cls(mode=data["mode"], grid=data["grid"], machine=data["machine"],
                   elapsed_s=data["elapsed_s"],
                   resumed_configurations=data.get("resumed_configurations", 0), rows=rows,
                   roofline=Roofline(**data["roofline"]),
                   peers=[PeerResult(**p) for p in data.get("peers", [])],
                   peak_memory_kind=data.get("peak_memory_kind",
                                             last.peak_memory_kind if last else ""),
                   peak_memory_bytes=data.get("peak_memory_bytes",
                                              last.peak_memory_bytes if last else 0),
                   seed=data.get("seed", 0))


def best_per_configuration(rows: list[ConfigResult]) -> dict[tuple, ConfigResult]:
    """For each (workload, drafter, mode, batch), the K with the best decode speedup."""
    best: dict[tuple, ConfigResult] = {}
    for r in rows:
        group = r.key[:4]
        if group not in best or r.decode_speedup > best[group].decode_speedup:
            best[group] = r
    return best


def summary_table(rows: list[ConfigResult]) -> list[str]:
    lines = ["| workload | drafter | mode | batch | best K | decode speedup | end to end | "
             "tau | ideal |", "|---|---|---|---|---|---|---|---|---|"]
    for (workload, drafter, mode, batch), r in best_per_configuration(rows).items():
        lines.append(f"| {workload} | {drafter} | {mode} | {batch} | {r.k} | "
                     f"{r.decode_speedup:.2f}x | {r.speedup:.2f}x | "
                     f"{r.mean_accepted_length:.2f} | {r.ideal_speedup:.2f}x |")
    return lines


def detail_table(rows: list[ConfigResult]) -> list[str]:
    lines = ["| workload | drafter | mode | B | K | spec tok/s | plain tok/s | speedup | decode "
             "| 1st token ms | alpha | beta | tau | batch tau | fwd/token | c | v | ideal | eff. |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r.workload} | {r.drafter} | {r.mode} | {r.batch} | {r.k} | "
            f"{r.spec_tokens_per_s:.0f} | {r.plain_tokens_per_s:.0f} | {r.speedup:.2f} | "
            f"{r.decode_speedup:.2f} | {r.spec_first_token_s * 1e3:.0f} / "
            f"{r.plain_first_token_s * 1e3:.0f} | {r.acceptance_rate:.3f} | "
            f"{r.position_acceptance_rate:.3f} | {r.mean_accepted_length:.2f} | "
            f"{r.batch_tokens_per_step:.2f} | {r.target_forwards_per_token:.3f} | "
            f"{r.cost_ratio_c:.3f} | {r.verify_cost_ratio_v:.2f} | {r.ideal_speedup:.2f} | "
            f"{r.efficiency:.2f} |")
    return lines


def what_limits(r: ConfigResult) -> str:
    """The ideal with the measured costs, with a free verify (v = 1) and with every draft
    accepted: which factor costs more, in numbers."""
    k, c, v = r.k, r.cost_ratio_c, r.verify_cost_ratio_v
    with_v1 = r.batch_tokens_per_step / (k * c + 1.0)
    all_accepted = (k + 1) / (k * c + v)
    limit = "the verify cost v" if with_v1 - r.ideal_speedup > all_accepted - r.ideal_speedup \
        else "acceptance"
    return (f"ideal {r.ideal_speedup:.2f}x; with a verify as cheap as one step (v = 1) it "
            f"would be {with_v1:.2f}x, with every draft accepted {all_accepted:.2f}x: "
            f"{limit} costs more here")


def goals(rows: list[ConfigResult]) -> list[str]:
    lines = []
    b1 = [r for r in rows if (r.workload, r.drafter, r.mode, r.batch)
          == ("held-out code", "draft model", "greedy", 1)]
    if b1:
        best = max(b1, key=lambda r: r.decode_speedup)
        total = max(b1, key=lambda r: r.speedup)
        lines += [
            f"- Bundled pair, greedy, batch 1: best decode-phase speedup "
            f"{best.decode_speedup:.2f}x at K={best.k} (goal >= 2x: "
            f"{'met' if best.decode_speedup >= 2 else 'not met'}); end to end, prefill "
            f"included, {total.speedup:.2f}x at K={total.k}; efficiency {best.efficiency:.2f} "
            f"(goal >= 0.8: {'met' if best.efficiency >= 0.8 else 'not met'}).",
            f"- Why, at K={best.k}: v = {best.verify_cost_ratio_v:.2f} for "
            f"{best.k + 1} tokens, c = {best.cost_ratio_c:.3f}, tau = "
            f"{best.mean_accepted_length:.2f}; {what_limits(best)}."]
    largest = max((r.batch for r in rows), default=1)
    wide = [r for r in rows if r.batch == largest > 1 and r.drafter == "draft model"
            and r.mode == "greedy"]
    if wide:
        top = max(wide, key=lambda r: r.decode_speedup)
        verdict = "speculation helps" if top.decode_speedup > 1 else "speculation does not help"
        lines.append(
            f"- Batch {top.batch}: best decode speedup {top.decode_speedup:.2f}x (K={top.k}, "
            f"{top.speedup:.2f}x end to end): {verdict} here. v = "
            f"{top.verify_cost_ratio_v:.2f} ({top.batch} x {top.k + 1} verify rows against a "
            f"{top.batch}-row step), batch tau {top.batch_tokens_per_step:.2f} against a "
            f"per-row tau of {top.mean_accepted_length:.2f} (a batch steps until its slowest "
            f"row is done); {what_limits(top)}.")
    return lines


def peers_section(peers: list[PeerResult]) -> list[str]:
    if not peers:
        return []
    lines = ["", "## transformers on the same weights (greedy, batch 1)", "",
             "| prompt | decoder | tok/s | identical to transformers plain |", "|---|---|---|---|"]
    by_decoder: dict[str, list[float]] = {}
    for p in peers:
        lines.append(f"| {p.prompt} | {p.decoder} | {p.tokens_per_s:.0f} | "
                     f"{p.identical_to_transformers_plain} |")
        by_decoder.setdefault(p.decoder, []).append(p.tokens_per_s)
    mean = lambda name: sum(by_decoder[name]) / len(by_decoder[name])
    ours, theirs = "specjax draft model K=8", "transformers assisted (draft model)"
    if ours in by_decoder and theirs in by_decoder:
        ratio = mean(ours) / mean(theirs)
        lines.append(f"\nspecjax draft-model decoding / transformers assisted generation: "
                     f"{ratio:.2f}x tokens/s (goal >= 2x: {'met' if ratio >= 2 else 'not met'}).")
    return lines


def roofline_section(line: Roofline, memory_kind: str, memory: int) -> list[str]:
    floor, step = line.roofline_step_s, line.measured_step_s
    text = (f"A decode step reads {line.bytes_per_step / 1e6:.1f} MB (weights + a 512-slot "
            f"cache); measured copy bandwidth {line.device_copy_bandwidth_bytes_s / 1e9:.1f} "
            f"GB/s (jax) / {line.host_copy_bandwidth_bytes_s / 1e9:.1f} GB/s (numpy); "
            f"{line.bandwidth_bytes_s / 1e9:.1f} GB/s gives a {floor * 1e3:.2f} ms floor; the "
            f"measured step is {step * 1e3:.2f} ms ({floor / step:.0%} of the bandwidth "
            "roofline).")
    if floor > step:
        text += (" The step beats the DRAM floor: the weights fit in the CPU's caches, so "
                 "this decoding is bound by compute and dispatch, not memory bandwidth.")
    return ["", "## Roofline of plain decoding (batch 1)", "", text, "",
            f"Peak memory ({memory_kind}): {memory / 1e9:.2f} GB."]


def render(suite: SuiteResult, plots: list[str]) -> str:
    machine = suite.machine
    bundled = [r for r in suite.rows if r.workload != "random 32k-vocab pair"]
    lines = [f"# Benchmark suite ({suite.mode}, {machine.get('jax_backend', '?')})", "",
             f"Command: `{machine['command']}` ({suite.elapsed_s:.0f} s"
             + (f"; {suite.resumed_configurations} configurations from an interrupted run"
                if suite.resumed_configurations else "")
             + f"). Machine: {machine['processor']}, {machine['cpu_count']} CPUs, devices "
             f"{machine['devices']}, jax {machine['jax']}. Seed {suite.seed}. Bundled pair "
             "(4.9M target, 0.46M distilled draft) on held-out prompts; medians of "
             f"{suite.grid['reps']} alternating repetitions; {suite.grid['new_tokens']} new "
             "tokens per row; compile excluded (JSON: `spec_compile_s`, `plain_compile_s`).",
             "", "## Summary", "",
             "The best K of each configuration. `decode speedup`: tokens per second after the "
             "first token, speculative over plain decoding of the same target; `end to end`: "
             "the whole request, prefill included; tau: tokens per target forward; `ideal`: "
             "tau / (K c + v), what the measured costs c and v allow.", "",
             *summary_table(bundled), "", "## Goals and why", "", *goals(bundled), "",
             "## All configurations", "",
             "Columns: tokens/s and `speedup` end to end (prefill included); `1st token` = the "
             "time to the first token, spec / plain (prefill + one step); `decode` = the "
             "speedup of the decode phase (end to end minus first token), the figure that the "
             "ideal predicts and that the efficiency compares with. tau = tokens per target "
             "forward of a row while it runs; `batch tau` = tokens per row per batched step "
             "(a batch runs until its slowest row is done), which the ideal "
             "`batch tau / (K c + v)` uses; the two are equal at batch 1.", "",
             *detail_table(suite.rows), *peers_section(suite.peers),
             *roofline_section(suite.roofline, suite.peak_memory_kind,
                               suite.peak_memory_bytes), "",
             "Plots: " + ", ".join(f"`{Path(p).name}`" for p in plots), ""]
    return "\n".join(lines)
