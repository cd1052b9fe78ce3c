"""Training prompts for drafters of a chat model (written for this project; nothing is
downloaded, and none of them is in `benchmarks/real_prompts.py`, the evaluation set).

A drafter for a chat model learns from the model's own answers (self-distillation), so the
prompts only need to cover what users ask: questions, explanations, advice, lists, short
creative writing and code (`chat_prompts`), and tasks that copy from a text in the prompt
(`rewrite_prompts`, built on texts the model itself wrote, so they need no corpus).
"""

from __future__ import annotations

import numpy as np

SUBJECTS = (
    "photosynthesis", "the water cycle", "black holes", "volcanoes", "earthquakes",
    "the moon's phases", "rainbows", "thunderstorms", "tides", "the seasons", "gravity",
    "magnets", "electricity", "batteries", "solar panels", "wind turbines", "nuclear power",
    "recycling", "composting", "climate change", "coral reefs", "rainforests", "deserts",
    "bees", "ants", "dolphins", "elephants", "owls", "penguins", "whales", "octopuses",
    "dinosaurs", "fossils", "the human heart", "the immune system", "sleep", "vitamins",
    "exercise", "meditation", "stress", "dreams", "memory", "habits", "motivation",
    "the printing press", "the Roman empire", "ancient Egypt", "the Renaissance",
    "the industrial revolution", "the internet", "smartphones", "email", "passwords",
    "encryption", "cloud storage", "databases", "spreadsheets", "machine learning",
    "robots", "3D printing", "electric cars", "bicycles", "trains", "airplanes",
    "rockets", "satellites", "GPS", "maps", "money", "inflation", "interest rates",
    "budgeting", "saving for retirement", "taxes", "insurance", "renting a flat",
    "buying a used car", "job interviews", "writing a CV", "public speaking",
    "time management", "working from home", "learning a language", "reading more books",
    "playing the guitar", "learning to swim", "gardening", "houseplants", "baking bread",
    "making pasta", "brewing coffee", "tea", "chocolate", "cheese", "olive oil", "spices",
    "vegetarian cooking", "meal planning", "camping", "travelling by train",
    "visiting Japan", "visiting Italy", "museums", "photography", "painting",
    "chess", "football", "basketball", "running a marathon", "yoga", "dogs", "cats",
    "keeping fish", "birdwatching", "the night sky", "the periodic table", "atoms",
    "DNA", "vaccines", "antibiotics", "bacteria", "viruses", "the brain", "colours",
    "music theory", "jazz", "poetry", "short stories", "fairy tales", "friendship",
    "moving to a new city", "neighbours", "volunteering", "birthdays", "weddings",
    "holidays", "libraries", "schools", "homework", "exams", "online courses",
    "open source software", "version control", "the command line", "web browsers",
)

QUESTIONS = (
    "Explain {s} to a ten-year-old.",
    "What are the most important facts about {s}?",
    "Give me three interesting facts about {s}.",
    "Write a short paragraph about {s}.",
    "What are common misconceptions about {s}?",
    "How would you explain {s} in one paragraph?",
    "List five tips related to {s}.",
    "What are the pros and cons of {s}?",
    "Write a haiku about {s}.",
    "Write a short poem about {s}.",
    "Tell me a short story that involves {s}.",
    "What questions should a beginner ask about {s}?",
    "Summarise what everyone should know about {s}.",
    "How has {s} changed over the last hundred years?",
    "Why is {s} important?",
    "Describe {s} in three sentences.",
    "What is a good way to start learning about {s}?",
    "Write a friendly message to a friend about {s}.",
    "Give me a step-by-step guide related to {s}.",
    "Compare {s} with {t}.",
    "What do {s} and {t} have in common?",
    "Write a short dialogue between two people talking about {s}.",
    "Create a quiz with three questions about {s}, with answers.",
    "What would a good title be for an article about {s}? Give five options.",
)

CODE_TASKS = (
    "Write a Python function that {c}.",
    "Write a JavaScript function that {c}.",
    "Show how to {c} in Python, with a short explanation.",
    "Write a Python function that {c}, with a docstring and one example.",
)

CODE_SUBJECTS = (
    "reverses a string", "counts the vowels in a string", "returns the largest number in "
    "a list", "removes duplicates from a list while keeping the order", "sorts a list of "
    "dictionaries by a key", "reads a CSV file and prints each row", "checks whether a "
    "number is prime", "computes the factorial of a number", "merges two sorted lists",
    "converts Celsius to Fahrenheit", "counts how often each word appears in a text",
    "returns the n-th triangular number", "flattens a nested list", "checks whether two "
    "strings are anagrams", "finds the second smallest number in a list", "capitalises the "
    "first letter of every word", "returns the sum of the digits of a number", "validates "
    "an email address with a regular expression", "computes the average of a list of "
    "numbers", "splits a list into chunks of size n", "transposes a matrix", "computes the "
    "greatest common divisor of two numbers", "generates the first n square numbers",
    "returns the longest word in a sentence", "checks whether a year is a leap year",
    "converts a number to binary", "finds all even numbers in a list", "reads a JSON file "
    "into a dictionary", "implements binary search", "counts lines in a text file",
)

REWRITES = (
    "Rewrite the following text in a more formal tone:\n\n{x}",
    "Summarise the following text in two sentences:\n\n{x}",
    "Turn the following text into a bulleted list of its main points:\n\n{x}",
    "Rewrite the following text so that a child can understand it:\n\n{x}",
    "Shorten the following text without losing any facts:\n\n{x}",
    "Rewrite the following text in the first person:\n\n{x}",
    "Give the following text a title, then repeat it with each sentence on its own "
    "line:\n\n{x}",
    "Correct any mistakes in the following text and return the corrected text:\n\n{x}",
)


def chat_prompts(count: int, seed: int = 0) -> list[str]:
    """`count` distinct user messages (questions, writing, code), a pure function of seed."""
    distinct = len(CODE_TASKS) * len(CODE_SUBJECTS) + sum(
        len(SUBJECTS) * (len(SUBJECTS) - 1 if "{t}" in q else 1) for q in QUESTIONS)
    if count > distinct // 4:  # beyond that, drawing distinct prompts slows down
        raise ValueError(f"{count} prompts are more than these templates make well (at "
                         f"most {distinct // 4})")
    rng = np.random.default_rng(seed)
    prompts, seen = [], set()
    while len(prompts) < count:
        if rng.random() < 0.2:
            text = CODE_TASKS[rng.integers(len(CODE_TASKS))].format(
                c=CODE_SUBJECTS[rng.integers(len(CODE_SUBJECTS))])
        else:
            first, second = rng.choice(len(SUBJECTS), 2, replace=False)
            text = QUESTIONS[rng.integers(len(QUESTIONS))].format(s=SUBJECTS[first],
                                                                  t=SUBJECTS[second])
        if text not in seen:
            seen.add(text)
            prompts.append(text)
    return prompts


def rewrite_prompts(texts: list[str], seed: int = 0) -> list[str]:
    """One rewrite / summary / extraction request per text in `texts`."""
    rng = np.random.default_rng([seed, 1])
    return [REWRITES[rng.integers(len(REWRITES))].format(x=text.strip()) for text in texts]
