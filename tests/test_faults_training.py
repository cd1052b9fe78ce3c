"""Fault injection for training: a run SIGKILLed during a step, or while a checkpoint is
being written (orbax writes it in the background; the kill lands before it completes),
resumes from its last complete checkpoint and ends with bit-identical parameters and the
same metrics history as a run never interrupted; a history line cut short by a kill is
dropped. Next-token training and feature-head training share the loop; both are killed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent

RUN = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    import jax, numpy as np
    from conftest import build_lm, tiny_config
    import specjax_models
    from specjax.training import (HeadTrainConfig, TrainConfig, checkpoints, train,
                                  train_head)

    out, kind, fault = sys.argv[1], sys.argv[2], sys.argv[3]
    config = TrainConfig(steps=12, warmup_steps=2, checkpoint_every=3, eval_every=6,
                         log_every=1)
    where, _, at = fault.partition(":")
    if where == "save":  # killed while orbax writes the checkpoint of step `at`
        original = checkpoints.save
        def save(manager, step, params, opt_state):
            original(manager, step, params, opt_state)
            if step == int(at):
                os.kill(os.getpid(), signal.SIGKILL)
        checkpoints.save = save
    def killing(batch_of):  # killed when step `at` starts
        def batches(step, *rest):
            if where == "step" and step == int(at):
                os.kill(os.getpid(), signal.SIGKILL)
            return batch_of(step, *rest)
        return batches
    lm = build_lm(0)
    data = np.random.default_rng(7).integers(0, 32, (40, 17)).astype(np.int32)
    if kind == "train":
        result = train(lm, killing(lambda step: data[step % 4 * 8: step % 4 * 8 + 8]),
                       config, checkpoint_dir=out + "/run", heldout=[data[32:]],
                       progress=False)
    else:
        head = specjax_models.create_head("eagle3", lm, tiny_config(), seed=1)
        import specjax.training.heads as heads_module
        epoch_batches = heads_module.epoch_batches
        heads_module.epoch_batches = lambda *a: killing(epoch_batches(*a))
        result = train_head(head, lm, data[:32], config, HeadTrainConfig(method="eagle3"),
                            batch_size=8, checkpoint_dir=out + "/run", heldout=[data[32:]],
                            progress=False)
    leaves = jax.tree.leaves(result.lm.params)
    np.savez(out + "/final.npz", *[np.asarray(x) for x in leaves])
""").format(tests=str(TESTS))


def run(out: Path, kind: str, fault: str = "none") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN, str(out), kind, fault],
                          capture_output=True, text=True, timeout=600)


def final(out: Path) -> list[np.ndarray]:
    with np.load(out / "final.npz") as saved:
        return [saved[name] for name in sorted(saved.files, key=lambda n: int(n[4:]))]


def history(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "run" / "history.jsonl").read_text()
            .splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    runs = {}
    for kind in ("train", "head"):
        out = tmp_path_factory.mktemp(f"whole_{kind}")
        done = run(out, kind)
        assert done.returncode == 0, done.stderr
        runs[kind] = out
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("kind, fault", [("train", "step:7"), ("train", "save:6"),
                                         ("head", "step:5"), ("head", "save:9")])
def test_a_killed_run_resumes_to_the_same_result(uninterrupted, tmp_path, kind, fault):
    killed = run(tmp_path, kind, fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (tmp_path / "final.npz").exists()
    if fault == "step:7":  # and a history line that the kill cut short
        with open(tmp_path / "run" / "history.jsonl", "a") as f:
            f.write('{"step": 7, "lo')
    resumed = run(tmp_path, kind)
    assert resumed.returncode == 0, resumed.stderr
    for ours, theirs in zip(final(tmp_path), final(uninterrupted[kind]), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert history(tmp_path) == history(uninterrupted[kind])
