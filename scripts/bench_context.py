"""Decoding as the context grows, after 128, 512 and 2,000 tokens (the shipped model).

Passes: a plain AR pass, a 4-node chain without streams, the same chain with streams on every
node, and an AR-sized pass plus its deferred stream pass (``--adapter``, lossless), each the
median of ``--reps`` passes over the same cache (trimmed back after each); one layer's attention
over that cache for 1 and 4 query rows, and a prefill of that many tokens.

Generations: greedy decoding of ``--prompts`` sql test prompts, each after a few-shot context of
valid-split examples cut to make the prompt exactly that long, by plain AR, ``--adapter`` and
``--shared`` (``bench.time_methods``: interleaved, fastest of ``--repeats`` runs). Decode tokens/s
and speed-up over AR (ratio of summed decode times, prefill excluded, with a 95% bootstrap interval
over prompts); every lossless output is compared with AR's.

    .venv/bin/python scripts/bench_context.py [--adapter sql-lossless --shared sql
        --contexts 128,512,2000] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


import mlx_specstream  # noqa: E402,F401  (first: it loads the optimized BLAS before MLX is imported)

# isort: split
import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_specstream import outputs  # noqa: E402
from mlx_specstream.api import DEFAULT_MODEL, load  # noqa: E402
from mlx_specstream.arch.base import causal_mask  # noqa: E402
from mlx_specstream.bench import REPEATS, Method, best_time, our_decoder, speedup, time_methods  # noqa: E402
from mlx_specstream.kernels.attention import sdpa  # noqa: E402
from mlx_specstream.kv_cache import make_cache  # noqa: E402
from mlx_specstream.outputs import markdown_table, run_meta, write_results_file  # noqa: E402
from mlx_specstream.streams import forward, stream_pass  # noqa: E402
from mlx_specstream.tree import chain  # noqa: E402


def filled(model, n: int, rng) -> list:
    """A cache holding n random tokens, written 256 at a time."""
    caches = make_cache(model)
    for a in range(0, n, 256):
        b = min(n, a + 256)
        forward(model, chain(rng.integers(5, 4000, b - a)), caches, a)
        for c in caches:
            c.commit(a, list(range(b - a)))
    return caches


def pass_rows(model_dir: Path, adapter: str, contexts: list[int], g: int, reps: int) -> list[dict]:
    """Per context: the median time (ms) of each kind of pass; the fastest of ``reps`` runs of one
    layer's attention over the cache for 1 and 4 query rows; a prefill of that many tokens."""
    model, _ = load(model_dir, adapter=adapter)
    rng = np.random.default_rng(0)

    def deferred(caches, n):
        out = forward(model, chain([5]), caches, n)
        mx.eval(out.msa_input)
        for c in caches:
            c.commit(n, [0])
        mx.eval(stream_pass(model, out.msa_input[0], caches, n + 1, g))

    passes = {
        "ar_ms": lambda c, n: mx.eval(forward(model, chain([5]), c, n).main_logits),
        "chain4_ms": lambda c, n: mx.eval(forward(model, chain([5, 6, 7, 8]), c, n).main_logits),
        "chain4_streams_ms": lambda c, n: mx.eval(
            forward(model, chain([5, 6, 7, 8]), c, n, gamma=g).stream_logits),
        "ar_deferred_streams_ms": deferred,
    }
    attn = model.layers[0].self_attn if hasattr(model.layers[0], "self_attn") else None
    rows = []
    for n in contexts:
        caches = filled(model, n, rng)
        row = {"context": n}
        if attn is not None:  # one layer's attention over the cached keys, for 1 and 4 query rows
            keys, values = caches[0].state
            for rows_q in (1, 4):
                q = mx.random.normal((1, attn.n_heads, rows_q, keys.shape[-1]), key=mx.random.key(0))
                k, v = keys[:, :, : n - 4 + rows_q], values[:, :, : n - 4 + rows_q]
                mask = causal_mask(rows_q, n - 4) if rows_q > 1 else None
                row[f"attention_{rows_q}_row_ms"] = round(best_time(
                    lambda q=q, k=k, v=v, mask=mask: mx.eval(sdpa(q, k, v, mask, attn.scale)), reps) * 1e3, 3)
        prompt = chain(rng.integers(5, 4000, n))
        row["prefill_s"] = round(best_time(
            lambda p=prompt: mx.eval(forward(model, p, make_cache(model), 0).main_logits), 1), 3)
        for name, run in passes.items():
            times = []
            for _ in range(reps + 1):
                t = time.perf_counter()
                run(caches, n)
                times.append(time.perf_counter() - t)
                for c in caches:
                    c.trim(c.offset - n)
            row[name] = round(statistics.median(times[1:]) * 1e3, 2)
        rows.append(row)
        print(row, file=sys.stderr)
    return rows


