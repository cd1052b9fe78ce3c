"""specjax.cli.train_drafter: `specjax train-drafter` trains a head that `specjax generate`
then decodes with exactly; its help shows each model's defaults."""

import json

import pytest
from conftest import plain_cli, run_cli

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
    prompt = "def parse(source):\n    "
    plain = plain_cli("generate", prompt, "--json", "--max-new-tokens", "24", "--no-speculation")
    assert plain.returncode == 0, plain.stderr
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
        # Kangaroo with its early exit set from the command line.
        extra = ("--min-confidence", "0.2") if method == "kangaroo" else ()
        spec = run_cli("generate", prompt, "--json", "--max-new-tokens", "24", "--drafter", method,
                   "--head", str(out), *extra)
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


@pytest.mark.slow
def test_train_a_parallel_draft_then_generate_with_it(tmp_path):
    """`train-drafter --method pard` adapts the bundled draft into a parallel draft that
    `generate --drafter parallel --draft OUT` decodes with, greedy output equal to plain
    decoding; a resumed run continues it."""
    data = tmp_path / "corpus"
    corpus.build_corpus(max_files=30).save(data)
    out = tmp_path / "pard"
    common = ["--method", "pard", "--out", str(out), "--sequences", "16", "--seq-len", "40",
              "--prompt-len", "16", "--batch-size", "8", "--eval-batches", "1",
              "--eval-every", "2", "--log-every", "1", "--positions", "4", "--aligned",
              "--corpus", str(data)]
    first = run_cli("train-drafter", "--steps", "2", *common)
    assert first.returncode == 0, first.stderr
    assert "acceptance@4" in first.stdout and "expected_accepted" in first.stdout
    resumed = run_cli("train-drafter", "--steps", "3", *common)
    assert "resuming from step 2 of 3" in resumed.stderr, resumed.stderr
    assert json.loads((out / "parallel.json").read_text()) == {"mask_id": 255,
                                                                "positions": 4}
    prompt = "def parse(source):\n    "
    spec = run_cli("generate", prompt, "--json", "--max-new-tokens", "24", "--drafter",
                   "parallel", "--draft", str(out), "--num-draft-tokens", "4")
    plain = plain_cli("generate", prompt, "--json", "--max-new-tokens", "24",
                      "--no-speculation")
    assert spec.returncode == 0, spec.stderr
    assert json.loads(spec.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    stats = json.loads(spec.stdout)["stats"]
    assert stats["draft_forwards"] == stats["target_forwards"]


@pytest.mark.slow
def test_train_a_p_eagle_head_then_generate_with_it(tmp_path):
    """`train-drafter --method p-eagle` adapts the bundled EAGLE-3 head into a P-EAGLE head
    that `generate --drafter p-eagle --head OUT` decodes with (one head forward per step),
    greedy output equal to plain decoding; a resumed run continues it."""
    data = tmp_path / "corpus"
    corpus.build_corpus(max_files=30).save(data)
    out = tmp_path / "p-eagle"
    common = ["--method", "p-eagle", "--out", str(out), "--sequences", "16", "--seq-len",
              "40", "--prompt-len", "16", "--batch-size", "8", "--eval-batches", "1",
              "--eval-every", "2", "--log-every", "1", "--positions", "4", "--corpus",
              str(data)]
    first = run_cli("train-drafter", "--steps", "2", *common)
    assert first.returncode == 0, first.stderr
    assert "acceptance@4" in first.stdout and "expected_accepted" in first.stdout
    resumed = run_cli("train-drafter", "--steps", "3", *common)
    assert "resuming from step 2 of 3" in resumed.stderr, resumed.stderr
    assert json.loads((out / "head.json").read_text())["config"]["mask_id"] == 255
    assert json.loads((out / "metadata.json").read_text())["steps_done"] == 3
    prompt = "def parse(source):\n    "
    spec = run_cli("generate", prompt, "--json", "--max-new-tokens", "24", "--drafter",
                   "p-eagle", "--head", str(out), "--num-draft-tokens", "4")
    plain = plain_cli("generate", prompt, "--json", "--max-new-tokens", "24",
                      "--no-speculation")
    assert spec.returncode == 0, spec.stderr
    assert json.loads(spec.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    stats = json.loads(spec.stdout)["stats"]
    assert stats["draft_forwards"] == stats["target_forwards"]


@pytest.mark.parametrize("args,message", [
    (["--mask-id", "259"], "--mask-id 259 is outside the draft's vocabulary"),
    (["--positions", "0"], "--positions must be an int in [1, 64]"),
    (["--cod-ratio", "1.5"], "--cod-ratio must be a number in (0, 1]"),
    (["--mask-id", "65"], "--mask-id 65 is the byte 0x41, which UTF-8 text holds ('A'"),
    (["--mask-id", "200"], "--mask-id 200 is the byte 0xc8, which UTF-8 text holds"),
    (["--positions", "40", "--seq-len", "64", "--prompt-len", "8", "--cod-min", "0.01"],
     "--positions 40: with --seq-len 64 and COD"),
])
def test_parallel_training_refuses_bad_settings_before_any_data(tmp_path, args, message):
    out = run_cli("train-drafter", "--method", "pard", "--out", str(tmp_path / "p"), *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "p" / "data.npz").exists()


def test_draft_is_for_parallel_training_only(tmp_path):
    out = run_cli("train-drafter", "--method", "eagle3", "--draft", str(tmp_path),
                  "--out", str(tmp_path / "h"))
    assert out.returncode == 2 and "--draft is the draft model --method pard adapts" in \
        out.stderr
