"""A batched pass of B sequences' trees (``streams.forward_batch``) against one sequence's tree of
as many rows (``streams.forward``): `sql-lossless`, no streams, the first 4 sql test prompts
cached; fastest of 40, ms, two rounds.

    .venv/bin/python results/serve/gemm_pad/batch_vs_tree.py
"""

import json
import time

import mlx_specstream  # noqa: F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx

from mlx_specstream import api, streams
from mlx_specstream.runner import MLXRunner
from mlx_specstream.tree import chain

model, tok = api.load(adapter="sql-lossless")
with open("data/sql/test.jsonl") as f:
    prompts = [tok.encode(json.loads(next(f))["prompt"]) for _ in range(4)]
runners = []
for p in prompts:
    r = MLXRunner(model)
    r.start(p, 4, True)
    runners.append(r)


def tree(k: int):
    return chain([5 + i for i in range(k)])


def batch_ms(trees: list, rs: list, reps: int = 40) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        outs = streams.forward_batch(model, trees, [r.caches for r in rs], [r.n for r in rs])
        mx.eval([o.main_logits for o in outs])
        best = min(best, time.perf_counter() - t)
        for r in rs:
            r.discard()
    return round(best * 1e3, 2)


def single_ms(k: int, r: MLXRunner, reps: int = 40) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(streams.forward(model, tree(k), r.caches, r.n).main_logits)
        best = min(best, time.perf_counter() - t)
        r.discard()
    return round(best * 1e3, 2)


print("cached tokens", [r.n for r in runners])
for _ in range(2):
    print("one sequence: 1 node", single_ms(1, runners[0]), "4 nodes", single_ms(4, runners[0]),
          "16 nodes", single_ms(16, runners[0]), "| 4 x 1 node", batch_ms([tree(1)] * 4, runners),
          "4 x 4 nodes", batch_ms([tree(4)] * 4, runners),
          "3 x 4 nodes", batch_ms([tree(4)] * 3, runners[:3]))
