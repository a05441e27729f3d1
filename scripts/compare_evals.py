"""Compare two evaluations of the same prompts prompt by prompt (``scripts/eval_ss.py`` results
files): the prompts each gets right that the other does not, the difference in exact match with
its 95% bootstrap interval over prompts, and McNemar's exact test, the chance of a split of the
discordant prompts at least that uneven if neither adapter were better.

    .venv/bin/python scripts/compare_evals.py A.json B.json [--out FILE]

Why: on the 500 sql test prompts one prompt moves exact match by 0.002, and two adapters that
decode most prompts alike differ on a few dozen. Whether "0.874 against 0.876" says anything is
the paired question answered here, not the difference of the two means.

Example: A right on 3 prompts where B is wrong, B right on 4 where A is wrong, 500 prompts:
difference -0.002, interval about (-0.012, 0.008), McNemar p = 1.0 -- no evidence either way.
"""

from __future__ import annotations

import argparse
import json
import sys
from math import comb
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.bench import bootstrap_interval  # noqa: E402
from mlx_specstream.outputs import recorded_path, run_meta, write_results_file  # noqa: E402


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: discordant pairs as fair coin flips (binomial, p = 1/2)."""
    m = only_a + only_b
    if m == 0:
        return 1.0
    tail = sum(comb(m, i) for i in range(min(only_a, only_b) + 1)) / 2 ** m
    return min(1.0, 2 * tail)


def paired(a: list[bool], b: list[bool]) -> dict:
    """Exact match of ``a`` and ``b`` (per-prompt right/wrong, same prompts in the same order),
    their difference a - b with a percentile bootstrap interval over prompts, the discordant
    counts and McNemar's exact p-value."""
    if len(a) != len(b) or not a:
        raise ValueError(f"not the same prompts: {len(a)} and {len(b)} results")
    x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
    d = x - y
    lo, hi = bootstrap_interval(lambda i: d[i].mean(1), len(d))  # the benchmark's resamples and seed
    only_a, only_b = int((d > 0).sum()), int((d < 0).sum())
    return {"n": len(d), "exact_a": float(x.mean()), "exact_b": float(y.mean()),
            "only_a": only_a, "only_b": only_b, "difference": float(d.mean()),
            "difference_ci95": [lo, hi], "mcnemar_p": mcnemar_exact(only_a, only_b)}


def read_eval(path: Path) -> dict:
    """The one result of an eval_ss results file, which must hold per-prompt records."""
    data = json.loads(path.read_text())
    res = data["results"][0] if isinstance(data, dict) and data.get("results") else None
    if not isinstance(res, dict) or "adapter" not in res:
        raise ValueError(f"{path}: not a results file of scripts/eval_ss.py")
    if "per_prompt" not in res:
        raise ValueError(f"{path}: no per-prompt records (made before eval_ss kept them): evaluate again")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = outputs.parse_script_args(ap)
    try:
        ra, rb = read_eval(args.a), read_eval(args.b)
        key = ("task", "split", "n", "max_tokens")
        if [ra[k] for k in key] != [rb[k] for k in key]:
            raise ValueError(f"not the same prompts: {[ra[k] for k in key]} against {[rb[k] for k in key]}")
        out = {"a": recorded_path(args.a), "b": recorded_path(args.b),
               "adapter_a": ra["adapter"], "adapter_b": rb["adapter"],
               **paired([p["exact"] for p in ra["per_prompt"]], [p["exact"] for p in rb["per_prompt"]])}
    except (OSError, ValueError, KeyError, IndexError) as e:
        sys.exit(f"compare_evals: {e}")
    lo, hi = out["difference_ci95"]
    print(f"{out['adapter_a']}: {out['exact_a']:.3f}, {out['adapter_b']}: {out['exact_b']:.3f} on {out['n']} "
          f"prompts; right only with {out['adapter_a']}: {out['only_a']}, only with {out['adapter_b']}: "
          f"{out['only_b']}; difference {out['difference']:+.3f} (95% interval {lo:+.3f} to {hi:+.3f}), "
          f"McNemar p = {out['mcnemar_p']:.3g}")
    if args.out:
        write_results_file(args.out, run_meta(), [out])


if __name__ == "__main__":
    main()
