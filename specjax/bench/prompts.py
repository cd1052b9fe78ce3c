"""The prompts of a benchmark run (`specjax.bench`): question files read and checked, and
questions turned into token ids, multi-turn questions included.

Two file formats:
- JSONL in Spec-Bench's and MT-Bench's question format: one JSON object per line with
  `turns` (a list of user messages; a multi-turn question has several), and optionally
  `category` and `question_id`; other fields (`reference`, ...) are ignored.
- Plain text: one prompt per line (blank lines skipped), category "prompts".

Every problem is refused with the file and line it is on, before any model loads.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

UNCATEGORISED = "uncategorised"
TEXT_CATEGORY = "prompts"
OVERALL = "overall"  # the report's all-prompts rows (specjax.bench.report)


@dataclasses.dataclass(frozen=True)
class Question:
    """One question: its user turns (one for a single-turn question), its category and a
    name that reports cite ("81" or "line 3")."""

    name: str
    category: str
    turns: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class BenchPrompt:
    """One decoding request of a run: the token ids the target continues, the category it
    is reported under, and a name that a failure cites ("81, turn 2")."""

    ids: tuple[int, ...]
    category: str = UNCATEGORISED
    name: str = ""

    def __post_init__(self):
        if len(self.ids) < 1:
            raise ValueError(f"BenchPrompt {self.name!r} has no tokens")


def _text_of(path: Path) -> str:
    """The file as text; a UTF-8 byte-order mark (which some editors write) is not text."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line} is not UTF-8 text (byte {error.start}); save "
                         "the file as UTF-8") from None


def file_lines(text: str) -> list[str]:
    """The lines of a prompt or question file: split at line feeds only (a CRLF's CR
    dropped). `str.splitlines` also splits at form feeds, U+2028, U+0085 and \x1c-\x1e,
    which sit inside Python sources and inside JSON strings written with
    `ensure_ascii=False`: they stay in their line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_questions(path, file_format: str | None = None) -> list[Question]:
    """The questions of a JSONL question file (`file_format="jsonl"`) or a plain-text
    prompt file (`"text"`, one prompt a line); by default the format follows the suffix
    (.jsonl and .json: JSONL, anything else: text). Refuses a missing, empty or non-UTF-8
    file and a malformed line, naming its number."""
    path = Path(path)
    if file_format is None:
        file_format = "jsonl" if path.suffix.lower() in (".jsonl", ".json") else "text"
    if file_format not in ("jsonl", "text"):
        raise ValueError(f"file_format must be 'jsonl' or 'text', got {file_format!r}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory, not a prompt file")
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    lines = file_lines(_text_of(path))
    questions = (_jsonl_questions(path, lines) if file_format == "jsonl"
                 else [Question(f"line {n}", TEXT_CATEGORY, (line,))
                       for n, line in enumerate(lines, 1) if line.strip()])
    if not questions:
        raise ValueError(f"{path} holds no prompts (every line is blank)")
    return questions


def _jsonl_questions(path: Path, lines: list[str]) -> list[Question]:
    questions, names = [], set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where} is not valid JSON ({error.msg}, column {error.colno}); "
                             "a question file holds one JSON object per line") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where} is a JSON {type(record).__name__}, not an object with "
                             "\"turns\"")
        turns = record.get("turns")
        if (not isinstance(turns, list) or not turns
                or not all(isinstance(t, str) and t.strip() for t in turns)):
            raise ValueError(f"{where} needs \"turns\": a non-empty list of non-empty strings "
                             "(Spec-Bench's / MT-Bench's question format), got "
                             f"{json.dumps(turns)[:80]}")
        category = record.get("category", UNCATEGORISED)
        if not isinstance(category, str) or not category.strip():
            raise ValueError(f"{where}: \"category\" must be a non-empty string, got "
                             f"{json.dumps(category)[:80]}")
        name = str(record.get("question_id", f"line {number}"))
        if name in names:
            raise ValueError(f"{where}: question_id {name} appears twice")
        names.add(name)
        questions.append(Question(name, category.strip(), tuple(turns)))
    return questions


def check_categories(items: Sequence[Question | BenchPrompt]) -> None:
    """A category named like the report's all-prompts rows ("overall") would be hidden by
    them: refused (unless it is the only category, whose rows are the same)."""
    categories = {item.category for item in items}
    if OVERALL in categories and len(categories) > 1:
        clashing = [item.name for item in items if item.category == OVERALL][:3]
        raise ValueError(f"question(s) {', '.join(map(repr, clashing))} have the category "
                         f"{OVERALL!r}, the name of the report's all-prompts rows: rename "
                         "that category (e.g. 'overall questions')")


def select_categories(questions: Sequence[Question],
                      categories: Sequence[str] | None) -> list[Question]:
    """The questions of the named categories (all for None); refuses a name that matches
    none, listing the file's categories."""
    if categories is None:
        return list(questions)
    present = list(dict.fromkeys(q.category for q in questions))
    unknown = [c for c in categories if c not in present]
    if unknown:
        raise ValueError(f"no question has the category {', '.join(map(repr, unknown))}; the "
                         f"prompts' categories are: {', '.join(present)}")
    return [q for q in questions if q.category in categories]


