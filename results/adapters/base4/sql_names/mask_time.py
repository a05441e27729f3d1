"""Time of the allowed set that sampling under --sql-names needs per new state: read from the
tokenizer's text trie (``SQLNames.allowed``) against ``advance`` token by token
(``TokenConstraint.allowed``), at every state along the first 40 sql test reference queries;
checks that both give the same set.

    .venv/bin/python results/adapters/base4/sql_names/mask_time.py
"""

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from mlx_specstream.api import DEFAULT_MODEL  # noqa: E402
from mlx_specstream.constraint import DONE, TokenConstraint  # noqa: E402
from mlx_specstream.outputs import run_meta, write_results_file  # noqa: E402
from mlx_specstream.sql_names import SQLNames  # noqa: E402
from mlx_specstream.tokenizer import load_tokenizer  # noqa: E402

tok = load_tokenizer(DEFAULT_MODEL)
rows = [json.loads(line) for line in (ROOT / "data" / "sql" / "test.jsonl").read_text().splitlines()][:40]
trie = token = 0.0
states = 0
for row in rows:
    c = SQLNames.from_prompt(row["prompt"], tok)
    state = c.start
    for t in [*tok.encode(row["completion"], add_special_tokens=False), tok.eos_token_id]:
        t0 = time.perf_counter()
        a = c.allowed(state)
        t1 = time.perf_counter()
        b = TokenConstraint.allowed(c, state)
        token += time.perf_counter() - t1
        trie += t1 - t0
        assert (a == b).all()
        states += 1
        state = c.advance(state, t)
        if state in (None, DONE):
            break
result = {"states": states, "vocabulary": tok.vocab_size, "trie_ms_per_state": round(1000 * trie / states, 2),
          "token_by_token_ms_per_state": round(1000 * token / states, 2), "same_sets": True}
print(result)
write_results_file(Path(__file__).with_name("mask_time.json"), run_meta(), [result])
