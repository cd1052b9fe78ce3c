"""specjax.cli.train: `specjax train` then `specjax distill` end to end, resumable."""

import pytest
from conftest import run_cli

from specjax_models.recipes import stdlib_corpus as corpus


@pytest.mark.slow
def test_train_then_distill_end_to_end(tmp_path):
    data = tmp_path / "corpus"
    corpus.build_corpus(max_files=30).save(data)
    common = ["--steps", "3", "--batch-size", "2", "--seq-len", "32", "--eval-batches", "1",
              "--log-every", "1", "--corpus", str(data)]
    target = run_cli("train", "--config", "draft", "--out", str(tmp_path / "t"), *common)
    assert target.returncode == 0, target.stderr
    assert "trained 3 steps" in target.stdout
    for phase in ("loading the corpus",
                  "compiling the training step", "first step done", "saving to"):
        assert phase in target.stderr, phase
    assert "loss (nats/token)" in target.stderr and "held-out bits/token" in target.stderr
    resumed = run_cli("train", "--config", "draft", "--out", str(tmp_path / "t"),
                  *common[:1], "4", *common[2:])
    assert "resuming from step 3 of 4" in resumed.stderr, resumed.stderr
    draft = run_cli("distill", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "t"),
                "--out", str(tmp_path / "d"), "--divergence", "tvd", *common)
    assert draft.returncode == 0, draft.stderr
    assert (tmp_path / "d" / "params").exists() and (tmp_path / "d" / "metadata.json").exists()
    gen = run_cli("generate", "import os", "--target", str(tmp_path / "t"), "--draft",
              str(tmp_path / "d"), "--json", "--max-new-tokens", "8")
    assert gen.returncode == 0, gen.stderr
