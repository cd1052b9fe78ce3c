"""Where one entry of the exactness registry spends its time: its chi-square call
(tests/test_exactness.py, `speculative_joint_pvalues` over 36,256 rows) made twice in one
process, the first call making its programs, the second only decoding.

    python -m benchmarks.machines.registry_entry_time "draft model, chain, sampled"
    python -m benchmarks.machines.registry_entry_time "draft model, dynamic tree, top-k" --level 1

Run from the repository root. The process takes the test suite's XLA settings
(tests/conftest.py: -O0 and the rest); `--level` compiles the entry's decoder at another
optimisation level. Prints each call's seconds, the programs it made (JAX's tracing,
lowering and XLA backend seconds; a call that finds its programs compiled makes none) and
the p-values (identical across levels: the same draws).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("entry", help="a name in tests/test_exactness.py's ENTRIES")
    parser.add_argument("--level", type=int, choices=(0, 1, 2, 3), default=None,
                        help="XLA backend optimisation level of the entry's decoder "
                             "(default: the harness's own choice)")
    parser.add_argument("--calls", type=int, default=2, help="calls in this process")
    args = parser.parse_args(argv)
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import conftest  # noqa: F401  (the test suite's XLA flags, set before jax starts)
    import test_exactness as registry
    from conftest import MICRO, build_lm

    import specjax.testing as harness
    from benchmarks.machines.suite_profile import CompileEvents
    from specjax.testing import perturbed

    if args.entry not in registry.ENTRIES:
        parser.error(f"no entry {args.entry!r}; the entries: {sorted(registry.ENTRIES)}")
    micro = build_lm(3, **MICRO)  # tests/conftest.py's micro_lm and its close draft
    close = perturbed(micro, 0.1, seed=2)
    options = {}
    if args.level is not None:
        # The harness's own block (level 1 for trees) would override this process's.
        harness.HARNESS_CPU_COMPILER_OPTIONS = {}
        options = {"xla_backend_optimization_level": args.level}
    events = CompileEvents().start()
    for call in range(args.calls):
        before = events.snapshot()
        start = time.perf_counter()
        with harness.compiler_options(**options):
            pvalues, _ = registry.chi_square_call(args.entry, micro, close)
        seconds = time.perf_counter() - start
        made = events.snapshot() - before  # this call's compile events only
        print(f"call {call}: {seconds:.2f} s ({made['programs']} programs made: trace "
              f"{made['trace']:.2f} s, lowering {made['lowering']:.2f} s, backend "
              f"{made['backend']:.2f} s), p-values {[round(float(p), 3) for p in pvalues]}",
              flush=True)
    events.stop()


if __name__ == "__main__":
    main()
