"""Time a few lossless training steps of the shipped model on fp32, int8 and int4 bases.

Run from the repository root:
`.venv/bin/python results/training/quantized_base_2026-11-28/quantized_train.py`.
Two rounds, the three bases interleaved in each; prints seconds per run (4 steps of 8 examples).
"""

import time

from mlx_specstream.api import DEFAULT_MODEL, load
from mlx_specstream.data import Dataset, load_jsonl
from mlx_specstream.trainer import train

tok = load(DEFAULT_MODEL)[1]
ds = Dataset(load_jsonl("data/sql/valid.jsonl", tok, progress=False).examples[:64])
for rnd in range(2):
    for q in (None, (8, 64), (4, 64)):
        m, _ = load(DEFAULT_MODEL, quantize=q)
        t = time.perf_counter()
        train(m, (ds, None), mode="lossless", iters=4, batch_size=8, self_distill=False, accept_prompts=0,
              val_every=0, progress=False, log=lambda s: None, processes=1)
        print(rnd, "fp32" if q is None else f"int{q[0]}", round(time.perf_counter() - t, 1), flush=True)
