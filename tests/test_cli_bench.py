"""specjax.cli.bench: `specjax bench` refuses bad methods, settings, prompt files,
categories and outputs in one line before any model loads; the issue's command runs on
the bundled pair, writes JSON, CSV and SVG, and resumes from its journal."""

import csv
import json
import re
import subprocess
import sys

import pytest
from conftest import run_cli

from specjax.cli import main
from specjax.cli.bench import METHODS, SETTINGS, MethodSpec, parse_methods


def test_methods_parse_with_their_settings():
    specs = parse_methods("plain, draft[k=4,greedy],eagle3[tree=16/6/4,verification=token],"
                          "prompt-lookup[ngram=2,as=lookup]")
    assert specs == [MethodSpec("plain", ()), MethodSpec("draft", (("k", "4"), ("greedy", ""))),
                     MethodSpec("eagle3", (("tree", "16/6/4"), ("verification", "token"))),
                     MethodSpec("prompt-lookup", (("ngram", "2"), ("as", "lookup")))]
    assert [s.label for s in specs] == ["plain", "draft[k=4,greedy]",
                                        "eagle3[tree=16/6/4,verification=token]", "lookup"]


@pytest.mark.parametrize("methods, message", [
    ("plain,medussa", "unknown method 'medussa'; the methods are plain, draft"),
    ("draft[depth=3]", "draft has no setting 'depth'"),
    ("draft[k]", r"draft\[k\] needs a value"),
    ("draft[k=4", "a '\\[' without its '\\]'"),
    ("draft]", "a '\\]' without its '\\['"),
    ("draft[k=4]x", "has text after its"),
    ("draft,,plain", "an empty method name"),
    ("draft,draft", "names a method twice"),
    ("plain[k=2]", "plain takes no settings"),
    ("draft[k=0]", "k must be a positive integer"),
    ("draft[confidence=high]", "confidence must be a number"),
    ("draft[verification=typicl]", "verification must be block, traversal, token .* or "
                                   "typical"),
    ("draft[k=3,k=5]", r"'draft\[k=3,k=5\]' sets k twice"),
    ("draft[greedy=maybe]", r"greedy is on or off"),
    ("draft[greedy,greedy=false]", "sets greedy twice"),
    ("published", "published needs dir=DIR"),
    ("layer-skip", "layer-skip needs skip="),
    ("draft[dir=/no/such/dir]", "dir /no/such/dir does not exist"),
    ("draft[tree=16/6]", "--dynamic-tree takes NODES,DEPTH,TOP_K"),
    ("prompt-lookup[tree=8/3/2]", "--dynamic-tree needs a drafter that scores tokens"),
    ("lookahead[lookahead=5/4]", "--lookahead takes W,N,G"),
    ("retrieval[verification=block]", "--verification block judges a chain"),
    ("prompt-lookup[confidence=0.5]", "--min-confidence needs a drafter that scores"),
])
def test_bad_methods_are_one_line_and_exit_2(methods, message, capsys):
    """Each refusal is one line naming the method."""
    assert main(["bench", "--methods", methods]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.search(message, err), err


def test_greedy_takes_a_value_and_the_label_tells_what_runs():
    from specjax.cli import build_parser
    from specjax.cli.bench import method_args

    specs = parse_methods("draft[greedy=false,k=3],draft[greedy=true,as=g],draft[greedy=no,"
                          "as=n],draft[greedy,as=bare]")
    assert specs[0].label == "draft[k=3]"  # greedy=false is the default: sampled drafts
    args = build_parser().parse_args(["bench"])
    assert [method_args(args, s).greedy_draft for s in specs] == [False, True, False, True]
    with pytest.raises(Exception, match="names a method twice"):
        parse_methods("draft,draft[greedy=false]")


@pytest.mark.parametrize("options, message", [
    (["--typical-epsilon", "1.5", "--verification", "typical"],
     "^specjax bench: error: --typical-epsilon and --typical-delta must be numbers in"),
    (["--typical-epsilon", "0.2", "--methods", "plain"], "add --verification typical"),
    (["--typical-epsilon", "0.2"], "add --verification typical"),
    (["--typical-delta", "0.2", "--methods", "draft[verification=token]"],
     "add --verification typical"),
])
def test_the_typical_rules_settings_are_checked_as_the_runs_options(options, message, capsys):
    assert main(["bench", *options]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err) and "--methods" not in err.split(":")[2], err


def test_a_method_may_run_the_typical_rule(tmp_path):
    from specjax.cli import build_parser
    from specjax.cli.bench import method_args
    from specjax.cli.common import verification_rule

    args = build_parser().parse_args(["bench", "--typical-epsilon", "0.2", "--methods",
                                      "draft[verification=typical],prompt-lookup"])
    draft, lookup = (method_args(args, s) for s in parse_methods(args.methods))
    assert verification_rule(draft).epsilon == 0.2 and verification_rule(lookup) is None


@pytest.mark.parametrize("content, name, prompts", [
    # Raw U+2028 / U+0085 inside JSON strings (json.dumps(ensure_ascii=False) writes them).
    ((json.dumps({"question_id": 7, "turns": ["a\u2028b"]}, ensure_ascii=False) + "\n"
      + json.dumps({"question_id": 8, "turns": ["c\x85d"]}, ensure_ascii=False) + "\n"
      ).encode(), "q.jsonl", [("7", "a\u2028b"), ("8", "c\x85d")]),
    # A UTF-8 byte-order mark is not part of the first line.
    (b"\xef\xbb\xbf" + json.dumps({"question_id": 1, "turns": ["x"]}).encode() + b"\n",
     "q.jsonl", [("1", "x")]),
    # A form feed, \x1c and U+2028 in a line of a text file (a Python source) stay in it.
    (b"\xef\xbb\xbfdef f():\r\n\x0c\x1cclass A:" + "\u2028".encode() + b"\n", "p.txt",
     [("line 1", "def f():"), ("line 2", "\x0c\x1cclass A:\u2028")]),
])
def test_prompt_files_split_at_line_feeds_only(tmp_path, content, name, prompts):
    from specjax.bench.prompts import read_questions

    path = tmp_path / name
    path.write_bytes(content)
    assert [(q.name, q.turns[0]) for q in read_questions(path)] == prompts


def test_a_category_named_overall_is_refused_before_any_model_loads(tmp_path, capsys):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": ["x"]})
                            + "\n" for i, c in enumerate(["overall", "code"])))
    assert main(["bench", "--questions", str(path)]) == 2
    assert "the name of the report's all-prompts rows: rename" in capsys.readouterr().err


