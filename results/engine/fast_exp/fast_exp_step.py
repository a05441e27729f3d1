"""A lossless SS step (a k-node chain's tree pass, then the deferred stream pass of its last node
and the streams' log-probabilities) with MLX's CPU ``exp`` in the attention softmax and the MLP's
SiLU, against the same step with an exponential built from element-wise operations (MLX's own
Cephes polynomial and exponent bits, fused by ``mx.compile``). `sql-lossless`, a context of
valid-split examples cut to CONTEXT tokens; 60 rounds alternating the two, (fastest, median) ms.

    .venv/bin/python results/engine/fast_exp/fast_exp_step.py [CONTEXT]
"""

import json
import sys
import time

import mlx_specstream  # noqa: F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx
import numpy as np

from mlx_specstream import api, streams
from mlx_specstream.arch import base, llama
from mlx_specstream.kernels import attention, host_math
from mlx_specstream.lora import project
from mlx_specstream.runner import MLXRunner
from mlx_specstream.tree import chain

LOG2E = 1.4426950408889634
COEFFS = [1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3, 5.550332471162809e-2,
          2.402264791363012e-1, 6.931472028550421e-1, 1.0]


def exp_ops(x):
    """exp(x) = 2^i * 2^f: i by exponent bits, 2^f by a degree-6 polynomial."""
    t = mx.clip(x * LOG2E, -127.0, 127.0)
    i = mx.floor(t + 0.5)
    f = t - i
    p = COEFFS[0]
    for c in COEFFS[1:]:
        p = p * f + c
    return p * mx.view((i.astype(mx.int32) + 127) << 23, mx.float32)


fast_exp = mx.compile(exp_ops)


@mx.compile
def silu_times(g, u):
    return g / (1.0 + exp_ops(-g)) * u


def fast_attention(q, k, v, mask, scale):
    B, H, T, D = q.shape
    hkv, S = k.shape[1], k.shape[2]
    G = H // hkv
    scores = ((q * scale).reshape(B, hkv, G * T, D) @ k.swapaxes(-1, -2)).reshape(B, hkv, G, T, S)
    if mask is not None:
        mask = (mask[None, None] if mask.ndim == 2 else mask)[:, :, None]
        scores = mx.where(mask, scores, -mx.inf) if mask.dtype == mx.bool_ else scores + mask
    e = fast_exp(scores - mx.max(scores, axis=-1, keepdims=True))
    p = e / mx.sum(e, axis=-1, keepdims=True)
    return (p.reshape(B, hkv, G * T, S) @ v).reshape(B, H, T, D)


shipped_sdpa, shipped_mlp = attention.sdpa, llama.MLP.__call__


def fast_sdpa(q, k, v, mask, scale):
    if q.shape[2] > attention.FOLD_MAX_ROWS or host_math.active():
        return shipped_sdpa(q, k, v, mask, scale)
    return fast_attention(q, k, v, mask, scale)


def fast_mlp(self, x, n_main=None):
    g = silu_times(project(self.gate_proj, x, n_main), project(self.up_proj, x, n_main))
    return project(self.down_proj, g, n_main)


def use_fast(on: bool) -> None:
    base.sdpa = fast_sdpa if on else shipped_sdpa
    llama.MLP.__call__ = fast_mlp if on else shipped_mlp


model, tok = api.load(adapter="sql-lossless")
context = int(sys.argv[1]) if len(sys.argv) > 1 else 100
text = ""
with open("data/sql/valid.jsonl") as f:
    for line in f:
        row = json.loads(line)
        text += row["prompt"] + row["completion"] + "\n"
        if len(tok.encode(text)) > context:
            break
runner = MLXRunner(model)
runner.start(tok.encode(text)[:context], 4, True)


def logits(on: bool) -> np.ndarray:
    use_fast(on)
    out = np.array(streams.forward(model, chain([5, 6, 7, 8]), runner.caches, runner.n).main_logits)
    runner.discard()
    return out


plain, fast = logits(False), logits(True)
print("cached", runner.n, "max logit difference", np.abs(plain - fast).max(),
      "same argmax", bool((plain.argmax(-1) == fast.argmax(-1)).all()))


def step_s(k: int) -> float:
    t = time.perf_counter()
    out = streams.forward(model, chain([5 + i for i in range(k)]), runner.caches, runner.n)
    mx.eval(out.main_logits)
    for c in runner.caches:
        c.commit(runner.n, list(range(k)))
    s = streams.stream_pass(model, out.msa_input[k - 1], runner.caches, runner.n + k, 4)
    mx.eval(s - mx.logsumexp(s, axis=-1, keepdims=True))
    elapsed = time.perf_counter() - t
    for c in runner.caches:
        c.trim(k)
    return elapsed


times = {on: {1: [], 4: []} for on in (False, True)}
for _ in range(60):
    for on in (False, True):
        use_fast(on)
        for k in (1, 4):
            times[on][k].append(step_s(k))
for on in (False, True):
    summary = {f"{k} node(s)": (round(min(v) * 1e3, 2), round(float(np.median(v)) * 1e3, 2))
               for k, v in times[on].items()}
    print("fast exp" if on else "MLX exp", summary)
