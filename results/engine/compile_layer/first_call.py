"""The first call of an ``mx.compile``d element-wise function on a CPU (MLX compiles the fused
graph with the system C++ compiler; a later process finds it in MLX's disk cache), then again."""

import time

import mlx_specstream  # noqa: F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx

fused = mx.compile(lambda x, y: (x * mx.sigmoid(x)) * y + 1.0)
for n in (1, 4, 7, 16):
    x, y = mx.ones((1, n, 1024)), mx.ones((1, n, 1024))
    for label in ("first call", "second"):
        t = time.perf_counter()
        mx.eval(fused(x, y))
        print(n, label, round((time.perf_counter() - t) * 1e3, 2), "ms")
