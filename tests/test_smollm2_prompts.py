"""SmolLM2 training prompts (specjax_models.recipes.smollm2_prompts)."""

import pytest

from benchmarks.real_prompts import PROMPTS
from specjax_models.recipes.smollm2_prompts import chat_prompts, rewrite_prompts


def test_prompts_are_distinct_reproducible_and_not_the_evaluation_set():
    prompts = chat_prompts(500, seed=3)
    assert len(set(prompts)) == 500 and prompts == chat_prompts(500, seed=3)
    assert prompts != chat_prompts(500, seed=4)
    evaluation = {p for kind in PROMPTS.values() for p in kind}
    assert not evaluation & set(prompts)
    assert any("Python" in p for p in prompts) and any("poem" in p for p in prompts)
    with pytest.raises(ValueError, match="more than these templates make"):
        chat_prompts(10**7)


def test_rewrite_prompts_quote_each_text():
    texts = ["Bees make honey. They live in hives.", "Trains run on rails."]
    prompts = rewrite_prompts(texts, seed=1)
    assert len(prompts) == 2 and all(t in p for t, p in zip(texts, prompts, strict=True))
    assert prompts == rewrite_prompts(texts, seed=1)


def test_the_bench_question_file_holds_the_evaluation_prompts():
    """benchmarks/prompts/smollm2.jsonl (`specjax bench --questions`) is
    benchmarks/real_prompts.py in Spec-Bench's question format, kind by kind."""
    from pathlib import Path

    from specjax.bench.prompts import read_questions

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "prompts" / "smollm2.jsonl"
    questions = read_questions(path)
    assert [(q.category, q.turns) for q in questions] == [
        (kind, (prompt,)) for kind, prompts in PROMPTS.items() for prompt in prompts]
