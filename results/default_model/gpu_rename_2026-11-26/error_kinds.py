"""Kinds of wrong predictions in an errors file of `train_base.py eval --errors`: a table or a
column name that is not in the prompt's schema (not copied), else something else (a wrong but
existing name, a wrong value, operator or query form).

    python results/default_model/gpu_rename_2026-11-26/error_kinds.py FILE.jsonl ...
"""

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
from sqlgen import context  # noqa: E402

KEYWORDS = {"select", "from", "where", "join", "on", "as", "and", "or", "not", "group", "by", "order",
            "desc", "asc", "limit", "having", "count", "sum", "avg", "min", "max", "distinct", "like",
            "between", "in", "is", "null", "t1", "t2", "t3"}

for name in sys.argv[1:]:
    rows = [json.loads(line) for line in open(name)]
    kinds = {"table not in schema": 0, "column not in schema": 0, "other": 0}
    for r in rows:
        names = set()
        for table, cols in re.findall(r"CREATE TABLE (\w+) \((.*?)\);", context(r["prompt"])):
            names |= {table.lower()} | {c.split()[0].lower() for c in cols.split(",")}
        sql = re.sub(r"'[^']*'", "", r["pred"])
        words = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", sql)} - KEYWORDS
        after_from = {w.lower() for w in re.findall(r"(?:FROM|JOIN)\s+([A-Za-z_][A-Za-z_0-9]*)", sql)}
        if after_from - names:
            kinds["table not in schema"] += 1
        elif words - names:
            kinds["column not in schema"] += 1
        else:
            kinds["other"] += 1
    print(f"{name}: {len(rows)} errors: " + ", ".join(f"{k} {v}" for k, v in kinds.items()))
