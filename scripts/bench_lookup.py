"""Hybrid drafts ablation: mean accepted tokens per pass of greedy decoding with the streams only,
prompt lookup only, and both merged into one tree (the default), per shipped adapter, on the
project's held-out test prompts. Tokens per pass are a property of the drafts, not of the
machine's speed; every output is checked against plain autoregressive decoding.

    .venv/bin/python scripts/bench_lookup.py [--n 40] [--max-tokens 96] [--out results/lookup.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_specstream  # noqa: E402,F401  (first: the optimized BLAS before MLX)

# isort: split

from mlx_specstream.api import DEFAULT_MODEL, generate, load  # noqa: E402
from mlx_specstream.outputs import recorded_path, run_meta, write_results_file  # noqa: E402

ADAPTERS = {"sql-lossless": "sql", "sql": "sql", "code": "code"}
VARIANTS = {"streams only": {"lookup": False}, "lookup only": {"mode": "lookup"},
            "streams + lookup": {"lookup": True}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    for adapter, task in ADAPTERS.items():
        model, tok = load(DEFAULT_MODEL, adapter=adapter)
        prompts = [json.loads(line)["prompt"] for line in
                   Path(f"data/{task}/test.jsonl").read_text().splitlines()[: args.n]]
        refs = [generate(model, tok, p, max_tokens=args.max_tokens, mode="ar").tokens for p in prompts]
        for name, opts in VARIANTS.items():
            advanced = passes = 0
            same = True
            for p, ref in zip(prompts, refs):
                out = generate(model, tok, p, max_tokens=args.max_tokens, **opts)
                same &= out.tokens == ref
                advanced += sum(k * n for k, n in out.stats.accepted_lengths.items())
                passes += sum(out.stats.accepted_lengths.values())
            lossless = model.adapter_config.mode == "lossless" or opts.get("mode") == "lookup"
            rows.append({"adapter": adapter, "task": task, "drafts": name,
                         "mean_accepted_tokens": round(advanced / passes, 3),
                         "identical_to_ar": bool(same) if lossless else None})
            print(rows[-1], flush=True)
    meta = run_meta(model=recorded_path(DEFAULT_MODEL), n_prompts=args.n, max_tokens=args.max_tokens)
    lines = ["| adapter | task | streams only | lookup only | streams + lookup |", "|---|---|---:|---:|---:|"]
    for adapter, task in ADAPTERS.items():
        got = {r["drafts"]: r["mean_accepted_tokens"] for r in rows if r["adapter"] == adapter}
        lines.append(f"| {adapter} | {task} | " + " | ".join(str(got[v]) for v in VARIANTS) + " |")
    print("\n".join(lines))
    if args.out:
        write_results_file(args.out, meta, rows)


if __name__ == "__main__":
    main()
