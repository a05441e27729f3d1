"""Make the project's data sets, deterministically (fixed seeds, nothing downloaded).

    python scripts/make_data.py [--out data] [--sql-train 30000] [--sql-eval 500] [--code-eval 500]

Writes, as JSON lines ``{"prompt": ..., "completion": ..., "meta": {...}}``:

* ``data/sql/{train,valid,test}.jsonl`` -- synthetic text-to-SQL in the shape of
  sql-create-context: a ``CREATE TABLE`` context (one table, two for joins) and a question give
  one SQLite query. valid and test: 14 of the 60 hand-written schema domains
  (``data/sql_domains.py``), fixed and held out. train: ``scripts/sqlgen.py``, procedural schemas
  whose table and column names are composed on the fly (no fixed vocabulary of names: a model has
  to copy them from the context; domain "proc"), never a valid/test prompt or table name; the
  same generator feeds base-model pretraining without end. Every query runs on the context's
  tables in sqlite3.
* ``data/code/{train,valid,test}.jsonl`` -- functions of the CPython standard library installed
  on this machine (``sysconfig.get_paths()['stdlib']``): prompt = a ``# module: qualname``
  comment, the decorators, the signature and the docstring (when there is one; functions without
  a docstring need two statements or more); completion = the rest of the body.
  Split by top-level module (a package counts as one module); valid/test modules never appear in
  train. The result depends on the Python version whose stdlib is read (recorded in the manifest).
* ``data/pretrain.jsonl.gz`` -- ``{"text": ..., "src": ...}`` documents for the base model and
  its tokenizer: every sql and code train example (prompt + completion), the source files of the
  train-split stdlib modules and of the stdlib's test suite (``Lib/test``, leaving out the files
  named after a valid/test module), cut into chunks at top-level statement boundaries.
* ``data/manifest.json`` -- counts, seeds, Python version, sha256 of every file (and of the first
  ``HEAD_ROWS`` rows of each split: a quick check that the generators did not change).

Prompt formats (the ``prompt`` field is exactly what the model is given; the ``completion``
follows it directly, and the model ends it with EOS):

    SQL_PROMPT  = "### Context:\\n{context}\\n### Question:\\n{question}\\n### SQL:\\n"
    code prompt = "# {module}: {qualname}\\n{decorators}{signature}\\n{docstring}\\n"
                  (completion: the body lines after the docstring, ending with "\\n")

Both prompts end with a newline, so with the shipped tokenizer (no dummy prefix, newline as its
own byte token) encode(prompt) + encode(completion) == encode(prompt + completion).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import random
import re
import sys
import sysconfig
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "data"))

import sql_domains  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
import sqlgen  # noqa: E402
from sqlgen import check_sql, create_table, parent_phrase, q, say, sql_prompt  # noqa: E402,F401  (check_sql: part of this module's API)

SEED = 1234
SPLIT_SEED = 7  # which domains / modules are held out


def code_prompt(module: str, qualname: str, head: str) -> str:
    """``head`` = decorators + signature + docstring lines, dedented, ending with a newline."""
    return f"# {module}: {qualname}\n{head}"


# --------------------------------------------------------------------------------------------
# SQL: schemas
# --------------------------------------------------------------------------------------------
COL_RE = re.compile(r"^(\w+) (INTEGER|TEXT|REAL|DATE) (\[[^\]]*\]|\S+)(?: \| (.+))?$")
NAME_POOLS = {"person", "first", "last", "title", "company", "word", "code"}


@dataclass(eq=False)
class Column:
    name: str
    type: str
    gen: str
    phrase: str

    @property
    def is_key(self) -> bool:
        return self.gen == "key" or self.gen.startswith("fk:")

    @property
    def role(self) -> str:  # what sqlgen.create_table reads: a table's own key leads its columns
        return "key" if self.gen == "key" else self.gen

    @property
    def numeric(self) -> bool:
        return self.type in ("INTEGER", "REAL") and not self.is_key

    @property
    def ordered(self) -> bool:  # can be compared / sorted / used in BETWEEN
        return self.numeric or self.type == "DATE"

    @property
    def categorical(self) -> bool:
        pools = sql_domains.CATEGORICAL_POOLS
        return self.type == "TEXT" and (self.gen.startswith("[") or self.gen[1:] in pools)

    @property
    def textual(self) -> bool:
        return self.type == "TEXT"

    @property
    def namelike(self) -> bool:
        return self.type == "TEXT" and self.gen[1:] in NAME_POOLS


@dataclass(eq=False)
class Table:
    name: str
    ent: str
    ents: str
    columns: list[Column] = field(default_factory=list)
    domain: str = ""

    @property
    def key(self) -> Column:
        return next(c for c in self.columns if c.gen == "key")


def parse_table(spec: str, domain: str) -> Table:
    head, cols = spec.split(" : ", 1)
    name, ent, ents = (s.strip() for s in head.split("|"))
    table = Table(name, ent, ents, domain=domain)
    for raw in cols.split(";"):
        m = COL_RE.match(raw.strip())
        if not m:
            raise ValueError(f"{domain}: bad column spec {raw!r}")
        cname, ctype, gen, phrase = m.groups()
        table.columns.append(Column(cname, ctype, gen, phrase or cname.replace("_", " ")))
    return table


def load_domains() -> dict[str, list[Table]]:
    return {d: [parse_table(s, d) for s in specs] for d, specs in sql_domains.DOMAINS.items()}


def split_names(names: list[str], n_valid: int, n_test: int) -> dict[str, list[str]]:
    names = sorted(names)
    random.Random(SPLIT_SEED).shuffle(names)
    return {"test": sorted(names[:n_test]), "valid": sorted(names[n_test:n_test + n_valid]),
            "train": sorted(names[n_test + n_valid:])}


def sql_splits() -> dict[str, list[str]]:
    return split_names(list(sql_domains.DOMAINS), n_valid=6, n_test=8)


# --------------------------------------------------------------------------------------------
# SQL: values
# --------------------------------------------------------------------------------------------
P = sql_domains.POOLS


def text_value(rng: random.Random, col: Column) -> str:
    g = col.gen
    if g.startswith("["):
        return rng.choice([s.strip() for s in g[1:-1].split(",")])
    pool = g[1:]
    if pool == "person":
        return f"{rng.choice(P['first'])} {rng.choice(P['last'])}"
    if pool == "title":
        return f"{rng.choice(P['adj'])} {rng.choice(P['noun'])}"
    if pool == "company":
        return f"{rng.choice(P['costem'])} {rng.choice(P['cosuffix'])}"
    if pool == "code":
        letters = "ABCDEFGHJKLMNPRSTUVWXYZ"
        return rng.choice(letters) + rng.choice(letters) + str(rng.randint(10, 9999))
    if pool == "word":
        return rng.choice(P["word"]).capitalize()
    return rng.choice(P[pool])


def num_range(col: Column) -> tuple[float, float]:
    m = re.match(r"^(-?\d+)-(-?\d+)$", col.gen)
    return float(m.group(1)), float(m.group(2))


def ordered_value(rng: random.Random, col: Column, lo_q: float = 0.0, hi_q: float = 1.0) -> str:
    """A literal as it is written in SQL (dates quoted), drawn between two quantiles of the range."""
    lo, hi = num_range(col)
    u = lo_q + (hi_q - lo_q) * rng.random()
    if col.type == "DATE":
        year = int(lo + u * (hi - lo))
        return f"'{year:04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}'"
    x = lo + u * (hi - lo)
    if col.type == "REAL" and hi - lo <= 20:
        return f"{x:.1f}"
    if hi - lo >= 5000:  # round numbers for large ranges, as people ask
        step = 10 ** (len(str(int(hi - lo))) - 2)
        return str(int(round(x / step) * step))
    return str(int(round(x)))


def two_ordered(rng: random.Random, col: Column) -> tuple[str, str]:
    a = ordered_value(rng, col, 0.0, 0.45)
    b = ordered_value(rng, col, 0.55, 1.0)
    return a, b


# --------------------------------------------------------------------------------------------
# SQL: question forms. Each returns (question, sql, {table: set(columns)}) or None.
# --------------------------------------------------------------------------------------------
CMP_WORDS = {
    ">": ["greater than", "more than", "above", "over", "higher than"],
    "<": ["less than", "below", "under", "lower than", "smaller than"],
    ">=": ["at least", "no less than", "greater than or equal to"],
    "<=": ["at most", "no more than", "less than or equal to"],
}
DATE_CMP_WORDS = {">": ["after", "later than"], "<": ["before", "earlier than"],
                  ">=": ["on or after"], "<=": ["on or before"]}
AGG_WORDS = {"AVG": ["average", "mean"], "MIN": ["minimum", "lowest", "smallest"],
             "MAX": ["maximum", "highest", "largest"], "SUM": ["total", "sum of the"]}


def pick(rng, cols, pred, n=1, exclude=()):
    cand = [c for c in cols if pred(c) and c not in exclude]
    if len(cand) < n:
        return None
    return rng.sample(cand, n)


def any_col(c: Column) -> bool:
    return not c.is_key


def cmp_phrase(rng, col: Column, op: str) -> str:
    words = DATE_CMP_WORDS if col.type == "DATE" else CMP_WORDS
    return rng.choice(words[op])


def f_select_eq(rng, t: Table):
    r = pick(rng, t.columns, lambda c: c.textual)
    if not r:
        return None
    b = r[0]
    a = pick(rng, t.columns, any_col, exclude=(b,))
    if not a:
        return None
    a = a[0]
    lit = q(text_value(rng, b))
    v = say(rng, lit)
    qs = [f"What is the {a.phrase} of the {t.ent} whose {b.phrase} is {v}?",
          f"Find the {a.phrase} of {t.ents} whose {b.phrase} is {v}.",
          f"What are the {a.phrase} values of {t.ents} with {b.phrase} {v}?",
          f"Show the {a.phrase} for {t.ents} where {b.phrase} equals {v}.",
          f"List the {a.phrase} of all {t.ents} whose {b.phrase} is {v}.",
          f"Give the {a.phrase} of the {t.ents} that have {b.phrase} {v}."]
    return rng.choice(qs), f"SELECT {a.name} FROM {t.name} WHERE {b.name} = {lit}", {t: {a, b}}


def f_select2_eq(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.textual)
    if not b:
        return None
    b = b[0]
    a = pick(rng, t.columns, any_col, n=2, exclude=(b,))
    if not a:
        return None
    a1, a2 = a
    lit = q(text_value(rng, b))
    v = say(rng, lit)
    qs = [f"What are the {a1.phrase} and {a2.phrase} of {t.ents} whose {b.phrase} is {v}?",
          f"List the {a1.phrase} and {a2.phrase} of the {t.ents} with {b.phrase} {v}.",
          f"Show {a1.phrase} and {a2.phrase} for every {t.ent} where {b.phrase} is {v}."]
    return (rng.choice(qs), f"SELECT {a1.name}, {a2.name} FROM {t.name} WHERE {b.name} = {lit}",
            {t: {a1, a2, b}})


def f_select_cmp(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.ordered)
    if not b:
        return None
    b = b[0]
    a = pick(rng, t.columns, any_col, exclude=(b,))
    if not a:
        return None
    a = a[0]
    op = rng.choice([">", "<", ">=", "<="])
    lit = ordered_value(rng, b, 0.15, 0.85)
    w, v = cmp_phrase(rng, b, op), say(rng, lit)
    qs = [f"What is the {a.phrase} of {t.ents} whose {b.phrase} is {w} {v}?",
          f"List the {a.phrase} of all {t.ents} with {b.phrase} {w} {v}.",
          f"Which {t.ents} have a {b.phrase} {w} {v}? Give their {a.phrase}.",
          f"Show the {a.phrase} for {t.ents} where the {b.phrase} is {w} {v}."]
    return rng.choice(qs), f"SELECT {a.name} FROM {t.name} WHERE {b.name} {op} {lit}", {t: {a, b}}


def f_count_all(rng, t: Table):
    qs = [f"How many {t.ents} are there?", f"Count the number of {t.ents}.",
          f"What is the total number of {t.ents}?", f"How many {t.ents} do we have?"]
    return rng.choice(qs), f"SELECT COUNT(*) FROM {t.name}", {t: set()}


def f_count_eq(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.textual)
    if not b:
        return None
    b = b[0]
    lit = q(text_value(rng, b))
    v = say(rng, lit)
    qs = [f"How many {t.ents} have {b.phrase} {v}?",
          f"How many {t.ents} are there whose {b.phrase} is {v}?",
          f"Count the {t.ents} whose {b.phrase} is {v}.",
          f"What is the number of {t.ents} with {b.phrase} {v}?"]
    return rng.choice(qs), f"SELECT COUNT(*) FROM {t.name} WHERE {b.name} = {lit}", {t: {b}}


def f_count_cmp(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.ordered)
    if not b:
        return None
    b = b[0]
    op = rng.choice([">", "<", ">=", "<="])
    lit = ordered_value(rng, b, 0.15, 0.85)
    w, v = cmp_phrase(rng, b, op), say(rng, lit)
    qs = [f"How many {t.ents} have a {b.phrase} {w} {v}?",
          f"Count the {t.ents} whose {b.phrase} is {w} {v}.",
          f"What is the number of {t.ents} with {b.phrase} {w} {v}?"]
    return rng.choice(qs), f"SELECT COUNT(*) FROM {t.name} WHERE {b.name} {op} {lit}", {t: {b}}


def f_agg(rng, t: Table):
    c = pick(rng, t.columns, lambda c: c.numeric)
    if not c:
        return None
    c = c[0]
    fn = rng.choice(list(AGG_WORDS))
    w = rng.choice(AGG_WORDS[fn])
    qs = [f"What is the {w} {c.phrase} of all {t.ents}?", f"What is the {w} {c.phrase} of {t.ents}?",
          f"Find the {w} {c.phrase} across all {t.ents}.", f"Give the {w} {c.phrase} of the {t.ents}."]
    return rng.choice(qs), f"SELECT {fn}({c.name}) FROM {t.name}", {t: {c}}


def f_agg_where(rng, t: Table):
    c = pick(rng, t.columns, lambda c: c.numeric)
    if not c:
        return None
    c = c[0]
    b = pick(rng, t.columns, lambda x: x.textual or x.ordered, exclude=(c,))
    if not b:
        return None
    b = b[0]
    fn = rng.choice(list(AGG_WORDS))
    w = rng.choice(AGG_WORDS[fn])
    if b.textual:
        lit, op = q(text_value(rng, b)), "="
        cond = rng.choice([f"whose {b.phrase} is {say(rng, lit)}", f"with {b.phrase} {say(rng, lit)}"])
    else:
        op = rng.choice([">", "<"])
        lit = ordered_value(rng, b, 0.15, 0.85)
        cond = f"whose {b.phrase} is {cmp_phrase(rng, b, op)} {say(rng, lit)}"
    qs = [f"What is the {w} {c.phrase} of {t.ents} {cond}?",
          f"Find the {w} {c.phrase} among {t.ents} {cond}.",
          f"For {t.ents} {cond}, what is the {w} {c.phrase}?"]
    return (rng.choice(qs), f"SELECT {fn}({c.name}) FROM {t.name} WHERE {b.name} {op} {lit}",
            {t: {b, c}})


def f_minmax(rng, t: Table):
    c = pick(rng, t.columns, lambda c: c.numeric)
    if not c:
        return None
    c = c[0]
    if rng.random() < 0.5:
        qs = [f"What are the maximum and minimum {c.phrase} of {t.ents}?",
              f"Give the highest and lowest {c.phrase} among {t.ents}.",
              f"Find the largest and smallest {c.phrase} of all {t.ents}."]
        sql = f"SELECT MAX({c.name}), MIN({c.name}) FROM {t.name}"
    else:
        qs = [f"What are the average, minimum, and maximum {c.phrase} of {t.ents}?",
              f"Show the mean, lowest and highest {c.phrase} across all {t.ents}."]
        sql = f"SELECT AVG({c.name}), MIN({c.name}), MAX({c.name}) FROM {t.name}"
    return rng.choice(qs), sql, {t: {c}}


def f_between(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.ordered)
    if not b:
        return None
    b = b[0]
    a = pick(rng, t.columns, any_col, exclude=(b,))
    if not a:
        return None
    a = a[0]
    lo, hi = two_ordered(rng, b)
    x, y = say(rng, lo), say(rng, hi)
    qs = [f"List the {a.phrase} of {t.ents} whose {b.phrase} is between {x} and {y}.",
          f"What is the {a.phrase} of the {t.ents} with {b.phrase} between {x} and {y}?",
          f"Which {t.ents} have a {b.phrase} from {x} to {y}? Show their {a.phrase}.",
          f"Give the {a.phrase} of every {t.ent} with a {b.phrase} in the range {x} to {y}."]
    return (rng.choice(qs), f"SELECT {a.name} FROM {t.name} WHERE {b.name} BETWEEN {lo} AND {hi}",
            {t: {a, b}})


def f_like(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.namelike)
    if not b:
        return None
    b = b[0]
    a = pick(rng, t.columns, any_col, exclude=(b,))
    a = a[0] if a and rng.random() < 0.6 else b
    v = text_value(rng, b)
    kind = rng.choice(["start", "end", "contain"])
    if kind == "start":
        s = v[:rng.randint(1, 3)]
        pat = f"{s}%"
        cond = rng.choice([f"whose {b.phrase} starts with '{s}'", f"with a {b.phrase} beginning with '{s}'"])
    elif kind == "end":
        s = v[-rng.randint(2, 3):]
        pat = f"%{s}"
        cond = rng.choice([f"whose {b.phrase} ends with '{s}'", f"with a {b.phrase} ending in '{s}'"])
    else:
        words = v.split()
        s = rng.choice(words) if len(words) > 1 else v[1:4]
        pat = f"%{s}%"
        cond = rng.choice([f"whose {b.phrase} contains '{s}'", f"with '{s}' in their {b.phrase}"])
    if a is b:
        qs = [f"List the {b.phrase} of all {t.ents} {cond}.",
              f"Which {b.phrase} values of {t.ents} match: {cond}?"]
    else:
        qs = [f"What is the {a.phrase} of {t.ents} {cond}?", f"Show the {a.phrase} of every {t.ent} {cond}.",
              f"Find the {a.phrase} for {t.ents} {cond}."]
    return rng.choice(qs), f"SELECT {a.name} FROM {t.name} WHERE {b.name} LIKE {q(pat)}", {t: {a, b}}


def f_and(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.textual)
    c = pick(rng, t.columns, lambda c: c.ordered)
    if not b or not c:
        return None
    b, c = b[0], c[0]
    a = pick(rng, t.columns, any_col, exclude=(b, c))
    if not a:
        return None
    a = a[0]
    lb = q(text_value(rng, b))
    op = rng.choice([">", "<"])
    lc = ordered_value(rng, c, 0.15, 0.85)
    vb, w, vc = say(rng, lb), cmp_phrase(rng, c, op), say(rng, lc)
    qs = [f"What is the {a.phrase} of {t.ents} whose {b.phrase} is {vb} and whose {c.phrase} is {w} {vc}?",
          f"List the {a.phrase} of {t.ents} with {b.phrase} {vb} and {c.phrase} {w} {vc}.",
          f"Find the {a.phrase} of every {t.ent} that has {b.phrase} {vb} and a {c.phrase} {w} {vc}."]
    sql = f"SELECT {a.name} FROM {t.name} WHERE {b.name} = {lb} AND {c.name} {op} {lc}"
    return rng.choice(qs), sql, {t: {a, b, c}}


def f_or(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.textual)
    if not b:
        return None
    b = b[0]
    a = pick(rng, t.columns, any_col, exclude=(b,))
    if not a:
        return None
    a = a[0]
    v1 = text_value(rng, b)
    v2 = text_value(rng, b)
    if v1 == v2:
        return None
    l1, l2 = q(v1), q(v2)
    s1, s2 = say(rng, l1), say(rng, l2)
    qs = [f"What is the {a.phrase} of {t.ents} whose {b.phrase} is either {s1} or {s2}?",
          f"List the {a.phrase} of {t.ents} with {b.phrase} {s1} or {s2}.",
          f"Show the {a.phrase} for all {t.ents} where {b.phrase} is {s1} or {b.phrase} is {s2}."]
    sql = f"SELECT {a.name} FROM {t.name} WHERE {b.name} = {l1} OR {b.name} = {l2}"
    return rng.choice(qs), sql, {t: {a, b}}


def f_neq(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.categorical)
    if not b:
        return None
    b = b[0]
    a = pick(rng, t.columns, any_col, exclude=(b,))
    if not a:
        return None
    a = a[0]
    lit = q(text_value(rng, b))
    v = say(rng, lit)
    qs = [f"What is the {a.phrase} of {t.ents} whose {b.phrase} is not {v}?",
          f"List the {a.phrase} of all {t.ents} except those with {b.phrase} {v}.",
          f"Show the {a.phrase} of {t.ents} whose {b.phrase} is different from {v}."]
    return rng.choice(qs), f"SELECT {a.name} FROM {t.name} WHERE {b.name} != {lit}", {t: {a, b}}


def f_top1(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.ordered)
    if not b:
        return None
    b = b[0]
    a = pick(rng, t.columns, any_col, exclude=(b,))
    if not a:
        return None
    a = a[0]
    desc = rng.random() < 0.5
    if b.type == "DATE":
        w = rng.choice(["latest", "most recent"]) if desc else rng.choice(["earliest", "oldest"])
    else:
        w = rng.choice(["highest", "largest", "greatest"]) if desc else rng.choice(["lowest", "smallest"])
    qs = [f"What is the {a.phrase} of the {t.ent} with the {w} {b.phrase}?",
          f"Which {t.ent} has the {w} {b.phrase}? Give its {a.phrase}.",
          f"Find the {a.phrase} of the {t.ent} that has the {w} {b.phrase}."]
    sql = f"SELECT {a.name} FROM {t.name} ORDER BY {b.name}{' DESC' if desc else ''} LIMIT 1"
    return rng.choice(qs), sql, {t: {a, b}}


def f_topk(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.numeric)
    if not b:
        return None
    b = b[0]
    a = pick(rng, t.columns, any_col, exclude=(b,))
    if not a:
        return None
    a = a[0]
    k = rng.randint(2, 10)
    desc = rng.random() < 0.6
    w = rng.choice(["highest", "largest"]) if desc else rng.choice(["lowest", "smallest"])
    qs = [f"List the {a.phrase} of the {k} {t.ents} with the {w} {b.phrase}.",
          f"What are the {a.phrase} values of the top {k} {t.ents} by {w} {b.phrase}?",
          f"Show the {a.phrase} of the {k} {t.ents} that have the {w} {b.phrase}."]
    sql = f"SELECT {a.name} FROM {t.name} ORDER BY {b.name}{' DESC' if desc else ''} LIMIT {k}"
    return rng.choice(qs), sql, {t: {a, b}}


def f_order(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.ordered or c.textual)
    if not b:
        return None
    b = b[0]
    a = pick(rng, t.columns, any_col, exclude=(b,))
    if not a:
        return None
    a = a[0]
    desc = rng.random() < 0.5
    if desc:
        w = rng.choice(["in descending order", "from highest to lowest", "in decreasing order"])
    else:
        w = rng.choice(["in ascending order", "from lowest to highest", "in increasing order"])
    qs = [f"List the {a.phrase} of all {t.ents} sorted by {b.phrase} {w}.",
          f"Show the {a.phrase} of {t.ents} ordered by {b.phrase} {w}.",
          f"Sort the {t.ents} by {b.phrase} {w} and list their {a.phrase}."]
    sql = f"SELECT {a.name} FROM {t.name} ORDER BY {b.name}{' DESC' if desc else ''}"
    return rng.choice(qs), sql, {t: {a, b}}


def f_group_count(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.categorical)
    if not b:
        return None
    b = b[0]
    qs = [f"How many {t.ents} are there for each {b.phrase}?",
          f"Show each {b.phrase} and the number of {t.ents}.",
          f"Count the {t.ents} in each {b.phrase}.",
          f"For every {b.phrase}, how many {t.ents} are there?"]
    return rng.choice(qs), f"SELECT {b.name}, COUNT(*) FROM {t.name} GROUP BY {b.name}", {t: {b}}


def f_group_agg(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.categorical)
    c = pick(rng, t.columns, lambda c: c.numeric)
    if not b or not c:
        return None
    b, c = b[0], c[0]
    fn = rng.choice(list(AGG_WORDS))
    w = rng.choice(AGG_WORDS[fn])
    qs = [f"What is the {w} {c.phrase} of {t.ents} for each {b.phrase}?",
          f"Show each {b.phrase} together with the {w} {c.phrase} of its {t.ents}.",
          f"For every {b.phrase}, find the {w} {c.phrase} of the {t.ents}."]
    sql = f"SELECT {b.name}, {fn}({c.name}) FROM {t.name} GROUP BY {b.name}"
    return rng.choice(qs), sql, {t: {b, c}}


def f_having(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.categorical)
    if not b:
        return None
    b = b[0]
    k = rng.randint(1, 20)
    if rng.random() < 0.6:
        op, w = ">", rng.choice(["more than", "over"])
    else:
        op, w = ">=", "at least"
    qs = [f"Which {b.phrase} values have {w} {k} {t.ents}?",
          f"List the {b.phrase} shared by {w} {k} {t.ents}.",
          f"Find every {b.phrase} with {w} {k} {t.ents}."]
    sql = f"SELECT {b.name} FROM {t.name} GROUP BY {b.name} HAVING COUNT(*) {op} {k}"
    return rng.choice(qs), sql, {t: {b}}


def f_group_top(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.categorical)
    if not b:
        return None
    b = b[0]
    most = rng.random() < 0.7
    w = "most" if most else "fewest"
    qs = [f"Which {b.phrase} has the {w} {t.ents}?", f"What is the {b.phrase} with the {w} {t.ents}?",
          f"Find the {b.phrase} that appears among the {t.ents} the {w} times." if most else
          f"Find the {b.phrase} shared by the {w} {t.ents}."]
    sql = (f"SELECT {b.name} FROM {t.name} GROUP BY {b.name} ORDER BY COUNT(*)"
           f"{' DESC' if most else ''} LIMIT 1")
    return rng.choice(qs), sql, {t: {b}}


def f_distinct(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.categorical or c.namelike)
    if not b:
        return None
    b = b[0]
    if rng.random() < 0.6:
        qs = [f"What are the distinct {b.phrase} values of {t.ents}?",
              f"List the different {b.phrase} values among {t.ents}.",
              f"Show all unique {b.phrase} values of the {t.ents}."]
        return rng.choice(qs), f"SELECT DISTINCT {b.name} FROM {t.name}", {t: {b}}
    c = pick(rng, t.columns, lambda c: c.ordered, exclude=(b,))
    if not c:
        return None
    c = c[0]
    op = rng.choice([">", "<"])
    lit = ordered_value(rng, c, 0.15, 0.85)
    w, v = cmp_phrase(rng, c, op), say(rng, lit)
    qs = [f"What are the distinct {b.phrase} values of {t.ents} whose {c.phrase} is {w} {v}?",
          f"List the different {b.phrase} values of {t.ents} with {c.phrase} {w} {v}."]
    return rng.choice(qs), f"SELECT DISTINCT {b.name} FROM {t.name} WHERE {c.name} {op} {lit}", {t: {b, c}}


def f_count_distinct(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.categorical or c.namelike)
    if not b:
        return None
    b = b[0]
    qs = [f"How many different {b.phrase} values are there among {t.ents}?",
          f"How many distinct {b.phrase} values do the {t.ents} have?",
          f"Count the number of unique {b.phrase} values of {t.ents}."]
    return rng.choice(qs), f"SELECT COUNT(DISTINCT {b.name}) FROM {t.name}", {t: {b}}


def f_star(rng, t: Table):
    b = pick(rng, t.columns, lambda c: c.textual)
    if not b:
        return None
    b = b[0]
    lit = q(text_value(rng, b))
    v = say(rng, lit)
    qs = [f"Show all information about {t.ents} whose {b.phrase} is {v}.",
          f"Give me every detail of the {t.ents} with {b.phrase} {v}.",
          f"Return all columns for {t.ents} where {b.phrase} is {v}."]
    return rng.choice(qs), f"SELECT * FROM {t.name} WHERE {b.name} = {lit}", {t: {b}}


# ---- joins: child (has fk) = tables[1] as T1, parent = tables[0] as T2 ----------------------
def join_parts(tables):
    parent, child = tables[0], tables[1]
    fk = next(c for c in child.columns if c.gen == f"fk:{parent.name}")
    on = f"FROM {child.name} AS T1 JOIN {parent.name} AS T2 ON T1.{fk.name} = T2.{parent.key.name}"
    return parent, child, fk, on


def f_join_eq(rng, tables):
    parent, child, fk, on = join_parts(tables)
    a = pick(rng, child.columns, any_col)
    c = pick(rng, parent.columns, lambda c: c.textual)
    if not a or not c:
        return None
    a, c = a[0], c[0]
    lit = q(text_value(rng, c))
    pc, v = parent_phrase(parent, c), say(rng, lit)
    qs = [f"What is the {a.phrase} of {child.ents} whose {pc} is {v}?",
          f"List the {a.phrase} of all {child.ents} with {pc} {v}.",
          f"Show the {a.phrase} of the {child.ents} whose {parent.ent} has {c.phrase} {v}."]
    sql = f"SELECT T1.{a.name} {on} WHERE T2.{c.name} = {lit}"
    return rng.choice(qs), sql, {child: {a, fk}, parent: {parent.key, c}}


def f_join_select(rng, tables):
    parent, child, fk, on = join_parts(tables)
    a = pick(rng, child.columns, any_col)
    c = pick(rng, parent.columns, any_col)
    if not a or not c:
        return None
    a, c = a[0], c[0]
    pc = parent_phrase(parent, c)
    qs = [f"List the {a.phrase} of each {child.ent} together with its {pc}.",
          f"Show the {a.phrase} and {pc} of every {child.ent}.",
          f"For each {child.ent}, give its {a.phrase} and the {c.phrase} of its {parent.ent}."]
    sql = f"SELECT T1.{a.name}, T2.{c.name} {on}"
    return rng.choice(qs), sql, {child: {a, fk}, parent: {parent.key, c}}


def f_join_group(rng, tables):
    parent, child, fk, on = join_parts(tables)
    c = pick(rng, parent.columns, lambda c: c.textual)
    if not c:
        return None
    c = c[0]
    pc = parent_phrase(parent, c)
    qs = [f"How many {child.ents} are there for each {pc}?",
          f"Count the {child.ents} for every {pc}.",
          f"Show each {pc} and the number of {child.ents} it has."]
    sql = f"SELECT T2.{c.name}, COUNT(*) {on} GROUP BY T2.{c.name}"
    return rng.choice(qs), sql, {child: {fk}, parent: {parent.key, c}}


def f_join_agg(rng, tables):
    parent, child, fk, on = join_parts(tables)
    n = pick(rng, child.columns, lambda c: c.numeric)
    c = pick(rng, parent.columns, lambda c: c.textual)
    if not n or not c:
        return None
    n, c = n[0], c[0]
    fn = rng.choice(list(AGG_WORDS))
    w = rng.choice(AGG_WORDS[fn])
    lit = q(text_value(rng, c))
    pc, v = parent_phrase(parent, c), say(rng, lit)
    qs = [f"What is the {w} {n.phrase} of {child.ents} whose {pc} is {v}?",
          f"Find the {w} {n.phrase} among the {child.ents} with {pc} {v}."]
    sql = f"SELECT {fn}(T1.{n.name}) {on} WHERE T2.{c.name} = {lit}"
    return rng.choice(qs), sql, {child: {n, fk}, parent: {parent.key, c}}


def f_join_cmp(rng, tables):
    parent, child, fk, on = join_parts(tables)
    a = pick(rng, child.columns, any_col)
    n = pick(rng, parent.columns, lambda c: c.ordered)
    if not a or not n:
        return None
    a, n = a[0], n[0]
    op = rng.choice([">", "<"])
    lit = ordered_value(rng, n, 0.15, 0.85)
    w, v = cmp_phrase(rng, n, op), say(rng, lit)
    pn = parent_phrase(parent, n)
    qs = [f"List the {a.phrase} of {child.ents} whose {pn} is {w} {v}.",
          f"What is the {a.phrase} of the {child.ents} whose {parent.ent} has a {n.phrase} {w} {v}?"]
    sql = f"SELECT T1.{a.name} {on} WHERE T2.{n.name} {op} {lit}"
    return rng.choice(qs), sql, {child: {a, fk}, parent: {parent.key, n}}


def f_join_top(rng, tables):
    parent, child, fk, on = join_parts(tables)
    c = pick(rng, parent.columns, lambda c: c.textual)
    n = pick(rng, child.columns, lambda c: c.ordered)
    if not c or not n:
        return None
    c, n = c[0], n[0]
    desc = rng.random() < 0.6
    w = "highest" if desc else "lowest"
    if n.type == "DATE":
        w = "latest" if desc else "earliest"
    pc = parent_phrase(parent, c)
    qs = [f"What is the {pc} of the {child.ent} with the {w} {n.phrase}?",
          f"Find the {pc} for the {child.ent} that has the {w} {n.phrase}."]
    sql = f"SELECT T2.{c.name} {on} ORDER BY T1.{n.name}{' DESC' if desc else ''} LIMIT 1"
    return rng.choice(qs), sql, {child: {n, fk}, parent: {parent.key, c}}


SINGLE_FORMS = {
    "select_eq": (f_select_eq, 3), "select2_eq": (f_select2_eq, 1.5), "select_cmp": (f_select_cmp, 2),
    "count_all": (f_count_all, 1), "count_eq": (f_count_eq, 2), "count_cmp": (f_count_cmp, 1.5),
    "agg": (f_agg, 2), "agg_where": (f_agg_where, 2), "minmax": (f_minmax, 1), "between": (f_between, 1.5),
    "like": (f_like, 1.5), "and": (f_and, 1.5), "or": (f_or, 1), "neq": (f_neq, 1), "top1": (f_top1, 2),
    "topk": (f_topk, 1.5), "order": (f_order, 1.5), "group_count": (f_group_count, 1.5),
    "group_agg": (f_group_agg, 1.5), "having": (f_having, 1), "group_top": (f_group_top, 1),
    "distinct": (f_distinct, 1.5), "count_distinct": (f_count_distinct, 1), "star": (f_star, 1),
}
JOIN_FORMS = {
    "join_eq": (f_join_eq, 2), "join_select": (f_join_select, 1.5), "join_group": (f_join_group, 1.5),
    "join_agg": (f_join_agg, 1.5), "join_cmp": (f_join_cmp, 1.5), "join_top": (f_join_top, 1),
}
ALL_FORMS = {**SINGLE_FORMS, **JOIN_FORMS}


def sql_example(rng: random.Random, tables: list[Table]) -> dict | None:
    names = list(ALL_FORMS)
    weights = [ALL_FORMS[n][1] for n in names]
    form = rng.choices(names, weights)[0]
    fn = ALL_FORMS[form][0]
    if form in JOIN_FORMS:
        out = fn(rng, tables)
    else:
        out = fn(rng, rng.choice(tables))
    if out is None:
        return None
    question, sql, needed = out
    used = [t for t in tables if t in needed]
    if form not in JOIN_FORMS and rng.random() < 0.15:  # the other table, as a distractor
        used = list(tables)
    ctx = [create_table(rng, t, needed.get(t, set())) for t in used]
    if len(ctx) > 1 and rng.random() < 0.5:
        ctx.reverse()
    return {"prompt": sql_prompt("\n".join(ctx), question), "completion": sql,
            "meta": {"domain": tables[0].domain, "form": form}}


def make_sql(split: str, n: int, seed: int) -> list[dict]:
    """n distinct examples: train from procedural schemas (sqlgen), valid/test from their domains."""
    if split == "train":
        return sqlgen.train_split(n, seed)
    domains = load_domains()
    names = sql_splits()[split]
    rng = random.Random(f"sql-{split}-{seed}")
    out, seen = [], set()
    while len(out) < n:
        ex = sql_example(rng, domains[rng.choice(names)])
        if ex is None or ex["prompt"] in seen:
            continue
        seen.add(ex["prompt"])
        out.append(ex)
    return out


# --------------------------------------------------------------------------------------------
# code: functions of the CPython standard library
# --------------------------------------------------------------------------------------------
SKIP_TOP = {"test", "site-packages", "turtledemo", "pydoc_data", "encodings", "ensurepip",
            "lib-dynload", "__pycache__", "__phello__", "antigravity.py", "this.py", "__hello__.py"}
MAX_CODE_CHARS = 1400  # prompt + completion
MAX_BODY_LINES = 36


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_modules() -> dict[str, list[Path]]:
    """Top-level module name -> its .py files (a package's files, test folders left out)."""
    root = stdlib_dir()
    mods: dict[str, list[Path]] = {}
    for p in sorted(root.iterdir()):
        if p.name in SKIP_TOP or p.name.startswith("_sysconfigdata") or p.name.startswith("config-"):
            continue
        if p.is_file() and p.suffix == ".py":
            mods[p.stem] = [p]
        elif p.is_dir() and (p / "__init__.py").exists():
            files = [f for f in sorted(p.rglob("*.py"))
                     if not any(part in ("test", "tests", "idle_test") for part in f.relative_to(p).parts)]
            mods[p.name] = files
    return mods


def code_splits() -> dict[str, list[str]]:
    """Top-level stdlib modules by split. The held-out ones (valid, test) are those the shipped
    ``data/manifest.json`` names, whatever Python runs this: a seeded shuffle of another Python's
    module list would move held-out modules into train. Every other module here is train."""
    names = sorted(stdlib_modules())
    manifest = ROOT / "data" / "manifest.json"
    if not manifest.is_file():  # the first split of all
        n = len(names)
        return split_names(names, n_valid=max(1, n // 14), n_test=max(1, n // 9))
    held = json.loads(manifest.read_text())["code_splits"]
    out = {k: [m for m in names if m in held[k]] for k in ("test", "valid")}
    return out | {"train": [m for m in names if m not in held["test"] + held["valid"]]}


def module_name(path: Path) -> str:
    rel = path.relative_to(stdlib_dir()).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def functions_of(path: Path, mod: str | None = None) -> list[dict]:
    """Examples of the functions of one source file (``mod``: its module name, by default the
    standard library's name for it)."""
    try:
        src = path.read_text(encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(src)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines = src.splitlines(keepends=True)
    mod = mod or module_name(path)
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                ex = function_example(child, lines, mod, prefix + child.name)
                if ex:
                    out.append(ex)
                visit(child, prefix + child.name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree, "")
    return out


def function_example(fn, lines: list[str], mod: str, qualname: str) -> dict | None:
    """Prompt: decorators, signature and docstring (if any); completion: the remaining body."""
    body = fn.body
    has_doc = (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
               and isinstance(body[0].value.value, str))
    code = body[1:] if has_doc else body
    if not code or (not has_doc and len(code) < 2):
        return None
    start = min([fn.lineno] + [d.lineno for d in fn.decorator_list]) - 1
    # last line of the head (1-based, inclusive): the docstring's, else the line before the body
    doc_end = body[0].end_lineno if has_doc else code[0].lineno - 1
    end = fn.end_lineno
    if end - doc_end > MAX_BODY_LINES or code[0].lineno <= doc_end or doc_end <= start:
        return None
    text = "".join(lines[start:end])
    if not text.endswith("\n"):
        text += "\n"
    text = textwrap.dedent(text)
    n_head = doc_end - start
    tlines = text.splitlines(keepends=True)
    head, rest = "".join(tlines[:n_head]), "".join(tlines[n_head:])
    if "\t" in text or not rest.strip():
        return None
    prompt = code_prompt(mod, qualname, head)
    if len(prompt) + len(rest) > MAX_CODE_CHARS:
        return None
    return {"prompt": prompt, "completion": rest,
            "meta": {"module": mod, "qualname": qualname, "docstring": has_doc}}


def make_code(split: str, limit: int | None, seed: int) -> list[dict]:
    mods = stdlib_modules()
    out = []
    for name in code_splits()[split]:
        for path in mods[name]:
            for ex in functions_of(path):
                ex["meta"]["top"] = name
                out.append(ex)
    if limit is not None and len(out) > limit:
        rng = random.Random(f"code-{split}-{seed}")
        idx = sorted(rng.sample(range(len(out)), limit))
        out = [out[i] for i in idx]
    return out


def source_chunks(path: Path, max_chars: int = 2400) -> list[str]:
    """A module's source cut at top-level statement boundaries into chunks of <= max_chars."""
    try:
        src = path.read_text(encoding="utf-8")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(src)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines = src.splitlines(keepends=True)
    starts = sorted({min([n.lineno] + [d.lineno for d in getattr(n, "decorator_list", [])]) - 1
                     for n in tree.body} | {0})
    pieces = ["".join(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])]
    chunks, cur = [], ""
    for p in pieces:
        while len(p) > max_chars:  # a huge statement (a class): cut at line boundaries
            cut = p.rfind("\n", 0, max_chars) + 1 or max_chars
            if cur:
                chunks.append(cur)
                cur = ""
            chunks.append(p[:cut])
            p = p[cut:]
        if len(cur) + len(p) > max_chars and cur:
            chunks.append(cur)
            cur = ""
        cur += p
    if cur.strip():
        chunks.append(cur)
    return [c for c in chunks if c.strip() and "\t" not in c]


def stdlib_test_files(held_out: list[str]) -> list[Path]:
    """Python files of the stdlib's own test suite (Lib/test), except those about held-out modules."""
    root = stdlib_dir() / "test"
    if not root.is_dir():
        return []
    out = []
    for f in sorted(root.rglob("*.py")):
        parts = [p.lower() for p in f.relative_to(root).with_suffix("").parts]
        words = {w for p in parts for w in re.split(r"[_.]", p)} | set(parts)
        if any(m.lower().lstrip("_") in words or f"test_{m.lower()}" in parts for m in held_out):
            continue
        out.append(f)
    return out


def make_pretrain(sql_train: list[dict], code_train: list[dict], seed: int) -> list[dict]:
    docs = [{"text": e["prompt"] + e["completion"], "src": "sql"} for e in sql_train]
    docs += [{"text": e["prompt"] + e["completion"], "src": "code"} for e in code_train]
    mods = stdlib_modules()
    splits = code_splits()
    for name in splits["train"]:
        for path in mods[name]:
            docs += [{"text": c, "src": "stdlib"} for c in source_chunks(path)]
    for path in stdlib_test_files(splits["valid"] + splits["test"]):
        docs += [{"text": c, "src": "stdlib_tests"} for c in source_chunks(path)]
    random.Random(f"pretrain-{seed}").shuffle(docs)
    return docs


# --------------------------------------------------------------------------------------------
HEAD_ROWS = 1000  # the manifest's head_sha256: a quick check of a split that is made, not shipped


def jsonl_sha256(rows: list[dict]) -> str:
    return hashlib.sha256(jsonl_bytes(rows)).hexdigest()


def jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def write_jsonl(path: Path, rows: list[dict]) -> str:
    """Write JSON lines (gzip, with a fixed header, when the name ends in .gz); sha256 of the text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = jsonl_bytes(rows)
    if path.suffix == ".gz":
        with open(path, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as g:
            g.write(data)
    else:
        path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "data")
    ap.add_argument("--sql-train", type=int, default=30000)
    ap.add_argument("--sql-eval", type=int, default=500, help="valid and test size (each)")
    ap.add_argument("--code-train", type=int, default=None, help="cap (default: all)")
    ap.add_argument("--code-eval", type=int, default=500, help="valid and test cap (each)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--no-pretrain", action="store_true", help="skip data/pretrain.jsonl.gz")
    args = ap.parse_args(argv)
    out: Path = args.out
    manifest = {"seed": args.seed, "python": sys.version.split()[0], "stdlib": str(stdlib_dir()),
                "sql_splits": {k: v for k, v in sql_splits().items() if k != "train"},
                "sql_train": "procedural (scripts/sqlgen.py)", "code_splits": code_splits(), "files": {}}
    sets = {}
    for split, n in (("train", args.sql_train), ("valid", args.sql_eval), ("test", args.sql_eval)):
        rows = make_sql(split, n, args.seed)
        for r in rows:
            check_sql(r)
        sets[("sql", split)] = rows
    for split, n in (("train", args.code_train), ("valid", args.code_eval), ("test", args.code_eval)):
        sets[("code", split)] = make_code(split, n, args.seed)
    for (task, split), rows in sets.items():
        rel = f"{task}/{split}.jsonl"
        manifest["files"][rel] = {"n": len(rows), "sha256": write_jsonl(out / rel, rows),
                                  "head_sha256": jsonl_sha256(rows[:HEAD_ROWS])}
    if not args.no_pretrain:
        docs = make_pretrain(sets[("sql", "train")], sets[("code", "train")], args.seed)
        manifest["files"]["pretrain.jsonl.gz"] = {
            "n": len(docs), "chars": sum(len(d["text"]) for d in docs),
            "sha256": write_jsonl(out / "pretrain.jsonl.gz", docs)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for rel, info in manifest["files"].items():
        print(f"{rel}: {info['n']} rows" + (f", {info['chars']} chars" if "chars" in info else ""))
    return manifest


if __name__ == "__main__":
    main()
