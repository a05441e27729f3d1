"""Training batches: the padded layout of a batch with its main and stream targets, the
completion segments its stream rows are built in, and the order of the batches of a run.

Example: prompt ``[5, 6]`` and completion ``[7, 8, 9]`` (n_prompt 2, length 5). The main stream
of position 1 predicts 7 (the first completion token), stream j = 1 of position 1 predicts 8, and
j = 2 predicts 9; positions 1..3 carry streams (their main target is a completion token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .data import Dataset, Example


@dataclass
class Batch:
    """Right-padded token ids and, per row, the prompt length and the real length."""

    tokens: np.ndarray  # (B, T) int32
    n_prompt: np.ndarray  # (B,)
    length: np.ndarray  # (B,)

    @classmethod
    def of(cls, examples: list[Example]) -> Batch:
        T = max(len(e.tokens) for e in examples)
        tokens = np.zeros((len(examples), T), np.int32)
        for i, e in enumerate(examples):
            tokens[i, : len(e.tokens)] = e.tokens
        return cls(tokens, np.array([e.n_prompt for e in examples]),
                   np.array([len(e.tokens) for e in examples]))

    @property
    def window(self) -> tuple[int, int]:
        """Positions ``[w0, w1)`` that carry streams in some row: main target in the completion."""
        return int((self.n_prompt - 1).min()), int((self.length - 1).max())

    @property
    def span(self) -> int:
        """Completion positions of the longest row: lossless stream rows are laid out per row from
        its own last prompt token (``n_prompt - 1``), so a row never builds streams for another
        row's prompt."""
        return int((self.length - self.n_prompt).max())

    def at(self, a: int, b: int) -> np.ndarray:
        """Positions (B, b-a) of completion slots ``[a, b)``: ``n_prompt - 1 + k`` per row (slots past
        a row's end continue its numbering and carry no target)."""
        return (self.n_prompt - 1)[:, None] + np.arange(a, b)[None, :]

    def counts(self, gamma: int) -> np.ndarray:
        """Valid targets: [main (= early exit), stream 1, ..., stream gamma] (float64)."""
        n = (self.length - self.n_prompt).astype(np.float64)
        return np.array([n.sum()] + [np.maximum(n - j, 0).sum() for j in range(1, gamma + 1)])

    def targets(self, t: np.ndarray, gamma: int):
        """For positions ``t`` (B, L): main targets (B, L), stream targets (B, L, gamma) and their
        validity masks (targets must be completion tokens of the row)."""
        B, T = self.tokens.shape
        ahead = t[..., None] + 1 + np.arange(gamma + 1)  # (B, L, g+1): main, then streams
        idx = np.minimum(ahead, T - 1).reshape(B, -1)
        tgt = np.take_along_axis(self.tokens, idx, axis=1).reshape(ahead.shape)
        valid = (t[..., None] >= self.n_prompt[:, None, None] - 1) & (
            ahead < self.length[:, None, None])
        return tgt[..., 0], tgt[..., 1:], valid[..., 0], valid[..., 1:]

    def stream_rows(self, t: np.ndarray, gamma: int) -> np.ndarray:
        """Node-major indices (C,) into the ``L*gamma`` stream rows of positions ``t`` (B, L) of the
        rows a lossless step needs: those with a target in some row of the batch. They include every
        stream row they see, since stream j has a target only where stream j - 1 has one.

        Example: one row, completion of 3 tokens (slots 0..2), gamma 2: slot 0 needs streams 1, 2,
        slot 1 stream 1, slot 2 none, so the rows are [0, 1, 2] of 6.
        """
        return np.flatnonzero(self.targets(t, gamma)[3].any(axis=0).reshape(-1))


def segments(n: int, segment_len: int | None) -> list[tuple[int, int]]:
    """Slots ``[0, n)`` cut into segments of at most ``segment_len``."""
    if not segment_len:
        return [(0, n)]
    return [(a, min(a + segment_len, n)) for a in range(0, n, segment_len)]


HOLD_OUT_AT_LEAST = 8  # examples held out, at least
HOLD_OUT_MIN = 4 * HOLD_OUT_AT_LEAST  # examples from which hold_out spares some (a quarter at most)


def hold_out(ds: Dataset, seed: int, fraction: float = 0.1, at_most: int = 64,
             at_least: int = HOLD_OUT_AT_LEAST) -> tuple[Dataset, Dataset | None]:
    """A data set given without validation data, split into ``(train, valid)``: ``fraction`` of
    the examples (``at_least`` .. ``at_most``) held out at random, so the run can measure
    acceptance and keep its best adapter; ``(ds, None)`` when too small to spare them. The
    replies of one conversation (examples of one line) go to the same side."""
    n_valid = min(at_most, max(at_least, round(fraction * len(ds))))
    if len(ds) < 4 * n_valid:
        return ds, None
    lines: dict[int, list[int]] = {}
    for i, e in enumerate(ds.examples):
        if e.line is not None:
            lines.setdefault(e.line, []).append(i)
    most = min(at_most, len(ds) // 4)  # a conversation that would pass it stays in training
    held: set[int] = set()
    for i in np.random.default_rng(seed).permutation(len(ds)).tolist():
        if len(held) >= n_valid:
            break
        line = ds.examples[i].line
        group = lines[line] if line is not None else [i]
        if i not in held and len(held) + len(group) <= most:
            held.update(group)
    if not held:
        return ds, None
    train = [e for i, e in enumerate(ds.examples) if i not in held]
    return replace(ds, examples=train), Dataset([ds.examples[i] for i in sorted(held)], ds.path)


# A run given neither iters nor epochs (tuned on the project's code and sql data: docs/training.md)
DEFAULT_STEPS = 200
MAX_EPOCHS = 20


def default_iters(n_train: int, batch_size: int) -> int:
    """Steps of a run given neither ``iters`` nor ``epochs``: one epoch of a large data set; a small
    one is seen as many times as reach ``DEFAULT_STEPS`` steps (at most ``MAX_EPOCHS``), since one
    epoch of 120 prompts is 15 steps, which teach the streams nothing."""
    per_epoch = math.ceil(n_train / batch_size)
    return max(per_epoch, min(DEFAULT_STEPS, MAX_EPOCHS * per_epoch))


def length_keys(ds: Dataset, mode: str) -> np.ndarray:
    """What length-grouped batches sort by, (n, 2). Lossless stream rows start at each row's own
    prompt end, so rows of similar completion length pad least: (completion length, length);
    shared and LoRA windows start at the earliest prompt end of the batch: (prompt length, length)."""
    first = [e.n_targets if mode == "lossless" else e.n_prompt for e in ds.examples]
    return np.array([[f, len(e.tokens)] for f, e in zip(first, ds.examples)])


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int,
                  lengths: np.ndarray | None = None, pool: int = 16) -> list[list[int]]:
    """The global batches of one epoch, a function of (seed, epoch) only. With ``lengths``
    ((n, 2): :func:`length_keys`) every ``pool`` batches' worth of shuffled examples are sorted
    by them before they are cut into batches, and the batches shuffled, so few stream rows of a
    batch are padding."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n)
    if lengths is None:
        return [order[i: i + batch_size].tolist() for i in range(0, n, batch_size)]
    batches = []
    for c in range(0, n, batch_size * pool):
        chunk = order[c: c + batch_size * pool]
        chunk = chunk[np.lexsort((lengths[chunk, 1], lengths[chunk, 0]))]
        batches += [chunk[i: i + batch_size].tolist() for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]
