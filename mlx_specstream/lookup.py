"""Prompt-lookup drafts (Saxena, 2023): the tokens that followed the latest earlier occurrence
of the sequence's last n-gram. A model-free baseline that shares the engine's verification."""

from __future__ import annotations


def prompt_lookup(history: list[int], max_ngram: int = 3, num_draft: int = 10) -> list[int]:
    """Continuation of the longest (up to ``max_ngram``) suffix n-gram seen earlier, or []."""
    for n in range(min(max_ngram, len(history) - 1), 0, -1):
        suffix = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start : start + n] == suffix:
                return history[start + n : start + n + num_draft]
    return []
