"""Decode speed of one BLAS variant (decode_ab.txt says how each was loaded): 6 sql test prompts,
64 tokens, greedy, with sql-lossless, plain AR and SS, best of 3. Run from the repository root:
``python decode_ab.py LABEL``."""

import json
import sys
import time

import mlx_specstream  # noqa: F401  (before MLX: the BLAS)
from mlx_specstream.api import generate, load

model, tok = load("models/specstream-tiny/mlx", adapter="sql-lossless")
prompts = [json.loads(line)["prompt"] for line in open("data/sql/test.jsonl")][:6]
best = {}
for _ in range(3):
    for mode in ("ar", "ss"):
        start, n = time.perf_counter(), 0
        for p in prompts:
            n += len(generate(model, tok, p, max_tokens=64, mode=mode).tokens)
        best[mode] = max(best.get(mode, 0), n / (time.perf_counter() - start))
print(sys.argv[1] if len(sys.argv) > 1 else "", {k: round(v, 1) for k, v in best.items()},
      round(best["ss"] / best["ar"], 3))
