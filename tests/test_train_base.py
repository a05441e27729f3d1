"""scripts/train_base.py train: a run cut into short runs ends where the uninterrupted run ends,
and training stops by held-out validation (patience)."""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "models" / "specstream-tiny" / "hf"
pytestmark = pytest.mark.skipif(not (TOKENIZER / "tokenizer.model").exists(), reason="no shipped tokenizer")
TINY = ["--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--intermediate", "64",
        "--ctx", "64", "--batch", "4", "--eval-every", "3", "--eval-windows", "2", "--warmup", "2",
        "--eval-n", "0", "--threads", "1", "--tokenizer", str(TOKENIZER)]


def _load():
    spec = importlib.util.spec_from_file_location("train_base", ROOT / "scripts" / "train_base.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_base"] = mod
    spec.loader.exec_module(mod)
    return mod


tb = _load()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A small data folder: a few stdlib documents and the first valid rows of both tasks."""
    d = tmp_path_factory.mktemp("data")
    docs = [{"text": p.read_text(), "src": "stdlib"} for p in sorted(Path(json.__file__).parent.glob("*.py"))]
    with gzip.open(d / "pretrain.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(x) + "\n" for x in docs)
    for task in ("sql", "code"):
        (d / task).mkdir()
        rows = (ROOT / "data" / task / "valid.jsonl").read_text().splitlines()[:8]
        (d / task / "valid.jsonl").write_text("\n".join(rows) + "\n")
    return d


def _train(data: Path, run: Path, *extra: str) -> dict:
    tb.main(["train", "--data", str(data), "--out", str(run / "hf"), "--work", str(run / "work"), *TINY,
             *extra])
    return json.loads((run / "hf" / "train_log.json").read_text())


def _weights(run: Path) -> dict:
    import torch

    return torch.load(run / "work" / "ckpt.pt", weights_only=False)["model"]


def _sp():
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(TOKENIZER / "tokenizer.model"))


def test_batches_depend_on_seed_and_step_only(data):
    import numpy as np

    code = np.arange(5000, dtype=np.uint16) % 4000
    b = tb.Batcher(code, TOKENIZER, seed=3, ctx=64, bsz=6, sql_frac=0.5)
    x = b(7)
    assert x.shape == (6, 65) and (x == tb.Batcher(code, TOKENIZER, 3, 64, 6, 0.5)(7)).all()
    assert not (x == b(8)).all()
    sp = _sp()
    sql_rows = [r for r in x if r[0] == tb.BOS]  # generated SQL rows start a document
    assert sql_rows
    assert all(sp.decode(r[1:].tolist()).startswith("### Context:\nCREATE TABLE ") for r in sql_rows)


def test_short_runs_end_where_one_run_ends(data, tmp_path):
    import torch

    whole = _train(data, tmp_path / "whole", "--steps", "9")
    assert whole["finished"] and whole["stopped"] == "reached --steps 9"
    first = _train(data, tmp_path / "cut", "--steps", "9", "--run-steps", "5")
    assert not first["finished"] and first["steps"] == 5
    rest = _train(data, tmp_path / "cut", "--steps", "9", "--resume")
    assert rest["finished"] and rest["steps"] == 9
    assert [h["valid_sql"] for h in rest["history"]] == [h["valid_sql"] for h in whole["history"]]
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # from the compact checkpoint alone (fp16 best weights + train_log.json), as on another machine
    (tmp_path / "cut" / "work" / "ckpt.pt").unlink()
    again = _train(data, tmp_path / "cut", "--steps", "9", "--resume")
    assert again["finished"]  # a finished run stays finished
    for where in ("ckpt.pt", "hf"):  # said, not torch's screen of size mismatches
        for flag, value in (("--hidden", "64"), ("--heads", "4")):  # head counts: the same tensor sizes
            with pytest.raises(SystemExit, match=rf"{where}: its run has another model shape"):
                _train(data, tmp_path / "cut", "--steps", "9", "--resume", flag, value)
        (tmp_path / "cut" / "work" / "ckpt.pt").unlink(missing_ok=True)  # then the compact checkpoint


def test_stops_by_validation(data, tmp_path):
    log = _train(data, tmp_path / "p", "--steps", "60", "--patience", "2", "--min-delta", "100")
    # the first evaluation sets the best score; two more without a 100-nat gain stop the run
    assert log["finished"] and log["steps"] == 9 and "2 evaluations" in log["stopped"]
    assert log["saved_step"] == 3


def test_completion_loss_is_the_answer_tokens_cross_entropy(data):
    """Oracle: transformers' own loss with the prompt tokens masked, one example at a time."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    args = argparse.Namespace(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, max_positions=512,
                              tie=True)
    model = LlamaForCausalLM(tb.llama_config(args, 4096)).eval()
    sp = _sp()
    examples = tb.completion_examples(data, "valid", sp, 5)["sql"]
    no_amp = lambda: torch.autocast("cpu", enabled=False)  # noqa: E731
    got = tb.completion_loss(model, examples, torch.device("cpu"), no_amp, bsz=3)  # padded batches
    total = count = 0.0
    with torch.no_grad():
        for ids, start in examples:
            labels = torch.tensor([[-100] * start + ids[start:]])
            n = len(ids) - start
            total += model(input_ids=torch.tensor([ids]), labels=labels).loss.item() * n
            count += n
    assert got == pytest.approx(total / count, rel=1e-5)
    assert all(ids[0] == tb.BOS and ids[-1] == tb.EOS and 1 < start < len(ids) for ids, start in examples)


