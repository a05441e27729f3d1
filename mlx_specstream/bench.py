"""``specstream-mlx bench``: Speculative Streaming against the decoders a user would pick instead,
on the same prompts, in one process, interleaved prompt by prompt (so machine noise hits every
method alike). Speed is reported as a ratio to our own autoregressive decoding in the same run.

Methods (each skipped, with the reason recorded, when its model or adapter is missing):
``ar`` (ours), ``mlx-lm ar``, ``mlx-lm draft`` (mlx-lm's speculative decoding with the draft
model), ``lookup`` (prompt lookup), ``ss-lossless chain|tree|tree+prune`` (the lossless
adapter), ``ss-shared`` (the shared adapter), ``lora-ar`` (the next-token LoRA baseline).
"""

from __future__ import annotations

import difflib
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from .adapter import adapter_size
from .api import generate, load
from .blas import active_blas
from .engine import default_node_costs
from .outputs import check_replaceable_file, is_results_json

PRUNE_THRESHOLD = 0.05  # of "ss-lossless tree+prune" (the shipped adapters do not prune)


@dataclass
class Method:
    name: str
    run: Callable[[list[int], int], tuple[list[int], int]]  # (prompt ids, max) -> (tokens, calls)
    extra_params: int = 0
    lossless: bool = False  # output must equal our AR output
    task_model: str = "base"  # which model's outputs the task metric measures
    records: list = field(default_factory=list)


def our_decoder(model, tokenizer, **opts) -> Callable[[list[int], int], tuple[list[int], int]]:
    """A bench method running our decoder with these options: (prompt ids, max) -> (tokens, passes)."""
    def run(ids, max_tokens):
        out = generate(model, tokenizer, ids, max_tokens=max_tokens, **opts)
        return out.tokens, out.stats.calls + 1

    return run


def _mlx_lm(path: Path, draft: Path | None, eos: set[int], dtype: mx.Dtype, num_draft: int = 3):
    """mlx-lm's own decoding (plain or with a draft model) on the same weights, cast to the dtype
    our model runs in, so that both compute the same numbers."""
    from mlx_lm.generate import generate_step, speculative_generate_step
    from mlx_lm.utils import load as lm_load

    model, _ = lm_load(str(path))
    draft_model = lm_load(str(draft))[0] if draft else None
    for m in (model, draft_model):
        if m is not None:
            m.set_dtype(dtype)

    def run(ids, max_tokens):
        prompt = mx.array(ids)
        if draft_model is None:
            steps = generate_step(prompt, model, max_tokens=max_tokens)
        else:
            steps = speculative_generate_step(prompt, model, draft_model, max_tokens=max_tokens,
                                              num_draft_tokens=num_draft)
        tokens, calls = [], 0
        for item in steps:
            tok = int(item[0])
            from_draft = bool(item[2]) if draft_model is not None else False
            calls += 0 if from_draft else 1
            if tok in eos:
                break
            tokens.append(tok)
        return tokens, calls

    n = sum(v.size for _, v in tree_flatten(draft_model.parameters())) if draft_model else 0
    return run, n


def _normalize_sql(s: str) -> str:
    return " ".join(s.strip().rstrip(";").split()).lower()


def task_metrics(task: str, outputs: list[str], refs: list[str]) -> dict:
    """SQL: exact match (whitespace/case/semicolon-normalised). Code: exact match and edit
    similarity (difflib ratio), both on the stripped text."""
    if task == "sql":
        em = sum(_normalize_sql(o) == _normalize_sql(r) for o, r in zip(outputs, refs)) / len(refs)
        return {"exact_match": round(em, 4)}
    em = sum(o.strip() == r.strip() for o, r in zip(outputs, refs)) / len(refs)
    sim = sum(difflib.SequenceMatcher(None, o.strip(), r.strip()).ratio()
              for o, r in zip(outputs, refs)) / len(refs)
    return {"exact_match": round(em, 4), "edit_similarity": round(sim, 4)}


