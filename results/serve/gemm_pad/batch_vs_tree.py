import time, json, sys
import mlx_specstream
import mlx.core as mx, numpy as np
from mlx_specstream import api, streams
from mlx_specstream.runner import MLXRunner
from mlx_specstream.tree import Tree, chain, build_tree
model, tok = api.load(adapter='sql-lossless')
lines = open('data/sql/test.jsonl')
ids = [tok.encode(json.loads(next(lines))["prompt"]) for _ in range(4)]
runners = []
for p in ids:
    r = MLXRunner(model); r.start(p, 4, True); runners.append(r)
print([r.n for r in runners])
def tree(k):  # a chain of k nodes
    return chain([5 + i for i in range(k)])
def t_batch(trees, rs, reps=40):
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        outs = streams.forward_batch(model, trees, [r.caches for r in rs], [r.n for r in rs])
        mx.eval([[o.main_logits] for o in outs])
        best = min(best, time.perf_counter() - t)
        for r in rs: r.discard()
    return best * 1e3
def t_single(tr, r, reps=40):
    best = 1e9
    for _ in range(reps):
        t = time.perf_counter()
        out = streams.forward(model, tr, r.caches, r.n); mx.eval(out.main_logits)
        best = min(best, time.perf_counter() - t); r.discard()
    return best * 1e3
for rep in range(2):
    print('single 1-node', round(t_single(tree(1), runners[0]),2),
          'single 4-node', round(t_single(tree(4), runners[0]),2),
          'single 16-node', round(t_single(tree(16), runners[0]),2),
          'batch 4x1', round(t_batch([tree(1)]*4, runners),2),
          'batch 4x4', round(t_batch([tree(4)]*4, runners),2),
          'batch 3x4', round(t_batch([tree(4)]*3, runners[:3]),2),
          'batch 2x1', round(t_batch([tree(1)]*2, runners[:2]),2))
