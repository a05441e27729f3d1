"""Greedy Speculative Streaming decoding of a task's test (or valid) prompts with one adapter, through the
engine's defaults (hybrid drafts on): the mean accepted tokens per forward pass, exact match of
the outputs against the references (sql: SQL compared as scripts/train_base.py compares it; code:
the completion verbatim; an adapter without streams, such as a next-token LoRA, is decoded
plainly, one token a pass) and, with ``--check-ar``, whether every output equals plain greedy
autoregressive decoding of the same model (a lossless adapter must), or with ``--ar-adapter`` of
the model with another adapter (a tuned adapter's fine-tune, whose output it must reproduce).

    .venv/bin/python scripts/eval_ss.py MODEL_DIR ADAPTER [--task sql|code] [--split test|valid] [--n 200]
        [--max-tokens 96] [--no-lookup] [--no-ngrams] [--node-cost C] [--streams auto|tree|deferred]
        [--sql-names] [--check-ar [--ar-adapter NAME]] [--out FILE]

Used to compare base models (an adapter trained by the same command on each,
results/default_model/cpu_continued_training.json) and adapters of one base (docs/training.md);
``--split valid`` to choose between checkpoints of one run without looking at the test split.
The results file keeps each prompt's output and whether it matched, so that two evaluations of the
same prompts compare prompt by prompt (``scripts/compare_evals.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


# isort: split

from tqdm import tqdm  # noqa: E402

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.api import generate, load  # noqa: E402
from mlx_specstream.bench import exact_match  # noqa: E402
from mlx_specstream.outputs import recorded_path, run_meta, write_results_file  # noqa: E402
from mlx_specstream.pool import default_mode  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("adapter")
    ap.add_argument("--task", choices=("sql", "code"), default="sql")
    ap.add_argument("--split", choices=("test", "valid"), default="test")
    ap.add_argument("--n", type=int, default=200, help="the first N prompts of the split")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--no-lookup", action="store_true", help="streams-only drafts")
    ap.add_argument("--no-ngrams", action="store_true", help="hybrid drafts without the adapter's n-grams")
    ap.add_argument("--branch", type=int, default=None, help="candidates per stream (default: the adapter's)")
    ap.add_argument("--tree-budget", type=int, default=None, help="nodes per tree (default: the adapter's)")
    ap.add_argument("--node-cost", type=float, default=None,
                    help="tree sizing (default: this machine's; 0: the whole tree budget, as on Metal)")
    ap.add_argument("--streams", choices=("auto", "tree", "deferred"), default="auto",
                    help="where lossless streams run (auto: this machine's choice, deferred on a CPU; "
                         "tree: in the tree pass, as on Metal, so a lookup chain never drafts alone)")
    ap.add_argument("--check-ar", action="store_true",
                    help="also decode each prompt with plain AR and compare the outputs")
    ap.add_argument("--ar-adapter", help="--check-ar: plain AR of the model with this adapter instead")
    ap.add_argument("--sql-names", action="store_true",
                    help="sql: only the schema's names may be written (constrained decoding, AR check too)")
    args = outputs.parse_script_args(ap)
    if args.n < 1:
        ap.error(f"--n must be at least 1, not {args.n}")
    model, tok = load(args.model, adapter=args.adapter)
    ar_model = load(args.model, adapter=args.ar_adapter)[0] if args.ar_adapter else model
    split = Path(__file__).resolve().parent.parent / "data" / args.task / f"{args.split}.jsonl"
    rows = [json.loads(line) for line in split.read_text().splitlines()][: args.n]
    mode = default_mode(model)  # "ar" for an adapter without streams, such as a next-token LoRA
    exact = tokens = passes = differ = 0
    per_prompt = []
    bar = tqdm(rows, desc=f"{args.adapter} {args.task} {args.split}", unit="prompt")
    for r in bar:
        res = generate(model, tok, r["prompt"], max_tokens=args.max_tokens, lookup=not args.no_lookup,
                       ngrams=False if args.no_ngrams else None, node_cost=args.node_cost, mode=mode,
                       streams=args.streams, branch=args.branch, tree_budget=args.tree_budget,
                       sql_names=args.sql_names)
        right = exact_match(args.task, res.text, r["completion"])
        exact += right
        per_prompt.append({"exact": right, "output": res.text})
        tokens += sum(k * c for k, c in res.stats.accepted_lengths.items())
        passes += sum(res.stats.accepted_lengths.values())
        if args.check_ar:
            ar = generate(ar_model, tok, r["prompt"], max_tokens=args.max_tokens, mode="ar",
                          sql_names=args.sql_names)
            differ += ar.tokens != res.tokens
        bar.set_postfix(exact=f"{exact / (bar.n + 1):.3f}", tok_pass=f"{tokens / max(passes, 1):.2f}")
    out = {"model": recorded_path(args.model), "adapter": args.adapter, "mode": mode, "task": args.task,
           "split": args.split, "n": len(rows), "max_tokens": args.max_tokens, "lookup": not args.no_lookup,
           "ngrams": not args.no_ngrams and getattr(model, "adapter_ngrams", None) is not None,
           "node_cost": args.node_cost if args.node_cost is not None else "default",
           "branch": args.branch or "adapter's", "tree_budget": args.tree_budget or "adapter's",
           "streams": args.streams,
           "sql_names": args.sql_names, "exact_match": round(exact / len(rows), 4),
           "tokens_per_pass": round(tokens / passes, 4)}
    if args.check_ar:
        out["identical_to_ar"] = differ == 0
        out["ar_of"] = args.ar_adapter or args.adapter
    print(json.dumps(out))
    out["per_prompt"] = per_prompt  # for scripts/compare_evals.py
    if args.out:
        write_results_file(args.out, run_meta(), [out])


if __name__ == "__main__":
    main()
