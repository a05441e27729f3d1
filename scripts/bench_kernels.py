"""Benchmark of the tree / multi-stream attention Metal kernels against the pure-MLX path (dense
mask + mx.fast.scaled_dot_product_attention), and of the decode engine's tokens/s with each.

Needs Apple silicon (MLX on a Metal device); elsewhere it says so and exits. Run it on a Mac:

    python scripts/bench_kernels.py [--dtype float16] [--head-dim 128] [--out results/kernels_mac.json]

Part 1 (kernels): for cache lengths x tree sizes x (no streams | lossless | shared streams), the
median time of one attention call (one layer), kernel vs dense, and their max abs difference.
Part 2 (engine): tokens/s of AR decoding and of Speculative Streaming decoding with attention on
the dense path and on the kernels, on a random llama (speed does not depend on the weights;
acceptance does, so compare the two SS rows with each other, not with AR).
See docs/kernels.md for what to look for.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_specstream  # noqa: E402,F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream import tree as tree_mod  # noqa: E402
from mlx_specstream.kernels import attention as A  # noqa: E402
from mlx_specstream.kernels import metal_available  # noqa: E402
from mlx_specstream.outputs import run_meta, write_results_file  # noqa: E402

KERNEL = "metal"  # "emulator" with --emulate


def timed(fn, reps: int) -> float:
    for _ in range(3):
        mx.eval(fn())
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def full_tree(m: int, rng) -> np.ndarray:
    """A draft tree of m nodes as the engine builds them (top-3 per level, best path scores)."""
    if m == 1:
        return np.array([-1])
    levels = [list(range(10 * j, 10 * j + 3)) for j in range(6)]
    scores = [sorted(np.log(rng.dirichlet(np.ones(3))), reverse=True) for _ in range(6)]
    return tree_mod.build_tree(0, levels, scores, m).parents


def kernel_rows(args, rng) -> list[dict]:
    dtype = getattr(mx, args.dtype)
    H, Hkv, D = args.heads, args.kv_heads, args.head_dim
    rows = []
    for n_prefix in args.cache:
        for m in args.nodes:
            parents = full_tree(m, rng)
            for mode in ("tree", "lossless", "shared"):
                if mode == "tree":
                    plan = A.AttentionPlan.for_tree(parents, n_prefix)
                else:
                    plan = A.AttentionPlan.for_streams(parents, n_prefix, np.arange(m), args.gamma,
                                                       mode == "shared")
                q = mx.random.normal((1, H, plan.n_rows, D)).astype(dtype)
                k = mx.random.normal((1, Hkv, n_prefix + m, D)).astype(dtype)
                v = mx.random.normal((1, Hkv, n_prefix + m, D)).astype(dtype)
                ks = vs = None
                if plan.has_streams:
                    ks = mx.random.normal((1, Hkv, plan.n_stream_rows, D)).astype(dtype)
                    vs = mx.random.normal((1, Hkv, plan.n_stream_rows, D)).astype(dtype)
                scale = D**-0.5

                def run(backend, q=q, k=k, v=v, ks=ks, vs=vs, plan=plan, scale=scale):
                    return A.planned_attention(q, k, v, ks, vs, plan, scale, backend=backend)

                err = float(mx.abs(run(KERNEL).astype(mx.float32) - run("mlx").astype(mx.float32)).max())
                t_dense = timed(lambda run=run: run("mlx"), args.reps)
                t_kernel = timed(lambda run=run: run(KERNEL), args.reps)
                row = dict(cache=n_prefix, nodes=m, mode=mode, rows=plan.n_rows, dense_us=t_dense * 1e6,
                           kernel_us=t_kernel * 1e6, speedup=t_dense / t_kernel, max_abs_err=err)
                rows.append(row)
                print(f"cache {n_prefix:5d}  nodes {m:3d}  {mode:8s}  rows {plan.n_rows:4d}  "
                      f"dense {row['dense_us']:8.1f} us  kernel {row['kernel_us']:8.1f} us  "
                      f"x{row['speedup']:5.2f}  err {err:.1e}", flush=True)
    return rows


def engine_rows(args) -> list[dict]:
    from mlx.utils import tree_flatten

    from mlx_specstream.adapter import new_adapter
    from mlx_specstream.api import generate
    from mlx_specstream.arch import build_model

    dtype = getattr(mx, args.dtype)
    cfg = dict(model_type="llama", hidden_size=args.hidden, num_attention_heads=args.heads,
               num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
               intermediate_size=int(args.hidden * 2.75), num_hidden_layers=args.layers,
               vocab_size=args.vocab, max_position_embeddings=8192)
    mx.random.seed(0)
    model = build_model(cfg)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    new_adapter(model, mode=args.mode, gamma=args.gamma, msa_layers=args.msa_layers, seed=0)
    prompt = list(np.random.default_rng(0).integers(0, args.vocab, args.prompt))
    rows = []
    runs = [("ar", "mlx", dict(mode="ar"))]
    for backend in ("mlx", KERNEL):
        runs.append((f"ss tree streams, attention: {backend}", backend,
                     dict(branch=args.branch, tree_budget=args.budget, streams="tree")))
    for name, backend, kw in runs:
        old = A.set_backend(backend)
        try:
            generate(model, None, prompt, max_tokens=16, **kw)  # warm-up (kernel builds)
            res = generate(model, None, prompt, max_tokens=args.tokens, **kw)
        finally:
            A.set_backend(old)
        st = res.stats
        rows.append(dict(run=name, tokens_per_s=st.tokens_per_second, calls=st.calls,
                         mean_accepted=st.mean_accepted_tokens, params=n_params))
        print(f"{name:40s} {st.tokens_per_second:8.1f} tok/s  {st.calls:4d} calls  "
              f"{st.mean_accepted_tokens:.2f} tokens/call", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--cache", type=int, nargs="+", default=[128, 1024, 4096])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--mode", default="lossless", choices=["lossless", "shared"])
    ap.add_argument("--msa-layers", type=int, default=2)
    ap.add_argument("--branch", type=int, default=3)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--emulate", action="store_true",
                    help="run the kernels on the CPU emulator: a smoke test of this script, timings "
                         "meaningless")
    args = outputs.parse_script_args(ap)

    global KERNEL
    if args.emulate:
        KERNEL = "emulator"
    elif not metal_available():
        print("bench_kernels.py measures Metal kernels and needs MLX on a Metal device (Apple "
              "silicon); this machine has none. The kernels' correctness is checked everywhere by "
              "`pytest tests/test_kernels.py` through the CPU emulator of Metal.", file=sys.stderr)
        sys.exit(2)

    rng = np.random.default_rng(0)
    meta = run_meta(device_info=({k: str(v) for k, v in mx.metal.device_info().items()}
                                 if metal_available() else {}),
                    kernel_backend=KERNEL,
                    args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()})
    result = {}
    print(f"# attention kernels vs dense path: {args.dtype}, {args.heads} heads / {args.kv_heads} kv "
          f"heads, head dim {args.head_dim}, gamma {args.gamma}")
    result["kernels"] = kernel_rows(args, rng)
    if not args.skip_engine:
        print(f"# engine: random llama hidden {args.hidden}, {args.layers} layers, {args.dtype}, "
              f"{args.prompt}-token prompt, {args.tokens} tokens")
        result["engine"] = engine_rows(args)
    if args.out:
        write_results_file(args.out, meta, [result])
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
