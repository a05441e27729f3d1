"""Tree attention and multi-stream attention of the decode step: custom Metal kernels
(``metal/tree_attention.metal``, ``metal/attention_combine.metal``) with their pure-MLX references.

Backends (``backend=`` on each function, or the global :func:`set_backend` that
``planned_attention(..., backend=None)`` follows):

- ``"mlx"``: the dense path: a boolean mask built with :mod:`mlx_specstream.tree` and
  ``mx.fast.scaled_dot_product_attention`` (stream keys concatenated after the cache);
- ``"metal"``: the kernels through ``mx.fast.metal_kernel`` (Apple silicon);
- ``"emulator"``: the same kernel sources run by the CPU emulator of Metal (slow; for tests);
- ``"auto"``: ``"metal"`` on a Metal device, once the kernel has passed a quick self-check
  against the dense path there (else it warns and stays on ``"mlx"``); ``"mlx"`` everywhere else.

Shapes: q (B, H, R, D); k, v (B, Hkv, n_prefix + M, D): the cache prefix followed by the M tree
nodes (the cache after appending the nodes' keys); k_streams, v_streams (B, Hkv, K * gamma, D):
the stream rows, never written to the cache. Rows of q and who sees what follow
:mod:`mlx_specstream.layout` (main rows of the M nodes, then stream rows node-major). H must be a
multiple of Hkv (GQA).
Supported: float32, float16, bfloat16; any head dim up to 128 (tested: 16, 64, 80, 96, 128);
any cache length.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from .. import layout, machine
from .. import tree as tree_mod
from ..device import on_cuda, on_gpu
from . import host_math, metal_available, metal_kernel, read_metal, require_metal
from .emulator import to_mx

BACKENDS = ("auto", "mlx", "metal", "emulator")
ROWS_PER_SIMDGROUP = 4
THREADGROUP_MEMORY = 32768


def _env_backend() -> str:
    """``$MLX_SPECSTREAM_ATTENTION``: a backend of :data:`BACKENDS`; anything else is ``auto``,
    with a warning that names the variable (a stray value must not fail every generation)."""
    value = os.environ.get("MLX_SPECSTREAM_ATTENTION", "auto").strip() or "auto"
    if value not in BACKENDS:
        machine.warn(f"MLX_SPECSTREAM_ATTENTION={value!r} is not one of {', '.join(BACKENDS)}: using auto")
        return "auto"
    return value


_backend = _env_backend()
calls: Counter = Counter()  # kernel launches by backend, for tests and benchmarks


def _checked(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    return backend


def set_backend(backend: str) -> str:
    """Set the backend ``planned_attention`` uses by default; returns the previous one."""
    global _backend
    old, _backend = _backend, _checked(backend)
    return old


# ---- visibility ------------------------------------------------------------------------------

def parents_from_bits(anc_bits: np.ndarray, m: int) -> np.ndarray:
    """Parents of a breadth-first tree from its ancestor bits: the closest (highest-index)
    proper ancestor of each node, -1 for roots."""
    a = unpack_bits(anc_bits, m)
    parents = np.full(m, -1, np.int64)
    for i in range(m):
        prior = np.nonzero(a[i, :i])[0]
        if len(prior):
            parents[i] = prior[-1]
    return parents


def unpack_bits(anc_bits: np.ndarray, m: int) -> np.ndarray:
    """Boolean (M, M) ancestor matrix from ``tree.ancestor_bits``' packing."""
    bits = np.asarray(anc_bits, np.uint32).reshape(m, -1) if m else np.zeros((0, 1), np.uint32)
    shifts = np.arange(32, dtype=np.uint32)
    a = ((bits[:, :, None] >> shifts) & 1).astype(bool).reshape(m, -1)
    return a[:, :m]


