"""Greedy autoregressive decoding of many prompts at once: the base model's own continuations,
for self-distillation.

Prompts are left-padded to a common length so every row's next token sits in the same column.
Row ``i`` with ``pad`` leading pad slots gives slot ``s`` the position ``s - pad`` and sees the
keys of its own slots only (a pad slot sees itself, so no softmax row is empty). Example, two
prompts [5, 6, 7] and [8]: slots ``[5 6 7] [_ _ 8]``, positions ``[0 1 2] [0 0 0]``; row 1's
next token, at slot 3, sees slots 2 and 3 and sits at position 1. On a CPU one pass over 16
rows costs little more than over one, so distilling a data set this way is several times faster
than prompt by prompt; the tokens equal greedy decoding alone (tested).
"""

from __future__ import annotations

from collections.abc import Iterator

import mlx.core as mx
import numpy as np

from .kv_cache import make_cache


def _visible(pads: np.ndarray, first: int, n: int, total: int) -> mx.array:
    """Mask (B, 1, n, total) of the queries at slots ``[first, first + n)``."""
    q = np.arange(first, first + n)[:, None]
    k = np.arange(total)[None, :]
    own = (k >= pads[:, None, None]) | (k == q)[None]
    return mx.array((own & (k <= q)[None])[:, None])


def greedy_batch(model, prompts: list[list[int]], budgets: list[int], eos: set[int] | frozenset[int],
                 ) -> list[list[int]]:
    """Greedy continuations (EOS kept, then stop) of ``prompts``, up to ``budgets[i]`` tokens each,
    decoded together in one batch."""
    B = len(prompts)
    P = max(len(p) for p in prompts)
    pads = np.array([P - len(p) for p in prompts])
    tokens = np.zeros((B, P), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, pads[i]:] = p
    cache = make_cache(model)
    for c in cache:  # each sequence's keys at its own positions: its padding's come first
        c.start = mx.array(-pads)
    pos = np.maximum(np.arange(P)[None, :] - pads[:, None], 0)
    logits = model(mx.array(tokens), cache=cache, mask=_visible(pads, 0, P, P), positions=mx.array(pos))
    out: list[list[int]] = [[] for _ in range(B)]
    live = np.array([b > 0 for b in budgets])
    for step in range(max(budgets)):
        nxt = np.array(mx.argmax(logits[:, -1], axis=-1))
        for i in np.flatnonzero(live):
            out[i].append(int(nxt[i]))
            live[i] = len(out[i]) < budgets[i] and int(nxt[i]) not in eos
        if not live.any():
            break
        slot = P + step
        logits = model(mx.array(nxt[:, None].astype(np.int32)), cache=cache,
                       mask=_visible(pads, slot, 1, slot + 1), positions=mx.array(slot - pads[:, None]))
    return out


def greedy_batches(model, prompts: list[list[int]], budgets: list[int], eos: set[int] | frozenset[int],
                   batch_size: int = 16) -> Iterator[tuple[list[int], list[list[int]]]]:
    """:func:`greedy_batch` over batches of similar prompt length and budget (little padding);
    yields ``(indices, continuations)`` per batch as it finishes."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), budgets[i]))
    for k in range(0, len(order), batch_size):
        ids = order[k: k + batch_size]
        yield ids, greedy_batch(model, [prompts[i] for i in ids], [budgets[i] for i in ids], eos)
