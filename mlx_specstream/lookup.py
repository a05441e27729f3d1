"""Prompt-lookup drafts (Saxena, 2023): the tokens that followed the latest earlier occurrence
of the sequence's last n-gram. Alone, a model-free baseline (``mode="lookup"``); beside the
streams, a chain of deterministic candidates merged into the draft tree (hybrid drafts), scored
by how long the match is and how often lookup has been right in this generation. The adapter's
n-gram drafts (:mod:`mlx_specstream.ngrams`) lead the same chain where it has them."""

from __future__ import annotations

import math
from dataclasses import dataclass


def lookup_match(history: list[int], max_ngram: int = 3, num_draft: int = 10) -> tuple[list[int], int]:
    """``(continuation, n)``: what followed the latest earlier occurrence of the longest (up to
    ``max_ngram``) suffix n-gram of ``history``, and n; ``([], 0)`` when there is none."""
    for n in range(min(max_ngram, len(history) - 1), 0, -1):
        suffix = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):
            if history[start: start + n] == suffix:
                return history[start + n: start + n + num_draft], n
    return [], 0


# How often a lookup token is right before any evidence, by match length (1, 2, >= 3 tokens).
PRIOR = (0.25, 0.45, 0.6)
PRIOR_WEIGHT = 2.0


def match_prior(n: int) -> float:
    """The prior of a lookup token after a match of ``n`` tokens."""
    return PRIOR[min(n, len(PRIOR)) - 1]


@dataclass
class LookupScore:
    """Per-token log-probability of one source's deterministic drafts (prompt lookup, or the
    adapter's n-grams): a token's prior (:func:`match_prior`, or its n-gram share) updated by the
    tokens this source proposed and got right so far in this generation (a Beta posterior mean)."""

    hits: int = 0
    tries: int = 0

    def logp(self, prior: float) -> float:
        return math.log((self.hits + PRIOR_WEIGHT * prior) / (self.tries + PRIOR_WEIGHT))

    def update(self, proposed: int, accepted: int) -> None:
        """``proposed`` chain tokens were in the verified tree; the first ``accepted`` matched."""
        self.hits += accepted
        self.tries += min(proposed, accepted + 1)