@pytest.mark.parametrize("content, options, message", [
    (b"", [], "holds no prompts"),
    (b'{"turns": ["\xff"]}\n', [], "line 1 is not UTF-8"),
    (b'{"turns": ["a"]}\n{"turns": "b"\n', [], "line 2 is not valid JSON"),
    (b'{"turns": ["a"], "category": "math"}\n', ["--categories", "code"],
     "no question has the category 'code'; the prompts' categories are: math"),
])
def test_bad_prompt_files_are_refused_before_any_model_loads(tmp_path, content, options,
                                                            message, capsys):
    path = tmp_path / "q.jsonl"
    path.write_bytes(content)
    assert main(["bench", "--questions", str(path), *options]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("options, message", [
    (["--resume"], "--resume continues from the journal"),
    (["--hf", "/no/such"], "--hf /no/such does not exist"),
    (["--model", "smollm2"], "pass the prompts"),
    (["--json", "/no/such/folder/out.json"], "not a file in an existing folder"),
    (["--reps", "0"], "--reps must be >= 1"),
    (["--prompts", "a.txt", "--questions", "b.jsonl"], "pass one"),
])
def test_bad_options_are_refused(options, message, capsys):
    assert main(["bench", *options]) == 2
    assert message in capsys.readouterr().err


def test_help_lists_every_method_and_setting(capsys):
    assert main(["bench", "--help"]) == 0
    text = capsys.readouterr().out
    for name in [*METHODS, *SETTINGS]:
        assert f"\n  {name} " in text


def test_refusals_load_no_jax(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("not json\n")
    probe = ("import sys; from specjax.cli import main; "
             f"code = main(['bench', '--questions', {str(path)!r}]); "
             "print(code, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr


@pytest.mark.slow  # the bundled pair's decoders compile in a fresh process
def test_the_issues_command_runs_on_the_bundled_pair_and_resumes(tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        json.dumps({"question_id": 1, "category": "code", "turns": ["def add(a, b):\n"]}) + "\n"
        + json.dumps({"question_id": 2, "category": "code",
                      "turns": ["import os\n", "def main():\n"]}) + "\n"
        + json.dumps({"question_id": 3, "category": "prose",
                      "turns": ["The cat sat on the mat. The cat"]}) + "\n")
    out = tmp_path / "out.json"
    args = ["bench", "--questions", str(questions), "--methods", "plain,prompt-lookup,draft",
            "--max-new-tokens", "24", "--reps", "1", "--json", str(out), "--csv",
            str(tmp_path / "out.csv")]
    done = run_cli(*args, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    rows = {(r["method"], r["category"]): r for r in report["rows"]}
    assert set(rows) == {(m, c) for m in ("plain", "prompt-lookup", "draft")
                         for c in ("code", "prose", "overall")}
    assert rows[("draft", "overall")]["prompts"] == 4  # question 2 has two turns
    assert all(r["exact"] for r in report["rows"]) and report["failures"] == []
    assert rows[("draft", "code")]["tau"] > 1.0
    assert "| draft | overall | 4 |" in done.stdout
    assert len(list(csv.DictReader((tmp_path / "out.csv").open()))) == 9
    assert (tmp_path / "out.svg").read_text().startswith("<svg")
    # A finished run resumed measures nothing again and reports the same rows.
    again = run_cli(*args, "--resume", timeout=600)
    assert again.returncode == 0, again.stderr
    assert json.loads(out.read_text())["rows"] == report["rows"]


def test_limit_and_categories_pick_the_first_questions_of_each_category(tmp_path):
    from specjax.cli import build_parser
    from specjax.cli.bench import validate

    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"q{i}"]})
                            + "\n" for i, c in enumerate("aabbba")))
    args = build_parser().parse_args(["bench", "--questions", str(path), "--limit", "2",
                                      "--methods", "plain,draft[k=3]"])
    specs, questions = validate(args)
    assert [q.name for q in questions] == ["0", "1", "2", "3"]
    assert [s.label for s in specs] == ["plain", "draft[k=3]"]
    args = build_parser().parse_args(["bench", "--questions", str(path), "--categories", "b"])
    assert [q.name for q in validate(args)[1]] == ["2", "3", "4"]
