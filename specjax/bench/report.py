"""What a benchmark run (`specjax.bench.run`) reports: a row per method and category, and
the same as a markdown table, JSON, CSV and an SVG chart.

Definitions (DESIGN.md section 7). Over a group of units (a category's, or all):
speedup = (method's tokens / its seconds) / (plain decoding's tokens / its seconds), each
a sum over the group's units of the median seconds of alternating repetitions; the 95%
interval resamples the units (bootstrap, percentile). tau = tokens emitted / target
forwards; acceptance = drafts accepted / drafts proposed; nodes = drafts verified per
forward. C: the measured seconds of one step's draft block, v: of a target forward as wide
as the method's mean verify (nodes + 1; interpolated between measured widths), both over a
one-token target forward; c = C / K (K: the chain's drafts or the tree's nodes). ideal =
tau / (C + v) (= tau / (K c + v)), efficiency = speedup / ideal.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections.abc import Sequence
from html import escape
from pathlib import Path

import numpy as np

from specjax.bench.prompts import OVERALL
from specjax.verification.rules import is_lossy_rule_name

PLAIN = "plain"  # the baseline method every row is measured against

COLUMNS = ("method", "category", "prompts", "tokens", "seconds", "tokens_per_second",
           "speedup", "speedup_low", "speedup_high", "tau", "acceptance", "nodes_per_step",
           "draft_cost", "draft_block_cost", "verify_cost", "ideal_speedup", "efficiency",
           "compile_seconds", "exact", "verification")


@dataclasses.dataclass(frozen=True)
class BenchReport:
    """rows: a dict per method x category, plus each method's "overall" (COLUMNS; None
    where a figure does not apply: plain decoding's costs, exactness at temperature > 0).
    failures: at temperature 0, every prompt whose tokens under a method differ from
    plain decoding's (method, prompt, category, position of the first difference).
    settings: the run's. `ok`: no failure."""

    rows: list[dict]
    failures: list[dict]
    settings: dict

    @property
    def ok(self) -> bool:
        return not self.failures

    def row(self, method: str, category: str = OVERALL) -> dict:
        for row in self.rows:
            if row["method"] == method and row["category"] == category:
                return row
        raise KeyError(f"no row for method {method!r}, category {category!r}")

    def as_dict(self) -> dict:
        return {"settings": self.settings, "rows": self.rows, "failures": self.failures}

    def to_json(self, path) -> None:
        Path(path).write_text(json.dumps(self.as_dict(), indent=1) + "\n")

    def to_csv(self, path=None) -> str:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        if path is not None:
            Path(path).write_text(buffer.getvalue())
        return buffer.getvalue()

    def to_markdown(self) -> str:
        sampling = self.settings.get("sampling", {})
        greedy = sampling.get("temperature", 0.0) == 0.0
        lines = ["| method | category | prompts | speedup [95% CI] | tau | acceptance | "
                 "tokens/s | c | v | ideal | efficiency | compile s | exact |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in self.rows:
            exact = _exact_text(row, greedy)
            lines.append(
                f"| {row['method']} | {row['category']} | {row['prompts']} | "
                f"{_speedup_text(row)} | {_num(row['tau'])} | {_num(row['acceptance'])} | "
                f"{row['tokens_per_second']:.1f} | {_num(row['draft_cost'], 3)} | "
                f"{_num(row['verify_cost'])} | {_num(row['ideal_speedup'])} | "
                f"{_num(row['efficiency'])} | {row['compile_seconds']:.1f} | {exact} |")
        if self.failures:
            lines += ["", f"**{len(self.failures)} exactness failure(s)** (temperature 0: the "
                      "tokens differ from plain decoding's):"]
            lines += [f"- {f['method']}: prompt {f['prompt']} ({f['category']}), first "
                      f"difference at new token {f['position']}" for f in self.failures]
        return "\n".join(lines)

    def to_svg(self, path=None) -> str:
        svg = speedup_chart(self.rows)
        if path is not None:
            Path(path).write_text(svg)
        return svg


def _exact_text(row: dict, greedy: bool) -> str:
    """The markdown's verdict: a lossy rule's rows say NOT exact (and which rule)."""
    if is_lossy_rule_name(row.get("verification")):
        settings = row["verification"].partition("; ")[2].rstrip(")")
        return f"NOT exact (typical{': ' + settings if settings else ''})"
    if greedy:
        return "yes" if row["exact"] else "NO"
    return "distribution only"


def _num(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _speedup_text(row) -> str:
    if row["speedup_low"] is None:
        return f"{row['speedup']:.2f}x"
    return f"{row['speedup']:.2f}x [{row['speedup_low']:.2f}, {row['speedup_high']:.2f}]"


def interpolated(seconds_by_width: dict, width: float) -> float:
    """Seconds of a forward `width` tokens wide, linear between the measured widths
    (clamped to them)."""
    widths = sorted(int(w) for w in seconds_by_width)
    return float(np.interp(width, widths, [seconds_by_width[str(w)] for w in widths]))


def bootstrap_interval(tokens, seconds, plain_tokens, plain_seconds, samples: int,
                       seed: int = 0) -> tuple[float, float] | tuple[None, None]:
    """The 95% percentile interval of the tokens/s ratio, resampling the units."""
    arrays = [np.asarray(x, np.float64) for x in (tokens, seconds, plain_tokens,
                                                    plain_seconds)]
    n = len(arrays[0])
    if n < 2 or samples < 1:
        return None, None
    picks = np.random.default_rng(seed).integers(0, n, (samples, n))
    tok, sec, ptok, psec = (a[picks].sum(1) for a in arrays)
    ratios = (tok / sec) / (ptok / psec)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def summarise(*, methods, prompts, units, records, costs: dict, settings: dict,
              bootstrap_samples: int) -> BenchReport:
    """The report of a run from its per-unit records (see `specjax.bench.measure_unit`)
    and per-method costs (`specjax.bench.measure_costs`)."""
    greedy = settings["sampling"]["temperature"] == 0.0
    categories = list(dict.fromkeys(prompts[u[0]].category for u in units))
    groups = {c: [i for i, u in enumerate(units) if prompts[u[0]].category == c]
              for c in categories}
    groups[OVERALL] = list(range(len(units)))  # always there, for programs reading rows
    rows = []
    for method in methods:
        for category, unit_ids in groups.items():
            rows.append(_row(method, category, unit_ids, units, records, costs, greedy,
                             bootstrap_samples))
    failures = [dict(method=m.name, **miss) for m in methods if m.speculative
                for record in records for miss in record[m.name].get("mismatches", [])]
    return BenchReport(rows=rows, failures=failures, settings=settings)


def _row(method, category: str, unit_ids: Sequence[int], units, records, costs: dict,
         greedy: bool, bootstrap_samples: int) -> dict:
    name = method.name
    mine = [records[i][name] for i in unit_ids]
    plain = [records[i][PLAIN] for i in unit_ids]
    total = lambda entries, key: sum(e.get(key, 0) for e in entries)
    tokens, seconds = total(mine, "tokens"), total(mine, "median_seconds")
    rate = tokens / seconds
    speedup = rate / (total(plain, "tokens") / total(plain, "median_seconds"))
    low, high = (None, None)
    if method.speculative:
        low, high = bootstrap_interval([e["tokens"] for e in mine],
                                       [e["median_seconds"] for e in mine],
                                       [e["tokens"] for e in plain],
                                       [e["median_seconds"] for e in plain], bootstrap_samples)
    row = dict.fromkeys(COLUMNS)
    row.update(method=name, category=category, prompts=sum(len(units[i]) for i in unit_ids),
               tokens=tokens, seconds=seconds, tokens_per_second=rate, speedup=speedup,
               speedup_low=low, speedup_high=high,
               compile_seconds=total(mine, "compile_seconds"))
    if not method.speculative:
        row.update(tau=1.0, exact=True if greedy else None)
        return row
    forwards = max(total(mine, "target_forwards"), 1)
    tau = total(mine, "emitted") / forwards
    nodes = total(mine, "proposed") / forwards
    rule = mine[0].get("verification")
    row.update(tau=tau, acceptance=total(mine, "accepted") / max(total(mine, "proposed"), 1),
               nodes_per_step=nodes, verification=rule,
               exact=False if is_lossy_rule_name(rule) else (
                   (not any(e.get("mismatches") for e in mine)) if greedy else None))
    cost = costs.get(name)
    if cost is not None:
        one = cost["forward_seconds"]["1"]
        block = cost["draft_seconds"] / one
        verify = interpolated(cost["forward_seconds"], nodes + 1) / one
        ideal = tau / (block + verify)
        row.update(draft_block_cost=block, draft_cost=block / method.verify_nodes(),
                   verify_cost=verify, ideal_speedup=ideal, efficiency=speedup / ideal)
    return row


def speedup_chart(rows: Sequence[dict]) -> str:
    """An SVG bar chart: the speedup of each speculative method (bars) per category
    (groups), the 95% interval as a whisker, plain decoding (1x) as a dashed line."""
    bars = [r for r in rows if r["method"] != "plain"]
    categories = list(dict.fromkeys(r["category"] for r in bars))
    methods = list(dict.fromkeys(r["method"] for r in bars))
    if not bars:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="200" height="40"><text x="10" ' \
               'y="25">no speculative method</text></svg>\n'
    top = max(max(r["speedup_high"] or r["speedup"] for r in bars), 1.0) * 1.1
    height, left, bottom, bar = 320, 60, 260, 50
    width = max(left + 20 + bar * len(bars) + 40 * len(categories), left + 20 + 120 * len(methods))
    scale = (bottom - 30) / top
    colours = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
               "#ff9da7", "#9c755f", "#bab0ac"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             'font-family="sans-serif" font-size="11">',
             f'<line x1="{left}" y1="{bottom}" x2="{width - 10}" y2="{bottom}" stroke="black"/>',
             f'<line x1="{left}" y1="{bottom}" x2="{left}" y2="20" stroke="black"/>']
    for tick in np.linspace(0, top, 5):
        y = bottom - tick * scale
        parts.append(f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end">{tick:.1f}x'
                     '</text>')
    one = bottom - scale
    parts.append(f'<line x1="{left}" y1="{one:.1f}" x2="{width - 10}" y2="{one:.1f}" '
                 'stroke="gray" stroke-dasharray="4 3"/>')
    x = left + 20
    for category in categories:
        start = x
        for row in (r for r in bars if r["category"] == category):
            colour = colours[methods.index(row["method"]) % len(colours)]
            h = row["speedup"] * scale
            parts.append(f'<rect x="{x}" y="{bottom - h:.1f}" width="{bar - 8}" '
                         f'height="{h:.1f}" fill="{colour}"><title>{escape(row["method"])}, '
                         f'{escape(category)}: {row["speedup"]:.2f}x</title></rect>')
            if row["speedup_low"] is not None and math.isfinite(row["speedup_low"]):
                mid = x + (bar - 8) / 2
                y0, y1 = bottom - row["speedup_low"] * scale, bottom - row["speedup_high"] * scale
                parts.append(f'<line x1="{mid}" y1="{y0:.1f}" x2="{mid}" y2="{y1:.1f}" '
                             'stroke="black"/>')
            x += bar
        parts.append(f'<text x="{(start + x - 8) / 2:.1f}" y="{bottom + 15}" '
                     f'text-anchor="middle">{escape(category)}</text>')
        x += 40
    for i, method in enumerate(methods):
        lx = left + i * 120
        parts.append(f'<rect x="{lx}" y="290" width="10" height="10" '
                     f'fill="{colours[i % len(colours)]}"/><text x="{lx + 14}" y="299">'
                     f'{escape(method)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
