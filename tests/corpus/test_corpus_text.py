"""The classifier sees whitespace-collapsed text; decontamination by word 10-grams and short exact matches."""

from __future__ import annotations

from grpo_core.corpus.decontam import BenchmarkIndex
from grpo_core.corpus.text import ngrams, normalize, tokens, words


def test_normalize_only_collapses_whitespace():
    # The classifier sees bare fastText's input: whitespace collapsed, nothing else changed.
    assert normalize("Solve x^2+1=5,\n\n then $\\frac{a}{b}$!") == "Solve x^2+1=5, then $\\frac{a}{b}$!"
    assert normalize('  "Why?"\tf\'(x): 1,000.5; end. ') == '"Why?" f\'(x): 1,000.5; end.'
    assert tokens("a, b.") == ["a", ",", "b", "."]  # decontamination's exact match keeps them
    assert normalize("3.14  and\nＸ") == "3.14 and Ｘ"
    assert normalize("") == ""


def test_words_drop_punctuation_but_keep_numbers_and_commands():
    assert words("If 2+2=4, what is \\sqrt{16}?") == ["if", "2", "2", "4", "what", "is", "\\sqrt", "16"]
    assert ngrams(["a", "b", "c"], 2) == {("a", "b"), ("b", "c")}
    assert ngrams(["a"], 2) == set()


QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)


def test_a_shared_ten_gram_contaminates_whatever_the_formatting():
    index = BenchmarkIndex()
    index.add("gsm8k", QUESTION)
    page = "Forum post: natalia SOLD clips to 48 of her friends in april -- and then? She sold half as many."
    assert index.match(page) == "gsm8k"
    # Nine words in common are not enough.
    assert index.match("She sold clips to 48 of her friends in June, all of them.") is None
    assert index.texts["gsm8k"] == 1


def test_short_benchmark_texts_match_as_whole_word_substrings():
    index = BenchmarkIndex()
    index.add("math", "Compute $\\dbinom{8}{4}$.")  # 4 words: matched exactly
    index.add("math", "Find x.")  # 2 words: too short to index
    assert index.match("Exercise 3. Compute \\dbinom{8}{4} by hand.") == "math"
    assert index.match("Compute \\dbinom{8}{45} by hand.") is None  # whole words only
    assert index.match("Find x. Then find y.") is None
    assert index.texts["math"] == 1
    index.add("own-test", "What is 3 + 4?")
    assert index.match("Drill: what is 3 + 4? Then 5 - 1.") == "own-test"
    assert index.match("What is 3 + 4 + 2?") is None  # operators and punctuation count in exact matches
