"""benchmarks/machines/roofline.py: the bytes and FLOPs a forward must move and do (by hand for a
small config), rows measured, resumed without measuring again, and the oracle loop's
efficiency against its ideal."""

import json

import pytest
from test_real_sizes import TINY

from benchmarks.machines import roofline
from specjax_models import real_sizes


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(real_sizes.PUBLISHED, "tiny", TINY)
    return real_sizes.real_size_config("tiny", "float32", max_seq_len=64)


def test_the_cost_model_counts_weights_cache_and_matmuls(tiny):
    costs = roofline.model_costs(tiny)
    # embedding 96x32 (a lookup: no matmul) + LM head 32x96 + 2 layers of q, o 32x32, k, v
    # 32x16, gate, up 32x64, down 64x32 and two norms, + the final norm: float32.
    layer = 2 * 1024 + 2 * 512 + 3 * 2048
    assert costs["param_bytes"] == 4 * (3072 + 3072 + 2 * (layer + 64) + 32)
    assert costs["matmul_params"] == 3072 + 2 * layer
    # layers x K,V x kv heads x dim, float32, and the slot's int32 position
    assert costs["kv_bytes_per_slot"] == 2 * 2 * 2 * 8 * 4 + 4
    assert costs["attention_macs_per_slot"] == 2 * 4 * (8 + 8)  # layers x heads x (QK + PV)
    assert roofline.forward_bytes(costs, 2, 3, 10) == costs["param_bytes"] + 260 * 2 * 13
    assert roofline.forward_flops(costs, 2, 3, 10) == 2 * 6 * (costs["matmul_params"]
                                                                + 128 * 13)


def test_rows_are_measured_once_and_the_oracle_reaches_its_ideal(tiny, tmp_path):
    probes = {"bandwidth": 1e10, "peak_float32": 1e11}
    rows, done, built = tmp_path / "r.jsonl", {}, []

    def build(config):
        built.append(config)
        return real_sizes.random_model("tiny", "float32", max_seq_len=config.max_seq_len)

    for _ in range(2):  # the second pass finds every row and builds nothing
        roofline.measure_forwards("tiny", tiny, build, [1, 2], [1, 3], 16, 1, 1, rows, done,
                                  probes)
    assert len(built) == 1
    measured = [json.loads(line) for line in rows.read_text().splitlines()]
    assert [(r["batch"], r["width"]) for r in measured] == [(1, 1), (1, 3), (2, 1), (2, 3)]
    for r in measured:
        assert r["seconds"] > 0 and r["limit_fraction"] == pytest.approx(
            max(r["bytes"] / 1e10, r["flops"] / 1e11) / r["seconds"])
        assert r["v"] == pytest.approx(r["seconds"] / next(
            m["seconds"] for m in measured if m["batch"] == r["batch"] and m["width"] == 1))
    assert roofline._done(rows).keys() == done.keys()
    lm = build(real_sizes.real_size_config("tiny", "float32", max_seq_len=64))
    roofline.measure_oracle("tiny", lm, 3, 8, rows, done)
    oracle = done["oracle/tiny/float32/k3/n8"]
    assert oracle["tau"] > 3.0 and oracle["exact"] is True  # every draft accepted
    assert oracle["efficiency"] == pytest.approx(oracle["speedup"] / oracle["ideal"])
    text = roofline.markdown(done, {**probes, "copy_bytes_per_s": 1e10, "read_bytes_per_s": 1e10,
                                    "stream_bytes_per_s": 1e10, "bandwidth_source": "test"},
                             {"cpu_model": "a CPU", "cpu_count": 2}, "python -m x")
    assert "| tiny | float32 | unrolled | 2 | 3 |" in text and "| tiny | float32 | 3 | 8 |" in text


def test_chips_are_known_by_their_device_kind():
    assert roofline.chip_spec("NVIDIA H100 80GB HBM3")[0] == 3.35e12
    assert roofline.chip_spec("NVIDIA H200")[0] == 4.8e12
    assert roofline.chip_spec("some new chip") is None
