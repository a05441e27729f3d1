"""Tree size on the trained adapters: fixed node budgets against the adaptive cut (each tree cut
to the size with the most expected tokens per unit of pass cost, ``--node-cost``), and pruning
thresholds on top of the adaptive cut, on the same test prompts, in one process, timed by the
``specstream-mlx bench`` harness (``--repeats`` interleaved runs, the fastest counts; speed-up
against our AR with a 95% bootstrap interval).

    .venv/bin/python scripts/bench_tree_size.py [--task sql] [--n 50] [--repeats 3]
        [--out results/tree-size-sql]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from mlx_specstream.adapter import adapter_size  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL, load  # noqa: E402
from mlx_specstream.bench import REPEATS, Method, check_out_dir, our_decoder, run_bench  # noqa: E402
from mlx_specstream.errors import OutputExistsError  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--task", default="sql", choices=["sql", "code"])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=REPEATS, help="runs per prompt and method")
    ap.add_argument("--budgets", default="4,8,16,32")
    ap.add_argument("--prune", default="0.02,0.05,0.1", help="pruning thresholds to try")
    ap.add_argument("--out", type=Path, help="results folder (default: results/tree-size-TASK)")
    ap.add_argument("--overwrite", action="store_true", help="replace the results of an earlier run in --out")
    args = ap.parse_args()
    try:  # before the models load, in the command line's terms
        check_out_dir(args.out or ROOT / "results" / f"tree-size-{args.task}", args.overwrite)
    except OSError as e:
        ap.error(e.render("cli") if isinstance(e, OutputExistsError) else str(e))
    base, tok = load(args.model)
    methods = [Method("ar", our_decoder(base, tok, mode="ar"), plain_ar=True)]
    adapters = {"sql": [("ss-lossless", "sql-lossless"), ("ss-shared", "sql")],
                "code": [("ss-lossless", "code")]}[args.task]
    for label, name in adapters:
        model, _ = load(args.model, adapter=name)
        n, ar = adapter_size(model), "ar" if label == "ss-lossless" else None
        for t in [0.0, *map(float, args.prune.split(","))]:
            run = our_decoder(model, tok, branch=3, prune_threshold=t)
            tag = f" prune {t:g}" if t else ""
            methods.append(Method(f"{label} adaptive{tag}", run, n, ar))
        for b in map(int, args.budgets.split(",")):
            run = our_decoder(model, tok, branch=3, tree_budget=b, node_cost=0.0, prune_threshold=0.0)
            methods.append(Method(f"{label} budget {b}", run, n, ar))
    out = args.out or ROOT / "results" / f"tree-size-{args.task}"
    run_bench(args.model, args.task, args.n, args.max_tokens, out,
              methods=methods, overwrite=args.overwrite, repeats=args.repeats)
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