def test_init_starts_a_new_run_from_trained_weights(data, tmp_path):
    """--init: the run's first weights are the given checkpoint's (lr 0 keeps them), at step 0."""
    import torch

    first = _train(data, tmp_path / "a", "--steps", "3")
    log = _train(data, tmp_path / "b", "--init", str(tmp_path / "a" / "hf"), "--steps", "3", "--lr", "0")
    assert log["steps"] == 3 and log["history"][0]["step"] == 3
    init = torch.load(tmp_path / "a" / "work" / "ckpt.pt", weights_only=False)["best_weights"]
    for k, v in _weights(tmp_path / "b").items():
        torch.testing.assert_close(v, init[k].float(), atol=1e-3, rtol=0)  # fp16 round trip of --out
    assert first["valid_loss"] == pytest.approx(log["valid_loss"], rel=1e-3)


def test_greedy_cuts_at_eos_and_says_which_outputs_ended():
    """An output that reaches its token budget without EOS (a repetition loop) is reported as not
    ended; the text stops before EOS otherwise."""
    import torch

    sp = _sp()
    a, b = sp.encode("SELECT name FROM t"), sp.encode("SELECT x FROM x FROM x")
    loop = (b * 4)[:len(a) + 3]  # fills the budget
    continuations = [a + [tb.EOS] + b[:2], loop]

    class Scripted:  # answers generate() with fixed continuations after the (left-padded) prompts
        def eval(self):
            pass

        def generate(self, input_ids, max_new_tokens, **_):
            rows = [c[:max_new_tokens] + [tb.EOS] * (max_new_tokens - len(c)) for c in continuations]
            return torch.cat([input_ids, torch.tensor(rows)], dim=1)

    texts, ended = tb.greedy(Scripted(), sp, ["p1\n", "a longer prompt\n"], len(a) + 3, "cpu", 8)
    assert texts == ["SELECT name FROM t", sp.decode(loop)]
    assert ended == [True, False]


def _run(prompt: str, sql: str) -> list:
    """The query's rows on its context's tables, each filled with the same three rows."""
    import sqlite3

    ctx = tb.sqlgen.context(prompt)
    con = sqlite3.connect(":memory:")
    con.executescript(ctx)
    for table, cols in re.findall(r"CREATE TABLE (\w+) \((.*?)\);", ctx):
        n = len(cols.split(", "))
        for i in range(3):
            row = [f"v{i}" if j % 2 else i for j in range(n)]
            con.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * n)})", row)
    return con.execute(sql).fetchall()


def test_renamed_tables_keep_the_query_and_the_question():
    """A one-table example renamed with tokenizer pieces answers its question with the same rows
    under the new name; pieces that no generated name starts with (``▁air``, ``▁case``) are among
    the names; several tables are left as they are."""
    import itertools
    import random

    sp = _sp()
    first, inner = tb.name_pieces(sp)
    assert {"air", "case", "book", "less"} <= set(first) and "craft" in inner
    rng, renamed, kept = random.Random(0), 0, 0
    for ex in itertools.islice(tb.sqlgen.examples("rename"), 60):
        name = tb.piece_name(rng, first, inner)
        new = tb.rename_table(ex, name)
        if new is None:
            kept += ex["prompt"].count("CREATE TABLE ") > 1
            continue
        renamed += 1
        question = lambda p: p.split("### Question:", 1)[1]  # noqa: E731
        assert question(new["prompt"]) == question(ex["prompt"])
        assert f"CREATE TABLE {name} (" in new["prompt"] and re.search(rf"\b{name}\b", new["completion"])
        assert _run(new["prompt"], new["completion"]) == _run(ex["prompt"], ex["completion"])
    assert renamed > 10 and kept > 10, (renamed, kept)