def long_prompts(tokenizer, context: int, n: int) -> list[list[int]]:
    """The first ``n`` sql test prompts, each after as much of a few-shot context (valid-split
    examples, prompt and completion) as makes it ``context`` tokens long, BOS first."""
    data = ROOT / "data" / "sql"
    rows = [json.loads(line) for line in (data / "valid.jsonl").read_text().splitlines() if line.strip()]
    shots = tokenizer.encode("".join(f"{r['prompt']}{r['completion']}\n\n" for r in rows[:200]))[1:]
    tests = [json.loads(line)["prompt"] for line in (data / "test.jsonl").read_text().splitlines()[:n]]
    out = []
    for text in tests:
        ids = tokenizer.encode(text)
        room = context - len(ids)
        if room < 0 or room > len(shots):
            raise ValueError(f"context {context}: a prompt of {len(ids)} tokens cannot be made that long")
        out.append(ids[:1] + shots[len(shots) - room:] + ids[1:])
    return out


def decode_time_records(m: Method) -> Method:
    """``m`` with each prompt's fastest run timed by its decode time alone (prefill excluded)."""
    return Method(m.name, m.run, records=[{**r, "time": r["stats"].decode_time} for r in m.records])


def generation_rows(model_dir: Path, lossless: str, shared: str, contexts: list[int], n: int,
                    max_tokens: int, repeats: int) -> list[dict]:
    """Per context and method (AR, the ``lossless`` adapter, the ``shared`` one): decode tokens/s,
    tokens per pass, speed-up over AR (decode time)."""
    base, tok = load(model_dir)
    methods = [Method("ar", our_decoder(base, tok, mode="ar")),
               Method("ss-lossless", our_decoder(load(model_dir, adapter=lossless)[0], tok), reproduces="ar"),
               Method("ss-shared", our_decoder(load(model_dir, adapter=shared)[0], tok))]
    rows = []
    for context in contexts:
        for m in methods:
            m.records = []
        time_methods(methods, long_prompts(tok, context, n), max_tokens, repeats, desc=f"context {context}")
        ar = decode_time_records(methods[0])
        for m in methods:
            timed = decode_time_records(m)
            stats = [r["stats"] for r in m.records]
            tokens, calls = sum(s.generated_tokens for s in stats), sum(s.calls for s in stats)
            ratio, lo, hi = speedup(timed, ar)
            same = None if m.reproduces is None else all(
                r["tokens"] == a["tokens"] for r, a in zip(m.records, methods[0].records))
            rows.append({"context": context, "method": m.name,
                         "tokens_per_s": round(tokens / sum(s.decode_time for s in stats), 1),
                         "tokens_per_pass": round(tokens / calls, 3), "speedup": round(ratio, 3),
                         "speedup_ci95": [round(lo, 3), round(hi, 3)], "identical_to_ar": same})
            print(rows[-1], file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--adapter", default="sql-lossless")
    ap.add_argument("--contexts", default="128,512,2000")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--shared", default="sql", help="a shared-mode adapter for the generations")
    ap.add_argument("--prompts", type=int, default=8, help="generations: sql test prompts decoded")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--no-passes", action="store_true", help="generations only")
    ap.add_argument("--no-generations", action="store_true", help="passes only")
    args = outputs.parse_script_args(ap)
    contexts = [int(x) for x in args.contexts.split(",")]
    load_before = os.getloadavg()
    rows = [] if args.no_passes else pass_rows(args.model, args.adapter, contexts, args.gamma, args.reps)
    if rows:
        print(markdown_table({"cached tokens": "context", "AR pass (ms)": "ar_ms",
                              "4-node chain": "chain4_ms", "+ streams on every node": "chain4_streams_ms",
                              "AR + deferred stream pass": "ar_deferred_streams_ms",
                              "attention, 1 row": "attention_1_row_ms", "4 rows": "attention_4_row_ms",
                              "prefill (s)": "prefill_s"}, rows))
    gens = [] if args.no_generations else generation_rows(args.model, args.adapter, args.shared, contexts,
                                                          args.prompts, args.max_tokens, args.repeats)
    if gens:
        print(markdown_table({"context": "context", "method": "method", "tokens/s": "tokens_per_s",
                              "tokens/pass": "tokens_per_pass", "speed-up vs AR": "speedup",
                              "95% interval": "interval", "identical to AR": "same"},
                             [{**r, "interval": "{}–{}".format(*r["speedup_ci95"]),
                               "same": "" if r["identical_to_ar"] is None else r["identical_to_ar"]}
                              for r in gens]))
    meta = run_meta(adapter=args.adapter, shared=args.shared, gamma=args.gamma, prompts=args.prompts,
                    max_tokens=args.max_tokens, repeats=args.repeats,
                    load_before_after=[round(load_before[0], 2), round(os.getloadavg()[0], 2)])
    if args.out:
        write_results_file(args.out, meta, [{"table": "pass", **r} for r in rows]
                           + [{"table": "generation", **r} for r in gens])


if __name__ == "__main__":
    main()
