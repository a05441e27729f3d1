"""Cost of the decode passes as the context grows: a plain AR pass, a 4-node chain without
streams, the same chain with streams on every node, and an AR-sized pass plus its deferred
stream pass, after 128, 512 and 2,000 cached tokens (the shipped model and a lossless adapter).

    .venv/bin/python scripts/bench_context.py [--adapter sql-lossless --contexts 128,512,2000] [--out FILE]

Each figure is the median of ``--reps`` passes; the cache is trimmed back after each, so every
pass sees the same context.
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


# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_specstream.api import DEFAULT_MODEL, load  # noqa: E402
from mlx_specstream.kv_cache import make_cache  # noqa: E402
from mlx_specstream.outputs import markdown_table, run_meta, write_results_file  # noqa: E402
from mlx_specstream.streams import forward, stream_pass  # noqa: E402
from mlx_specstream.tree import chain  # noqa: E402


def filled(model, n: int, rng) -> list:
    """A cache holding n random tokens, written 256 at a time."""
    caches = make_cache(model)
    for a in range(0, n, 256):
        b = min(n, a + 256)
        forward(model, chain(rng.integers(5, 4000, b - a)), caches, a)
        for c in caches:
            c.commit(a, list(range(b - a)))
    return caches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--adapter", default="sql-lossless")
    ap.add_argument("--contexts", default="128,512,2000")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    model, _ = load(args.model, adapter=args.adapter)
    rng = np.random.default_rng(0)
    g = args.gamma

    def deferred(caches, n):
        out = forward(model, chain([5]), caches, n)
        mx.eval(out.msa_input)
        for c in caches:
            c.commit(n, [0])
        mx.eval(stream_pass(model, out.msa_input[0], caches, n + 1, g))

    passes = {
        "ar_ms": lambda c, n: mx.eval(forward(model, chain([5]), c, n).main_logits),
        "chain4_ms": lambda c, n: mx.eval(forward(model, chain([5, 6, 7, 8]), c, n).main_logits),
        "chain4_streams_ms": lambda c, n: mx.eval(
            forward(model, chain([5, 6, 7, 8]), c, n, gamma=g).stream_logits),
        "ar_deferred_streams_ms": deferred,
    }
    load_before = os.getloadavg()
    rows = []
    for n in (int(x) for x in args.contexts.split(",")):
        caches = filled(model, n, rng)
        row = {"context": n}
        for name, run in passes.items():
            times = []
            for _ in range(args.reps + 1):
                t = time.perf_counter()
                run(caches, n)
                times.append(time.perf_counter() - t)
                for c in caches:
                    c.trim(c.offset - n)
            row[name] = round(statistics.median(times[1:]) * 1e3, 2)
        rows.append(row)
        print(row, file=sys.stderr)
    meta = run_meta(adapter=args.adapter, gamma=g,
                    load_before_after=[round(load_before[0], 2), round(os.getloadavg()[0], 2)])
    print(markdown_table({"cached tokens": "context", "AR pass (ms)": "ar_ms", "4-node chain": "chain4_ms",
                          "+ streams on every node": "chain4_streams_ms",
                          "AR + deferred stream pass": "ar_deferred_streams_ms"}, rows))
    if args.out:
        write_results_file(args.out, meta, rows)


if __name__ == "__main__":
    main()
