"""benchmarks/device.sh, the accelerator session's one script, dry-run on CPU at CI size so
that it cannot rot between the sessions that get a device."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_device_script_runs_every_measurement_at_ci_size(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable, BUDGET_S="900")
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "device.sh"), "--dry-run"],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "device.json").read_text())
    assert result["skipped"] == []
    curves = {(r["model"], r["dtype"], r["layout"]) for r in result["verify"]}
    assert curves == {("bundled", dtype, layout) for dtype in ("float32", "bfloat16")
                      for layout in ("unrolled", "scan")}
    for row in result["verify"]:
        assert row["ms"] > 0 and (row["tokens"] > 1 or row["steps"] == 1.0)
    decoders = {r["decoder"] for r in result["decode"]}
    assert decoders == {"draft model, chain K=4", "EAGLE-3, dynamic tree 16",
                        "prompt lookup, chain K=4", "lookahead W=7 N=4 G=7",
                        "retrieval, own text, 16 nodes",
                        "layer skip, odd inner blocks, chain K=4",
                        "published EAGLE-3 layout (random), dynamic tree 16",
                        "draft model, chain K=4, target on a one-device mesh"}
    for row in result["decode"]:
        assert row["greedy_identical"] is True  # greedy: the same tokens as plain decoding
        # A dry run's timings are a few milliseconds: numbers, not measurements.
        assert row["tau"] >= 1.0 and math.isfinite(row["decode_speedup"])
    moe = {(r["model"], r["tokens"]) for r in result["moe"]}
    assert moe == {(model, n) for model in ("moe", "dense") for n in (1, 2, 3)}
    assert all(r["model_steps"] >= 1.0 for r in result["moe"] if r["model"] == "moe")
    report = (tmp_path / "device.md").read_text()
    assert "Verify cost v(K)" in report and "Decode-phase speedup" in report
    assert "v(n) of a mixture of experts" in report
    assert (tmp_path / "machine.txt").exists()
    # The roofline at the smallest real size: forwards against the limits, the oracle.
    roofline = result["roofline"]
    forwards = [r for r in roofline.values() if "width" in r]
    assert {(r["batch"], r["width"]) for r in forwards} == {(1, 1), (1, 2)}
    assert all(r["bytes"] > 1e9 and 0 < r["limit_fraction"] for r in forwards)
    oracle = next(r for r in roofline.values() if "efficiency" in r)
    assert oracle["exact"] is True and oracle["tau"] > 3.0
    assert "| qwen2.5-0.5b | float32 | unrolled | 1 | 2 |" in (
        tmp_path / "roofline.md").read_text()
