"""Benchmarks as a library (`specjax bench` is its command line): the run
(`runner`: every method's decode speed against plain decoding, acceptance, measured step
costs and exactness, resumable), its journal (`journal`), its prompts (`prompts`), its
report (`report`: rows, markdown, JSON, CSV, a chart) and the analytical speed model the
measurements are compared with (`analysis`, also `specjax.analysis`). Imports run one way:
runner -> report -> prompts. The package's attributes are `runner`'s public names
(`specjax.bench.run`, ...)."""

from __future__ import annotations

from specjax.runtime.lazy import lazy_attributes

# Public name -> the module that defines it; any other name loads as a submodule.
_SOURCES = {
    "PLAIN": "specjax.bench.runner",
    "BenchMethod": "specjax.bench.runner",
    "plan_units": "specjax.bench.runner",
    "unit_shape": "specjax.bench.runner",
    "measure_unit": "specjax.bench.runner",
    "first_difference": "specjax.bench.runner",
    "measure_costs": "specjax.bench.runner",
    "describe_drafter": "specjax.bench.runner",
    "fingerprint": "specjax.bench.runner",
    "run": "specjax.bench.runner",
}

__getattr__, __dir__ = lazy_attributes(__name__, _SOURCES, globals())