def row_table(m: int, stream_nodes, gamma: int, shared: bool) -> np.ndarray:
    """(R, 3) int32 per query row: the node whose ancestors it sees, and the range
    [lo, lo + count) of stream keys it sees: the ``NODE, LO, COUNT`` columns of ``layout.rows``
    (M = 0: the streams of the last cached token, stream node -1)."""
    nodes = np.zeros(0, np.int64) if stream_nodes is None else np.asarray(stream_nodes, np.int64)
    table = layout.rows(m, nodes, gamma, own=shared) if m else layout.rows(0, nodes, gamma, main_rows=False)
    rows = table[:, [layout.NODE, layout.LO, layout.COUNT]].astype(np.int32)
    rows[:, 0] = np.maximum(rows[:, 0], 0)
    return rows


def dense_mask(parents: np.ndarray, n_prefix: int, stream_nodes=None, gamma: int = 0,
               shared: bool = False) -> mx.array:
    """The boolean mask of the dense path, from tree.py (M = 0: streams of the last cached token,
    which sees the whole cache)."""
    m = len(parents)
    if stream_nodes is None or gamma == 0:
        return tree_mod.tree_mask(parents, n_prefix)
    if m == 0:
        if len(stream_nodes) != 1:
            raise ValueError("with no tree nodes, streams belong to one cached token")
        return mx.array(layout.pass_mask(np.ones((1, n_prefix), bool), [0], gamma, main_rows=False))
    return tree_mod.stream_mask(parents, n_prefix, np.asarray(stream_nodes), gamma, shared)


@dataclass(eq=False)
class AttentionPlan:
    """Everything the attention of one tree pass needs besides q, k, v; shared by all layers.

    ``anc_bits``: (M, ceil(M/32)) uint32 from ``tree.ancestor_bits``. ``stream_nodes``: the nodes
    carrying ``gamma`` streams (None: plain tree rows); M = 0 with one stream node (-1) stands
    for the streams of the last cached token (deferred streams). ``shared``: main rows also see
    their node's streams. The dense mask, the row table and the device copies are built lazily,
    once per plan.
    """

    n_prefix: int
    anc_bits: np.ndarray
    stream_nodes: np.ndarray | None = None
    gamma: int = 0
    shared: bool = False
    parents: np.ndarray | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def for_tree(cls, parents, n_prefix: int) -> AttentionPlan:
        parents = np.asarray(parents, np.int64)
        return cls(n_prefix, tree_mod.ancestor_bits(parents), parents=parents)

    @classmethod
    def for_streams(cls, parents, n_prefix: int, stream_nodes, gamma: int, shared: bool) -> AttentionPlan:
        parents = np.asarray(parents, np.int64)
        return cls(n_prefix, tree_mod.ancestor_bits(parents), np.asarray(stream_nodes, np.int64), gamma,
                   shared, parents=parents)

    @classmethod
    def deferred(cls, n_prefix: int, gamma: int) -> AttentionPlan:
        """The gamma streams of the token at position n_prefix - 1 (already in the cache)."""
        return cls(n_prefix, np.zeros((0, 1), np.uint32), np.array([-1]), gamma, False,
                   parents=np.zeros(0, np.int64))

    @property
    def n_nodes(self) -> int:
        return int(self.anc_bits.shape[0])

    @property
    def has_streams(self) -> bool:
        return self.stream_nodes is not None and self.gamma > 0

    @property
    def n_stream_rows(self) -> int:
        return len(self.stream_nodes) * self.gamma if self.has_streams else 0

    @property
    def n_rows(self) -> int:
        return self.n_nodes + self.n_stream_rows

    def _get(self, key, build):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    @property
    def tree_parents(self) -> np.ndarray:
        if self.parents is None:
            self.parents = parents_from_bits(self.anc_bits, self.n_nodes)
        return self.parents

    @property
    def mask(self) -> mx.array:
        """The dense boolean mask (rows, n_prefix + M [+ K*gamma]) of the pure-MLX path."""
        return self._get("mask", lambda: dense_mask(self.tree_parents, self.n_prefix,
                                                    self.stream_nodes if self.has_streams else None,
                                                    self.gamma, self.shared))

    @property
    def rows(self) -> np.ndarray:
        return self._get("rows", lambda: row_table(self.n_nodes, self.stream_nodes if self.has_streams
                                                   else None, self.gamma, self.shared))

    def kernel_inputs(self, on_device: bool):
        """(anc, rows) as the kernel takes them (mx arrays, made once, for Metal)."""
        def build():
            anc = np.ascontiguousarray(self.anc_bits, np.uint32)
            if anc.size == 0:
                anc = np.zeros((1, 1), np.uint32)
            rows = np.ascontiguousarray(self.rows)
            return (mx.array(anc), mx.array(rows)) if on_device else (anc, rows)
        return self._get(("inputs", on_device), build)


