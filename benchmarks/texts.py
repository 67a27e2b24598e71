"""Random texts for the pooling benchmarks (``embeddings.py``, ``rerank.py``): words drawn from
one small vocabulary, the same texts for the same seed on every run."""

from __future__ import annotations

import random

__all__ = ["WORDS", "random_texts"]

WORDS = [
    "the",
    "weather",
    "in",
    "Oslo",
    "is",
    "cold",
    "and",
    "snowy",
    "Paris",
    "capital",
    "France",
    "python",
    "programming",
    "language",
    "cats",
    "dogs",
    "pets",
    "river",
    "flows",
    "sea",
    "train",
    "leaves",
    "station",
    "noon",
    "mountains",
    "tall",
    "bananas",
    "yellow",
    "fruit",
    "retrieval",
    "models",
    "fast",
    "vector",
    "search",
    "index",
    "query",
    "document",
    "answer",
]
"""The words the texts are drawn from."""


def random_texts(n: int, words: int, seed: int = 0) -> list[str]:
    """``n`` texts of ``words`` words each, numbered (``... 7.``) so that no two are equal."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) + f" {i}." for i in range(n)]
