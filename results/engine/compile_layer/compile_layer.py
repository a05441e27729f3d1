"""Graph building and evaluation of a 1-row and a 4-node pass of the base model (the first sql
test prompt cached), with each llama layer as shipped and with its work before and after the
attention ``mx.compile``d (norm, q/k/v, rotary embedding; output projection, residuals, norm,
MLP). Fastest of 60, ms; plain, compiled, plain, compiled. Full rotary dims and no adapters only:
a measurement, not an implementation.

    .venv/bin/python results/engine/compile_layer/compile_layer.py
"""

import json
import time

import mlx_specstream  # noqa: F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx

from mlx_specstream import api, streams
from mlx_specstream.arch import base, llama
from mlx_specstream.runner import MLXRunner
from mlx_specstream.tree import chain

model, tok = api.load()
with open("data/sql/test.jsonl") as f:
    prompt = tok.encode(json.loads(f.readline())["prompt"])
runner = MLXRunner(model)
runner.start(prompt, 0, True)


def timed(k: int, reps: int = 60) -> tuple[float, float]:
    tree = chain([5 + i for i in range(k)])
    build = evaluate = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        out = streams.forward(model, tree, runner.caches, runner.n)
        t1 = time.perf_counter()
        mx.eval(out.main_logits)
        t2 = time.perf_counter()
        build, evaluate = min(build, t1 - t0), min(evaluate, t2 - t1)
        runner.discard()
    return round(build * 1e3, 2), round(evaluate * 1e3, 2)


def compiled_parts(block):
    att = block.self_attn

    def qkv(x, positions):
        B, T, _ = x.shape
        x = block.input_layernorm(x)
        q = att.q_proj(x).reshape(B, T, att.n_heads, -1).transpose(0, 2, 1, 3)
        k = att.k_proj(x).reshape(B, T, att.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = att.v_proj(x).reshape(B, T, att.n_kv_heads, -1).transpose(0, 2, 1, 3)
        cos, sin = att.rope.tables(positions, x.dtype)
        half = att.rope.dims // 2

        def rotate(z):
            return z * cos + mx.concatenate([-z[..., half:], z[..., :half]], axis=-1) * sin

        return rotate(q), rotate(k), v

    def after(x, o):
        B, _, T, _ = o.shape
        h = x + att.o_proj(o.transpose(0, 2, 1, 3).reshape(B, T, -1))
        return h + block.mlp(block.post_attention_layernorm(h))

    return mx.compile(qkv), mx.compile(after)


parts: dict = {}


def compiled_call(self, x, positions, mask=None, cache=None, n_main=None):
    if id(self) not in parts:
        parts[id(self)] = compiled_parts(self)
    qkv, after = parts[id(self)]
    q, k, v = qkv(x, positions)
    att = self.self_attn
    return after(x, base.attention(q, k, v, cache, mask, n_main, att.scale, positions, att.window))


plain_call = llama.Block.__call__
for label, call in (("plain", plain_call), ("compiled", compiled_call)) * 2:
    llama.Block.__call__ = call
    for k in (1, 4):
        build, evaluate = timed(k)
        print(label, f"{k} node(s)", "build", build, "eval", evaluate)
llama.Block.__call__ = plain_call
