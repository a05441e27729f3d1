import time, json, os
import mlx_specstream
import mlx.core as mx, numpy as np
from mlx_specstream import api, streams
from mlx_specstream.runner import MLXRunner
from mlx_specstream.tree import chain
from mlx_specstream.arch import llama, base
model, tok = api.load()
p = tok.encode(json.loads(open('data/sql/test.jsonl').readline())["prompt"])
r = MLXRunner(model); r.start(p, 0, True)
def timeit(k, reps=60):
    tr = chain([5 + i for i in range(k)])
    bb = be = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        out = streams.forward(model, tr, r.caches, r.n)
        t1 = time.perf_counter(); mx.eval(out.main_logits); t2 = time.perf_counter()
        bb = min(bb, t1 - t0); be = min(be, t2 - t1); r.discard()
    return round(bb*1e3, 2), round(be*1e3, 2)
res = {}
for k in (1, 4): res[('plain', k)] = timeit(k)
orig = llama.Block.__call__
def make(block):
    def mlp_part(h):
        return h + block.mlp(block.post_attention_layernorm(h))
    att = block.self_attn
    def qkv(x, positions):
        B, T, _ = x.shape
        x = block.input_layernorm(x)
        q = att.q_proj(x).reshape(B, T, att.n_heads, -1).transpose(0, 2, 1, 3)
        k = att.k_proj(x).reshape(B, T, att.n_kv_heads, -1).transpose(0, 2, 1, 3)
        v = att.v_proj(x).reshape(B, T, att.n_kv_heads, -1).transpose(0, 2, 1, 3)
        cos, sin = att.rope.tables(positions, x.dtype)
        def rot(z):
            half = att.rope.dims // 2
            z1, z2 = z[..., :half], z[..., half:]
            return z * cos + mx.concatenate([-z2, z1], axis=-1) * sin
        return rot(q), rot(k), v
    def out_part(x, o):
        B, _, T, _ = o.shape
        return mlp_part(x + att.o_proj(o.transpose(0, 2, 1, 3).reshape(B, T, -1)))
    return mx.compile(qkv), mx.compile(out_part)
comp = {}
def call(self, x, positions, mask=None, cache=None, n_main=None):
    if id(self) not in comp: comp[id(self)] = make(self)
    qkv, out_part = comp[id(self)]
    q, k, v = qkv(x, positions)
    o = base.attention(q, k, v, cache, mask, n_main, self.self_attn.scale, positions, self.self_attn.window)
    return out_part(x, o)
llama.Block.__call__ = call
for k in (1, 4): res[('compiled', k)] = timeit(k)
llama.Block.__call__ = orig
for k in (1, 4): res[('plain2', k)] = timeit(k)
llama.Block.__call__ = call
for k in (1, 4): res[('compiled2', k)] = timeit(k)
for kk, v in res.items(): print(kk, 'build', v[0], 'eval', v[1])
