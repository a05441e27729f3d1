"""The shipped model's 57 matrix products (7 per layer, 8 layers, the head) for M rows, random
fp32 weights of its shapes, one evaluation per set; fastest of 30, ms.

    .venv/bin/python results/serve/gemm_pad/products.py 1 4 8 16 32
"""

import sys
import time

import mlx_specstream  # noqa: F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx

from mlx_specstream import blas

SHAPES = [(384, 384), (384, 128), (384, 128), (384, 384), (384, 1024), (384, 1024), (1024, 384)] * 8
SHAPES.append((384, 4096))


def best_ms(weights: list, rows: int, reps: int = 30) -> float:
    xs = {k: mx.random.normal((rows, k)) for k in (384, 1024)}
    mx.eval(list(xs.values()))
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval([xs[w.shape[0]] @ w for w in weights])
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> None:
    print(blas.blas_label())
    weights = [mx.random.normal(s) for s in SHAPES]
    mx.eval(weights)
    for rows in [int(a) for a in sys.argv[1:]] or range(1, 41):
        print(rows, round(best_ms(weights, rows), 2), flush=True)


if __name__ == "__main__":
    main()
