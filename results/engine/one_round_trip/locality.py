"""The timings behind docs/engine.md's "One host round trip per greedy step" (tried and dropped):
a 4-node tree pass with its deferred stream pass, as the one-round-trip step ran it and with the
stream pass independent of the verification, alternated 150 times in one process. Runs at
commit 511718c (the step was reverted after it), from the repository root:
``git checkout 511718c && .venv/bin/python results/engine/one_round_trip/locality.py``."""

import sys
import time

sys.path.insert(0, "scripts")

import mlx_specstream  # noqa: E402,F401  (first: the optimized BLAS)

# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from bench_engine import test_prompts  # noqa: E402

from mlx_specstream.api import load  # noqa: E402
from mlx_specstream.runner import MLXRunner, _topk  # noqa: E402
from mlx_specstream.streams import forward, stream_pass  # noqa: E402
from mlx_specstream.tree import build_tree  # noqa: E402
from mlx_specstream.verify import verify_greedy, verify_greedy_on_device  # noqa: E402

model, tok = load(adapter="sql-lossless")
runner = MLXRunner(model)
runner.start(tok.encode(test_prompts(1)[0]), 4, True, 3)
n0 = runner.n
levels = [list(range(10 + 4 * j, 14 + 4 * j)) for j in range(4)]
tree = build_tree(3, levels, [[-0.1, -0.5, -1.0, -2.0]] * 4, 4)


def reset():
    runner.n = n0
    for c in runner.caches:
        c.offset = n0


def one_round_trip():  # the step as it shipped in 511718c
    runner._run_ahead(tree)
    reset()


def streams_of(node, n, depend_on_verification):
    out = forward(model, tree, runner.caches, runner.n, gamma=0)
    argmax = mx.argmax(out.main_logits, axis=-1)
    _, length = verify_greedy_on_device(tree, argmax)
    for c in runner.caches:
        c.offset = n0 + 1
    if depend_on_verification:
        n = n + 0 * length
    drafts = _topk(stream_pass(model, out.msa_input[node], runner.caches, n, 4), 3)
    mx.eval(argmax, *drafts)
    np.array(argmax)
    reset()


def three_round_trips():
    out = forward(model, tree, runner.caches, runner.n, gamma=0)
    mx.eval(out.main_logits)
    verify_greedy(tree, np.array(mx.argmax(out.main_logits, axis=-1)))
    for c in runner.caches:
        c.commit(runner.n, [0])
    [np.array(x) for x in _topk(stream_pass(model, out.msa_input[0], runner.caches, runner.n + 1, 4), 3)]
    reset()


fns = {
    "one round trip (the step)": one_round_trip,
    "stream pass independent of the verification": lambda: streams_of(0, runner.n + 1, False),
    "the same, its key count depending on the verification":
        lambda: streams_of(0, mx.array(runner.n + 1), True),
    "three round trips": three_round_trips,
}
times = {k: [] for k in fns}
for f in fns.values():
    f()
    f()
for _ in range(150):
    for k, f in fns.items():
        t = time.perf_counter()
        f()
        times[k].append(time.perf_counter() - t)
for k, v in times.items():
    v = np.array(v) * 1e3
    print(f"{k}: fastest {v.min():.2f} ms, median {np.median(v):.2f} ms")
