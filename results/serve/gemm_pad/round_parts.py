"""Where a batched round's time goes: the scheduler's batched passes timed by kind (tree passes,
deferred stream passes), the rest of the wall time (prefills, host work) by difference; 12 sql test
prompts in groups of 4, 64 tokens, the second of two passes over them. ``AD=`` for AR batching.

    AD=sql-lossless .venv/bin/python results/serve/gemm_pad/round_parts.py
"""

import collections
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, "scripts")
import bench_rounds  # noqa: E402  (scripts/bench_rounds.py; it loads the BLAS before MLX)

# isort: split
from mlx_specstream import runner, scheduler  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL  # noqa: E402
from mlx_specstream.pool import ModelPool  # noqa: E402

spent: dict = collections.defaultdict(float)
count: collections.Counter = collections.Counter()
rows: list = []


def timed(requests) -> None:
    kind = "streams" if requests[0].tree is None else "tree"
    t = time.perf_counter()
    runner.run_passes(requests)
    spent[kind] += time.perf_counter() - t
    count[kind] += 1
    if kind == "tree":
        sizes = [len(r.tree) for r in requests]
        rows.append((len(sizes), sum(sizes), len(sizes) * max(sizes)))


scheduler.run_passes = timed
adapter = os.environ.get("AD", "sql-lossless")
pool = ModelPool(DEFAULT_MODEL, [adapter] if adapter else [])
model = pool.get(f"{pool.base_id}:{adapter}") if adapter else pool.base
with open("data/sql/test.jsonl") as f:
    prompts = [pool.tokenizer.encode(json.loads(next(f))["prompt"]) for _ in range(12)]
sched = scheduler.Scheduler(max_active=4)
sched.start()
run = bench_rounds.rounds_method(sched, model, pool.tokenizer, mode="ss" if adapter else "ar")
for _ in range(2):
    spent.clear()
    count.clear()
    rows.clear()
    t = time.perf_counter()
    tokens = sum(len(run(prompts[k:k + 4], 64)[0]) for k in range(0, 12, 4))
    wall = time.perf_counter() - t
sched.stop()
outside = wall - sum(spent.values())
print("wall", round(wall, 3), "tokens", tokens, "outside batched passes", round(outside, 3))
for kind, s in spent.items():
    print(kind, "passes", count[kind], "total s", round(s, 3), "ms each", round(s / count[kind] * 1e3, 2))
r = np.array(rows)
print("tree passes: sequences", r[:, 0].mean(), "rows", r[:, 1].mean(), "rows with padding", r[:, 2].mean())
