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

from .runner import logsumexp, top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted ``token``, its ``logprob`` and the ``top`` (token, logprob) pairs at its
    position, most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(logits: np.ndarray, tokens: Sequence[int], k: int) -> list[TokenLogprob]:
    """The log-probabilities of ``tokens`` (N,) under ``logits`` (at least N rows of V), row i
    predicting token i, each with the ``k`` most likely tokens of its row (the stream drafts' top-k,
    :func:`~.runner.top_logprobs`)."""
    ids = np.asarray(tokens, np.int64)
    z = np.asarray(logits, np.float64)[:len(ids)]
    chosen = z[np.arange(len(ids)), ids] - logsumexp(z)[:, 0]
    k = min(k, z.shape[-1])
    top, vals = top_logprobs(z, k) if k else (ids[:, None][:, :0], chosen[:, None][:, :0])
    return [TokenLogprob(int(t), float(c), tuple(zip(map(int, tt), map(float, vv))))
            for t, c, tt, vv in zip(ids, chosen, top, vals)]
