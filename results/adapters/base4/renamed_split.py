"""How `sql-lora-renamed_*` got its train split (2026-11-26; the experiment, not a recipe): the
adapters' sql train split with the table of a share 0.8 of its one-table examples renamed as the
base model's pretraining renames them (`scripts/train_base.py`: `rename_table`, `piece_name`, the
shipped tokenizer's pieces); valid.jsonl copied unchanged. Run from the repository root:

    .venv/bin/python results/adapters/base4/renamed_split.py runs/ren/data
    cp data/sql/valid.jsonl runs/ren/data/

It renamed 16,224 of 30,000 examples (the rest have two tables or kept their name)."""

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, "scripts")
import sentencepiece as spm  # noqa: E402
from train_base import name_pieces, piece_name, rename_table  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
sp = spm.SentencePieceProcessor(model_file="models/specstream-tiny/mlx/tokenizer.model")
pieces = name_pieces(sp)
rng = random.Random("rename-adapter-split")
renamed = 0
with open(out / "train.jsonl", "w") as f:
    for line in open("data/sql/train.jsonl"):
        ex = json.loads(line)
        if rng.random() < 0.8:
            new = rename_table(ex, piece_name(rng, *pieces))
            if new:
                ex, renamed = new, renamed + 1
        f.write(json.dumps(ex) + "\n")
print(renamed)
