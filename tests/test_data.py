"""The data sets of scripts/make_data.py: deterministic, held-out splits, valid SQL and Python."""

from __future__ import annotations

import ast
import importlib.util
import json
import sqlite3
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--sql-train", "400", "--sql-eval", "60", "--code-train", "300", "--code-eval", "60"]


def _load_make_data():
    spec = importlib.util.spec_from_file_location("make_data", ROOT / "scripts" / "make_data.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_data"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


md = _load_make_data()


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    manifest = md.main(["--out", str(out), *SMALL])
    return out, manifest


@pytest.mark.slow  # a second full build (~25 s); tests/test_sqlgen.py checks generation by seed by default
def test_deterministic(made, tmp_path):
    out, manifest = made
    again = md.main(["--out", str(tmp_path), *SMALL])
    assert again["files"] == manifest["files"]
    for rel in manifest["files"]:
        assert (out / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel


def test_sizes(made):
    out, manifest = made
    f = manifest["files"]
    assert f["sql/train.jsonl"]["n"] == 400 and f["sql/valid.jsonl"]["n"] == 60
    assert f["code/train.jsonl"]["n"] == 300 and f["code/test.jsonl"]["n"] == 60
    assert f["pretrain.jsonl.gz"]["n"] > 700


def test_sql_domains_held_out(made):
    out, manifest = made
    splits = md.sql_splits()
    assert not set(splits["train"]) & (set(splits["valid"]) | set(splits["test"]))
    assert not set(splits["valid"]) & set(splits["test"])
    assert len(splits["train"]) >= 40
    for split in ("train", "valid", "test"):
        domains = {r["meta"]["domain"] for r in _rows(out / "sql" / f"{split}.jsonl")}
        assert domains <= set(splits[split]) | ({"proc"} if split == "train" else set()), split
    # held-out table names never appear in a train context
    tables = md.load_domains()
    test_tables = {t.name for d in splits["test"] + splits["valid"] for t in tables[d]}
    train_tables = {t.name for d in splits["train"] for t in tables[d]}
    for r in _rows(out / "sql" / "train.jsonl"):
        for name in test_tables - train_tables:
            assert f"CREATE TABLE {name} (" not in r["prompt"]


def test_sql_runs_on_context(made):
    out, _ = made
    for split in ("train", "valid", "test"):
        for r in _rows(out / "sql" / f"{split}.jsonl"):
            assert r["prompt"].startswith("### Context:\nCREATE TABLE ")
            assert r["prompt"].endswith("\n### SQL:\n")
            assert "\n" not in r["completion"]
            md.check_sql(r)  # raises sqlite3.Error on an invalid query


def test_sql_check_catches_bad_query():
    ex = {"prompt": md.sql_prompt("CREATE TABLE t (a INTEGER);", "q?"), "completion": "SELECT b FROM t"}
    with pytest.raises(sqlite3.Error):
        md.check_sql(ex)


def test_sql_variety(made):
    out, _ = made
    rows = _rows(out / "sql" / "train.jsonl")
    forms = {r["meta"]["form"] for r in rows}
    assert len(forms) >= 25
    sql = " ".join(r["completion"] for r in rows)
    for kw in ("JOIN", "GROUP BY", "HAVING", "ORDER BY", "LIMIT", "BETWEEN", "LIKE", "DISTINCT",
               "COUNT(", "AVG(", "MIN(", "MAX(", "SUM(", " OR ", " AND ", "!="):
        assert kw in sql, kw
    for t in ("INTEGER", "TEXT", "REAL", "DATE"):
        assert any(f" {t}" in r["prompt"] for r in rows), t
    # one question never maps to two different queries
    seen = {}
    for r in rows:
        assert seen.setdefault(r["prompt"], r["completion"]) == r["completion"]


def test_code_modules_held_out(made):
    out, _ = made
    splits = md.code_splits()
    assert not set(splits["train"]) & (set(splits["valid"]) | set(splits["test"]))
    assert not set(splits["valid"]) & set(splits["test"])
    tops = {}
    for split in ("train", "valid", "test"):
        tops[split] = {r["meta"]["top"] for r in _rows(out / "code" / f"{split}.jsonl")}
        assert tops[split] <= set(splits[split])
    assert not tops["train"] & (tops["valid"] | tops["test"])


def test_code_held_out_modules_stay_held_out_on_another_python(monkeypatch):
    """Another Python's stdlib has other modules (3.12 drops some, adds others): the held-out
    modules are still the shipped manifest's, and none of them becomes train."""
    shipped = json.loads((ROOT / "data" / "manifest.json").read_text())["code_splits"]
    here = md.stdlib_modules()
    dropped = set(shipped["train"][:5]) | {shipped["test"][0]}
    other = {m: f for m, f in here.items() if m not in dropped} | {"_newmod": [], "zz_added": []}
    monkeypatch.setattr(md, "stdlib_modules", lambda: other)
    splits = md.code_splits()
    assert splits["test"] == shipped["test"][1:] and splits["valid"] == shipped["valid"]
    assert set(splits["train"]) == set(other) - set(shipped["test"]) - set(shipped["valid"])
    assert "_newmod" in splits["train"] and not dropped & set(splits["train"])


def test_code_parses(made):
    out, _ = made
    for split in ("train", "valid", "test"):
        for r in _rows(out / "code" / f"{split}.jsonl"):
            p, c = r["prompt"], r["completion"]
            assert p.startswith("# ") and p.endswith("\n") and c.endswith("\n") and c.strip()
            tree = ast.parse(p + c)
            assert isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef))
            assert len(p) + len(c) <= md.MAX_CODE_CHARS


def test_pretrain_has_no_held_out_text(made):
    out, _ = made
    docs = md.read_jsonl(out / "pretrain.jsonl.gz")
    assert {d["src"] for d in docs} == {"sql", "code", "stdlib", "stdlib_tests"}
    held = {r["prompt"] for s in ("valid", "test") for r in _rows(out / "sql" / f"{s}.jsonl")}
    held |= {r["prompt"] + r["completion"] for s in ("valid", "test")
             for r in _rows(out / "code" / f"{s}.jsonl")}
    texts = {d["text"] for d in docs}
    for h in held:
        assert h not in texts
    train_prompts = {r["prompt"] for r in _rows(out / "sql" / "train.jsonl")}
    assert not train_prompts & {r["prompt"] for r in _rows(out / "sql" / "test.jsonl")}


TOKENIZER = ROOT / "models" / "specstream-tiny" / "hf" / "tokenizer.model"


@pytest.mark.skipif(not TOKENIZER.exists(), reason="no shipped tokenizer")
def test_tokenizer_splits_at_prompt_boundary(made):
    """encode(prompt) + encode(completion) == encode(prompt + completion), and decode round-trips."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))
    out, _ = made
    for task in ("sql", "code"):
        for r in _rows(out / task / "valid.jsonl")[:30]:
            p, c = r["prompt"], r["completion"]
            assert sp.encode(p) + sp.encode(c) == sp.encode(p + c)
            assert sp.decode(sp.encode(p + c)) == p + c
