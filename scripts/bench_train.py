"""Training step cost on this machine: steps/s, tokens/s and peak memory per mode, on the
shipped model and the project's data (a fixed set of batches, warmed up, methods interleaved).

    .venv/bin/python scripts/bench_train.py [--data data/sql] [--steps 12] [--reps 3]
        [--before REV] [--lossless-only] [--processes] [--profile] [--rows] [--out FILE]

Rows: lossless with today's default MSA layers (4, as before 2026-11-23) with the base recomputed
every step (``--state-cache-mb 0``) and with the base states kept across epochs (the default; the
steps timed are a later epoch's, so every state is kept), also with the exponentials left to MLX
(``kernels/host_math.py`` off); lossless with 2 MSA layers; shared mode and the LoRA baseline;
with ``--processes``, the default lossless and shared steps in 2 processes on this machine
(``train --processes 2``: half of each batch each, one BLAS thread each, gradients summed by pipes);
with ``--profile``, that lossless step again, timed in two parts: computing, and summing.
``--rows`` only counts the stream rows the lossless step builds over these batches.
Every row trains on the same examples, batched as train() batches them for its mode. ``--before
REV`` adds the lossless rows of the training step at git revision REV, timed in the same rounds,
so a change is measured before and after on the same machine state. Each figure is the fastest of
``--reps`` interleaved rounds; the ratio column is against the first row (the oldest recomputing
lossless step).
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mlx_specstream  # noqa: E402,F401  (first: the optimized BLAS before MLX)

# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_specstream import outputs, training_run  # noqa: E402
from mlx_specstream import trainer as current  # noqa: E402
from mlx_specstream.adapter import AdapterConfig, attach, detach  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL, load  # noqa: E402
from mlx_specstream.base_states import BaseStateCache  # noqa: E402
from mlx_specstream.data import load_jsonl  # noqa: E402
from mlx_specstream.kernels import host_math  # noqa: E402
from mlx_specstream.outputs import markdown_table, recorded_path, run_meta, write_results_file  # noqa: E402
from mlx_specstream.process_group import run_local  # noqa: E402
from mlx_specstream.train_batches import epoch_batches, length_keys, segments  # noqa: E402
from mlx_specstream.trainer import MODES, _resolve_alphas, set_trainable  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _module_at(rev: str, name: str, as_name: str):
    """``mlx_specstream/NAME`` as it was at git revision ``rev``, imported inside the package as
    ``as_name`` (its relative imports resolve to today's modules); None where it did not exist."""
    shown = subprocess.run(["git", "show", f"{rev}:mlx_specstream/{name}"], cwd=ROOT, capture_output=True,
                           text=True)
    if shown.returncode != 0:
        return None
    path = Path(tempfile.mkdtemp()) / name
    path.write_text(shown.stdout)
    spec = importlib.util.spec_from_file_location(f"mlx_specstream.{as_name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def train_module_at(rev: str):
    """The training module (``mlx_specstream/trainer.py``, ``train.py`` before 2026-11-28) as it
    was at git revision ``rev``, with the objective it imports (``objective.py``, split out of it
    on 2026-11-28) of the same revision; its other relative imports resolve to today's modules."""
    objective = _module_at(rev, "objective.py", "_objective_before")
    today = sys.modules.get("mlx_specstream.objective")
    if objective is not None:  # the trainer of rev imports the objective of rev
        sys.modules["mlx_specstream.objective"] = objective
    try:
        module = (_module_at(rev, "trainer.py", "_train_before")
                  or _module_at(rev, "train.py", "_train_before"))
    finally:
        if today is not None:
            sys.modules["mlx_specstream.objective"] = today
        else:
            sys.modules.pop("mlx_specstream.objective", None)
    if module is None:
        raise SystemExit(f"{rev}: no mlx_specstream/trainer.py or train.py")
    return module


def time_row(model, data, ids: list[list[int]], mode: str, keep: bool, module, msa: int,
             distributed=None, profile: bool = False) -> tuple[float, ...]:
    """Seconds for the steps of ``ids`` (after a first pass that warms up and fills the state
    cache) and peak MB, for a training step of ``module`` (today's ``train`` or an earlier one).
    With ``distributed`` (a process group; ``model`` None: loaded here) today's data-parallel step;
    with ``profile`` as well, the same step in its two parts, each timed: this process's share
    (``share_gradients``) and the sum over the processes (``batch_gradients`` is the two),
    which includes waiting for the slower one; then ``(seconds, peak MB, computing seconds)``."""
    module = module or current
    if model is None:
        model, tok = load(DEFAULT_MODEL)
        data = load_jsonl(Path(data) / "valid.jsonl", tok, max_seq_len=512)
    gamma = 0 if mode == "lora" else 4
    attach(model, AdapterConfig(mode=mode, gamma=gamma, msa_layers=msa), seed=0)
    set_trainable(model)
    tc = module.TrainConfig(mode=mode, gamma=gamma, msa_layers=msa, alphas=_resolve_alphas(None, mode, gamma))
    # an earlier trainer's own state cache where it had one (today's lives in base_states.py)
    cache = getattr(module, "BaseStateCache", BaseStateCache)(4 << 30) if keep else None
    for _ in range(2):  # the first pass warms up and fills the cache
        mx.reset_peak_memory()
        if distributed is not None:  # every process starts the timed pass together
            mx.eval(distributed.all_sum(mx.array(1.0)))
        t = time.perf_counter()
        computing = 0.0
        for b_ids in ids:
            if profile:
                c = time.perf_counter()
                loss, grads = training_run.share_gradients(model, data, b_ids, tc, distributed, cache)
                mx.eval(loss, grads)
                computing += time.perf_counter() - c
                grads, loss = training_run._all_sum([grads, loss], distributed)
            elif module is current:
                loss, grads = training_run.batch_gradients(model, data, b_ids, tc, distributed, cache)
            else:
                ex = [data.examples[i] for i in b_ids]
                b = module.Batch.of(ex)
                states = cache.states(model, list(b_ids), ex) if cache is not None else None
                step = getattr(module, "grad_step", None) or module._grad_step  # private before 2026-11-28
                loss, grads = step(model, b, tc, b.counts(gamma), states)
            mx.eval(loss, grads)
        seconds = time.perf_counter() - t
    detach(model)
    return (seconds, mx.get_peak_memory() / 2**20) + ((computing,) if profile else ())


def stream_rows(data, batches: list[list[int]], processes: int, gamma: int = 4,
                segment_len: int | None = current.TrainConfig.segment_len) -> tuple[int, int]:
    """Stream rows a lossless step builds over ``batches`` (each shared out as ``share_gradients``
    shares it): all ``L*gamma`` of every segment, and only those with a target
    (``Batch.stream_rows``, what the step builds)."""
    every = needed = 0
    for ids in batches:
        for rank in range(processes):
            batch = current.Batch.of([data.examples[i] for i in ids[rank::processes]])
            for seg in segments(batch.span, segment_len):
                t = batch.at(*seg)
                every += t.size * gamma
                needed += len(batch.tokens) * len(batch.stream_rows(t, gamma))
    return every, needed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "sql")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--before", metavar="REV", help="also time the lossless step at git revision REV")
    ap.add_argument("--lossless-only", action="store_true", help="time the lossless rows only")
    ap.add_argument("--processes", action="store_true",
                    help="also time the lossless and shared steps in 2 processes (train --processes 2)")
    ap.add_argument("--profile", action="store_true",
                    help="also time the 2-process lossless step in parts: computing, summing (and waiting)")
    ap.add_argument("--rows", action="store_true",
                    help="only count the stream rows the lossless step builds (1 and 2 processes), no timing")
    args = outputs.parse_script_args(ap)
    model, tok = load(DEFAULT_MODEL)
    ds = load_jsonl(args.data / "valid.jsonl", tok, max_seq_len=512)
    # the same examples in every row, grouped into batches as train() groups them for each mode
    # (the revision before grouped every mode as shared mode does)
    sub = np.random.default_rng(0).permutation(len(ds))[: args.steps * args.batch_size]

    def grouped(mode: str) -> list[list[int]]:
        keys = length_keys(ds, mode)[sub]
        return [sub[b].tolist() for b in epoch_batches(len(sub), args.batch_size, 0, 0, keys)]

    batches = {mode: grouped(mode) for mode in MODES}
    if args.rows:
        for n in (1, 2):
            every, needed = stream_rows(ds, batches["lossless"], n)
            print(f"{n} process(es): {needed} stream rows built of {every} ({needed / every:.1%})")
        return
    # name -> (mode, base states kept, train module, batch grouping, MSA layers)
    runs = {}
    if args.before:
        old = train_module_at(args.before)
        runs |= {f"lossless at {args.before}, 4 MSA layers (base every step)":
                 ("lossless", False, old, "shared", 4),
                 f"lossless at {args.before}, 4 MSA layers (base states kept)":
                 ("lossless", True, old, "shared", 4)}
    n_s = current.TrainConfig.msa_layers
    runs |= {f"lossless, {n_s} MSA layers (base every step)": ("lossless", False, current, "lossless", n_s),
             f"lossless, {n_s} MSA layers (base states kept; the default)":
             ("lossless", True, current, "lossless", n_s),
             f"lossless, {n_s} MSA layers (base states kept), exponentials in MLX":
             ("lossless", True, current, "lossless", n_s),
             "lossless, 2 MSA layers (base states kept)": ("lossless", True, current, "lossless", 2),
             f"shared, {n_s} MSA layers": ("shared", False, current, "shared", n_s),
             "lora": ("lora", False, current, "lora", n_s)}
    if args.lossless_only:
        runs = {k: v for k, v in runs.items() if v[0] == "lossless"}
    best: dict[str, float] = {}
    peak: dict[str, float] = {}
    local = {f"lossless, {n_s} MSA layers (base states kept), 2 processes (--processes 2)":
             ("lossless", True, current, "lossless", n_s),
             f"shared, {n_s} MSA layers, 2 processes (--processes 2)":
             ("shared", False, current, "shared", n_s)}
    if args.processes:
        runs |= {k: v for k, v in local.items() if not args.lossless_only or v[0] == "lossless"}
    parts = f"lossless, {n_s} MSA layers (base states kept), 2 processes, timed in parts (--profile)"
    if args.profile:
        local[parts] = runs[parts] = ("lossless", True, current, "lossless", n_s)
    computing: dict[str, float] = {}
    for _ in range(args.reps):
        for name, (mode, keep, module, grouping, msa) in runs.items():
            host_math.set_allowed("exponentials in MLX" not in name)
            if name in local:  # today's module, imported by each process
                got = run_local(2, time_row, {"model": None, "data": str(args.data), "ids": batches[grouping],
                                              "mode": mode, "keep": keep, "module": None, "msa": msa,
                                              "profile": name == parts})
            else:
                got = time_row(model, ds, batches[grouping], mode, keep, module, msa)
            if got[0] / args.steps < best.get(name, float("inf")) and len(got) > 2:
                computing[name] = got[2] / args.steps
            best[name] = min(best.get(name, float("inf")), got[0] / args.steps)
            peak[name] = got[1]
    tokens = float(np.mean([sum(len(ds.examples[i].tokens) for i in ids) for ids in batches["lossless"]]))
    ref = next(iter(best.values()))
    rows = [{"mode": n, "ms_per_step": round(s * 1e3, 1), "steps_per_s": round(1 / s, 3),
             "tokens_per_s": round(tokens / s, 1), "speedup": round(ref / s, 2),
             "peak_memory_mb": round(peak[n], 1)}
            | ({"computing_ms": round(computing[n] * 1e3, 1),
                "summing_ms": round((s - computing[n]) * 1e3, 1)} if n in computing else {})
            for n, s in best.items()]
    meta = run_meta(model=recorded_path(DEFAULT_MODEL), data=recorded_path(args.data / "valid.jsonl"),
                    batch_size=args.batch_size, steps=args.steps, reps=args.reps,
                    mean_tokens_per_batch=round(tokens, 1))
    print(f"`{meta['command']}` — {meta['date']}, {meta['machine']}, MLX {meta['mlx']}, BLAS {meta['blas']}, "
          f"batch {args.batch_size}, {meta['mean_tokens_per_batch']} tokens per batch, best of {args.reps}\n")
    print(markdown_table({"mode": "mode", "ms/step": "ms_per_step", "steps/s": "steps_per_s",
                          "tokens/s": "tokens_per_s", f"vs {rows[0]['mode']}": "speedup",
                          "peak MB": "peak_memory_mb"}, [r | {"speedup": f"{r['speedup']}x"} for r in rows]))
    for r in rows:
        if "computing_ms" in r:
            print(f"\n{r['mode']}: {r['computing_ms']} ms computing (rank 0), {r['summing_ms']} ms summing "
                  "the gradients and waiting for the other process")
    if args.out:
        write_results_file(args.out, meta, rows)


if __name__ == "__main__":
    main()
