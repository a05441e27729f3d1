"""The new-user check of adapter training: prompts of Python source the project never trained or
tuned on (functions of third-party packages installed beside it: signature and docstring, no
completion), `specstream-mlx train --data DIR --out NAME` with no other flag on the default
model, then greedy Speculative Streaming on held-out prompts of the same packages.

    .venv/bin/python scripts/new_user_check.py [--packages click,jinja2,rich] [--n-train 120]
        [--n-test 40] [--max-tokens 96] [--out results/new_user.json] [-- extra train flags]
    .venv/bin/python scripts/new_user_check.py --project-code ...   # the same flow on the
        project's own code data (standard library): what defaults are tuned on

Reports the wall time of `train` (self-distillation included), mean accepted tokens per pass of
the trained adapter and of an untrained one (same configuration), and whether every output equals
plain autoregressive decoding. The model directory is copied to a temporary directory first, so
nothing is written into the shipped model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import mlx_specstream  # noqa: E402,F401  (first: the optimized BLAS before MLX)

# isort: split
from make_data import functions_of  # noqa: E402

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.adapter import load_adapter, new_adapter  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL, generate, load  # noqa: E402
from mlx_specstream.data import make_project_train_split  # noqa: E402
from mlx_specstream.outputs import run_meta, write_text_atomic  # noqa: E402


def user_functions(packages: list[str], seed: int) -> list[dict]:
    """Prompts (``# module: qualname`` + signature + docstring) of the documented functions of
    ``packages``, shuffled with ``seed``."""
    site = Path(sysconfig.get_paths()["purelib"])
    rows = []
    for pkg in packages:
        for path in sorted((site / pkg).rglob("*.py")):
            mod = ".".join(path.relative_to(site).with_suffix("").parts).removesuffix(".__init__")
            for ex in functions_of(path, mod):
                if ex["meta"]["docstring"] and len(ex["prompt"]) <= 1200:
                    rows.append({"prompt": ex["prompt"], "completion": ""})
    random.Random(seed).shuffle(rows)
    return rows


def project_functions(split: str, seed: int) -> list[dict]:
    """Prompts of the project's own code split (standard-library functions), given alone (its
    train split made first where a fresh checkout does not have it yet)."""
    path = ROOT / "data/code" / f"{split}.jsonl"
    if not path.is_file():
        make_project_train_split(path.parent)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [{"prompt": r["prompt"], "completion": ""} for r in rows if r["meta"].get("docstring")]
    random.Random(seed).shuffle(rows)
    return rows


def mean_accepted(model, tok, prompts: list[str], max_tokens: int) -> tuple[float, bool]:
    """Tokens per pass over all prompts (greedy SS), and whether every output equals AR's."""
    tokens = passes = 0
    same = True
    for p in prompts:
        ss = generate(model, tok, p, max_tokens=max_tokens)
        ar = generate(model, tok, p, max_tokens=max_tokens, mode="ar")
        same &= ss.tokens == ar.tokens
        tokens += sum(k * n for k, n in ss.stats.accepted_lengths.items())
        passes += sum(ss.stats.accepted_lengths.values())
    return tokens / passes, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packages", default="click,jinja2,rich")
    ap.add_argument("--project-code", action="store_true",
                    help="train on data/code train prompts, test on its valid prompts (for tuning)")
    ap.add_argument("--n-train", type=int, default=120)
    ap.add_argument("--n-test", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    args = outputs.parse_script_args(ap, pass_through=True)
    extra = args.passed
    if args.project_code:
        train_rows = project_functions("train", args.seed)[: args.n_train]
        test_rows = project_functions("valid", args.seed)[: args.n_test]
    else:
        rows = user_functions(args.packages.split(","), args.seed)
        if len(rows) < args.n_train + args.n_test:
            sys.exit(f"only {len(rows)} documented functions in {args.packages}")
        train_rows, test_rows = rows[: args.n_train], rows[args.n_train: args.n_train + args.n_test]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = tmp / "model"
        shutil.copytree(DEFAULT_MODEL, model_dir, ignore=shutil.ignore_patterns("adapters", "draft"))
        data = tmp / "data"
        data.mkdir()
        (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_rows))
        cmd = [str(ROOT / ".venv/bin/specstream-mlx"), "train", "--model", str(model_dir),
               "--data", str(data), "--out", "mine", *extra]
        load_before = os.getloadavg()[0]
        t = time.perf_counter()
        subprocess.run(cmd, check=True)
        seconds = time.perf_counter() - t
        load_after = os.getloadavg()[0]
        adapter = model_dir / "adapters" / "mine"
        report = json.loads((adapter / "training_report.json").read_text())
        prompts = [r["prompt"] for r in test_rows]
        model, tok = load(model_dir)
        load_adapter(model, adapter)
        trained, same_trained = mean_accepted(model, tok, prompts, args.max_tokens)
        model, tok = load(model_dir)
        cfg = report["config"]
        new_adapter(model, mode=cfg["mode"], gamma=cfg["gamma"], msa_layers=cfg["msa_layers"],
                    rank=cfg["rank"], seed=0)
        untrained, same_untrained = mean_accepted(model, tok, prompts, args.max_tokens)
    result = {
        "meta": run_meta(
            train_command=" ".join(["specstream-mlx", *cmd[1:]]).replace(str(tmp), "TMP"),
            source="data/code (train / valid)" if args.project_code else args.packages,
            n_train=len(train_rows), n_test=len(test_rows), max_tokens=args.max_tokens,
            load_average_1min_before_and_after_train=[round(load_before, 2), round(load_after, 2)]),
        "train_seconds": round(seconds, 1),
        "iters": cfg["iters"],
        "trained_mean_accepted_tokens": round(trained, 3),
        "untrained_mean_accepted_tokens": round(untrained, 3),
        "gain": round(trained - untrained, 3),
        "lossless": bool(same_trained and same_untrained),
        "best": report.get("best"),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
