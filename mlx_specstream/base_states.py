"""Lossless training: the frozen base model's states of a batch, computed once without gradients
(the hidden states entering the pruning and MSA layers, the MSA layers' main keys/values), and
kept across epochs within a memory bound, so a step backpropagates through stream rows only."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .arch.base import causal_mask
from .data import Example
from .kernels import host_math
from .train_batches import Batch


class _Recorder:
    """A one-shot "cache" that keeps the keys/values a layer computes for its main rows."""

    def append(self, k, v):
        self.k, self.v = k, v
        return k, v


class FixedKV:
    """Precomputed main keys/values, seen by stream rows that are never cached (n_main=0)."""

    def __init__(self, k, v):
        self.k, self.v = k, v

    def append(self, k, v):
        if k.shape[2]:
            raise RuntimeError("stream-only pass appended main rows")
        return self.k, self.v


def msa_start(model) -> int:
    return model.adapter_config.msa_start(len(model.layers))


@host_math.enabled()  # a training pass: NumPy's exponentials on a CPU
def base_states(model, tokens: mx.array):
    """Lossless mode, no gradients: the main hidden states entering the pruning layer and the MSA
    layers, the main keys/values of every MSA layer, and the final hidden states."""
    cfg = model.adapter_config
    T = tokens.shape[1]
    pos = mx.arange(T)
    mask = causal_mask(T, 0) if T > 1 else None
    h = model.embed(tokens, pos)
    msa = msa_start(model)
    h_prune = h_msa = None
    kvs = []
    for i, layer in enumerate(model.layers):
        if i == cfg.prune_layer:
            h_prune = h
        if i == msa:
            h_msa = h
        rec = _Recorder() if i >= msa else None
        h = layer(h, pos, mask, rec)
        if rec is not None:
            kvs.append((rec.k, rec.v))
    out = (mx.stop_gradient(h_prune), mx.stop_gradient(h_msa),
           [(mx.stop_gradient(k), mx.stop_gradient(v)) for k, v in kvs], mx.stop_gradient(h))
    mx.eval(out[0], out[1], out[2], out[3])
    return out


def _copy(x: mx.array) -> mx.array:
    return mx.array(np.array(x, copy=True), dtype=x.dtype)


class BaseStateCache:
    """Lossless mode: the frozen base's states of each training example (hidden states entering
    the pruning and MSA layers, the MSA layers' main keys/values), kept across epochs, so a small
    data set runs the base once per example instead of once per epoch.

    Memory is bounded by ``max_bytes``: an example's states are kept only while the total stays
    within it (first come, first kept; the default model needs about 7 KB per token in fp32, so
    1 GB holds ~150k tokens); the others are recomputed whenever they come up. Right padding and
    the causal mask make an example's states the same alone or in a batch, so a batch assembled
    from kept states gives the step the same loss and gradients (tested).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes, self.used = max_bytes, 0
        self.kept: dict[int, tuple] = {}

    def states(self, model, ids: list[int], examples: list[Example]):
        """``(h_prune, h_msa, kvs)`` of the right-padded batch of ``examples`` (ids: their
        indices in the data set)."""
        missing = [r for r, i in enumerate(ids) if i not in self.kept]
        fresh = {}
        if missing:
            sub = Batch.of([examples[r] for r in missing])
            h_prune, h_msa, kvs, _ = base_states(model, mx.array(sub.tokens))
            if len(missing) == len(ids) and self.used >= self.max_bytes:
                return h_prune, h_msa, kvs  # nothing more fits: the batch as computed
            for j, r in enumerate(missing):
                n = int(sub.length[j])
                fresh[r] = (h_prune[j, :n], h_msa[j, :n], [(k[j, :, :n], v[j, :, :n]) for k, v in kvs])
        rows = []
        for r, i in enumerate(ids):
            st = self.kept.get(i) or fresh[r]
            rows.append(st)
            if i not in self.kept:
                size = st[0].nbytes + st[1].nbytes + sum(k.nbytes + v.nbytes for k, v in st[2])
                if self.used + size <= self.max_bytes:  # own copies: no view keeps the batch alive
                    own = (_copy(st[0]), _copy(st[1]), [(_copy(k), _copy(v)) for k, v in st[2]])
                    self.kept[i] = own
                    self.used += size
        T = max(len(e.tokens) for e in examples)

        def stack(xs, axis):
            pad = [[(0, 0)] * x.ndim for x in xs]
            for p, x in zip(pad, xs):
                p[axis] = (0, T - x.shape[axis])
            return mx.stack([mx.pad(x, p) for p, x in zip(pad, xs)])

        kvs = [(stack([r[2][layer][0] for r in rows], 1), stack([r[2][layer][1] for r in rows], 1))
               for layer in range(len(rows[0][2]))]
        return stack([r[0] for r in rows], 0), stack([r[1] for r in rows], 0), kvs