def build_methods(model_path: Path, task: str, draft_path: Path | None) -> tuple[list[Method], dict]:
    """The methods that can run with what exists, and the reasons the others are skipped."""
    base, tok = load(model_path)
    eos = set(tok.eos_token_ids)
    dtype = next(v.dtype for _, v in tree_flatten(base.parameters()) if mx.issubdtype(v.dtype, mx.floating))
    methods = [Method("ar", our_decoder(base, tok, mode="ar"))]
    skipped = {}
    try:
        methods.append(Method("mlx-lm ar", _mlx_lm(model_path, None, eos, dtype)[0], lossless=True))
        if draft_path and draft_path.exists():
            run, n = _mlx_lm(model_path, draft_path, eos, dtype)
            methods.append(Method("mlx-lm draft", run, n, lossless=True))
        else:
            skipped["mlx-lm draft"] = f"no draft model at {draft_path}"
    except Exception as e:  # mlx-lm cannot read this model
        skipped["mlx-lm ar"] = f"mlx-lm failed to load the model: {e}"
    methods.append(Method("lookup", our_decoder(base, tok, mode="lookup"), lossless=True))

    adapters = model_path / "adapters"
    lossless_name, shared_name = f"{task}-lossless", task
    if task == "code":
        lossless_name, shared_name = "code", "code-shared"
    if (adapters / lossless_name).exists():
        m, _ = load(model_path, adapter=lossless_name)
        n = adapter_size(m)
        for label, opts in (("chain", dict(branch=1)), ("tree", dict(branch=3, prune_threshold=0.0)),
                            ("tree+prune", dict(branch=3, prune_threshold=PRUNE_THRESHOLD))):
            methods.append(Method(f"ss-lossless {label}", our_decoder(m, tok, **opts), n, lossless=True))
    else:
        skipped["ss-lossless"] = f"no adapter {adapters / lossless_name}"
    if (adapters / shared_name).exists():
        m, _ = load(model_path, adapter=shared_name)
        n = adapter_size(m)
        methods.append(Method("ss-shared", our_decoder(m, tok, branch=3), n, task_model="shared"))
        shared_ar = load(model_path, adapter=shared_name)[0]
        methods.append(Method("ss-shared ar", our_decoder(shared_ar, tok, mode="ar"), n, task_model="shared"))
    else:
        skipped["ss-shared"] = f"no adapter {adapters / shared_name}"
    if (adapters / f"{task}-lora").exists():
        m, _ = load(model_path, adapter=f"{task}-lora")
        n = adapter_size(m)
        methods.append(Method("lora-ar", our_decoder(m, tok, mode="ar"), n, task_model="lora"))
    else:
        skipped["lora-ar"] = f"no adapter {adapters / f'{task}-lora'}"
    return methods, {"tokenizer": tok, "skipped": skipped}


RESULT_FILES = ("results.json", "results.md", "results.png")


def check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Fail before the run if ``out_dir`` holds results that ``overwrite`` may not replace:
    earlier results of ours need ``overwrite``; files of the same names that are not ours are
    never replaced. Other files in ``out_dir`` are left alone."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    for name in RESULT_FILES:
        check_replaceable_file(out_dir / name, overwrite,
                               lambda _: is_results_json(out_dir / "results.json"))


