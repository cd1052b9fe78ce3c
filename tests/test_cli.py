"""specjax.cli: the commands run end to end in a subprocess, with one-line errors."""

import json
import subprocess
import sys

import pytest

from specjax_models import corpus


def run(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "specjax.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_generate_json_speculative_equals_plain_greedy():
    prompt = "def parse(source, filename):\n    "
    spec = run("generate", prompt, "--json", "--max-new-tokens", "40", "--num-draft-tokens", "4")
    plain = run("generate", prompt, "--json", "--max-new-tokens", "40", "--no-speculation")
    assert spec.returncode == 0, spec.stderr
    assert plain.returncode == 0, plain.stderr
    spec_out, plain_out = json.loads(spec.stdout), json.loads(plain.stdout)
    assert spec_out["tokens"] == plain_out["tokens"] and len(spec_out["tokens"]) > 0
    assert spec_out["stats"]["acceptance_rate"] > 0.3
    assert plain_out["stats"] is None and spec_out["speculative"] is True
    lookup = run("generate", prompt, "--json", "--max-new-tokens", "40", "--drafter",
                 "prompt-lookup", "--max-ngram-size", "2")
    assert lookup.returncode == 0, lookup.stderr
    lookup_out = json.loads(lookup.stdout)
    assert lookup_out["tokens"] == plain_out["tokens"]
    assert lookup_out["stats"]["draft_forwards"] == [0]


def test_demo_streams_and_reports_speed():
    out = run("demo", "--max-new-tokens", "24", "--prompts", "1", "--color", "never")
    assert out.returncode == 0, out.stderr
    assert "(held out)" in out.stdout
    assert "acceptance rate" in out.stdout and "speedup" in out.stdout
    assert "prompt lookup: acceptance rate" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["generate", "x", "--target", "/nonexistent/ckpt"], "not a specjax checkpoint"),
    (["generate", "x", "--temperature", "-1"], "temperature must be >= 0"),
    (["generate", "x", "--num-draft-tokens", "0"], "--num-draft-tokens must be >= 1"),
    (["generate", "x", "--top-p", "0"], "top_p must be in"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_train_then_distill_end_to_end(tmp_path):
    data = tmp_path / "corpus"
    corpus.build_corpus(max_files=30).save(data)
    common = ["--steps", "3", "--batch-size", "2", "--seq-len", "32", "--eval-batches", "1",
              "--log-every", "1", "--corpus", str(data)]
    target = run("train", "--config", "draft", "--out", str(tmp_path / "t"), *common)
    assert target.returncode == 0, target.stderr
    assert "trained 3 steps" in target.stdout
    draft = run("distill", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "t"),
                "--out", str(tmp_path / "d"), "--divergence", "tvd", *common)
    assert draft.returncode == 0, draft.stderr
    assert (tmp_path / "d" / "params").exists() and (tmp_path / "d" / "metadata.json").exists()
    gen = run("generate", "import os", "--target", str(tmp_path / "t"), "--draft",
              str(tmp_path / "d"), "--json", "--max-new-tokens", "8")
    assert gen.returncode == 0, gen.stderr
