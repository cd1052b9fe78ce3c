"""specjax.cli: the `specjax` command (its parser, errors and compilation cache): bad
input is one line and exit status 2 before anything loads, `--help` and errors need no
jax, compiled programs go to the cache folder."""

import os
import subprocess
import sys

import pytest
from conftest import run_cli


@pytest.mark.parametrize("args, message", [
    (["generate", "x", "--target", "/nonexistent/ckpt"], "/nonexistent/ckpt does not exist"),
    (["generate", "x", "--temperature", "-1"], "temperature must be >= 0"),
    (["generate", "x", "--num-draft-tokens", "0"], "--num-draft-tokens must be an int >= 1"),
    (["generate", "x", "--top-p", "0"], "top_p must be in"),
    (["generate", "x", "--max-ngram-size", "0"], "max_ngram_size must be an int >= 1"),
    (["generate", "x", "--max-new-tokens", "5000"], "exceed the model's max_seq_len"),
    (["generate", "x", "--prefill-chunk", "0"], "--prefill-chunk must be >= 1"),
    (["generate", "x", "--dynamic-tree", "16,6"], "--dynamic-tree takes NODES,DEPTH,TOP_K"),
    (["generate", "x", "--dynamic-tree", "99,2,3"], "exceeds the 12 nodes"),
    (["generate", "x", "--dynamic-tree", "8,3,2", "--drafter", "prompt-lookup"],
     "--dynamic-tree needs a drafter that scores tokens"),
    (["generate", "x", "--drafter", "medusa", "--head", "/nonexistent"],
     "--head /nonexistent holds no trained head"),
    (["generate", "x", "--head", "/tmp"], "holds no trained head"),
    (["generate", "x", "--model", "smollm2", "--drafter", "medusa"],
     "the shipped heads belong to the bundled target"),
    (["train-drafter", "--model", "smollm2", "--method", "mtp", "--out", "/tmp/x"],
     "--model smollm2 trains an EAGLE-3 head"),
    (["generate", "x", "--model", "smollm2", "--drafter", "mtp"],
     "pass --head DIR with a head trained on this target"),
    (["generate", "x", "--drafter", "lookahead", "--min-confidence", "0.5"],
     "model, eagle, eagle3, mtp, kangaroo, parallel, p-eagle or layer-skip"),
    (["train-drafter", "--model", "smollm2", "--method", "eagle3", "--out", "/tmp/x",
      "--chat-prompts", "4", "--rewrite-prompts", "8"], "--rewrite-prompts at most"),
    (["train-drafter", "--model", "smollm2", "--method", "eagle3", "--out", "/tmp/x",
      "--target", "/tmp"], "--target is for the bundled model"),
    (["train-drafter", "--model", "smollm2", "--method", "eagle3", "--out", "/tmp/x",
      "--data-temperature", "0"], "--data-temperature must be > 0"),
    (["generate", "x", "--min-confidence", "0"], "--min-confidence must be None"),
    (["generate", "x", "--drafter", "prompt-lookup", "--min-confidence", "0.3"],
     "--min-confidence needs a drafter that scores its drafts"),
    (["generate", "x", "--dynamic-tree", "8,3,2", "--min-confidence", "0.3"],
     "--min-confidence is for chains"),
    (["train-drafter", "--method", "draft", "--out", "/tmp/x"],
     "--method draft distils a layer draft of SmolLM2"),
    (["train-drafter", "--model", "smollm2", "--method", "draft", "--out", "/tmp/x",
      "--draft-layers", "0,x"], "--draft-layers takes target layer indices"),
    (["generate", "x", "--model", "smollm2", "--drafter", "model", "--draft", "/nope"],
     "--draft /nope does not exist"),
    (["train-drafter", "--method", "eagle3", "--out", "/tmp/x", "--target", "/nope"],
     "/nope does not exist"),
    (["distill", "--target", "/nope", "--draft", "/nope", "--out", "/tmp/x"],
     "/nope does not exist"),
    (["train-drafter", "--method", "p-eagle", "--out", "/tmp/x", "--mask-id", "300"],
     "--mask-id 300 is outside the target's vocabulary"),
    (["train-drafter", "--method", "p-eagle", "--out", "/tmp/x", "--draft", "BUNDLED/medusa"],
     "starts from an EAGLE-1 or EAGLE-3 head; this one is 'medusa'"),
    (["train-drafter", "--method", "p-eagle", "--out", "/tmp/x", "--target",
      "BUNDLED/target"], "with --target, pass --draft HEAD_DIR"),
    (["generate", "x", "--drafter", "p-eagle", "--head", "BUNDLED/eagle3"],
     "drafts autoregressively (no placeholder)"),
    (["generate", "x", "--seed", str(2**70)], "is outside [0, 2**63 - 1]"),
    (["generate", "x", "--seed", "-1"], "argument --seed: -1 is outside"),
    (["generate", "x", "--top-k", "many"], "argument --top-k: invalid int value"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    """In this process (`main`, as the script runs it; the compilation cache left alone):
    a fresh process per case cost a jax import each. The subprocess path is checked
    below on two of them."""
    import specjax_models
    from specjax.cli import main

    bundled = str(specjax_models.bundled.CHECKPOINTS)
    args = [arg.replace("BUNDLED", bundled) for arg in args]
    assert main([*args, "--no-compilation-cache"]) == 2
    out = capsys.readouterr()
    assert message in out.err and len(out.err.strip().splitlines()) == 1
    assert "Traceback" not in out.err
    assert out.out == ""  # refused before the prompt is echoed


@pytest.mark.parametrize("args, message", [
    (["generate", "x", "--temperature", "-1"], "temperature must be >= 0"),
    (["train-drafter", "--method", "draft", "--out", "/tmp/x"],
     "--method draft distils a layer draft of SmolLM2"),
])
def test_bad_input_from_the_script_is_one_line_and_exit_2(args, message):
    out = run_cli(*args)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_help_and_input_errors_load_no_jax():
    """`specjax --help` and options refused before any library check answer before jax,
    the decoders or the models load (that is what keeps them instant; a value the library
    validates, such as a temperature, loads the sampling module first)."""
    probe = ("import sys\n"
             "from specjax.cli import main\n"
             "for argv in (['generate', 'x', '--max-new-tokens', '0'],\n"
             "             ['generate', 'x', '--target', '/nonexistent'], ['--help']):\n"
             "    try:\n"
             "        main(argv)\n"
             "    except SystemExit:\n"
             "        pass\n"
             "heavy = sorted(m for m in ('jax', 'flax', 'specjax_models',\n"
             "                           'specjax.decoding.step')\n"
             "               if m in sys.modules)\n"
             "print('loaded:', heavy, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert "loaded: []" in out.stderr, out.stderr


@pytest.mark.slow
def test_compiled_programs_go_to_the_cache_folder_unless_turned_off(tmp_path):
    # With speculation: its decoder compiles for well over the cache's 0.2 s threshold
    # (plain decoding's, at the tests' fast-compile flags, can fall under it).
    args = ("generate", "x = 1\n", "--max-new-tokens", "4", "--quiet")
    env = dict(os.environ, SPECJAX_COMPILATION_CACHE=str(tmp_path / "cache"))
    off = run_cli(*args, "--no-compilation-cache", env=env)
    assert off.returncode == 0, off.stderr
    assert not (tmp_path / "cache").exists()
    on = run_cli(*args, env=env)
    assert on.returncode == 0, on.stderr
    assert any((tmp_path / "cache").iterdir())
    assert on.stdout == off.stdout


def test_layers_auto_scans_short_requests_only_before_anything_is_measured():
    """With no timings recorded (the suite turns them off), `--layers auto` scans the
    target's layers up to SCANNED_UP_TO_TOKENS new tokens and unrolls them beyond; an
    explicit layout is kept; the choice and its reason are left on the arguments."""
    import argparse

    from specjax.cli.common import add_layers_option, scan_layers
    from specjax.cli.layouts import SCANNED_UP_TO_TOKENS

    parser = argparse.ArgumentParser()
    add_layers_option(parser)
    parse = lambda *argv, n: argparse.Namespace(**vars(parser.parse_args(argv)),
                                                max_new_tokens=n, model="bundled",
                                                target="target", drafter=None, draft=None)
    assert scan_layers(parse(n=16)) and scan_layers(parse(n=SCANNED_UP_TO_TOKENS))
    args = parse(n=SCANNED_UP_TO_TOKENS + 1)
    assert not scan_layers(args)
    assert args.layers_chosen == "unrolled" and "nothing measured" in args.layers_reason
    assert scan_layers(parse("--layers", "scanned", n=1000))
    assert not scan_layers(parse("--layers", "unrolled", n=1))
    with pytest.raises(SystemExit):
        parser.parse_args(["--layers", "stacked"])


def test_a_16_bit_checkpoint_decoded_on_a_cpu_loads_in_float32_where_it_fits(tmp_path):
    """XLA's CPU backend converts 16-bit kernels to float32 in every step (Llama-3.2-1B's
    shape: 9x slower in bfloat16, docs/benchmarks.md): --hf loads a bfloat16 checkpoint
    in float32 on a CPU when twice its weights fit, and leaves other cases alone."""
    import json

    from specjax.cli.loading import cpu_decoding_dtype

    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    assert cpu_decoding_dtype(str(tmp_path), "cpu", 10_000) == "float32"
    assert cpu_decoding_dtype(str(tmp_path), "cpu", 2_500) is None  # would not fit
    assert cpu_decoding_dtype(str(tmp_path), "gpu", 10_000) is None  # bf16 is native there
    assert cpu_decoding_dtype(str(tmp_path), "cpu", None) is None  # memory unknown
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
    assert cpu_decoding_dtype(str(tmp_path), "cpu", 10_000) is None
    assert cpu_decoding_dtype(str(tmp_path / "missing"), "cpu", 10_000) is None
