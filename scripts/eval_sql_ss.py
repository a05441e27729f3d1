"""Greedy Speculative Streaming decoding of the sql test prompts with one adapter: exact match of the
outputs against the references (for a lossless adapter, the base model's own greedy output) and
the mean accepted tokens per pass. Compares base models: train an adapter by the same command on
each, then run this on each (results/default_model/cpu_continued_training.json).

    .venv/bin/python scripts/eval_sql_ss.py MODEL_DIR ADAPTER [N]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx_specstream  # noqa: E402,F401  (first: the optimized BLAS before MLX)
from mlx_specstream.api import generate, load  # noqa: E402


def norm_sql(s: str) -> str:
    """As scripts/train_base.py compares SQL: whitespace runs and a final ';' do not count."""
    return " ".join(s.strip().rstrip(";").split())


def main() -> None:
    model_dir, adapter = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    model, tok = load(model_dir, adapter=adapter)
    test = Path(__file__).resolve().parent.parent / "data" / "sql" / "test.jsonl"
    rows = [json.loads(line) for line in test.read_text().splitlines()][:n]
    exact = tokens = passes = 0
    for r in rows:
        res = generate(model, tok, r["prompt"], max_tokens=96)
        exact += norm_sql(res.text) == norm_sql(r["completion"])
        tokens += sum(k * c for k, c in res.stats.accepted_lengths.items())
        passes += sum(res.stats.accepted_lengths.values())
    print(json.dumps({"model": model_dir, "adapter": adapter, "n": n, "exact_match": exact / n,
                      "tokens_per_pass": round(tokens / passes, 4)}))


if __name__ == "__main__":
    main()
