"""The correlations ``adapter.same_base`` compares with ``adapter.SAME_BASE``: the shipped model's
weights probe (its layers' part and its embeddings' part) and output probe against those of its
int8/int4 copies, its half-precision copies, and copies with Gaussian noise added to every matrix.

    .venv/bin/python scripts/probe_correlation.py --out results/adapters/probe_correlation.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_specstream  # noqa: E402,F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.adapter import probe, weights_probe  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL  # noqa: E402
from mlx_specstream.loader import load_model  # noqa: E402

NOISE = (0.02, 0.01, 0.005, 0.0025)  # standard deviations of the noise added to every matrix


def correlation(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a) - np.mean(a), np.asarray(b) - np.mean(b)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def with_noise(sigma: float):
    model = load_model(DEFAULT_MODEL)
    rng = np.random.default_rng(0)
    model.load_weights([(k, v + mx.array(rng.normal(0, sigma, v.shape).astype(np.float32)))
                        for k, v in tree_flatten(model.parameters()) if v.ndim == 2], strict=False)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = outputs.parse_script_args(ap)
    base = load_model(DEFAULT_MODEL)
    layers, embedded = weights_probe(base)
    output = probe(base)
    spread = float(np.std(np.concatenate([np.array(v).ravel() for _, v in tree_flatten(base.parameters())
                                          if v.ndim == 2])))
    copies = {f"int{bits} g{group}": lambda b=bits, g=group: load_model(DEFAULT_MODEL, quantize=(b, g))
              for bits, group in ((8, 64), (4, 64), (4, 128))}
    copies |= {dtype: lambda d=dtype: load_model(DEFAULT_MODEL, dtype=d) for dtype in ("bfloat16", "float16")}
    copies |= {f"noise {sigma} ({sigma / spread:.2f} of the spread)": lambda s=sigma: with_noise(s)
               for sigma in NOISE}
    rows = []
    for name, make in copies.items():
        model = make()
        w = weights_probe(model)
        rows.append({"copy": name, "layers": round(correlation(layers, w[0]), 4),
                     "embeddings": round(correlation(embedded, w[1]), 4),
                     "output": round(correlation(output, probe(model)), 4)})
        print(rows[-1])
    if args.out is not None:
        meta = outputs.run_meta(model=outputs.recorded_path(DEFAULT_MODEL), weight_spread=round(spread, 4))
        outputs.write_results_file(args.out, meta, rows)


if __name__ == "__main__":
    main()
