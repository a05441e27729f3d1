"""The server's batched rounds without HTTP: groups of ``--concurrency`` test prompts submitted
together to the server's own :class:`~mlx_specstream.scheduler.Scheduler` in this process, decoded
pass by pass as one batch, for each method in turn (the bench harness: every group ``--repeats``
times per method, interleaved, the fastest run counting). Reports per-request tokens/s (each
group's tokens over its wall time, prefill included: every request of a group joins at once) and
the speed-up over AR batching with its 95% bootstrap interval over groups. A method is
``NAME=ADAPTER[:node_cost]``: an adapter decoded with Speculative Streaming (its node cost when
given), or ``ar=`` for the base model token by token. Greedy; lossless outputs are checked
against AR's.

    .venv/bin/python scripts/bench_rounds.py [--concurrency 4 --n 12 --max-tokens 64] \
        [--methods "ar=,ss-lossless=sql-lossless,ss-lossless nc 0.25=sql-lossless:0.25"] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


import mlx_specstream  # noqa: E402,F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL, decoder, responses  # noqa: E402
from mlx_specstream.bench import REPEATS, Method, speed_summary, time_methods  # noqa: E402
from mlx_specstream.outputs import markdown_table, recorded_path, run_meta, write_results_file  # noqa: E402
from mlx_specstream.pool import ModelPool  # noqa: E402
from mlx_specstream.scheduler import Job, Scheduler  # noqa: E402


def rounds_method(scheduler: Scheduler, model, tok, **opts):
    """A bench method over a group of prompts: all submitted to ``scheduler`` at once; returns
    (every request's tokens, concatenated; summed passes, prefill included)."""
    def run(group: list[list[int]], max_tokens: int) -> tuple:
        decoders = [decoder(model, tok, ids, max_tokens=max_tokens, batched=True, **opts) for ids in group]
        outputs: list[list[int]] = [[] for _ in group]
        left, done, errors = [len(group)], threading.Event(), []

        def emitter(i: int):
            def emit(response, error) -> None:
                if error is not None:
                    errors.append(error)
                if response is not None:
                    outputs[i].extend(response.tokens)
                    return
                left[0] -= 1  # (None, None) or an error: this request is over
                if left[0] == 0:
                    done.set()
            return emit

        for i, d in enumerate(decoders):
            scheduler.submit(Job(responses(d, tok, None), emitter(i)))
        done.wait()
        if errors:
            raise errors[0]
        return [t for out in outputs for t in out], sum(d.stats.calls + 1 for d in decoders)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--task", default="sql", help="test prompts from data/TASK/test.jsonl")
    ap.add_argument("--n", type=int, default=12, help="prompts (a multiple of --concurrency)")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--methods", default="ar=,ss-lossless=sql-lossless,ss-shared=sql",
                    help="NAME=ADAPTER[:NODE_COST] pairs (empty adapter: AR of the base model)")
    ap.add_argument("--repeats", type=int, default=REPEATS)
    args = outputs.parse_script_args(ap)
    if args.concurrency < 1 or args.n < args.concurrency or args.n % args.concurrency:
        ap.error("--n must be a positive multiple of --concurrency")

    specs = [m.split("=", 1) for m in args.methods.split(",")]
    if any(len(s) != 2 for s in specs):
        ap.error("--methods: NAME=ADAPTER[:NODE_COST] pairs")
    names = {a.split(":")[0] for _, a in specs if a}
    pool = ModelPool(args.model, sorted(names))  # one base, the adapters over it: as the server
    tok = pool.tokenizer
    models = {"": pool.base, **{a: pool.get(f"{pool.base_id}:{a}") for a in names}}
    lines = (ROOT / "data" / args.task / "test.jsonl").open()
    ids = [tok.encode(json.loads(next(lines))["prompt"]) for _ in range(args.n)]
    groups = [ids[k:k + args.concurrency] for k in range(0, args.n, args.concurrency)]

    scheduler = Scheduler(max_active=args.concurrency)
    scheduler.start()
    methods = []
    for name, spec in specs:
        adapter, _, cost = spec.partition(":")
        opts = {"mode": "ss" if adapter else "ar", **({"node_cost": float(cost)} if cost else {})}
        methods.append(Method(name, rounds_method(scheduler, models[adapter], tok, **opts),
                              reproduces="ar" if adapter and models[adapter].adapter_config.mode != "shared"
                              else None, plain_ar=not adapter))
    load_before = os.getloadavg()
    try:
        time_methods(methods, groups, args.max_tokens, args.repeats, desc="rounds")
    finally:
        scheduler.stop()
    rows = []
    for rec in speed_summary(methods):  # against AR batching, the run's one plain AR method
        lo, hi = rec["speedup_ci95"]
        rows.append({**rec, "concurrency": args.concurrency,
                     "per_request_tokens_per_s": round(rec["tokens_per_s"] / args.concurrency, 1),
                     "interval": f"{lo:.3f}-{hi:.3f}" + ("" if rec["interval_within_10pct"] else " ⚠"),
                     "identical": {True: "yes", False: "no"}.get(rec.get("identical_to_ar"), "")})
    meta = run_meta(model=recorded_path(args.model), task=args.task, n=args.n, concurrency=args.concurrency,
                    max_tokens=args.max_tokens, repeats=args.repeats,
                    load_before_after=[round(load_before[0], 2), round(os.getloadavg()[0], 2)])
    columns = {"method": "method", "concurrency": "concurrency",
               "per-request tok/s": "per_request_tokens_per_s", "tokens per pass": "mean_accepted_tokens",
               "× AR batching": "speedup", "95% interval (⚠: wider than ±10%)": "interval",
               "identical to AR": "identical"}
    print(markdown_table(columns, rows))
    if args.out:
        write_results_file(args.out, meta, rows)


if __name__ == "__main__":
    main()
