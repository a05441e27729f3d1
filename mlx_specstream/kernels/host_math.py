"""The exponential-heavy operations of a training step (cross-entropy over the vocabulary, SiLU,
the attention softmax) computed by NumPy when MLX runs on the CPU, with their own gradients.

Why: MLX's CPU ``exp`` runs at ~14 ns per element on this project's 2-core x86 machine against
~1.5 ns for NumPy's vectorised one (``scripts/bench_host_math.py``, docs/training.md), and a lossless
step over ~1,000 stream rows spends most of its time there: the softmax of 1,000 x 4,096 logits
(and its gradient), the gates of the MLP, the attention scores. Matrix products stay in MLX.

Each operation is an ``mx.custom_function`` whose forward (and, where it needs an exponential,
backward) evaluates its inputs and runs in NumPy; it is a synchronisation point, so it is used only
inside :func:`enabled` (the training step turns it on; ``attention.sdpa`` for the softmax of a pass
bigger than a decode step, such as a prefill) and only on a CPU device. Everywhere else, and in
every decode-sized inference pass, the MLX operations run as before; ``MLX_SPECSTREAM_HOST_MATH=0``
(or :func:`set_allowed`) keeps them everywhere.
Off host math, :func:`cross_entropy`, :func:`silu` and :func:`attention` compute the same
functions with MLX operations.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .. import machine

_enabled = False
_allowed = os.environ.get("MLX_SPECSTREAM_HOST_MATH", "1") != "0"  # "0": MLX's operations everywhere
_THREADS = min(8, machine.cores())
_MIN_SPLIT = 1 << 15  # elements below which one thread does the whole array


class _Workers:
    """Threads that run the parts of a call: the parts go through one queue, each call's results
    through its own, both C-level (``queue.SimpleQueue``), so an interrupt of the caller at any
    point (Ctrl-C, a notebook's "interrupt kernel") holds nothing the next call needs; parts it
    left running finish into buffers no one reads. (``ThreadPoolExecutor``'s Python-level locks
    can be left taken by one, which a walkthrough saw hang every later call.) The threads start at
    the first call, in the process that makes it: a forked child starts its own."""

    def __init__(self, n: int):
        self.n, self.parts, self.pid = n, None, None  # (started by the first map)

    def _start(self) -> None:
        self.parts, self.pid = queue.SimpleQueue(), os.getpid()  # (a fork's parent's queue: no one reads it)
        for i in range(self.n):
            threading.Thread(target=self._work, args=(self.parts,), name=f"host-math-{i}",
                             daemon=True).start()

    @staticmethod
    def _work(parts: queue.SimpleQueue) -> None:
        while True:
            f, arg, done = parts.get()
            try:
                done.put((f(arg), None))
            except BaseException as e:  # said in the caller's thread
                done.put((None, e))

    def map(self, f: Callable, args: list) -> list:
        if self.pid != os.getpid():
            self._start()
        done: queue.SimpleQueue = queue.SimpleQueue()
        for arg in args:
            self.parts.put((f, arg, done))
        results = [done.get() for _ in args]
        for _, error in results:
            if error is not None:
                raise error
        return [r for r, _ in results]


_pool = _Workers(_THREADS) if _THREADS > 1 else None


@contextmanager
def enabled(on: bool = True) -> Iterator[None]:
    """Use the NumPy versions inside this block (or, as a decorator, during each call of the
    function) when the default device is a CPU."""
    global _enabled
    old, _enabled = _enabled, on and _allowed and mx.default_device() == mx.cpu
    try:
        yield
    finally:
        _enabled = old


def active() -> bool:
    return _enabled


def set_allowed(allowed: bool) -> bool:
    """Allow (the default) or forbid the NumPy versions; returns the previous setting."""
    global _allowed
    old, _allowed = _allowed, allowed
    return old


def _np(x: mx.array) -> np.ndarray:
    return np.asarray(x.astype(mx.float32) if x.dtype != mx.float32 else x)


def _by_rows(f: Callable[..., None], out: np.ndarray, *inputs: np.ndarray, axis: int = 0) -> np.ndarray:
    """``f(out_chunk, *input_chunks)`` over contiguous ranges of ``axis``, on the cores (NumPy's
    ufuncs release the GIL); every input has ``out``'s extent along ``axis`` (other axes may
    broadcast)."""
    n = out.shape[axis]
    if _pool is None or out.size < _MIN_SPLIT or n < 2:
        f(out, *inputs)
        return out
    cuts = np.linspace(0, n, min(_THREADS, n) + 1).astype(int)
    lead = (slice(None),) * (axis % out.ndim)

    def part(i: int) -> None:
        sl = (*lead, slice(cuts[i], cuts[i + 1]))
        f(out[sl], *(x[sl] for x in inputs))

    _pool.map(part, list(range(len(cuts) - 1)))
    return out


def _softmax_into(out: np.ndarray, x: np.ndarray) -> None:
    """Softmax of ``x`` over its last axis into ``out``; a row with no finite entry gives zeros."""
    m = x.max(axis=-1, keepdims=True)
    m[~np.isfinite(m)] = 0.0
    np.subtract(x, m, out=out)
    np.exp(out, out=out)
    s = out.sum(axis=-1, keepdims=True)
    s[s == 0] = 1.0
    out /= s


# -- cross-entropy ----------------------------------------------------------------------------

def _ce_into(out: np.ndarray, x: np.ndarray, t: np.ndarray) -> None:
    m = x.max(axis=-1)
    out[:] = np.log(np.exp(x - m[:, None]).sum(axis=-1)) + m - x[np.arange(len(t)), t]


def _ce_grad_into(out: np.ndarray, x: np.ndarray, t: np.ndarray, c: np.ndarray) -> None:
    _softmax_into(out, x)
    out[np.arange(len(t)), t] -= 1.0
    out *= c[:, None]


@mx.custom_function
def _ce_host(logits: mx.array, targets: mx.array) -> mx.array:
    x = _np(logits)
    return mx.array(_by_rows(_ce_into, np.empty(len(x), np.float32), x, np.array(targets)))


@_ce_host.vjp
def _ce_host_vjp(primals, cotangent, output):
    logits, targets = primals
    x = _np(logits)
    c = np.array(cotangent, dtype=np.float32)
    g = _by_rows(_ce_grad_into, np.empty_like(x), x, np.array(targets), c)
    return mx.array(g).astype(logits.dtype), mx.zeros_like(targets)


def cross_entropy(logits: mx.array, targets: mx.array) -> mx.array:
    """Per-row cross-entropy (N,) of logits (N, V) against integer targets (N,), in float32."""
    if _enabled and logits.ndim == 2:
        return _ce_host(logits, targets)
    logits = logits.astype(mx.float32)
    picked = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return mx.logsumexp(logits, axis=-1) - picked


# -- SiLU -------------------------------------------------------------------------------------

def _silu_into(out: np.ndarray, x: np.ndarray) -> None:
    with np.errstate(over="ignore"):
        np.exp(-x, out=out)
    out += 1.0
    np.divide(x, out, out=out)


def _silu_grad_into(out: np.ndarray, x: np.ndarray) -> None:
    """d silu / dx = s (1 + x (1 - s)), s = sigmoid(x)."""
    with np.errstate(over="ignore"):
        np.exp(-x, out=out)
    out += 1.0
    np.reciprocal(out, out=out)
    out *= 1.0 + x * (1.0 - out)


def _flat(x: mx.array) -> np.ndarray:
    return _np(x).reshape(-1)


@mx.custom_function
def _silu_host(x: mx.array) -> mx.array:
    xn = _flat(x)
    return mx.array(_by_rows(_silu_into, np.empty_like(xn), xn)).reshape(x.shape).astype(x.dtype)


@_silu_host.vjp
def _silu_host_vjp(x, cotangent, output):  # one input: given and returned bare
    xn = _flat(x)
    d = _by_rows(_silu_grad_into, np.empty_like(xn), xn)
    return cotangent * mx.array(d).reshape(x.shape).astype(cotangent.dtype)


def silu(x: mx.array) -> mx.array:
    """``x * sigmoid(x)``."""
    return _silu_host(x) if _enabled else nn.silu(x)


# -- attention --------------------------------------------------------------------------------

def _scores_softmax_into(out: np.ndarray, x: np.ndarray, bias: np.ndarray, scale: float) -> None:
    np.multiply(x, scale, out=out)
    out += bias
    _softmax_into(out, out)


@mx.custom_function
def _attention_probs_host(scores: mx.array, bias: mx.array, scale: mx.array) -> mx.array:
    """softmax(scale * scores + bias) over the keys; scores (..., T, S), bias (0 or -inf)
    broadcastable to them with the full T axis (or a single element)."""
    x, b, sc = _np(scores), _np(bias), scale.item()
    out = _by_rows(lambda o, x, b: _scores_softmax_into(o, x, b, sc),
                   np.empty(x.shape, np.float32), x, np.broadcast_to(b, b.shape[:-2] + x.shape[-2:]), axis=-2)
    return mx.array(out).astype(scores.dtype)


@_attention_probs_host.vjp
def _attention_probs_host_vjp(primals, cotangent, output):
    """In MLX: the same product in NumPy would wait for the cotangent in the middle of the backward
    pass, which made a 4-layer lossless step ~25 % slower (365 against 283 ms)."""
    scores, bias, scale = primals
    g = output * (cotangent - (output * cotangent).sum(axis=-1, keepdims=True)) * scale
    return g, mx.zeros_like(bias), mx.zeros_like(scale)


def attention(q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None, scale: float) -> mx.array:
    """Softmax attention with a boolean mask (or None): q (B, H, T, D); k, v (B, Hkv, S, D), H a
    multiple of Hkv (grouped-query heads share their key/value head); mask broadcastable to
    (B, 1, T, S). Returns (B, H, T, D). The G = H / Hkv query heads of a key/value head run as one
    matrix product of G*T rows; the scale and the mask (as a 0/-inf bias, made once per call, not
    per head) are applied inside the NumPy softmax. Off host math:
    ``mx.fast.scaled_dot_product_attention``."""
    if not _enabled or (mask is not None and mask.dtype != mx.bool_):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    B, H, T, D = q.shape
    hkv, S = k.shape[1], k.shape[2]
    G = H // hkv  # heads of a group next to each other, as HF orders them
    dtype = q.dtype  # fp16 / bf16: scores, probabilities and their sum in fp32, as MLX's attention
    q, k, v = (x.astype(mx.float32) for x in (q, k, v))  # (fp16 scores overflow; bf16's are coarse)
    scores = (q.reshape(B, hkv, G * T, D) @ k.swapaxes(-1, -2)).reshape(B, hkv, G, T, S)
    if mask is None:
        bias = mx.zeros((1, 1, 1, 1, 1), scores.dtype)
    else:  # (T, S) or (B|1, 1, T, S) -> (B|1, 1, 1, T, S)
        mask = mask[None, None] if mask.ndim == 2 else mask
        bias = mx.where(mask, mx.array(0.0, mx.float32), mx.array(-mx.inf, mx.float32))[:, :, None]
    p = _attention_probs_host(scores, mx.stop_gradient(bias), mx.array(scale, mx.float32))
    return (p.reshape(B, hkv, G * T, S) @ v).reshape(B, H, T, D).astype(dtype)
