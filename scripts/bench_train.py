"""Training step cost on this machine: steps/s, tokens/s and peak memory per mode, on the
shipped model and the project's data (a fixed set of batches, warmed up, methods interleaved).

    .venv/bin/python scripts/bench_train.py [--data data/sql] [--steps 8] [--reps 3] [--out FILE]

Rows: lossless with the base recomputed every step (``--state-cache-mb 0``), lossless with the
base states kept across epochs (the default; the steps timed are a later epoch's, so every
state is kept), shared mode and the LoRA baseline. Each figure is the fastest of ``--reps``
interleaved rounds; the ratio column is against the recomputing lossless step.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_specstream  # noqa: E402,F401  (first: the optimized BLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_specstream.adapter import AdapterConfig, attach, detach  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL, load  # noqa: E402
from mlx_specstream.blas import active_blas  # noqa: E402
from mlx_specstream.data import load_jsonl  # noqa: E402
from mlx_specstream.train import (  # noqa: E402
    BaseStateCache,
    Batch,
    TrainConfig,
    _grad_step,
    _resolve_alphas,
    epoch_batches,
    set_trainable,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path("data/sql"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    model, tok = load(DEFAULT_MODEL)
    ds = load_jsonl(args.data / "valid.jsonl", tok, max_seq_len=512)
    lengths = np.array([[e.n_prompt, len(e.tokens)] for e in ds.examples])
    batches = epoch_batches(len(ds), args.batch_size, 0, 0, lengths)[: args.steps]
    runs = {"lossless (base every step)": ("lossless", False),
            "lossless (base states kept)": ("lossless", True),
            "shared": ("shared", False), "lora": ("lora", False)}
    best: dict[str, float] = {}
    peak: dict[str, float] = {}
    for _ in range(args.reps):
        for name, (mode, keep) in runs.items():
            gamma = 0 if mode == "lora" else 4
            attach(model, AdapterConfig(mode=mode, gamma=gamma, msa_layers=4), seed=0)
            set_trainable(model)
            tc = TrainConfig(mode=mode, gamma=gamma, msa_layers=4, alphas=_resolve_alphas(None, mode, gamma))
            cache = BaseStateCache(4 << 30) if keep else None
            steps = []
            for warm in (True, False):  # a first pass warms up (and fills the cache)
                mx.reset_peak_memory()
                t = time.perf_counter()
                for ids in batches:
                    ex = [ds.examples[i] for i in ids]
                    b = Batch.of(ex)
                    states = cache.states(model, list(ids), ex) if cache is not None else None
                    loss, grads = _grad_step(model, b, tc, b.counts(gamma), states)
                    mx.eval(loss, grads)
                if not warm:
                    steps.append(time.perf_counter() - t)
            best[name] = min(best.get(name, float("inf")), min(steps) / len(batches))
            peak[name] = mx.get_peak_memory() / 2**20
            detach(model)
    tokens = float(np.mean([sum(len(ds.examples[i].tokens) for i in ids) for ids in batches]))
    ref = best["lossless (base every step)"]
    rows = [{"mode": n, "ms_per_step": round(s * 1e3, 1), "steps_per_s": round(1 / s, 3),
             "tokens_per_s": round(tokens / s, 1), "speedup": round(ref / s, 2),
             "peak_memory_mb": round(peak[n], 1)} for n, s in best.items()]
    meta = {"command": " ".join([".venv/bin/python", *sys.argv]), "date": str(date.today()),
            "machine": platform.platform(), "python": platform.python_version(), "mlx": mx.__version__,
            "blas": active_blas(), "model": str(DEFAULT_MODEL), "data": str(args.data / "valid.jsonl"),
            "batch_size": args.batch_size, "steps": len(batches), "reps": args.reps,
            "mean_tokens_per_batch": round(tokens, 1)}
    lines = [f"`{meta['command']}` — {meta['date']}, {meta['machine']}, MLX {meta['mlx']}, "
             f"BLAS {meta['blas']}, batch {args.batch_size}, {meta['mean_tokens_per_batch']} tokens per "
             f"batch, best of {args.reps}", "",
             "| mode | ms/step | steps/s | tokens/s | vs recomputing lossless | peak MB |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['mode']} | {r['ms_per_step']} | {r['steps_per_s']} | {r['tokens_per_s']} | "
              f"{r['speedup']}x | {r['peak_memory_mb']} |" for r in rows]
    print("\n".join(lines))
    if args.out:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
