"""What batching forward passes across requests costs on this machine: the time of one pass over
B sequences (each with its own cached context, T new rows) against a one-sequence pass, two ways:

- ``ideal``: one (B, T) batch over one batched cache (equal contexts, one attention call per
  layer): the floor of any batching;
- ``engine``: ``streams.forward_batch``, what the server runs: each sequence keeps its own cache
  and tree, attention runs per sequence.

T = 1 is a batched autoregressive step; T = 4 a chain of three drafts after the root (the
paper's rule for batched Speculative Streaming: trees off, one chain per sequence).

    .venv/bin/python scripts/bench_batch_pass.py [--model DIR --context 128 --batch 1,2,4,8,16] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


import mlx_specstream  # noqa: E402,F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL  # noqa: E402
from mlx_specstream.kv_cache import make_cache  # noqa: E402
from mlx_specstream.loader import load_model  # noqa: E402
from mlx_specstream.outputs import markdown_table, recorded_path, run_meta, write_results_file  # noqa: E402
from mlx_specstream.streams import forward, forward_batch  # noqa: E402
from mlx_specstream.tree import chain  # noqa: E402


def pass_time(model, batch: int, rows: int, context: int, reps: int) -> float:
    """Median seconds of one pass of ``rows`` new rows for each of ``batch`` cached sequences."""
    cache = make_cache(model)
    vocab = model.config["vocab_size"]
    mx.eval(model(mx.random.randint(0, vocab, (batch, context)), cache=cache))
    tokens = mx.random.randint(0, vocab, (batch, rows))
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        mx.eval(model(tokens, cache=cache))
        times.append(time.perf_counter() - t)
        for c in cache:
            c.trim(rows)
    return statistics.median(times[1:])


def engine_pass_time(model, batch: int, rows: int, context: int, reps: int) -> float:
    """Median seconds of ``streams.forward_batch`` over ``batch`` sequences with their own caches,
    a chain of ``rows`` nodes each."""
    vocab = model.config["vocab_size"]
    caches = []
    for _ in range(batch):
        cache = make_cache(model)
        forward(model, chain(np.random.randint(0, vocab, context)), cache, 0)
        caches.append(cache)
    trees = [chain(np.random.randint(0, vocab, rows)) for _ in range(batch)]
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        mx.eval([o.main_logits for o in forward_batch(model, trees, caches, [context] * batch)])
        times.append(time.perf_counter() - t)
        for cache in caches:
            for c in cache:
                c.trim(rows)
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", default="1,2,4,8,16")
    ap.add_argument("--rows", default="1,4", help="new rows per sequence and pass")
    ap.add_argument("--reps", type=int, default=20)
    args = outputs.parse_script_args(ap)

    model = load_model(args.model)
    load_before = os.getloadavg()
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        for batch in (int(b) for b in args.batch.split(",")):
            one, many, engine = [], [], []
            for _ in range(3):  # interleaved: the machine's load hits all alike
                one.append(pass_time(model, 1, rows, args.context, args.reps))
                many.append(pass_time(model, batch, rows, args.context, args.reps))
                engine.append(engine_pass_time(model, batch, rows, args.context, args.reps))
            t1, tb, te = statistics.median(one), statistics.median(many), statistics.median(engine)
            results.append({"rows": rows, "batch": batch, "one_sequence_ms": round(t1 * 1e3, 3),
                            "batched_ms": round(tb * 1e3, 3), "cost_vs_one_pass": round(tb / t1, 3),
                            "throughput_gain": round(batch * t1 / tb, 3), "engine_ms": round(te * 1e3, 3),
                            "engine_cost_vs_one_pass": round(te / t1, 3)})
            print(results[-1], file=sys.stderr)
    meta = run_meta(model=recorded_path(args.model), context=args.context,
                    load_before_after=[round(load_before[0], 2), round(os.getloadavg()[0], 2)])
    columns = {"rows per sequence": "rows", "batch": "batch", "one sequence (ms)": "one_sequence_ms",
               "ideal batch (ms)": "batched_ms", "ideal cost vs one pass": "cost_vs_one_pass",
               "engine batch (ms)": "engine_ms", "engine cost vs one pass": "engine_cost_vs_one_pass"}
    print(markdown_table(columns, results))
    if args.out:
        write_results_file(args.out, meta, results)


if __name__ == "__main__":
    main()
