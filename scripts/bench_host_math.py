"""The training step's exponential-heavy operations with MLX's operations and with their NumPy
versions (``mlx_specstream/kernels/host_math.py``), forward and backward, at the sizes of a default
lossless step (1,024 stream rows, the default model's 4,096-token vocabulary, 1,024 MLP features,
6 query and 2 key/value heads over 255 keys), plus ``exp`` alone per element, and MLX's
forward and backward through ``mx.compile`` (the issue's "compile the step where it pays").

    .venv/bin/python scripts/bench_host_math.py [--reps 10] [--out results/host_math.json]

Best of ``--reps`` runs each; run it alone on the machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_specstream  # noqa: E402,F401  (first: the optimized BLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.bench import best_time  # noqa: E402
from mlx_specstream.kernels import host_math  # noqa: E402
from mlx_specstream.outputs import markdown_table, run_meta, write_results_file  # noqa: E402


def best_ms(f, reps: int) -> float:
    return best_time(f, reps) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    args = outputs.parse_script_args(ap)
    rng = np.random.default_rng(0)
    logits = mx.array(rng.normal(0, 3, (1024, 4096)).astype(np.float32))
    targets = mx.array(rng.integers(0, 4096, 1024).astype(np.int32))
    gates = mx.array(rng.normal(0, 2, (1024, 1024)).astype(np.float32))
    q = mx.array(rng.normal(0, 1, (8, 6, 128, 64)).astype(np.float32))
    k, v = (mx.array(rng.normal(0, 1, (8, 2, 255, 64)).astype(np.float32)) for _ in range(2))
    mask = mx.array(rng.uniform(size=(8, 1, 128, 255)) < 0.7)
    mx.eval(logits, targets, gates, q, k, v, mask)
    ops = {  # name -> (inputs, function of them to differentiate)
        "cross-entropy 1024 x 4096": (logits, lambda x: host_math.cross_entropy(x, targets).sum()),
        "SiLU 1024 x 1024": (gates, lambda x: host_math.silu(x).sum()),
        "attention (8, 6, 128, 64) over 255 keys":
            (q, lambda x: host_math.attention(x, k, v, mask, 0.125).sum()),
    }
    rows = []
    for name, (x, f) in ops.items():
        row = {"operation": name}
        for side, on in (("mlx", False), ("numpy", True)):
            with host_math.enabled(on):
                row[f"{side}_forward_ms"] = round(best_ms(lambda f=f, x=x: mx.eval(f(x)), args.reps), 2)
                row[f"{side}_forward_backward_ms"] = round(
                    best_ms(lambda f=f, x=x: mx.eval(mx.value_and_grad(f)(x)), args.reps), 2)
        with host_math.enabled(False):
            compiled = mx.compile(mx.value_and_grad(f))
            row["mlx_compiled_forward_backward_ms"] = round(
                best_ms(lambda c=compiled, x=x: mx.eval(c(x)), args.reps), 2)
        row["speedup"] = round(row["mlx_forward_backward_ms"] / row["numpy_forward_backward_ms"], 2)
        rows.append(row)
    xn = np.array(logits)
    exp_ns = {"mlx": best_ms(lambda: mx.eval(mx.exp(logits)), args.reps) * 1e6 / logits.size,
              "numpy": best_ms(lambda: np.exp(xn), args.reps) * 1e6 / logits.size}
    meta = run_meta(numpy=np.__version__, reps=args.reps,
                    exp_ns_per_element={k: round(t, 2) for k, t in exp_ns.items()})
    print(f"`{meta['command']}` — {meta['date']}, {meta['machine']}, MLX {meta['mlx']}, "
          f"NumPy {meta['numpy']}, best of {args.reps}; exp per element: MLX {exp_ns['mlx']:.2f} ns, "
          f"NumPy {exp_ns['numpy']:.2f} ns\n")
    print(markdown_table({"operation": "operation", "MLX fwd ms": "mlx_forward_ms",
                          "NumPy fwd ms": "numpy_forward_ms", "MLX fwd+bwd ms": "mlx_forward_backward_ms",
                          "MLX compiled fwd+bwd ms": "mlx_compiled_forward_backward_ms",
                          "NumPy fwd+bwd ms": "numpy_forward_backward_ms", "speed-up": "speedup"}, rows))
    if args.out:
        write_results_file(args.out, meta, rows)


if __name__ == "__main__":
    main()
