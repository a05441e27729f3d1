"""Cost of a Speculative Streaming forward pass relative to a plain one-token (AR) pass, and where
decode time goes (forward passes vs bookkeeping), on the shipped model and a lossless adapter
(default) or on a random llama (``--random``: speed does not depend on what the weights say).

    .venv/bin/python scripts/bench_engine.py [--adapter sql-lossless] [--context 128] [--out FILE]
    .venv/bin/python scripts/bench_engine.py --random [--hidden 512 --layers 6 --vocab 4096]

Passes run over ``--context`` cached tokens; each is the fastest of ``--reps`` runs. Decode rows
generate greedily from the first ``--prompts`` held-out sql test prompts (random tokens with
``--random``), every method interleaved per prompt, the fastest of ``--decode-reps`` runs counting.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


import mlx_specstream  # noqa: E402,F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402
from tqdm import tqdm  # noqa: E402

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.adapter import new_adapter  # noqa: E402
from mlx_specstream.api import load  # noqa: E402
from mlx_specstream.arch import build_model  # noqa: E402
from mlx_specstream.bench import Method, best_time, our_decoder, time_methods  # noqa: E402
from mlx_specstream.engine import default_node_costs  # noqa: E402
from mlx_specstream.kv_cache import make_cache  # noqa: E402
from mlx_specstream.outputs import markdown_table, recorded_path, run_meta, write_results_file  # noqa: E402
from mlx_specstream.streams import forward, stream_pass  # noqa: E402
from mlx_specstream.tree import build_tree, chain  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TREE_SIZES = (1, 4, 16, 32)


def random_model(args) -> tuple[object, dict]:
    cfg = dict(model_type="llama", hidden_size=args.hidden, num_attention_heads=8, num_key_value_heads=2,
               intermediate_size=int(args.hidden * 2.75), num_hidden_layers=args.layers,
               vocab_size=args.vocab, max_position_embeddings=4096)
    mx.random.seed(0)
    model = build_model(cfg)
    new_adapter(model, gamma=args.gamma, msa_layers=args.msa_layers, seed=0)
    return model, cfg


def test_prompts(n: int) -> list[str]:
    lines = (ROOT / "data/sql/test.jsonl").read_text().splitlines()[:n]
    return [json.loads(line)["prompt"] for line in lines]


def pass_rows(model, context: list[int], gamma: int, reps: int) -> list[dict]:
    """Each pass over the cached ``context``, as the decode loop runs it (outputs evaluated)."""
    caches = make_cache(model)
    forward(model, chain(context), caches, 0, gamma=0)
    mx.eval([c.keys for c in caches])
    n = len(context)

    def reset(offset):
        for c in caches:
            c.offset = offset

    def run(tree, gamma, threshold=0.0):
        out = forward(model, tree, caches, n, gamma=gamma, prune_threshold=threshold)
        mx.eval(out.main_logits, out.stream_logits if out.stream_logits is not None else [])
        reset(n)

    def deferred(tree):  # tree pass without streams, then the accepted root's stream pass
        out = forward(model, tree, caches, n, gamma=0)
        mx.eval(out.main_logits)
        reset(n + 1)
        mx.eval(stream_pass(model, out.msa_input[0], caches, n + 1, gamma))
        reset(n)

    def one_graph(tree):  # the same two passes evaluated together: no host round trip between them
        out = forward(model, tree, caches, n, gamma=0)
        reset(n + 1)
        mx.eval(out.main_logits, stream_pass(model, out.msa_input[0], caches, n + 1, gamma))
        reset(n)

    levels = [list(range(10 + 4 * j, 14 + 4 * j)) for j in range(gamma)]
    scores = [[-0.1, -0.5, -1.0, -2.0]] * gamma
    rows = [("1-token pass (AR)", 1, lambda: run(chain([1]), 0))]
    lossless = model.adapter_config.mode == "lossless"  # deferred streams need it
    for m in TREE_SIZES:
        tree = build_tree(3, levels, scores, m)
        rows.append((f"SS pass, {m}-node tree, streams on every node", m, lambda t=tree: run(t, gamma)))
        if lossless:
            rows.append((f"SS pass, {m}-node tree + deferred stream pass", m, lambda t=tree: deferred(t)))
    if lossless:
        rows.append(("SS pass, 4-node tree + deferred stream pass, one graph (the stream pass not waiting "
                     "for verification)", 4, lambda t=build_tree(3, levels, scores, 4): one_graph(t)))
    rows.append(("SS pass, 32-node tree + pruning (thr 0.05)", 32,
                 lambda t=build_tree(3, levels, scores, 32): run(t, gamma, 0.05)))
    times = [best_time(fn, reps) for _, _, fn in tqdm(rows, desc="passes")]
    return [{"pass": name, "nodes": m, "ms": round(t * 1e3, 3), "x_ar_pass": round(t / times[0], 3)}
            for (name, m, _), t in zip(rows, times)]


def decode_rows(model, tokenizer, prompts: list, max_tokens: int, reps: int,
                node_costs: list[float]) -> list[dict]:
    """Greedy decoding of every prompt by each method, timed by ``bench.time_methods`` (interleaved,
    the fastest run per (prompt, method) counts); ``node_costs``: the first SS policy (deferred
    streams; a shared adapter's streams on every node) again with each of these node costs
    instead of the default. Bookkeeping: decode time outside the forward
    passes."""
    ids = [tokenizer.encode(p) if tokenizer else p for p in prompts]
    if model.adapter_config.mode == "lossless":
        policies = [("ss, deferred streams", "deferred"), ("ss, streams on every node", "tree")]
    else:  # a shared adapter's streams are always in the tree pass
        policies = [("ss, streams on every node", "tree")]
    methods = [Method(name, our_decoder(model, tokenizer, **kw)) for name, kw in (
        ("ar", {"mode": "ar"}), *((name, {"mode": "ss", "streams": p}) for name, p in policies),
        *((f"{policies[0][0]}, node cost {c}", {"mode": "ss", "streams": policies[0][1], "node_cost": c})
          for c in node_costs))]
    time_methods(methods, ids, max_tokens, reps, desc="decode")
    out = []
    for m in methods:
        stats = [r["stats"] for r in m.records]
        # the decode passes' tokens (the prefill's first token and time are left out of both)
        tokens = sum(k * c for s in stats for k, c in s.accepted_lengths.items())
        calls = sum(s.calls for s in stats)
        decode, model_time = sum(s.decode_time for s in stats), sum(s.model_time for s in stats)
        out.append({"method": m.name, "tokens_per_s": round(tokens / decode, 1), "calls": calls,
                    "tokens_per_pass": round(tokens / calls, 3),
                    "ms_per_pass": round(decode / calls * 1e3, 2),
                    "bookkeeping_share": round(1 - model_time / decode, 4)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="MLX model directory (default: the shipped model)")
    ap.add_argument("--adapter", default="sql-lossless", help="a stream adapter of the model")
    ap.add_argument("--random", action="store_true", help="a random llama instead of a trained model")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--gamma", type=int, default=4, help="--random: streams")
    ap.add_argument("--msa-layers", type=int, default=2, help="--random: multi-stream layers")
    ap.add_argument("--context", type=int, default=128, help="cached tokens before each pass")
    ap.add_argument("--reps", type=int, default=30, help="timed runs of each pass; the fastest counts")
    ap.add_argument("--prompts", type=int, default=12, help="prompts decoded")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--decode-reps", type=int, default=3)
    ap.add_argument("--node-costs", type=lambda v: [float(c) for c in v.split(",")], default=[],
                    help="comma-separated node costs to decode with besides the default (deferred streams; "
                         "streams on every node with a shared adapter)")
    args = outputs.parse_script_args(ap)
    for flag in ("reps", "prompts", "max_tokens", "decode_reps"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be at least 1, not {getattr(args, flag)}")

    rng = np.random.default_rng(0)
    if args.random:
        (model, cfg), tokenizer = random_model(args), None
        prompts = [list(rng.integers(0, args.vocab, 16)) for _ in range(args.prompts)]
        label = f"random llama (hidden {args.hidden}, {args.layers} layers, vocab {args.vocab})"
    else:
        model, tokenizer = load(args.model, adapter=args.adapter)
        cfg = model.config
        prompts = test_prompts(args.prompts)
        label = f"{recorded_path(model.path)} + {args.adapter}"
    gamma = model.adapter_config.gamma
    pool = [t for p in prompts for t in (tokenizer.encode(p) if tokenizer else p)]
    context = (pool * (args.context // max(len(pool), 1) + 1))[: args.context]
    passes = pass_rows(model, context, gamma, args.reps)
    decode = decode_rows(model, tokenizer, prompts, args.max_tokens, args.decode_reps, args.node_costs)

    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    shape = {k: cfg[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k in cfg}
    meta = run_meta(model=label, params=int(n_params), config=shape,
                    gamma=gamma, context=args.context, reps=args.reps, prompts=len(prompts),
                    max_tokens=args.max_tokens, decode_reps=args.decode_reps,
                    node_costs=default_node_costs(), node_costs_tried=args.node_costs)
    print(f"`{meta['command']}` — {meta['date']}, {meta['machine']}, MLX {meta['mlx']}, BLAS {meta['blas']}; "
          f"{label}, {n_params / 1e6:.1f}M parameters, {args.context} cached tokens\n")
    print(markdown_table({"pass": "pass", "ms": "ms", "× AR pass": "x_ar_pass"}, passes) + "\n")
    print(markdown_table({"decode": "method", "tokens/s": "tokens_per_s", "tokens/pass": "tokens_per_pass",
                          "ms/pass": "ms_per_pass", "bookkeeping": "bookkeeping_share"}, decode))
    if args.out:
        write_results_file(args.out, meta, [{"passes": passes, "decode": decode}])


if __name__ == "__main__":
    main()
