"""specjax.bench.prompts: question files (Spec-Bench / MT-Bench JSONL, one prompt a line)
read and refused by line, categories selected, questions turned into prompts (later turns
after the earlier answers)."""

import json

import pytest

from specjax.bench.prompts import (
    BenchPrompt,
    Question,
    bench_prompts,
    raw_chat_text,
    read_questions,
    select_categories,
)


def _jsonl(path, *records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


def test_spec_bench_questions_keep_their_ids_categories_and_turns(tmp_path):
    path = _jsonl(tmp_path / "q.jsonl",
                  {"question_id": 81, "category": "writing", "turns": ["a", "b"],
                   "reference": ["ignored"]},
                  "",
                  {"turns": ["only one"]})
    questions = read_questions(path)
    assert questions == [Question("81", "writing", ("a", "b")),
                         Question("line 3", "uncategorised", ("only one",))]


def test_a_text_file_is_one_prompt_a_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n  \nsecond {\"json\": 1}\n")
    assert read_questions(path) == [Question("line 1", "prompts", ("first prompt",)),
                                    Question("line 4", "prompts", ('second {"json": 1}',))]


@pytest.mark.parametrize("content, message", [
    (b"", "holds no prompts"),
    (b"\n  \n", "holds no prompts"),
    (b'{"turns": ["ok"]}\n{"turns": ["caf\xe9"]}\n', "line 2 is not UTF-8"),
    (b'{"turns": ["ok"]}\n\n{"turns": [ok]}\n', "line 3 is not valid JSON"),
    (b'["a"]\n', "line 1 is a JSON list"),
    (b'{"question": "a"}\n', "line 1 needs \"turns\""),
    (b'{"turns": []}\n', "line 1 needs \"turns\""),
    (b'{"turns": ["a", 3]}\n', "line 1 needs \"turns\""),
    (b'{"turns": ["a"], "category": 4}\n', "\"category\" must be a non-empty string"),
    (b'{"question_id": 1, "turns": ["a"]}\n{"question_id": 1, "turns": ["b"]}\n',
     "line 2: question_id 1 appears twice"),
])
def test_bad_question_files_are_refused_by_line(tmp_path, content, message):
    path = tmp_path / "q.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_questions(path)


def test_a_missing_file_or_a_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_questions(tmp_path / "absent.jsonl")
    with pytest.raises(ValueError, match="is a directory"):
        read_questions(tmp_path)
    with pytest.raises(ValueError, match="file_format"):
        read_questions(tmp_path / "x", "yaml")


def test_categories_select_questions_and_an_unknown_one_is_named():
    questions = [Question("1", "math", ("a",)), Question("2", "code", ("b",))]
    assert select_categories(questions, None) == questions
    assert select_categories(questions, ["code"]) == [questions[1]]
    with pytest.raises(ValueError, match="'poetry'.*categories are: math, code"):
        select_categories(questions, ["code", "poetry"])


def test_later_turns_follow_the_answers_to_the_earlier_ones():
    questions = [Question("a", "x", ("hi", "more")), Question("b", "y", ("one",)),
                 Question("c", "x", ("p", "q", "r"))]
    asked = []

    def encode(messages):
        return [len(m["content"]) + (100 if m["role"] == "assistant" else 0)
                for m in messages]

    def answer(chats):
        asked.append([list(c) for c in chats])
        return ["ans" * len(c) for c in chats]

    prompts = bench_prompts(questions, encode=encode, answer=answer)
    assert [p.name for p in prompts] == ["a, turn 1", "a, turn 2", "b", "c, turn 1",
                                         "c, turn 2", "c, turn 3"]
    assert [p.category for p in prompts] == ["x", "x", "y", "x", "x", "x"]
    # turn 2 of "a": its question (2), the answer to it (3 * 1 chars + 100), "more" (4)
    assert prompts[1].ids == (2, 103, 4)
    assert prompts[5].ids == (1, 103, 1, 109, 1)
    assert asked == [[[2], [1]], [[1, 103, 1]]]  # turn by turn, all questions at once
    with pytest.raises(ValueError, match="need `answer`"):
        bench_prompts(questions, encode=encode)
    with pytest.raises(ValueError, match="repeat"):
        bench_prompts([questions[1], questions[1]], encode=encode)
    with pytest.raises(ValueError, match="no tokens"):
        BenchPrompt(())


def test_a_chat_without_a_template_is_the_text_in_order():
    assert raw_chat_text([{"role": "user", "content": "def f("},
                          {"role": "assistant", "content": "x):"},
                          {"role": "user", "content": "def g("}]) == "def f(x):\ndef g("


def test_a_prompt_too_long_for_the_run_is_refused_by_its_question_before_any_answer():
    """A 100,000-character turn is named by its question_id and turn, as soon as it is
    encoded: no earlier turn is answered (the answers are the long work)."""
    questions = [Question("7", "short", ("hi", "again")),
                 Question("81", "essays", ("x" * 100_000,))]
    answered = []

    def answer(chats):
        answered.append(chats)
        return ["ok"] * len(chats)

    with pytest.raises(ValueError, match=r"question 81 \(essays\) is 100000 tokens long; "
                                         r"this run decodes prompts of at most 2000 tokens"):
        bench_prompts(questions, encode=lambda chat: [1] * len(chat[-1]["content"]),
                      answer=answer, max_tokens=2000)
    assert answered == []
    # A later turn counts the earlier turns and their answers.
    with pytest.raises(ValueError, match=r"question 7, turn 2 \(short\) is 9 tokens long "
                                         r"with the earlier turns and their answers"):
        bench_prompts(questions[:1], answer=answer, max_tokens=5,
                      encode=lambda chat: [1] * sum(len(m["content"]) for m in chat))
