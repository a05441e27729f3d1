"""Log-probabilities of the emitted tokens, as OpenAI's API returns them (``logprobs``).

A token's log-probability is read from the model's own distribution at its position: the
log-softmax of the main stream's logits there, before temperature, top-k, top-p, min-p and any
constraint (what vLLM and mlx-lm report by default), with the ``k`` most likely tokens of that
distribution beside it. Speculative Streaming reads them from the pass that verified the tokens:
the node of the accepted path before each token holds the logits that predict it, and the last
node the logits of the next root. Plain decoding reads its one-row passes; both give the base
model's numbers (lossless adapters) up to the rounding of the pass a row is in.

Example: a pass accepted drafts ``[17, 4]`` and chose root ``9``; its path's three nodes' logits
(3, V) give ``[TokenLogprob(17, -0.02, ((17, -0.02), (5, -4.1))), TokenLogprob(4, ...),
TokenLogprob(9, ...)]`` for ``k = 2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted ``token``, its ``logprob`` and the ``top`` (token, logprob) pairs at its
    position, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: np.ndarray, tokens: Sequence[int], k: int) -> list[TokenLogprob]:
    """The log-probabilities of ``tokens`` (N,) under ``logits`` (N, V), row i predicting token
    i, each with the ``k`` most likely tokens of its row."""
    z = np.asarray(logits, np.float64)
    m = z.max(-1, keepdims=True)
    lp = z - (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))
    k = min(k, lp.shape[-1])
    out = []
    for row, token in zip(lp, tokens):
        top = np.argpartition(-row, k - 1)[:k] if 0 < k < len(row) else np.arange(k)
        top = top[np.lexsort((top, -row[top]))]  # most likely first, then by id
        out.append(TokenLogprob(int(token), float(row[token]),
                                tuple((int(t), float(row[t])) for t in top)))
    return out
