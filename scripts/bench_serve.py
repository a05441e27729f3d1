"""Throughput of ``specstream-mlx serve`` at several concurrency levels, SS against AR.

Starts a loopback server (the base model and the adapters benchmarked), then for each
concurrency level sends the same test prompts, ``concurrency`` at a time, for every method in
turn (interleaved: one level, all methods, then the next level), and reports aggregate tokens/s
(all generated tokens / wall time) and per-request latency and speed. Greedy; the lossless
method's texts are checked against AR's. Then each prompt is decoded by ``generate`` in this
process and by the idle server, ``--repeats`` times each, interleaved, the fastest run per prompt
counting (the project's bench harness): the server's overhead at concurrency 1, with its 95%
bootstrap interval over prompts.

    .venv/bin/python scripts/bench_serve.py [--n 8 --max-tokens 64 --concurrency 1,4,8] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# isort: split
from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL, generate, load  # noqa: E402
from mlx_specstream.bench import REPEATS, Method, speedup, time_methods  # noqa: E402
from mlx_specstream.loader import model_name  # noqa: E402
from mlx_specstream.outputs import recorded_path, run_meta, write_results_file  # noqa: E402
from mlx_specstream.pool import default_mode  # noqa: E402


def post(url: str, body: dict) -> tuple[dict, float]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        reply = json.loads(r.read())
    return reply, time.perf_counter() - t


def run_level(url: str, model_id: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    body = {"model": model_id, "max_tokens": max_tokens, "temperature": 0}
    t = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda p: post(url + "/v1/completions", {**body, "prompt": p}), prompts))
    wall = time.perf_counter() - t
    tokens = [r["usage"]["completion_tokens"] for r, _ in replies]
    latency = [s for _, s in replies]
    passes = sum(r["speculative"]["passes"] for r, _ in replies)
    return {"tokens": sum(tokens), "wall_s": round(wall, 3),
            "aggregate_tokens_per_s": round(sum(tokens) / wall, 2),
            "mean_latency_s": round(statistics.mean(latency), 3),
            "per_request_tokens_per_s": round(statistics.mean(n / s for n, s in zip(tokens, latency)), 2),
            "mean_accepted_tokens": round(sum(tokens) / max(passes, 1), 3),
            "texts": [r["choices"][0]["text"] for r, _ in replies]}


def overhead(url: str, model_id: str, path: Path, adapter: str, prompts: list[str], max_tokens: int,
             repeats: int) -> dict:
    """Each prompt decoded by ``generate`` in this process and by the idle server, ``repeats``
    times each, interleaved (``bench.time_methods``: the fastest run per prompt counts): the time
    the server adds, as the ratio of summed best times, with its 95% bootstrap interval over
    prompts. Both decode greedily, so they generate the same tokens."""
    model, tok = load(path, adapter=adapter or None, fuse=False)
    mode = default_mode(model)

    def direct(prompt, n):
        return generate(model, tok, prompt, max_tokens=n, mode=mode).tokens, 0

    def served(prompt, n):
        reply = post(url + "/v1/completions", {"model": model_id, "prompt": prompt, "max_tokens": n,
                                               "temperature": 0})[0]
        return [None] * reply["usage"]["completion_tokens"], 0  # the count is what the timing needs

    methods = [Method("generate", direct), Method("served", served)]
    time_methods(methods, prompts, max_tokens, repeats, desc=f"overhead {model_id}")
    speed, lo, hi = speedup(methods[1], methods[0])
    tokens = sum(len(r["tokens"]) for r in methods[0].records)
    best = {m.name: sum(r["time"] for r in m.records) for m in methods}
    return {"generate_tokens_per_s": round(tokens / best["generate"], 2),
            "served_tokens_per_s": round(tokens / best["served"], 2),
            "server_overhead": round(1 / speed - 1, 4),
            "server_overhead_ci95": [round(1 / hi - 1, 4), round(1 / lo - 1, 4)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--task", default="sql", help="test prompts from data/TASK/test.jsonl")
    ap.add_argument("--n", type=int, default=8, help="prompts per concurrency level and method")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--methods", default="ss-lossless=sql-lossless,ss-shared=sql,ar=",
                    help="NAME=ADAPTER pairs (empty adapter: the base model, decoded token by token)")
    ap.add_argument("--repeats", type=int, default=REPEATS,
                    help="runs of each prompt by generate and by the server; the fastest counts")
    args = outputs.parse_script_args(ap)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, not {args.repeats}")

    levels = [int(c) for c in args.concurrency.split(",")]
    methods = dict(m.split("=", 1) for m in args.methods.split(","))
    base = model_name(args.model)
    ids = {name: f"{base}:{a}" if a else base for name, a in methods.items()}
    lines = (ROOT / "data" / args.task / "test.jsonl").open()
    prompts = [json.loads(next(lines))["prompt"] for _ in range(args.n)]

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    adapters = ",".join(a for a in methods.values() if a)
    cmd = [sys.executable, "-c", "from mlx_specstream.cli import main; main()", "serve", "--model",
           str(args.model), "--port", str(port), *(["--adapters", adapters] if adapters else [])]
    server = subprocess.Popen(cmd, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/health", timeout=5).read()
                break
            except OSError:
                time.sleep(0.2)
        load_before = os.getloadavg()
        for model_id in ids.values():  # warm-up
            post(url + "/v1/completions", {"model": model_id, "prompt": prompts[0], "max_tokens": 8})
        rows = []
        for c in levels:
            for name, model_id in ids.items():
                res = run_level(url, model_id, prompts, c, args.max_tokens)
                rows.append({"method": name, "model": model_id, "concurrency": c, **res})
                print(f"c={c} {name}: {res['aggregate_tokens_per_s']} tok/s aggregate, "
                      f"{res['per_request_tokens_per_s']} tok/s per request", file=sys.stderr)
        for name, adapter in methods.items():  # the server's overhead at concurrency 1
            row = next((r for r in rows if r["method"] == name and r["concurrency"] == 1), None)
            if row is not None:
                row.update(overhead(url, ids[name], args.model, adapter, prompts, args.max_tokens,
                                    args.repeats))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)

    ar_texts = {r["concurrency"]: r["texts"] for r in rows if r["method"] == "ar"}
    for r in rows:
        if r["method"].startswith("ss-lossless") and r["concurrency"] in ar_texts:
            r["identical_to_ar"] = r["texts"] == ar_texts[r["concurrency"]]
    meta = run_meta(load_before_after=[round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                    versions={p: version(p) for p in ("mlx", "mlx-lm", "starlette", "uvicorn")},
                    model=recorded_path(args.model), task=args.task, n=args.n, max_tokens=args.max_tokens,
                    repeats=args.repeats)
    print(table(rows))
    if args.out:
        write_results_file(args.out, meta, rows)


def table(rows: list[dict]) -> str:
    cols = ["concurrency", "method", "aggregate_tokens_per_s", "per_request_tokens_per_s", "mean_latency_s",
            "mean_accepted_tokens", "identical_to_ar", "generate_tokens_per_s", "served_tokens_per_s",
            "server_overhead", "server_overhead_ci95"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(out)


if __name__ == "__main__":
    main()