@dataclass(eq=False)
class BatchPlan:
    """The attention of a batched pass over B sequences, each with its own cache and plan.

    Rows are laid out (B, T): sequence b's main rows are ``[0, main[b])`` and its stream rows
    ``[n_main, n_main + streams[b])``; the rest are padding, which attends to nothing and is
    never cached. ``plans[b]`` is sequence b's :class:`AttentionPlan` (None: its rows see every
    key, as a one-node tree does). Example: trees of 3 and 1 nodes with 2 streams each give
    n_main 3, T 9, main [3, 1], streams [6, 2]: rows 0-2 and 3-8 of sequence 0, rows 0 and 3-4
    of sequence 1.
    """

    plans: list[AttentionPlan | None]
    main: list[int]
    streams: list[int]
    n_main: int

    def gather(self, x: mx.array, b: int, axis: int = 2) -> mx.array:
        """Sequence b's rows of x (B, ..., T, ...) along ``axis``, main rows then stream rows."""
        if self.main[b] == self.n_main and self.n_main + self.streams[b] == x.shape[axis]:
            return x[b:b + 1]  # no padding in this sequence
        spans = [(0, self.main[b]), (self.n_main, self.n_main + self.streams[b])]
        parts = [mx.take(x[b:b + 1], mx.arange(lo, hi), axis=axis) for lo, hi in spans if hi > lo]
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=axis)

    def scatter(self, o: mx.array, b: int, n_rows: int) -> mx.array:
        """Sequence b's rows o (1, H, main + streams, D) back in place in (1, H, T, D), zeros elsewhere."""
        def zeros(n):
            return mx.zeros((*o.shape[:2], n, o.shape[3]), o.dtype)

        m, s = self.main[b], self.streams[b]
        if m == self.n_main and m + s == n_rows:
            return o
        parts = [o[:, :, :m], zeros(self.n_main - m), o[:, :, m:], zeros(n_rows - self.n_main - s)]
        return mx.concatenate([p for p in parts if p.shape[2]], axis=2)


# ---- the kernels -----------------------------------------------------------------------------

_kernels: dict = {}


def _get_kernels(backend: str):
    if backend not in _kernels:
        attn = metal_kernel(
            name="specstream_tree_attention",
            input_names=["q", "k", "v", "ks", "vs", "anc", "rows", "params", "scale"],
            output_names=["out", "ml"], source=read_metal("tree_attention.metal"),
            ensure_row_contiguous=False, backend=backend)
        combine = metal_kernel(
            name="specstream_attention_combine", input_names=["part", "ml", "cparams"],
            output_names=["out"], source=read_metal("attention_combine.metal"), backend=backend)
        _kernels[backend] = (attn, combine)
    return _kernels[backend]


def threadgroup_bytes(dim: int, dtype, nsg: int) -> int:
    """Threadgroup memory of tree_attention.metal: q tile, key tile (padded rows), probabilities."""
    size = 4 if dtype == mx.float32 else 2
    kp = dim + (1 if size == 4 else 2)
    return nsg * dim * 16 + 32 * kp * size + nsg * 32 * 16


def simdgroups(dim: int, dtype, rows: int) -> int:
    """8 simdgroups (32 rows per threadgroup, half the key/value reads of 4) when there are more
    than 16 rows and the tiles fit in threadgroup memory; else 4."""
    if rows > 16 and threadgroup_bytes(dim, dtype, 8) <= THREADGROUP_MEMORY:
        return 8
    return 4