def run_bench(model_path: Path, task: str, n: int, max_tokens: int, out_dir: Path,
              draft_path: Path | None = None, data_dir: Path | None = None,
              command: str = "", methods: list[Method] | None = None, overwrite: bool = False) -> dict:
    """Run every method on the first ``n`` test prompts; write results.json, results.md, PNG.

    ``methods`` replaces the standard set (its first must be the AR reference); ``overwrite``
    replaces the results of an earlier run in ``out_dir``."""
    from tqdm import tqdm

    check_out_dir(Path(out_dir), overwrite)

    data_dir = data_dir or Path(__file__).resolve().parent.parent / "data" / task
    test = data_dir / "test.jsonl"
    if not test.is_file():
        raise FileNotFoundError(f"{test}: no test data (run scripts/make_data.py)")
    rows = [json.loads(line) for line in test.read_text().splitlines() if line.strip()][:n]
    if methods is None:
        methods, info = build_methods(model_path, task, draft_path)
    else:
        from .tokenizer import load_tokenizer

        info = {"tokenizer": load_tokenizer(model_path), "skipped": {}}
    tok = info["tokenizer"]
    load_before = os.getloadavg()[0]
    if load_before > 0.5:
        print(f"bench: the machine is busy (1-minute load average {load_before:.1f}); timings will be "
              "noisy, though the ratios between methods hold better", file=sys.stderr)
    prompts = [tok.encode(r["prompt"]) for r in rows]
    for m in methods:  # warm up (compilation, allocation) outside the timings
        m.run(prompts[0], 4)
    for ids in tqdm(prompts, desc=f"bench {task}", unit="prompt"):
        for m in methods:
            mx.reset_peak_memory()
            t = time.perf_counter()
            tokens, calls = m.run(ids, max_tokens)
            dt = time.perf_counter() - t
            m.records.append({"tokens": tokens, "calls": calls, "time": dt,
                              "peak": mx.get_peak_memory()})
    ar = methods[0]
    ar_tps = sum(len(r["tokens"]) for r in ar.records) / sum(r["time"] for r in ar.records)
    refs = [r["completion"] for r in rows]
    results = []
    for m in methods:
        ntok = sum(len(r["tokens"]) for r in m.records)
        secs = sum(r["time"] for r in m.records)
        texts = [tok.decode(r["tokens"]) for r in m.records]
        rec = {
            "method": m.name,
            "mean_accepted_tokens": round(ntok / max(sum(r["calls"] for r in m.records), 1), 3),
            "tokens_per_s": round(ntok / secs, 2),
            "speedup_vs_ar": round(ntok / secs / ar_tps, 3),
            **task_metrics(task, texts, refs),
            "extra_params": m.extra_params,
            "peak_memory_mb": round(max(r["peak"] for r in m.records) / 2**20, 1),
            "generated_tokens": ntok,
        }
        if m.lossless:
            same = [a["tokens"] == b["tokens"] for a, b in zip(m.records, ar.records)]
            rec["identical_to_ar"] = all(same)
            rec["identical_prompts"] = f"{sum(same)}/{len(same)}"
        results.append(rec)
    meta = {
        "command": command or " ".join(sys.argv), "date": str(date.today()),
        "machine": platform.platform(), "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "python": platform.python_version(), "mlx": mx.__version__, "blas": active_blas(),
        "model": str(model_path), "task": task, "prompts": len(rows), "max_tokens": max_tokens,
        "skipped": info["skipped"],
        "node_cost": default_node_costs(),
        "prune_threshold": PRUNE_THRESHOLD,
    }
    write_results(out_dir, meta, results)
    return {"meta": meta, "results": results}


def markdown_table(meta: dict, results: list[dict]) -> str:
    keys = ["method", "mean_accepted_tokens", "tokens_per_s", "speedup_vs_ar", "exact_match"]
    if any("edit_similarity" in r for r in results):
        keys.append("edit_similarity")
    keys += ["extra_params", "peak_memory_mb", "identical_to_ar"]
    lines = [f"`{meta['command']}` — {meta['date']}, {meta['machine']}, MLX {meta['mlx']}, "
             f"BLAS {meta['blas']}, {meta.get('cpus')} CPUs (load before/after: "
             f"{meta.get('load_average_1m')}), {meta['prompts']} prompts, "
             f"max {meta['max_tokens']} tokens", "",
             "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in results:
        lines.append("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    for name, why in meta["skipped"].items():
        lines.append(f"\nSkipped {name}: {why}")
    return "\n".join(lines) + "\n"


def write_results(out_dir: Path, meta: dict, results: list[dict]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "results.json.tmp"
    tmp.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    tmp.replace(out_dir / "results.json")
    (out_dir / "results.md").write_text(markdown_table(meta, results))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["method"] for r in results]
    axes[0].barh(names, [r["speedup_vs_ar"] for r in results], color="tab:blue")
    axes[0].axvline(1.0, color="gray", lw=1)
    axes[0].set_xlabel("speed-up vs our AR (same run)")
    axes[1].barh(names, [r["mean_accepted_tokens"] for r in results], color="tab:green")
    axes[1].set_xlabel("mean tokens per forward pass")
    for ax in axes:
        ax.invert_yaxis()
    fig.suptitle(f"{meta['task']}: {meta['prompts']} prompts, {meta['date']}, BLAS {meta['blas']}")
    fig.tight_layout()
    fig.savefig(out_dir / "results.png", dpi=120)
    plt.close(fig)
