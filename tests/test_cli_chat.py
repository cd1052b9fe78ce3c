"""specjax.cli.chat: `specjax chat` answers each stdin line in turn, one speed line per
reply, the conversation kept."""

import pytest
from conftest import run_cli, smollm2_or_skip


@pytest.mark.slow
def test_chat_answers_each_line_with_one_speed_line_per_reply():
    smollm2_or_skip()
    chat = run_cli("chat", "--color", "never", "--max-new-tokens", "24",
                   input="Hi!\nWhat is 2 + 2?\n", timeout=400)
    assert chat.returncode == 0, chat.stderr
    assert chat.stderr.count("tokens per target forward") == 2  # one line per reply
    assert "4" in chat.stdout


def test_chat_refuses_bad_options_before_loading():
    out = run_cli("chat", "--num-draft-tokens", "0")
    assert out.returncode == 2 and "--num-draft-tokens" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and out.stdout == ""


@pytest.mark.slow
def test_chat_with_retrieval_remembers_its_replies():
    """--drafter retrieval: SmolLM2's shipped datastore, then each reply joins it; the
    second, identical question's reply is drafted from the first."""
    smollm2_or_skip()
    chat = run_cli("chat", "--color", "never", "--max-new-tokens", "24", "--drafter",
                   "retrieval", "--temperature", "0", input="What is 2 + 2?\n" * 2,
                   timeout=400)
    assert chat.returncode == 0, chat.stderr
    taus = [float(line.split("tau ")[1].split()[0]) for line in chat.stderr.splitlines()
            if "tokens per target forward" in line]
    assert len(taus) == 2 and taus[1] > 1.0


def test_adapt_needs_a_draft_model():
    out = run_cli("chat", "--adapt", "--drafter", "prompt-lookup")
    assert out.returncode == 2 and "--adapt trains the chat's draft model" in out.stderr


@pytest.mark.slow
def test_chat_adapts_its_draft_after_each_reply():
    """--adapt with the shipped distilled draft: after each reply the draft takes optimizer
    steps on the chat so far (its loss reported), and the next reply drafts with it."""
    smollm2_or_skip()
    chat = run_cli("chat", "--color", "never", "--max-new-tokens", "16", "--drafter", "model",
                   "--adapt", "--temperature", "0", input="Hi!\nWhat is 2 + 2?\n",
                   timeout=600, real_checkpoint=True)
    assert chat.returncode == 0, chat.stderr
    assert chat.stderr.count("[draft adapted to this chat: loss") == 2
    assert chat.stderr.count("tokens per target forward") == 2


@pytest.mark.slow
def test_chat_with_a_hugging_face_model_and_a_published_head(tmp_path):
    """--hf DIR --drafter-dir DIR: the chat template of the model's tokenizer, an EAGLE-3
    head in the speculators layout; greedy replies equal plain decoding's."""
    from conftest import tiny_hub_model

    from specjax_models.published_layouts import SyntheticShape, write_synthetic_drafter

    model = tiny_hub_model(tmp_path / "model", 2)
    head = write_synthetic_drafter(tmp_path / "head", "eagle3-speculators", SyntheticShape(
        d_model=32, vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        draft_vocab_size=40), scale=0.3)
    common = ("chat", "--hf", str(model), "--color", "never", "--max-new-tokens", "8",
              "--temperature", "0")
    lines = "write a haiku\nthe jax of haiku\n"
    spec = run_cli(*common, "--drafter-dir", str(head), input=lines, timeout=400)
    plain = run_cli(*common, "--no-speculation", input=lines, timeout=400)
    assert spec.returncode == 0 and plain.returncode == 0, spec.stderr + plain.stderr
    assert spec.stdout == plain.stdout and spec.stdout.strip()
    assert spec.stderr.count("tokens per target forward") == 2


def test_chat_refuses_hf_with_model():
    out = run_cli("chat", "--hf", ".", "--model", "smollm2")
    assert out.returncode == 2 and "--hf names the chat model" in out.stderr
