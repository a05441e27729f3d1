"""Cost of one Speculative Streaming forward pass relative to a 1-token pass, and the share of
decode time spent outside the model (bookkeeping), on a ~20M-parameter llama (random weights:
speed does not depend on what the weights say).

    .venv/bin/python scripts/bench_engine.py [--hidden 512 --layers 6 --vocab 4096] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlx_specstream.blas import active_blas  # noqa: E402  (first: the optimized BLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from mlx_specstream.adapter import new_adapter  # noqa: E402
from mlx_specstream.api import generate  # noqa: E402
from mlx_specstream.arch import build_model  # noqa: E402
from mlx_specstream.bench import best_time  # noqa: E402
from mlx_specstream.kv_cache import make_cache  # noqa: E402
from mlx_specstream.streams import forward, stream_pass  # noqa: E402
from mlx_specstream.tree import build_tree, chain  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--context", type=int, default=128, help="cached tokens before each pass")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--msa-layers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30, help="timed runs of each pass; the fastest counts")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()

    cfg = dict(model_type="llama", hidden_size=args.hidden, num_attention_heads=8, num_key_value_heads=2,
               intermediate_size=int(args.hidden * 2.75), num_hidden_layers=args.layers,
               vocab_size=args.vocab, max_position_embeddings=4096)
    mx.random.seed(0)
    model = build_model(cfg)
    mx.eval(model.parameters())
    n_params = sum(v.size for _, v in __import__("mlx.utils").utils.tree_flatten(model.parameters()))
    new_adapter(model, gamma=args.gamma, msa_layers=args.msa_layers, seed=0)
    caches = make_cache(model)
    prompt = list(np.random.default_rng(0).integers(0, args.vocab, args.context))
    forward(model, chain(prompt), caches, 0, gamma=0)
    mx.eval([c.keys for c in caches])
    n = args.context

    def run(tree, gamma, threshold=0.0):
        out = forward(model, tree, caches, n, gamma=gamma, prune_threshold=threshold)
        mx.eval(out.main_logits, out.stream_logits if out.stream_logits is not None else [])
        for c in caches:
            c.offset = n  # drop what the pass appended

    rows = []
    one = best_time(lambda: run(chain([1]), 0), args.reps)
    rows.append(("1-token pass (AR)", 1, one))
    levels = [list(range(10 + 4 * j, 14 + 4 * j)) for j in range(args.gamma)]
    scores = [[-0.1, -0.5, -1.0, -2.0]] * args.gamma
    for nodes in (1, 16, 32):
        tree = build_tree(3, levels, scores, nodes)
        t = best_time(lambda tree=tree: run(tree, args.gamma), args.reps)
        rows.append((f"SS pass, {nodes}-node tree, {args.gamma} streams/node", nodes, t))
    tree = build_tree(3, levels, scores, 32)
    t = best_time(lambda: run(tree, args.gamma, threshold=0.05), args.reps)
    rows.append(("SS pass, 32-node tree + pruning (thr 0.05)", 32, t))

    def deferred(tree):
        out = forward(model, tree, caches, n, gamma=0)
        mx.eval(out.main_logits)
        for c in caches:
            c.offset = n + 1  # as if the root alone was accepted
        mx.eval(stream_pass(model, out.msa_input[0], caches, n + 1, args.gamma))
        for c in caches:
            c.offset = n

    for nodes in (16, 32):
        tree = build_tree(3, levels, scores, nodes)
        t = best_time(lambda tree=tree: deferred(tree), args.reps)
        rows.append((f"SS pass, {nodes}-node tree, deferred streams", nodes, t))

    decode = []
    runs = [("ar", {})] + [("ss", {"branch": 3, "tree_budget": b, "streams": s})
                           for b in (16, 32) for s in ("tree", "deferred")]
    for mode, kw in tqdm(runs, desc="decode runs"):
        out = generate(model, None, prompt[:16], max_tokens=200, mode=mode, **kw)
        decode.append({"mode": mode, **kw, **out.stats.as_dict()})

    print(f"\nmodel: llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, "
          f"{n_params / 1e6:.1f}M params, fp32; context {args.context}; BLAS {active_blas()}")
    print(f"{'pass':48} {'ms':>8} {'x 1-token':>10}")
    for name, _, t in rows:
        print(f"{name:48} {t * 1e3:8.2f} {t / one:10.2f}")
    print(f"\n{'decode (200 tokens)':36} {'tok/s':>8} {'calls':>6} {'bookkeeping':>12}")
    for d in decode:
        label = d["mode"]
        if d["mode"] == "ss":
            label += f" k={d['branch']} budget={d['tree_budget']} {d['streams']}"
        print(f"{label:36} {d['tokens_per_second']:8.1f} {d['calls']:6d} {d['bookkeeping_share']:12.1%}")
    result = {
        "command": " ".join(sys.argv), "date": str(date.today()), "machine": platform.platform(),
        "processor": platform.processor() or platform.machine(), "mlx": mx.__version__,
        "blas": active_blas(), "params": n_params, "config": cfg,
        "passes_ms": {name: round(t * 1e3, 3) for name, _, t in rows},
        "ratio_to_1_token": {name: round(t / one, 3) for name, _, t in rows}, "decode": decode,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
