"""Does a wider tree cost anything on a CPU? An adapter decoded with its old tree (k = 3, 32
nodes) and the new one (k = 5, 64 nodes), default node cost (this machine's tree sizing), greedy,
64 tokens, on the first N sql test prompts: both trees interleaved, the fastest of 3 runs per
prompt, the ratio of summed times with a 95% bootstrap interval over prompts.

    .venv/bin/python results/adapters/base4/tree/cpu_ab.py sql 25 results/adapters/base4/tree/cpu_ab_sql.json
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

from mlx_specstream import generate, load
from mlx_specstream.outputs import run_meta, write_results_file

TREES = {"k3_32": {"branch": 3, "tree_budget": 32}, "k5_64": {"branch": 5, "tree_budget": 64}}


def main() -> None:
    adapter, n, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    model, tok = load(adapter=adapter)
    split = Path(__file__).resolve().parents[4] / "data" / "sql" / "test.jsonl"
    rows = [json.loads(line) for line in split.read_text().splitlines()][:n]
    generate(model, tok, rows[0]["prompt"], max_tokens=16)  # warm-up
    best = {k: [] for k in TREES}
    outputs = {k: [] for k in TREES}
    for r in rows:
        times = {k: [] for k in TREES}
        for rep in range(3):
            for k in list(TREES)[:: 1 if rep % 2 == 0 else -1]:
                start = time.perf_counter()
                res = generate(model, tok, r["prompt"], max_tokens=64, **TREES[k])
                times[k].append(time.perf_counter() - start)
                if rep == 0:
                    outputs[k].append((res.tokens, res.stats.calls))
        for k in TREES:
            best[k].append(min(times[k]))
    old, new = np.array(best["k3_32"]), np.array(best["k5_64"])
    idx = np.random.default_rng(0).integers(0, n, (2000, n))
    boot = old[idx].sum(1) / new[idx].sum(1)
    result = {"adapter": adapter, "prompts": n,
              "seconds": {k: round(float(sum(v)), 3) for k, v in best.items()},
              "speedup_k5_64": round(float(old.sum() / new.sum()), 4),
              "ci95": [round(float(np.percentile(boot, q)), 4) for q in (2.5, 97.5)],
              "same_tokens": all(a[0] == b[0] for a, b in zip(outputs["k3_32"], outputs["k5_64"])),
              "passes": {k: sum(c for _, c in v) for k, v in outputs.items()}}
    print(json.dumps(result))
    write_results_file(out, run_meta(adapter=adapter, trees=TREES), [result])


if __name__ == "__main__":
    main()
