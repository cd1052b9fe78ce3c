"""specjax.cli.datastore: `specjax datastore build|info` (documents by file, paragraph,
line or JSON line; errors by name), and decoding with `--drafter retrieval --datastore`
and `--drafter lookahead` equal to plain greedy decoding."""

import json

import numpy as np
import pytest
from conftest import smollm2_or_skip

from specjax.cli import main
from specjax.drafters.datastore import SEPARATOR, Datastore
from specjax_models import ByteTokenizer


def _run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_build_splits_documents_and_info_describes_them(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("first paragraph\nstill first\n\nsecond\n")
    lines = tmp_path / "answers.jsonl"
    lines.write_text(json.dumps({"text": "ab"}) + "\n\n" + json.dumps({"text": "c"}) + "\n")
    out = tmp_path / "ds.npz"
    for split, documents in (("file", 3), ("paragraph", 4), ("line", 5)):
        code, _, err = _run(capsys, "datastore", "build", "--tokenizer", "bytes", str(text),
                            str(lines), "--split", split, "--out", str(out))
        assert code == 0, err
        assert f"{documents} documents" in err
    store = Datastore.load(out)
    stream = store.stream.tolist()
    tokenizer = ByteTokenizer()
    assert stream[:len(tokenizer.encode("first paragraph"))] == tokenizer.encode(
        "first paragraph")
    assert stream.count(SEPARATOR) == 5 and store.vocab_size == tokenizer.vocab_size
    code, printed, _ = _run(capsys, "datastore", "info", str(out))
    info = json.loads(printed)
    assert code == 0 and info["documents"] == 5 and info["tokens"] == store.num_tokens


def test_bad_inputs_are_named(tmp_path, capsys):
    out = str(tmp_path / "ds.npz")
    code, _, err = _run(capsys, "datastore", "build", "--tokenizer", "bytes",
                        str(tmp_path / "missing.txt"), "--out", out)
    assert code == 2 and "missing.txt does not exist" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"words": 1}\n')
    code, _, err = _run(capsys, "datastore", "build", "--tokenizer", "bytes", str(bad),
                        "--out", out)
    assert code == 2 and "bad.jsonl line 2" in err and '"text"' in err
    (tmp_path / "empty.txt").write_text("\n")
    code, _, err = _run(capsys, "datastore", "build", "--tokenizer", "bytes",
                        str(tmp_path / "empty.txt"), "--out", out)
    assert code == 2 and "no text" in err
    code, _, err = _run(capsys, "datastore", "build", "--tokenizer", str(tmp_path),
                        str(bad), "--out", out)
    assert code == 2 and "tokenizer.json" in err
    (tmp_path / "cut.npz").write_bytes(b"PK\x03\x04 cut")
    code, _, err = _run(capsys, "datastore", "info", str(tmp_path / "cut.npz"))
    assert code == 2 and "cut.npz" in err and "specjax datastore build" in err
    code, _, err = _run(capsys, "generate", "x", "--drafter", "lookahead",
                        "--lookahead", "4,4")
    assert code == 2 and "--lookahead takes W,N,G" in err
    code, _, err = _run(capsys, "generate", "x", "--drafter", "retrieval", "--datastore",
                        str(tmp_path / "missing.npz"))
    assert code == 2 and "missing.npz does not exist" in err
    code, _, err = _run(capsys, "generate", "x", "--datastore", out)
    assert code == 2 and "--datastore needs --drafter retrieval" in err


@pytest.mark.slow
def test_model_free_drafters_decode_exactly_from_the_command_line(tmp_path, capsys):
    source = tmp_path / "code.py"
    source.write_text("def parse(source, filename):\n    tree = compile(source, filename, "
                      "'exec', ast.PyCF_ONLY_AST)\n    return tree\n")
    store = str(tmp_path / "ds.npz")
    assert _run(capsys, "datastore", "build", "--tokenizer", "bytes", str(source),
                "--out", store)[0] == 0
    prompt = "def parse(source, filename):\n    "
    common = ("generate", prompt, "--json", "--max-new-tokens", "32")
    code, printed, err = _run(capsys, *common, "--no-speculation")
    assert code == 0, err
    plain = json.loads(printed)["tokens"]
    for drafter in (["--drafter", "retrieval", "--datastore", store],
                    ["--drafter", "retrieval"],
                    ["--drafter", "lookahead", "--lookahead", "3,3,2"]):
        code, printed, err = _run(capsys, *common, *drafter)
        assert code == 0, err
        assert json.loads(printed)["tokens"] == plain, drafter


@pytest.mark.slow
def test_a_smollm2_datastore_holds_smollm2_token_ids(tmp_path, capsys):
    smollm2_or_skip()
    text = tmp_path / "answer.txt"
    text.write_text("The capital of France is Paris.")
    out = tmp_path / "ds.npz"
    code, _, err = _run(capsys, "datastore", "build", "--tokenizer", "smollm2", str(text),
                        "--out", str(out))
    assert code == 0, err
    store = Datastore.load(out)
    assert store.vocab_size == 49152 and np.all(store.stream[:-1] < 49152)


def test_an_unwritable_out_is_one_line_and_leaves_nothing(tmp_path, capsys):
    text = tmp_path / "notes.txt"
    text.write_text("some text\n")
    folder = tmp_path / "store"
    folder.mkdir()
    for out, message in ((folder, "store is a directory"),
                         (tmp_path / "missing" / "ds.npz", "does not exist")):
        code, _, err = _run(capsys, "datastore", "build", "--tokenizer", "bytes", str(text),
                            "--out", str(out))
        assert code == 2 and message in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "store"]
    assert list(folder.iterdir()) == []
    code, _, err = _run(capsys, "datastore", "build", "--tokenizer", "bytes", str(text),
                        "--out", str(tmp_path / "plain"))  # any name: written as given
    assert code == 0 and Datastore.load(tmp_path / "plain").num_documents == 1, err
