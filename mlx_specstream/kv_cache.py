"""Pre-allocated KV cache built for speculation.

Rows are appended n at a time (a whole flattened tree), then :meth:`KVCache.commit` keeps a
chosen subset of the rows written since a given offset (the accepted path) and moves them to
contiguous slots; everything after them is dropped. Storage grows in steps so a step's append
never copies the whole cache.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

STEP = 256


class KVCache:
    # The position of each sequence's first slot, (B,), where a batch's sequences are left-padded
    # (:func:`~mlx_specstream.batch.greedy_batch`: minus each one's padding); None: slot i is at
    # position i. Sliding windows measure distances by it (:func:`~.arch.base.window_mask`).
    start: mx.array | None = None

    def __init__(self, step: int = STEP):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0
        self.step = step

    def append(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Write k, v (B, H, n, D) at the current offset; return all valid keys and values."""
        n = k.shape[2]
        need = self.offset + n
        if self.keys is None or need > self.keys.shape[2]:
            cap = ((need + self.step - 1) // self.step) * self.step
            shape = (*k.shape[:2], cap, k.shape[3])
            nk, nv = mx.zeros(shape, k.dtype), mx.zeros((*shape[:3], v.shape[3]), v.dtype)
            if self.keys is not None and self.offset:
                nk[:, :, : self.offset] = self.keys[:, :, : self.offset]
                nv[:, :, : self.offset] = self.values[:, :, : self.offset]
            self.keys, self.values = nk, nv
        self.keys[:, :, self.offset : need] = k
        self.values[:, :, self.offset : need] = v
        self.offset = need
        return self.keys[:, :, :need], self.values[:, :, :need]

    def commit(self, start: int, keep: int | list[int] | np.ndarray | mx.array) -> None:
        """Keep rows ``start + keep[i]`` as rows ``start + i``; drop every row after them.

        Rows already in place (``keep`` = 0, 1, ..., n-1 given on the host: a prefill, every AR
        step, a chain accepted in full; or their count, as :func:`rows_to_keep` gives it) are not
        copied."""
        keep = rows_to_keep(keep)
        if isinstance(keep, int):
            self.offset = start + keep
            return
        n = keep.size
        if n:
            idx = keep + start
            self.keys[:, :, start : start + n] = mx.take(self.keys, idx, axis=2)
            self.values[:, :, start : start + n] = mx.take(self.values, idx, axis=2)
        self.offset = start + n

    def trim(self, n: int) -> int:
        """Drop the last ``n`` rows; returns how many were dropped."""
        n = min(n, self.offset)
        self.offset -= n
        return n

    @property
    def state(self) -> tuple[mx.array, mx.array]:
        return self.keys[:, :, : self.offset], self.values[:, :, : self.offset]


def rows_to_keep(keep: int | list[int] | np.ndarray | mx.array) -> int | mx.array:
    """``keep`` as :meth:`KVCache.commit` uses it: host indices that are already in place (0, 1,
    ..., n-1: nothing to copy) as their count, other indices on the device. Converting once
    serves every layer that keeps the same rows, each then taking it as it is."""
    if isinstance(keep, int | mx.array):
        return keep
    keep = np.asarray(keep, np.int64)
    return keep.size if np.array_equal(keep, np.arange(keep.size)) else mx.array(keep.astype(np.int32))


def make_cache(model) -> list[KVCache]:
    """One cache per layer of ``model``."""
    return [KVCache() for _ in model.layers]