def bench_prompts(questions: Sequence[Question], *,
                  encode: Callable[[list[dict]], Sequence[int]],
                  answer: Callable[[list[Sequence[int]]], list[str]] | None = None,
                  max_tokens: int | None = None) -> list[BenchPrompt]:
    """One `BenchPrompt` per turn of every question. `encode(messages)` turns a chat (a
    list of {"role", "content"} dicts ending with a user turn) into the ids the target
    continues (its chat template, or the plain concatenation for a model without one).
    A later turn's chat holds the earlier turns and their answers: `answer(list of ids)`
    gives them (the CLI: the target's own greedy reply, the same for every method, so
    every method decodes the same prompts); needed only for multi-turn questions.
    `max_tokens`: the longest prompt the run can decode (the target's max_seq_len less
    the new tokens); a longer one is refused by its question's name and turn as soon as
    it is encoded, before any answer is generated."""
    if not questions:
        raise ValueError("bench_prompts: no questions")
    names = [q.name for q in questions]
    if len(set(names)) != len(names):
        raise ValueError(f"bench_prompts: question names repeat "
                         f"({sorted({n for n in names if names.count(n) > 1})}); each names "
                         "one question")
    prompts: list[tuple[int, int, BenchPrompt]] = []  # (question, turn, prompt)
    chats = {q.name: [] for q in questions}
    order = {q.name: i for i, q in enumerate(questions)}
    depth = max(len(q.turns) for q in questions)
    for turn in range(depth):
        asking = [q for q in questions if len(q.turns) > turn]
        if turn > 0:
            if answer is None:
                raise ValueError("multi-turn questions need `answer` (the earlier turns' "
                                 "replies)")
            earlier = [encode(chats[q.name]) for q in asking]
            for q, reply in zip(asking, answer(earlier), strict=True):
                chats[q.name].append({"role": "assistant", "content": reply})
        for q in asking:
            chats[q.name].append({"role": "user", "content": q.turns[turn]})
            name = q.name if len(q.turns) == 1 else f"{q.name}, turn {turn + 1}"
            ids = tuple(int(t) for t in encode(chats[q.name]))
            if max_tokens is not None and len(ids) > max_tokens:
                raise ValueError(
                    f"question {name} ({q.category}) is {len(ids)} tokens long"
                    + (" with the earlier turns and their answers" if turn else "")
                    + f"; this run decodes prompts of at most {max_tokens} tokens (the "
                    "target's max_seq_len less the new tokens): shorten it, leave it out, "
                    "or lower the new tokens")
            prompts.append((order[q.name], turn, BenchPrompt(ids, q.category, name)))
    return [prompt for _, _, prompt in sorted(prompts, key=lambda p: p[:2])]


def raw_chat_text(messages: list[dict]) -> str:
    """A chat as plain text for a model without a chat template: each reply follows its
    question directly (a continuation), each later question starts a new line."""
    text = ""
    for message in messages:
        if message["role"] == "user" and text:
            text += "\n"
        text += message["content"]
    return text
