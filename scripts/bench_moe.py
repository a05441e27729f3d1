"""Time a mixture of experts' products with the (row, expert) pairs grouped by expert (sorted
``gather_mm``, ``arch/moe.Experts`` from ``GROUPED_FROM`` pairs on) against one by one: one expert
matrix, and a prefill of a random Qwen3-MoE, interleaved, fastest of ``--reps`` each.

    .venv/bin/python scripts/bench_moe.py --out results/moe/grouped.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_specstream  # noqa: E402,F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx  # noqa: E402

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.arch import build_model, moe  # noqa: E402

CONFIG = dict(model_type="qwen3_moe", hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
              head_dim=64, intermediate_size=1024, moe_intermediate_size=256, num_experts=32,
              num_experts_per_tok=4, num_hidden_layers=8, vocab_size=4096, rms_norm_eps=1e-6, rope_theta=1e6,
              norm_topk_prob=True, max_position_embeddings=4096)


def best(fn, reps: int) -> float:
    fastest = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(fn())
        fastest = min(fastest, time.perf_counter() - t)
    return fastest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    args = outputs.parse_script_args(ap)
    mx.random.seed(0)
    model = build_model(CONFIG)
    mx.eval(model.parameters())
    ids = mx.random.randint(0, CONFIG["vocab_size"], (1, args.tokens))
    experts = model.layers[0].mlp.switch_mlp
    x = mx.random.normal((1, args.tokens, CONFIG["hidden_size"]))
    chosen = mx.random.randint(0, CONFIG["num_experts"], (1, args.tokens, CONFIG["num_experts_per_tok"]))
    times = {f"{what} {how}": [] for what in ("experts", "prefill") for how in ("grouped", "one by one")}
    for _ in range(3):  # rounds, the two ways interleaved
        for how, start in (("grouped", 64), ("one by one", 10**9)):
            moe.GROUPED_FROM = start
            times[f"experts {how}"].append(best(lambda: experts(x, chosen), args.reps))
            times[f"prefill {how}"].append(best(lambda: model(ids), args.reps))
    fastest = {k: min(v) for k, v in times.items()}
    speedup = {what: fastest[f"{what} one by one"] / fastest[f"{what} grouped"]
               for what in ("experts", "prefill")}
    print(speedup)
    if args.out is not None:
        meta = outputs.run_meta(config=CONFIG, tokens=args.tokens, reps=args.reps)
        results = [{"best_s": fastest, "rounds_s": times, "speedup": speedup}]
        outputs.write_results_file(args.out, meta, results)


if __name__ == "__main__":
    main()