def test_rename_frac_changes_only_names():
    """With every one-table example renamed, a batch is still a function of (seed, step), differs
    from the batch without renaming, and its rows are still whole examples."""
    code = np.arange(5000) % 4000 + 10
    b = tb.Batcher(code, TOKENIZER, seed=3, ctx=512, bsz=8, sql_frac=1.0, rename_frac=1.0)
    x = b(7)
    assert (x == tb.Batcher(code, TOKENIZER, 3, 512, 8, 1.0, 1.0)(7)).all()
    plain = tb.Batcher(code, TOKENIZER, 3, 512, 8, 1.0)(7)
    assert not (x == plain).all()
    texts = [b.sp.decode(r.tolist()) for r in x]
    assert all(t.startswith("### Context:\nCREATE TABLE ") for t in texts)


@pytest.mark.parametrize("flag", ["--sql-frac", "--fn-frac", "--rename-frac"])
def test_shares_out_of_range_are_refused_in_one_line(data, tmp_path, flag):
    with pytest.raises(SystemExit, match=rf"^train_base: {flag} must be in \[0, 1\], not 1.5$"):
        _train(data, tmp_path, flag, "1.5")
    both = r"^train_base: --sql-frac \+ --fn-frac must be in \[0, 1\], not 1.2$"
    with pytest.raises(SystemExit, match=both):
        _train(data, tmp_path, "--sql-frac", "0.7", "--fn-frac", "0.5")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "work").exists()


def test_function_rows_are_the_code_tasks_documents():
    """--fn-frac rows are the code task's documents packed from the start of one: the model sees
    functions posed and ended (EOS) as the code test split poses them; --fn-rename-frac gives them
    new parameter names, and nothing else changes."""
    sp = _sp()
    docs = [f"# m: f{i}\ndef f{i}(value):\n" + "    value += 1\n" * (i % 7 + 1) + "    return value\n"
            for i in range(60)]
    code = np.full(5000, 7, dtype=np.uint16)

    def batch(fn_frac, rename=0.0, bsz=16):
        return tb.Batcher(code, TOKENIZER, 3, 256, bsz, 0.0, functions=docs, fn_frac=fn_frac,
                          fn_rename_frac=rename)(5)

    x = batch(1.0)
    assert (x == batch(1.0)).all()
    for row in x:
        assert row[0] == tb.BOS and tb.EOS in row.tolist()
        assert sp.decode(row[1:row.tolist().index(tb.EOS)].tolist()) in docs
    mixed = batch(0.5, bsz=400)
    assert 120 < sum(r[0] == tb.BOS for r in mixed) < 280  # the others are code-stream windows (all 7)
    renamed = [sp.decode(r[1:r.tolist().index(tb.EOS)].tolist()) for r in batch(1.0, rename=1.0)]
    assert not set(renamed) & set(docs)
    for text in renamed:  # the same function under another parameter name
        name = re.search(r"def f\d+\((\w+)\)", text).group(1)
        assert text.replace(name, "value") in docs


def test_the_base_evaluation_compares_sql_as_bench_does():
    """``train_base.py`` runs without MLX and keeps its own copy of the exact-match rule."""
    from mlx_specstream.bench import exact_match

    pairs = [("SELECT a FROM t;", "SELECT a FROM t"), ("SELECT  a\nFROM t ", "SELECT a FROM t"),
             ("SELECT a FROM t WHERE c = 'Cornwall'", "SELECT a FROM t WHERE c = 'cornwall'"),
             ("select a from t", "SELECT a FROM t"), ("SELECT b FROM t", "SELECT a FROM t")]
    for out, ref in pairs:
        assert (tb.norm_sql(out) == tb.norm_sql(ref)) == exact_match("sql", out, ref), (out, ref)
    assert [exact_match("sql", o, r) for o, r in pairs] == [True, True, False, False, False]
