"""What ``sql_names`` costs: each decoder with and without the schema-names constraint, timed by
the benchmark's harness (every method R times per prompt, interleaved, the fastest run counts;
speed-up with its 95% bootstrap interval over prompts) on the held-out sql test prompts, with
exact match of both and a check that every constrained lossless output equals constrained plain
decoding. Run it alone: a second busy process on this machine changes the ratios.

    .venv/bin/python scripts/bench_sql_names.py [--n 50] [--max-tokens 96] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_specstream  # noqa: E402,F401  (first: the optimized BLAS before MLX)

# isort: split

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL, load  # noqa: E402
from mlx_specstream.bench import Method, our_decoder, speedup, task_metrics, time_methods  # noqa: E402
from mlx_specstream.outputs import run_meta, write_results_file  # noqa: E402

DECODERS = {"ar": (None, dict(mode="ar")), "ss-lossless": ("sql-lossless", dict(branch=3)),
            "ss-shared": ("sql", dict(branch=3))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    args = outputs.parse_script_args(ap)
    rows = [json.loads(line) for line in
            (Path(__file__).resolve().parent.parent / "data" / "sql" / "test.jsonl").read_text().splitlines()]
    rows = rows[: args.n]
    methods, tok = [], None
    for name, (adapter, opts) in DECODERS.items():
        model, tok = load(DEFAULT_MODEL, adapter=adapter)
        methods += [Method(name, our_decoder(model, tok, **opts)),
                    Method(f"{name} sql-names", our_decoder(model, tok, sql_names=True, **opts))]
    prompts = [tok.encode(r["prompt"]) for r in rows]
    time_methods(methods, prompts, args.max_tokens, args.repeats, desc="sql-names")
    by_name = {m.name: m for m in methods}
    results = []
    for m in methods:
        lengths = [r["stats"].accepted_lengths for r in m.records]
        plain = by_name[m.name.removesuffix(" sql-names")]
        texts = [tok.decode(r["tokens"]) for r in m.records]
        ratio, lo, hi = speedup(m, plain)
        rec = {"method": m.name, **task_metrics("sql", texts, [r["completion"] for r in rows]),
               "tokens_per_pass": round(sum(k * c for h in lengths for k, c in h.items())
                                        / sum(sum(h.values()) for h in lengths), 3),
               "tokens_per_second": round(sum(len(r["tokens"]) for r in m.records)
                                          / sum(r["time"] for r in m.records), 2),
               "speed_vs_unconstrained": [round(ratio, 3), round(lo, 3), round(hi, 3)]}
        if m.name == "ss-lossless sql-names":
            ref = by_name["ar sql-names"]
            rec["identical_to_constrained_ar"] = all(a["tokens"] == b["tokens"]
                                                     for a, b in zip(m.records, ref.records))
        results.append(rec)
        print(json.dumps(rec))
    if args.out:
        write_results_file(args.out, run_meta(n=args.n, max_tokens=args.max_tokens, repeats=args.repeats),
                           results)


if __name__ == "__main__":
    main()
