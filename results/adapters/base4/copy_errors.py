"""The base model's wrong test outputs sorted into names it did not copy (an identifier outside
string literals that the prompt's schema lacks: `cioations` for `citations`, `created` for
`year_created`) and the rest (a real column or table, but the wrong one; a wrong value). Reads
`sql-lossless_test500_nc0.json` (the base's output) by default. From the repository root:

    .venv/bin/python results/adapters/base4/copy_errors.py [EVAL.json]
"""

import collections
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "scripts"))
from sqlgen import context  # noqa: E402  (the prompt's CREATE TABLE statements)

SQL_WORDS = set("select from where and or as join on group by order desc asc limit having count avg min max "
                "sum distinct between like not in is null t1 t2".split())
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "sql-lossless_test500_nc0.json"
outputs = json.loads(path.read_text())["results"][0]["per_prompt"]
rows = [json.loads(line) for line in (HERE.parents[2] / "data/sql/test.jsonl").read_text().splitlines()]
wrong, names = collections.Counter(), collections.Counter()
for out, row in zip(outputs, rows):
    if out["exact"]:
        continue
    schema = set(IDENT.findall(context(row["prompt"])))
    made_up = [w for w in IDENT.findall(re.sub(r"'[^']*'", "", out["output"]))
               if w.lower() not in SQL_WORDS and w not in schema]
    wrong["not copied" if made_up else "other"] += 1
    names.update(set(made_up))
print(f"{path.name}: {sum(wrong.values())} wrong of {len(outputs)}: {dict(wrong)}")
print("names not in the schema (outputs using each):", names.most_common(12))
