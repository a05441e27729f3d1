"""Why continued training lost exact match: run a's new valid errors, and how often the first
tokenizer piece of each held-out table name starts a generated table name.

    .venv/bin/python results/default_model/gpu_continued_2026-11-26/name_pieces.py

Run it on `main` and on branch `next-base` (its generator) to compare; the output says which
generator it read (sqlgen.py's sha256).
"""

import collections
import hashlib
import itertools
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import sentencepiece as spm  # noqa: E402
import sqlgen  # noqa: E402

errors = {k: [json.loads(line) for line in open(HERE / f"{k}.valid200_errors.jsonl")]
          for k in ("a", "shipped")}
shipped = {e["prompt"] for e in errors["shipped"]}
new = [e for e in errors["a"] if e["prompt"] not in shipped]
air = [e for e in new if re.search(r"\bair", e["ref"])]
not_copied = [e for e in air if not re.search(r"\bair", e["pred"])]
print(f"run a: {len(new)} new errors on the first 200 valid prompts, {len(air)} on aircraft/airline "
      f"tables, {len(not_copied)} with the table name not copied")

TOKENIZER = ROOT / "models" / "specstream-tiny" / "hf" / "tokenizer.model"
sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))


def table_names(prompts) -> list[str]:
    return [name for p in prompts for name in re.findall(r"CREATE TABLE (\w+) \(", p)]


def first_pieces(names) -> collections.Counter:
    return collections.Counter(sp.encode(" " + name, out_type=str)[0] for name in names)


names = table_names(ex["prompt"] for ex in itertools.islice(sqlgen.examples("pieces"), 20000))
generated = first_pieces(names)
held = first_pieces(table_names(json.loads(line)["prompt"] for f in ("valid", "test")
                                for line in open(ROOT / "data" / "sql" / f"{f}.jsonl")))
total = len(names)
digest = hashlib.sha256((ROOT / "scripts" / "sqlgen.py").read_bytes()).hexdigest()[:12]
print(f"generator sqlgen.py {digest}: {total} table names in 20,000 examples, "
      f"{sum(n[0] in 'aeiou' for n in names) / total:.3f} of them vowel-initial")
print("first piece: held-out occurrences (valid + test), per 10,000 generated table names")
for piece in ("\u2581air", "\u2581book", "\u2581less", "\u2581case", "\u2581ap", "\u2581ag", "\u2581out"):
    print(f"  {piece}: {held[piece]}, {generated[piece] / total * 1e4:.1f}")