def choose_splits(n_keys: int, n_groups: int) -> int:
    """Key splits (flash-decoding): enough threadgroups to fill a GPU when the rows alone don't,
    keeping >= 256 keys per split. Untuned: measure on the Mac with scripts/bench_kernels.py."""
    if n_keys < 512:
        return 1
    want = max(1, math.ceil(128 / max(1, n_groups)))
    return int(max(1, min(want, n_keys // 256, 32)))


_NP_DTYPES = {np.dtype(np.float32): mx.float32, np.dtype(np.float16): mx.float16}


def run_kernel(backend, q, k, v, ks, vs, anc, rows, n_prefix, m, n_stream_keys, scale, splits=None):
    """Launch the attention kernel (and the combine kernel when the keys are split).

    q, k, v, ks, vs are mx arrays, or for the emulator also numpy arrays of any strides (that is
    how the tests exercise the strided indexing Metal sees on cache slices). ks, vs None: no
    stream keys. anc (M, W) uint32 and rows (R, 3) int32 as in :class:`AttentionPlan`.
    """
    B, H, R, D = q.shape
    Hkv, N = k.shape[1], k.shape[2]
    dtype = q.dtype if isinstance(q, mx.array) else _NP_DTYPES.get(np.dtype(q.dtype))
    if H % Hkv:
        raise ValueError(f"{H} query heads are not a multiple of {Hkv} key/value heads")
    if not kernel_supports(D, dtype):
        raise ValueError(f"heads of dim {D} in {q.dtype} are not supported by the kernels (1..128; "
                         "float32, float16, bfloat16)")
    if N != n_prefix + m:
        raise ValueError(f"k has {N} rows, expected n_prefix + M = {n_prefix + m}")
    G = H // Hkv
    nsg = simdgroups(D, dtype, G * R)
    n_blocks = math.ceil(G * R / (ROWS_PER_SIMDGROUP * nsg))
    n_splits = splits or choose_splits(N, n_blocks * B * Hkv)
    chunk = max(32, math.ceil(math.ceil(max(N, 1) / n_splits) / 32) * 32)
    n_splits = max(1, math.ceil(N / chunk))
    W = anc.shape[-1]
    params = np.array([n_prefix, N, n_stream_keys, R, G, W, H, Hkv, n_splits, chunk, B], np.int32)
    on_device = backend == "metal"
    if ks is None:
        ks = vs = mx.zeros((1, 1, 1, D), dtype)
    attn, combine = _get_kernels(backend)
    split = n_splits > 1
    out_dtype = mx.float32 if split else dtype
    shapes = ([(n_splits, B, H, R, D), (n_splits, B, H, R, 2)] if split else [(B, H, R, D), (1, 2)])
    calls[backend] += 1
    outs = attn(
        inputs=[q, k, v, ks, vs, anc, rows, mx.array(params) if on_device else params, float(scale)],
        template=[("T", dtype), ("OT", out_dtype), ("D", D), ("NSG", nsg), ("SPLIT", split)],
        grid=(32 * nsg * n_blocks, B * Hkv, n_splits), threadgroup=(32 * nsg, 1, 1),
        output_shapes=shapes, output_dtypes=[out_dtype, mx.float32])
    if split:
        cparams = np.array([n_splits, B * H * R, D], np.int32)
        outs = combine(
            inputs=[outs[0], outs[1], mx.array(cparams) if on_device else cparams],
            template=[("T", dtype)], grid=(D, B * H * R, 1), threadgroup=(min(D, 128), 1, 1),
            output_shapes=[(B, H, R, D)], output_dtypes=[dtype])
    out = outs[0]
    return out if on_device else to_mx(out, dtype)


# ---- backends --------------------------------------------------------------------------------

_self_check: dict = {}


def _metal_passes_self_check() -> bool:
    """Run the kernel once on this Metal device against the dense path (cached)."""
    if "ok" not in _self_check:
        try:
            rng = np.random.default_rng(0)
            parents = np.array([-1, 0, 0, 1, 1, 2, 3])
            plan = AttentionPlan.for_streams(parents, 37, np.arange(7), 2, True)
            q = mx.array(rng.normal(size=(1, 4, plan.n_rows, 64)).astype(np.float32))
            k, v = (mx.array(rng.normal(size=(1, 2, 37 + 7, 64)).astype(np.float32)) for _ in range(2))
            ks, vs = (mx.array(rng.normal(size=(1, 2, 14, 64)).astype(np.float32)) for _ in range(2))
            a = planned_attention(q, k, v, ks, vs, plan, 0.125, backend="metal")
            b = planned_attention(q, k, v, ks, vs, plan, 0.125, backend="mlx")
            err = float(mx.abs(a - b).max())
            _self_check["ok"] = err < 1e-3
            if not _self_check["ok"]:
                machine.warn(f"the tree-attention Metal kernel differs from the dense path by {err:.2e} "
                             "on this device; using the dense path")
        except Exception as e:  # compile or launch failure: keep decoding on the dense path
            machine.warn(f"the tree-attention Metal kernel failed on this device ({e}); using the dense path")
            _self_check["ok"] = False
    return _self_check["ok"]


def resolve(backend: str | None) -> str:
    """The backend that will run: "mlx", "metal" or "emulator"."""
    backend = _backend if backend is None else _checked(backend)
    if backend == "auto":
        return "metal" if metal_available() and _metal_passes_self_check() else "mlx"
    if backend == "metal":
        require_metal()
    return backend


def kernel_supports(dim: int, dtype) -> bool:
    """Whether the kernels run heads of ``dim`` in ``dtype`` (:func:`run_kernel` refuses others)."""
    return 1 <= dim <= 128 and dtype in (mx.float32, mx.float16, mx.bfloat16)


FOLD_MAX_ROWS = 32  # decode-sized passes; prefills and training passes run as they are
CUDA_MATMUL_MAX_ROWS = 256  # on CUDA, passes up to this many rows (any tree with its streams) skip cuDNN


def sdpa(q, k, v, mask, scale) -> mx.array:
    """``mx.fast.scaled_dot_product_attention`` with grouped-query heads folded into the rows: for a
    pass of at most ``FOLD_MAX_ROWS`` rows, q (B, H, T, D) runs as (B, Hkv, G*T, D) against the
    Hkv key/value heads, so K/V are read once per KV head instead of once per query head (on a
    CPU, a ~20 % faster AR pass at 2,000 cached tokens: docs/engine.md). The mask (T, S) or
    (B|1, 1, T, S) is repeated for the G heads of a group; other masks run as is.

    On a CPU the softmax of a bigger pass (a prefill; a boolean mask of the shapes above, or none)
    runs in NumPy (``host_math.attention``): MLX's CPU ``exp`` costs ~10x NumPy's, which made a 2,000-token
    prefill take seconds (docs/engine.md#long-contexts-decoding-as-the-context-grows-measured).
    Plain and speculative decoding prefill through the same call, so their caches stay equal;
    decode-sized passes keep MLX's operations (no host round trip inside them). On CUDA a pass of 2
    to ``CUDA_MATMUL_MAX_ROWS`` rows runs ``matmul_attention`` (``device.on_cuda`` says why), and
    no GPU folds (its kernels read K/V once per KV head already). Inside
    ``host_math.enabled()`` (a training step on a CPU) every softmax runs in NumPy."""
    B, H, T, D = q.shape
    if host_math.active():
        return host_math.attention(q, k, v, mask, scale)
    foldable = mask is None or mask.ndim == 2 or (mask.ndim == 4 and mask.shape[1] == 1)  # one per group
    if 1 < T <= CUDA_MATMUL_MAX_ROWS and foldable and on_cuda():
        return matmul_attention(q, k, v, mask, scale)
    if T > FOLD_MAX_ROWS and foldable:  # host_math.attention runs an additive mask in MLX itself
        with host_math.enabled():  # on a CPU, unless MLX_SPECSTREAM_HOST_MATH=0
            return host_math.attention(q, k, v, mask, scale)
    G = H // k.shape[1]
    if G == 1 or T > FOLD_MAX_ROWS or not foldable or on_gpu():  # GPUs' kernels share K/V already
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    if mask is not None:
        mask = mx.tile(mask, (G, 1) if mask.ndim == 2 else (1, 1, G, 1))
    o = mx.fast.scaled_dot_product_attention(q.reshape(B, k.shape[1], G * T, D), k, v, scale=scale, mask=mask)
    return o.reshape(B, H, T, D)


def matmul_attention(q, k, v, mask, scale, softcap: float | None = None) -> mx.array:
    """Softmax attention as plain MLX operations (scores, softmax in float32, values): the G query
    heads of a key/value head as one product of G*T rows. q (B, H, T, D); k, v (B, Hkv, S, D);
    mask None, (T, S) or (B|1, 1, T, S), boolean (True: visible) or additive. What a decode pass
    runs on CUDA (``device.on_cuda``): the same function as ``mx.fast.scaled_dot_product_attention``
    without a cuDNN graph built for each new key length; and every pass of a layer whose scores
    are soft-capped (``softcap * tanh(score / softcap)`` before the mask, Gemma 2's), which
    ``mx.fast`` cannot do."""
    B, H, T, D = q.shape
    hkv, S = k.shape[1], k.shape[2]
    G = H // hkv
    scores = ((q * scale).reshape(B, hkv, G * T, D) @ k.swapaxes(-1, -2)).reshape(B, hkv, G, T, S)
    scores = scores.astype(mx.float32)
    if softcap is not None:
        scores = mx.tanh(scores / softcap) * softcap
    if mask is not None:
        mask = (mask[None, None] if mask.ndim == 2 else mask)[:, :, None]  # (B|1, 1, 1, T, S)
        scores = mx.where(mask, scores, -mx.inf) if mask.dtype == mx.bool_ else scores + mask
    p = mx.softmax(scores, axis=-1).astype(v.dtype)
    return (p.reshape(B, hkv, G * T, S) @ v).reshape(B, H, T, D)


CAPPED_ROWS = 512  # rows of a soft-capped pass attended at once (a prefill's in blocks)


def capped_attention(q, k, v, mask, scale, softcap: float) -> mx.array:
    """:func:`matmul_attention` with soft-capped scores, its rows in blocks of :data:`CAPPED_ROWS`:
    a long prompt's prefill would otherwise hold each layer's whole (T, S) float32 scores, and
    their tanh, at once (an 8,000-token prompt of Gemma 2 9B: gigabytes)."""
    T = q.shape[2]
    if T <= CAPPED_ROWS:
        return matmul_attention(q, k, v, mask, scale, softcap)
    outs = []
    for r in range(0, T, CAPPED_ROWS):
        rows = slice(r, r + CAPPED_ROWS)
        part = None if mask is None else mask[rows] if mask.ndim == 2 else mask[:, :, rows]
        outs.append(matmul_attention(q[:, :, rows], k, v, part, scale, softcap))
    return mx.concatenate(outs, axis=2)


def tree_attention(q, k, v, n_prefix: int, anc_bits, scale: float, backend: str = "auto",
                   splits: int | None = None) -> mx.array:
    """Attention of the M tree nodes: node i sees the cache prefix and its ancestors and itself
    (bit j of ``anc_bits[i]``). q (B, H, M, D); k, v (B, Hkv, n_prefix + M, D)."""
    anc_bits = np.asarray(anc_bits, np.uint32)
    m = q.shape[2]
    if anc_bits.shape[0] != m:
        raise ValueError(f"anc_bits has {anc_bits.shape[0]} rows for {m} query rows")
    plan = AttentionPlan(n_prefix, anc_bits)
    return planned_attention(q, k, v, None, None, plan, scale, backend, splits)


def multistream_attention(q, k, v, k_streams, v_streams, n_prefix: int, anc_bits, stream_nodes,
                          gamma: int, shared: bool, scale: float, backend: str = "auto",
                          splits: int | None = None) -> mx.array:
    """Attention of a multi-stream pass, visibility exactly ``tree.stream_mask``'s.
    q (B, H, M + K*gamma, D); k, v (B, Hkv, n_prefix + M, D); k_streams, v_streams
    (B, Hkv, K*gamma, D)."""
    plan = AttentionPlan(n_prefix, np.asarray(anc_bits, np.uint32), np.asarray(stream_nodes, np.int64),
                         gamma, shared)
    return planned_attention(q, k, v, k_streams, v_streams, plan, scale, backend, splits)


def planned_attention(q, k, v, k_streams, v_streams, plan: AttentionPlan, scale: float,
                      backend: str | None = None, splits: int | None = None) -> mx.array:
    """Attention of one pass described by ``plan`` (plain tree rows when ``k_streams`` is None).

    ``backend`` None follows :func:`set_backend`. Returns (B, H, rows, D) in q's dtype.
    """
    if q.shape[2] != plan.n_rows:
        raise ValueError(f"q has {q.shape[2]} rows, the plan {plan.n_rows}")
    if plan.has_streams != (k_streams is not None):
        raise ValueError("stream keys must be given exactly when the plan has streams")
    if k_streams is not None and k_streams.shape[2] != plan.n_stream_rows:
        raise ValueError(f"k_streams has {k_streams.shape[2]} rows, the plan {plan.n_stream_rows}")
    which = resolve(backend)
    if which == "metal" and (backend or _backend) == "auto" and not kernel_supports(q.shape[-1], q.dtype):
        which = "mlx"  # auto: heads the kernel does not run (Gemma 3's 256) take the dense path
    if q.shape[2] == 0:  # no rows: nothing to attend (a kernel's grid would be empty)
        return mx.zeros(q.shape, q.dtype)
    if which == "mlx":
        calls["mlx"] += 1
        if k_streams is not None:
            k = mx.concatenate([k, k_streams], axis=2)
            v = mx.concatenate([v, v_streams], axis=2)
        return sdpa(q, k, v, plan.mask, scale)
    anc, rows = plan.kernel_inputs(on_device=which == "metal")
    return run_kernel(which, q, k, v, k_streams, v_streams, anc, rows, plan.n_prefix, plan.n_nodes,
                      plan.n_stream_rows, scale, splits)


def attend_with_cache(q, k, v, cache, plan: AttentionPlan, n_main: int | None, scale: float,
                      backend: str | None = None) -> mx.array:
    """What ``arch.base.attention`` does for a pass described by ``plan`` (its ``mask``).

    q, k, v (B, H, T, D) of this pass; the first ``n_main`` rows (all when None) are main rows:
    their keys/values are appended to ``cache`` (prefix + nodes); the rest are stream rows,
    passed to the kernel as separate stream keys, never cached nor concatenated.
    """
    return planned_attention(q, *cached_and_streams(k, v, cache, n_main), plan, scale, backend)


def cached_and_streams(k, v, cache, n_main: int | None):
    """The keys and values a pass attends to: ``(keys, values)`` of its first ``n_main`` rows (all
    when None) appended to ``cache`` (the cache's rows, then them; just them without a cache), and
    ``(k_streams, v_streams)``, the rest: stream rows, never cached (None, None when there are none)."""
    n_cached = k.shape[2] if n_main is None else n_main
    if cache is not None:
        keys, values = cache.append(k[:, :, :n_cached], v[:, :, :n_cached])
    else:
        keys, values = k[:, :, :n_cached], v[:, :, :n_cached]
    if n_cached < k.shape[2]:
        return keys, values, k[:, :, n_cached:], v[:, :, n_cached:]
    return keys, values, None, None
