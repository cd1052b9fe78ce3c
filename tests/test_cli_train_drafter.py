"""specjax.cli.train_drafter: `specjax train-drafter` trains a head that `specjax generate`
then decodes with exactly; its help shows each model's defaults."""

import json

import pytest
from conftest import run_cli

from specjax_models.recipes import stdlib_corpus as corpus


@pytest.mark.slow
def test_train_drafter_then_generate_with_it(tmp_path):
    """`specjax train-drafter` end to end (generate data, train, save), a resumed run, then
    `generate --drafter ... --head` whose greedy output equals plain decoding."""
    data = tmp_path / "corpus"
    corpus.build_corpus(max_files=30).save(data)
    common = ["--sequences", "16", "--seq-len", "40", "--prompt-len", "16", "--batch-size",
              "8", "--eval-batches", "1", "--eval-every", "2", "--log-every", "1",
              "--corpus", str(data)]
    for method in ("eagle3", "medusa", "kangaroo"):
        out = tmp_path / method
        first = run_cli("train-drafter", "--method", method, "--out", str(out), "--steps", "2",
                    *common)
        assert first.returncode == 0, first.stderr
        assert "held-out expected acceptance" in first.stdout
        assert "acceptance@1" in first.stderr and "generating 16 + 8" in first.stderr
        resumed = run_cli("train-drafter", "--method", method, "--out", str(out), "--steps", "3",
                      *common)
        assert "reusing the generated data" in resumed.stderr
        assert "resuming from step 2 of 3" in resumed.stderr, resumed.stderr
        meta = json.loads((out / "metadata.json").read_text())
        assert meta["steps_done"] == 3 and meta["method"] == method
        prompt = "def parse(source):\n    "
        # Kangaroo with its early exit set from the command line.
        extra = ("--min-confidence", "0.2") if method == "kangaroo" else ()
        spec = run_cli("generate", prompt, "--json", "--max-new-tokens", "24", "--drafter", method,
                   "--head", str(out), *extra)
        plain = run_cli("generate", prompt, "--json", "--max-new-tokens", "24", "--no-speculation")
        assert spec.returncode == 0, spec.stderr
        assert json.loads(spec.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]


def test_an_exit_layer_beyond_the_target_is_refused_before_any_data(tmp_path):
    out = run_cli("train-drafter", "--method", "kangaroo", "--exit-layer", "6", "--out",
                  str(tmp_path / "k"))
    assert out.returncode == 2
    assert "--exit-layer 6: the target has 6 blocks" in out.stderr
    assert not (tmp_path / "k" / "data.npz").exists()


def test_train_drafter_help_shows_each_models_defaults():
    out = run_cli("train-drafter", "--help")
    assert out.returncode == 0 and "default: None" not in out.stdout
    assert "1500 bundled, 600 smollm2" in " ".join(out.stdout.split())
