"""Which BLAS MLX's CPU backend runs on, and what it does to multi-row matmuls.

Speculative verification runs many query rows through the model at once; on the reference BLAS
bundled with the ``mlx[cpu]`` wheel that costs as much as running the rows one by one. This
prints, under the active BLAS (see ``specstream-mlx blas``): a 4096x1024 fp32 matmul
(``x @ W.T``, W of shape 4096x1024, as ``nn.Linear(1024, 4096)``) with 1, 4, 16 and 32 rows, and
a forward pass of a ~20M-parameter llama (random weights) for 1 and 16 new tokens over a KV
cache of 128 tokens.

    .venv/bin/python scripts/bench_blas.py            # the BLAS this process gets
    .venv/bin/python scripts/bench_blas.py --compare  # reference, OpenBLAS, MKL side by side

``--compare`` re-runs this script in subprocesses with ``SPECSTREAM_BLAS=reference``,
``=openblas`` and ``=mkl`` (those installed) and prints one table with the machine, versions and
date. This is a benchmark, not a test: timings on a shared machine are noisy; compare ratios
measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlx_specstream.blas import active_blas, blas_label, find_blas  # noqa: E402

ROWS = (1, 4, 16, 32)
TOKENS = (1, 16)
MODEL = dict(model_type="llama", hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
             intermediate_size=1408, num_hidden_layers=6, vocab_size=4096, max_position_embeddings=4096)


def timed(fn, reps: int, warmup: int = 2) -> float:
    """Median wall time of ``fn`` in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def measure(reps: int, context: int) -> dict:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlx_specstream.arch import build_model
    from mlx_specstream.kv_cache import make_cache

    mx.random.seed(0)
    w = mx.random.normal((4096, 1024)) * 0.02
    matmul = {}
    for n in ROWS:
        x = mx.random.normal((n, 1024))
        mx.eval(w, x)
        matmul[n] = timed(lambda x=x: mx.eval(x @ w.T), reps)

    model = build_model(MODEL)
    mx.eval(model.parameters())
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    cache = make_cache(model)
    mx.eval(model(mx.arange(context)[None] % MODEL["vocab_size"], cache=cache))
    forward = {}
    for n in TOKENS:
        tokens = mx.arange(n)[None] + 7

        def step(tokens=tokens):
            mx.eval(model(tokens, cache=cache))
            for c in cache:
                c.trim(tokens.shape[1])  # back to the same 128-token context

        forward[n] = timed(step, reps)
    return {"blas": active_blas(), "label": blas_label(),
            "library": os.environ.get("LD_PRELOAD", "") or "(bundled)", "matmul_ms": matmul,
            "forward_ms": forward, "model_params": params, "context": context}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import mlx.core as mx
    import numpy as np

    return (f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
            f"Python {platform.python_version()}, mlx {mx.__version__}, numpy {np.__version__}; "
            f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")


def table(results: list[dict]) -> str:
    """Markdown table, one column per BLAS."""

    def row(label, cells):
        return f"| {label} | " + " | ".join(cells) + " |"

    lines = [row("", [r["label"] for r in results]), "|---|" + "---:|" * len(results)]
    for n in ROWS:
        lines.append(row(f"4096x1024 fp32 matmul, {n} row{'s' if n > 1 else ''} (ms)",
                         [f"{r['matmul_ms'][n]:.2f}" for r in results]))
    lines.append(row("matmul: 16 rows / 1 row", [f"{r['matmul_ms'][16] / r['matmul_ms'][1]:.1f}x"
                                                 for r in results]))
    p = results[0]["model_params"] / 1e6
    for n in TOKENS:
        lines.append(row(f"llama {p:.0f}M forward, {n} token{'s' if n > 1 else ''}, cache "
                         f"{results[0]['context']} (ms)", [f"{r['forward_ms'][n]:.2f}" for r in results]))
    lines.append(row("forward: 16 tokens / 1 token", [f"{r['forward_ms'][16] / r['forward_ms'][1]:.1f}x"
                                                      for r in results]))
    return "\n".join(lines)


def compare(args) -> None:
    choices = ["reference", "openblas"] + (["mkl"] if find_blas("mkl") else [])
    results = []
    for choice in choices:
        if choice != "reference" and find_blas(choice) is None:
            print(f"{choice}: not installed, skipped", file=sys.stderr)
            continue
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env["SPECSTREAM_BLAS"] = choice
        cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--reps", str(args.reps),
               "--context", str(args.context)]
        print(f"running with SPECSTREAM_BLAS={choice} ...", file=sys.stderr)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{choice}: failed\n{out.stderr}", file=sys.stderr)
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        for key in ("matmul_ms", "forward_ms"):
            r[key] = {int(k): v for k, v in r[key].items()}
        if r["blas"] != choice:
            print(f"{choice}: asked for it but the run used {r['blas']}", file=sys.stderr)
        results.append(r)
    print(f"Machine: {machine()}")
    print(f"Command: {' '.join(['python', 'scripts/bench_blas.py', *sys.argv[1:]])}")
    for r in results:
        print(f"  {r['label']}: {r['library']}")
    print()
    print(table(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", action="store_true", help="reference vs OpenBLAS vs MKL, side by side")
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions (median is reported)")
    ap.add_argument("--context", type=int, default=128, help="cached tokens before each forward")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compare:
        compare(args)
        return
    r = measure(args.reps, args.context)
    if args.json:
        print(json.dumps(r))
        return
    print(f"Machine: {machine()}")
    print(f"BLAS: {r['label']} ({r['library']})\n")
    print(table([r]))


if __name__ == "__main__":
    main()
