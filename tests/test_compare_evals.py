"""scripts/compare_evals.py: two evaluations of the same prompts compared prompt by prompt."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("compare_evals", ROOT / "scripts" / "compare_evals.py")
ce = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ce)


def _enumerated_p(only_a: int, only_b: int) -> float:
    """Two-sided exact test by listing every split of the discordant prompts (each 1/2^m likely):
    the chance of one at most as likely as the split seen."""
    m = only_a + only_b
    splits = [sum(s) for s in itertools.product((0, 1), repeat=m)]
    prob = {k: splits.count(k) / 2 ** m for k in range(m + 1)}
    return min(1.0, sum(p for p in prob.values() if p <= prob[only_a] + 1e-12))


@pytest.mark.parametrize("only_a,only_b", [(0, 0), (0, 5), (3, 4), (1, 9), (6, 6), (2, 11)])
def test_mcnemar_matches_enumerating_every_split(only_a, only_b):
    assert ce.mcnemar_exact(only_a, only_b) == pytest.approx(_enumerated_p(only_a, only_b))


def test_paired_counts_and_interval():
    # 500 prompts: A alone right on 3, B alone on 4, both right on 430
    a = [True] * 3 + [False] * 4 + [True] * 430 + [False] * 63
    b = [False] * 3 + [True] * 4 + [True] * 430 + [False] * 63
    r = ce.paired(a, b)
    assert (r["n"], r["only_a"], r["only_b"]) == (500, 3, 4)
    assert r["exact_a"] == pytest.approx(433 / 500) and r["exact_b"] == pytest.approx(434 / 500)
    assert r["difference"] == pytest.approx(-1 / 500)
    lo, hi = r["difference_ci95"]
    # the normal approximation of the paired difference's interval (independent of the bootstrap)
    d = np.array(a, float) - np.array(b, float)
    half = 1.96 * d.std() / np.sqrt(len(d))
    assert lo == pytest.approx(d.mean() - half, abs=0.003) and hi == pytest.approx(d.mean() + half, abs=0.003)
    assert r["mcnemar_p"] == 1.0
    # one adapter right on every discordant prompt: a real difference
    assert ce.paired([True] * 20 + [False] * 80, [False] * 100)["mcnemar_p"] < 1e-5


def _eval_file(path: Path, exact: list[bool], n: int | None = None) -> Path:
    res = {"adapter": path.stem, "task": "sql", "split": "test", "n": n or len(exact), "max_tokens": 96,
           "per_prompt": [{"exact": e, "output": ""} for e in exact]}
    path.write_text(json.dumps({"meta": {}, "results": [res]}))
    return path


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "compare_evals.py"), *map(str, args)],
                          capture_output=True, text=True)


def test_cli_writes_results_and_refuses_other_prompts(tmp_path):
    a = _eval_file(tmp_path / "a.json", [True, True, False, True])
    b = _eval_file(tmp_path / "b.json", [True, False, False, True])
    r = _run(a, b, "--out", tmp_path / "cmp.json")
    assert r.returncode == 0, r.stderr
    assert "only with a: 1, only with b: 0" in r.stdout
    got = json.loads((tmp_path / "cmp.json").read_text())
    assert got["results"][0]["difference"] == pytest.approx(0.25) and "command" in got["meta"]
    other = _eval_file(tmp_path / "c.json", [True] * 5)
    r = _run(a, other)
    assert r.returncode != 0 and "not the same prompts" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"meta": {}, "results": [{"adapter": "x"}]}))
    r = _run(old, b)
    assert r.returncode != 0 and "evaluate again" in r.stderr
