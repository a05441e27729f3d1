"""Would streams on one guessed node of the tree pass (the node where the accepted path is
expected to end) pay against the deferred stream pass? Times three variants of a pass,
alternating, 60 rounds, over 128 cached tokens, the shipped model with ``sql-lossless``; then how
often greedy decoding of the first 30 sql test prompts (96 tokens) accepts each path length: a
guess pays only if it is right often enough.

    .venv/bin/python results/engine/stream_guess/guess_cost.py
"""

# ruff: noqa: I001  (mlx_specstream before mlx: it picks the BLAS MLX runs on)
import collections
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import mlx_specstream  # noqa: E402,F401  (first: it picks the BLAS MLX runs on)
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_specstream.api import load  # noqa: E402
from mlx_specstream.engine import DecodeOptions, Decoder  # noqa: E402
from mlx_specstream.kv_cache import make_cache  # noqa: E402
from mlx_specstream.streams import forward, stream_pass  # noqa: E402
from mlx_specstream.tree import build_tree, chain  # noqa: E402

GAMMA = 4
model, tokenizer = load(ROOT / "models" / "specstream-tiny" / "mlx", adapter="sql-lossless")
caches = make_cache(model)
context = list(range(5, 133))
forward(model, chain(context), caches, 0, gamma=0)
mx.eval([c.keys for c in caches])
n = len(context)


def reset(offset: int) -> None:
    for c in caches:
        c.offset = offset


def plain(tree) -> None:
    out = forward(model, tree, caches, n, gamma=0)
    mx.eval(out.main_logits)
    reset(n)


def deferred(tree) -> None:  # the tree pass, then the stream pass of its root once "committed"
    out = forward(model, tree, caches, n, gamma=0)
    mx.eval(out.main_logits)
    reset(n + 1)
    mx.eval(stream_pass(model, out.msa_input[0], caches, n + 1, GAMMA))
    reset(n)


def one_node(tree) -> None:  # the tree pass with the streams of its last node
    out = forward(model, tree, caches, n, gamma=GAMMA, stream_nodes="last")
    mx.eval(out.main_logits, out.stream_logits)
    reset(n)


print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.platform()}, MLX {mx.__version__}")
levels = [list(range(10 + 4 * j, 14 + 4 * j)) for j in range(GAMMA)]
scores = [[-0.1, -0.5, -1.0, -2.0]] * GAMMA
for m in (1, 4, 8):
    tree = build_tree(3, levels, scores, m)
    variants = {"tree pass, no streams": plain, "tree pass + deferred stream pass": deferred,
                "tree pass, streams on one node": one_node}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        fn(tree)
    for _ in range(60):
        for name, fn in variants.items():
            t = time.perf_counter()
            fn(tree)
            times[name].append(time.perf_counter() - t)
    for name, v in times.items():
        print(f"{m}-node {name:34s} fastest {min(v) * 1e3:6.2f} median {np.median(v) * 1e3:6.2f} ms")

lengths: collections.Counter = collections.Counter()
with open(ROOT / "data" / "sql" / "test.jsonl") as f:
    prompts = [json.loads(line)["prompt"] for line in f][:30]
for prompt in prompts:
    decoder = Decoder(model, tokenizer.encode(prompt), DecodeOptions(mode="ss", max_tokens=96))
    for _ in decoder.steps():
        pass
    lengths.update(decoder.stats.accepted_lengths)
total = sum(lengths.values())
print("accepted path length (root included): share of", total, "passes:",
      {k: round(v / total, 3) for k, v in sorted(lengths.items())})
