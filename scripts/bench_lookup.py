"""Hybrid drafts ablation: greedy decoding of the project's held-out test prompts with each draft
source alone and together, per shipped adapter, timed by the benchmark's harness (every method
R times per prompt, interleaved with plain AR, the fastest run counting; speed-up against AR with
its 95% bootstrap interval over prompts; AR is the base model's, as in ``bench``), with the mean
accepted tokens per pass and a check that every lossless output equals AR's. Run it alone: a
second busy process changes the ratios.

Sources: the adapter's streams, prompt lookup, and the n-gram drafts of the adapter's data
(``ngrams.npz``), which lead the lookup chain. "lookup + n-grams" is the chain alone (no stream
draft at all).

    .venv/bin/python scripts/bench_lookup.py [--n 30] [--max-tokens 96] [--repeats 3] [--out FILE]
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
from mlx_specstream.bench import Method, our_decoder, speedup, time_methods  # noqa: E402
from mlx_specstream.outputs import markdown_table, recorded_path, run_meta, write_results_file  # noqa: E402

ADAPTERS = {"sql-lossless": "sql", "sql": "sql", "code": "code"}
VARIANTS = {"streams only": dict(lookup=False), "lookup only": dict(mode="lookup", ngrams=False),
            "lookup + n-grams": dict(mode="lookup"), "streams + lookup": dict(ngrams=False),
            "streams + lookup + n-grams (default)": dict()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    args = outputs.parse_script_args(ap)
    root = Path(__file__).resolve().parent.parent
    rows = []
    base = load(DEFAULT_MODEL)[0]
    for adapter, task in ADAPTERS.items():
        model, tok = load(DEFAULT_MODEL, adapter=adapter)
        prompts = [tok.encode(json.loads(line)["prompt"]) for line in
                   (root / "data" / task / "test.jsonl").read_text().splitlines()[: args.n]]
        ar = Method("ar", our_decoder(base, tok, mode="ar"), plain_ar=True)
        methods = [ar] + [Method(name, our_decoder(model, tok, **opts)) for name, opts in VARIANTS.items()]
        time_methods(methods, prompts, args.max_tokens, args.repeats, desc=adapter)
        lossless = model.adapter_config.mode == "lossless"
        for m in methods[1:]:
            lengths = [r["stats"].accepted_lengths for r in m.records]  # as scripts/eval_ss.py counts
            tokens = sum(k * c for a in lengths for k, c in a.items())
            passes = sum(c for a in lengths for c in a.values())
            same = all(r["tokens"] == a["tokens"] for r, a in zip(m.records, ar.records))
            s, lo, hi = speedup(m, ar)
            rows.append({"adapter": adapter, "task": task, "drafts": m.name,
                         "tokens_per_pass": round(tokens / passes, 3),
                         "speedup_vs_ar": round(s, 3), "speedup_ci95": [round(lo, 3), round(hi, 3)],
                         "ar_tokens_per_s": round(sum(len(r["tokens"]) for r in ar.records)
                                                  / sum(r["time"] for r in ar.records), 1),
                         "identical_to_ar": same if lossless else None})
            print(json.dumps(rows[-1]), flush=True)
    meta = run_meta(model=recorded_path(DEFAULT_MODEL), n_prompts=args.n, max_tokens=args.max_tokens,
                    repeats=args.repeats)
    table = [{**r, "speedup_vs_ar": f"{r['speedup_vs_ar']} ({r['speedup_ci95'][0]}–{r['speedup_ci95'][1]})"}
             for r in rows]
    if args.out:
        write_results_file(args.out, meta, rows)
    print(markdown_table({"adapter": "adapter", "drafts": "drafts", "tokens / pass": "tokens_per_pass",
                          "× AR (95% interval)": "speedup_vs_ar", "= AR": "identical_to_ar"}, table))


if __name__ == "__main__":
    main()
