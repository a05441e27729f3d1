"""``specstream-mlx bench``: Speculative Streaming against the decoders a user would pick instead,
on the same prompts, in one process.

The timing rule (:func:`time_methods`, also used by ``scripts/bench_*.py``): each prompt runs
every method ``repeats`` times, interleaved (so machine noise hits every method alike), and the
fastest run of each (prompt, method) counts. Speed is reported against the fastest plain
autoregressive decoder of the run (ours or mlx-lm's, :func:`reference`): the ratio of summed
best times per generated token, with a 95% bootstrap interval over prompts (:func:`speedup`).

Methods (each skipped, with the reason recorded, when its model or adapter is missing):
``ar`` (ours), ``mlx-lm ar``, ``mlx-lm draft`` (mlx-lm's speculative decoding with the draft
model), ``lookup`` (prompt lookup), ``ss-lossless chain|tree|tree+prune`` (the lossless
adapter), ``ss-shared`` (the shared adapter), ``lora-ar`` (the next-token LoRA baseline),
``ss-tuned`` (the tuned lossless adapter over that baseline: its output must equal ``lora-ar``'s).
With ``adapters`` (``bench --adapter NAME``, a user's own), those replace the project's adapters
(:func:`adapter_methods`); with ``data`` (``--data DIR``), the prompts are a user's own
(:func:`read_prompts`).
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from .adapter import adapter_name, adapter_size, fine_tune_weights, resolve_adapter
from .adapter import fuse as fuse_adapter
from .api import decoder, load
from .arch.base import max_positions
from .data import (
    VALID_FILE,
    DataError,
    check_ids,
    check_system_prompt,
    encode_row,
    has_chat_template,
    message_text,
    no_file,
    outside_template,
    read_jsonl,
)
from .engine import default_node_costs
from .errors import CheckpointError, OptionError, check_number, check_path, check_switch, prompt_too_long
from .loader import model_dir, model_name
from .loader import read_config as read_model_config
from .machine import cores
from .outputs import (
    check_replaceable_file,
    check_writable,
    is_results_json,
    make_parents,
    markdown_table,
    recorded_path,
    remove_empty,
    results_text,
    run_meta,
    terminate_cleanly,
    write_files_atomic,
)
from .pool import with_adapter
from .project import project_data
from .tokenizer import load_tokenizer

PRUNE_THRESHOLD = 0.05  # of "ss-lossless tree+prune" (the shipped adapters do not prune)
REPEATS = 3  # runs of each (prompt, method); the fastest counts
BOOTSTRAP = {"resamples": 2000, "seed": 0}
MAX_HALF_WIDTH = 0.10  # an interval wider than +-10% of its speed-up is flagged in the table
MIN_BOOTSTRAP_PROMPTS = 5  # a bootstrap over fewer prompts bounds nothing: its interval is flagged too
BUSY_LOAD_PER_CORE = 0.25  # a 1-minute load average above this a core: other work competes for the CPU


@dataclass
class Method:
    name: str
    # (prompt ids, max) -> (tokens, calls) or, for our decoders, (tokens, calls, engine.Stats)
    run: Callable[[list[int], int], tuple]
    extra_params: int = 0
    reproduces: str | None = None  # the AR method whose output this one must equal, token for token
    plain_ar: bool = False  # a plain autoregressive decoder: a candidate for the speed reference
    records: list = field(default_factory=list)  # per prompt: the fastest run, and every run's time


def our_decoder(model, tokenizer, **opts) -> Callable[[list[int], int], tuple]:
    """A bench method running our decoder with these options: (prompt ids, max) -> (tokens, passes,
    the decoder's statistics). Token ids only, as mlx-lm's methods: the text is decoded after the
    timings."""
    def run(ids, max_tokens):
        dec = decoder(model, tokenizer, ids, max_tokens=max_tokens, **opts)
        tokens = [t for step in dec.steps() for t in step.tokens]
        return tokens, dec.stats.calls + 1, dec.stats

    return run


def check_count(name: str, value) -> None:
    """A count (``repeats``, ``n``, ``max_tokens``) is a whole number >= 1."""
    check_number(name, value, 1, whole=True)


def time_methods(methods: list[Method], prompts: list[list[int]], max_tokens: int | list[int],
                 repeats: int = REPEATS, clock: Callable[[], float] = time.perf_counter,
                 desc: str = "bench") -> None:
    """Run every method ``repeats`` times on each prompt, interleaved (prompt by prompt, round
    robin over the methods), for at most ``max_tokens`` tokens (or each prompt's own); append to
    each method's ``records`` the fastest run per prompt (tokens, passes, time, and the decoder's
    statistics for our decoders) with every run's time and the peak memory."""
    from tqdm import tqdm

    check_count("repeats", repeats)
    budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    for m in methods:  # warm up (compilation, allocation) outside the timings
        m.run(prompts[0], min(4, budgets[0]))
    with tqdm(total=len(prompts) * repeats * len(methods), desc=desc, unit="run") as bar:
        for ids, most in zip(prompts, budgets):
            runs: dict[str, list] = {m.name: [] for m in methods}
            for _ in range(repeats):
                for m in methods:
                    mx.reset_peak_memory()
                    t = clock()
                    tokens, calls, *stats = m.run(ids, most)
                    dt = clock() - t
                    runs[m.name].append({"tokens": tokens, "calls": calls, "time": dt,
                                         "peak": mx.get_peak_memory(), "stats": (stats or [None])[0]})
                    bar.update()
            for m in methods:
                best = min(runs[m.name], key=lambda r: r["time"])
                m.records.append({**best, "times": [r["time"] for r in runs[m.name]],
                                  "peak": max(r["peak"] for r in runs[m.name])})


def best_time(fn: Callable[[], object], repeats: int = REPEATS,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn`` after one warm-up call: the rule of
    :func:`time_methods` for a single operation (a forward pass, a kernel)."""
    check_count("repeats", repeats)
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = clock()
        fn()
        best = min(best, clock() - t)
    return best


def reference(methods: list[Method]) -> Method:
    """The speed reference: the fastest plain AR decoder of the run (ours or mlx-lm's), by
    generated tokens per summed best time, among those whose outputs equal the decoder they
    reproduce (mlx-lm's AR decodes another model where it reads a config otherwise, e.g. without
    Mixtral's sliding window: it is no reference then); the first method when none is marked
    ``plain_ar``."""
    by_name = {m.name: m for m in methods}
    plain = [m for m in methods
             if m.plain_ar and (m.reproduces is None or all(_same(m, by_name[m.reproduces])))]
    return max(plain or methods[:1], key=lambda m: _tokens(m).sum() / _times(m).sum())


def _same(m: Method, other: Method) -> list[bool]:
    """Per prompt, whether ``m``'s output equals ``other``'s, token for token."""
    return [a["tokens"] == b["tokens"] for a, b in zip(m.records, other.records)]


def _times(m: Method) -> np.ndarray:
    return np.array([r["time"] for r in m.records], np.float64)


def _tokens(m: Method) -> np.ndarray:
    return np.array([len(r["tokens"]) for r in m.records], np.float64)


def speedup(m: Method, ref: Method, resamples: int = BOOTSTRAP["resamples"],
            seed: int = BOOTSTRAP["seed"]) -> tuple[float, float, float]:
    """(speed-up of ``m`` over ``ref``, 95% interval): the ratio of summed best times per
    generated token (of summed best times when both generate the same tokens), and its
    percentile bootstrap over prompts (the same prompts resampled for both methods)."""
    tm, tr, nm, nr = _times(m), _times(ref), _tokens(m), _tokens(ref)
    ratio = (nm.sum() / tm.sum()) / (nr.sum() / tr.sum())
    lo, hi = bootstrap_interval(lambda i: (nm[i].sum(1) / tm[i].sum(1)) / (nr[i].sum(1) / tr[i].sum(1)),
                                len(tm), resamples, seed)
    return float(ratio), lo, hi


def bootstrap_interval(stat, n: int, resamples: int = BOOTSTRAP["resamples"],
                       seed: int = BOOTSTRAP["seed"]) -> tuple[float, float]:
    """95% percentile bootstrap interval over ``n`` prompts: ``stat`` maps a (resamples, n) array
    of prompt indices, one resample a row, to the statistic of each row."""
    idx = np.random.default_rng(seed).integers(0, n, (resamples, n))
    lo, hi = np.percentile(stat(idx), [2.5, 97.5])
    return float(lo), float(hi)


def interval_ok(rec: dict) -> bool:
    """Whether a result's 95% interval lies within +-10% of its speed-up."""
    lo, hi = rec["speedup_ci95"]
    return lo >= rec["speedup"] * (1 - MAX_HALF_WIDTH) and hi <= rec["speedup"] * (1 + MAX_HALF_WIDTH)


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


TASKS = ("sql", "code")  # the project's data sets and adapter sets (data/TASK, MODEL/adapters/TASK-…)
TEST_FILE = "test.jsonl"


def exact_match(task: str | None, output: str, ref: str) -> bool:
    """The project's exact match: SQL with whitespace runs and a final ";" normalised (case kept:
    a string literal's case matters), code and a user's data (``task`` None) on the stripped
    text. ``scripts/train_base.py``'s evaluation, which runs without MLX, keeps its own copy of
    the SQL rule (tested equal)."""
    if task == "sql":
        return " ".join(output.strip().rstrip(";").split()) == " ".join(ref.strip().rstrip(";").split())
    return output.strip() == ref.strip()


def task_metrics(task: str | None, outputs: list[str], refs: list[str]) -> dict:
    """Exact match (:func:`exact_match`); for code and a user's data (``task`` None) also edit
    similarity (difflib ratio) on the stripped text. Over the prompts with a reference: an empty
    one (a prompt given alone, as lossless training takes them) judges nothing; none, no metric."""
    judged = [(o, r) for o, r in zip(outputs, refs) if r.strip()]
    if not judged:
        return {}
    outputs, refs = zip(*judged)
    em = sum(exact_match(task, o, r) for o, r in zip(outputs, refs)) / len(refs)
    if task == "sql":
        return {"exact_match": round(em, 4)}
    sim = sum(difflib.SequenceMatcher(None, o.strip(), r.strip()).ratio()
              for o, r in zip(outputs, refs)) / len(refs)
    return {"exact_match": round(em, 4), "edit_similarity": round(sim, 4)}


def build_methods(model_path: Path, task: str, draft_path: Path | None,
                  adapters: list[str] | None = None) -> tuple[list[Method], dict[str, str]]:
    """The methods that can run with what exists, and the reasons the others are skipped.
    ``draft_path``: mlx-lm's draft model, which must load where it is given; None: the model's
    own ``draft/``, skipped where it is missing or unreadable. ``adapters``: a user's, timed in
    place of the project's adapters for ``task`` (:func:`adapter_methods`)."""
    given = draft_path is not None  # one asked for is said before the run, not skipped in its table
    draft_path = model_dir(draft_path, "--draft-model") if given else model_path / "draft"
    base, tok = load(model_path)
    eos = set(tok.eos_token_ids)
    dtype = next(v.dtype for _, v in tree_flatten(base.parameters()) if mx.issubdtype(v.dtype, mx.floating))
    methods = [Method("ar", our_decoder(base, tok, mode="ar"), plain_ar=True)]
    skipped = {}
    try:
        methods.append(Method("mlx-lm ar", _mlx_lm(model_path, None, eos, dtype)[0], reproduces="ar",
                              plain_ar=True))
    except Exception as e:  # mlx-lm cannot read this model
        skipped["mlx-lm ar"] = skipped["mlx-lm draft"] = f"mlx-lm failed to load the model: {e}"
    else:
        try:
            if not draft_path.exists():
                skipped["mlx-lm draft"] = f"no draft model at {draft_path}"
            else:
                run, n = _mlx_lm(model_path, draft_path, eos, dtype)
                methods.append(Method("mlx-lm draft", run, n, reproduces="ar"))
        except Exception as e:  # mlx-lm cannot read the draft model
            if given:
                raise CheckpointError(f"{draft_path}: mlx-lm cannot load this draft model: {e}") from None
            skipped["mlx-lm draft"] = f"mlx-lm failed to load the draft model {draft_path}: {e}"
    methods.append(Method("lookup", our_decoder(base, tok, mode="lookup"), reproduces="ar"))
    if adapters is not None:
        for name in adapters:
            methods += adapter_methods(base, name, tok)
        return methods, skipped
    methods += _project_adapter_methods(base, task, tok, skipped)
    return methods, skipped


def adapter_methods(base: nn.Module, adapter: str, tok) -> list[Method]:
    """A user's adapter as ``bench --adapter NAME`` times it: ``ss NAME`` decodes with Speculative
    Streaming as ``generate --adapter NAME`` does (its own tree and defaults); where the adapter
    carries a fine-tune (shared and lora modes, a tuned lossless one), ``ar NAME`` decodes the same
    model one token a pass. A lossless adapter's output must equal the plain decoding under it: the
    base's (``ar``) or its fine-tune's (``ar NAME``). The model is ``base``'s arrays with the
    adapter attached (fused, as ``generate`` loads it): no second copy of the base."""
    m = with_adapter(base, adapter, fuse=True)
    cfg, n = m.adapter_config, adapter_size(m)
    fine_tuned = cfg.mode != "lossless" or cfg.main_rank > 0
    methods = [Method(f"ar {cfg.name}", our_decoder(m, tok, mode="ar"), n)] if fine_tuned else []
    if cfg.gamma:
        under = f"ar {cfg.name}" if fine_tuned else "ar"
        methods.append(Method(f"ss {cfg.name}", our_decoder(m, tok), n,
                              reproduces=None if cfg.mode == "shared" else under))
    return methods


def check_adapters(model_path: Path, adapters: list[str]) -> list[str]:
    """Before anything loads: each adapter there, and no two of one name (the table tells them
    apart by their names, their folders'). One adapter named twice (by name and by path) is timed
    once, as ``serve --adapters`` serves it once; returns the adapters to time."""
    if isinstance(adapters, str) or not adapters:
        raise OptionError("{adapter} takes a list of adapter names or paths, one at least")
    found: dict[str, Path] = {}
    for adapter in adapters:
        path = resolve_adapter(model_path, adapter)
        name = adapter_name(path)
        if found.setdefault(name, path).resolve() != path.resolve():
            raise OptionError(f"{{adapter}}: two adapters named '{name}' ({found[name]} and {path}): the "
                              "table tells them apart by name: rename one")
    return [str(path) for path in found.values()]


def _project_adapter_methods(base: nn.Module, task: str, tok, skipped: dict) -> list[Method]:
    """The project's adapters for ``task`` under their table names (``ss-lossless chain|tree|
    tree+prune``, ``ss-shared``, ``ss-shared ar``, ``lora-ar``, ``ss-tuned``); each one missing is
    recorded in ``skipped``."""
    methods = []
    adapters = base.path / "adapters"
    lossless_name, shared_name = f"{task}-lossless", task
    if task == "code":
        lossless_name, shared_name = "code", "code-shared"
    if (adapters / lossless_name).exists():
        m = with_adapter(base, lossless_name, fuse=True)
        n = adapter_size(m)
        # "tree": the adapter's own (branch, budget), as users decode it
        for label, opts in (("chain", dict(branch=1)), ("tree", dict(prune_threshold=0.0)),
                            ("tree+prune", dict(prune_threshold=PRUNE_THRESHOLD))):
            methods.append(Method(f"ss-lossless {label}", our_decoder(m, tok, **opts), n, reproduces="ar"))
    else:
        skipped["ss-lossless"] = f"no adapter {recorded_path(adapters / lossless_name)}"
    if (adapters / shared_name).exists():
        m = with_adapter(base, shared_name, fuse=True)
        n = adapter_size(m)
        methods.append(Method("ss-shared", our_decoder(m, tok), n))
        methods.append(Method("ss-shared ar", our_decoder(m, tok, mode="ar"), n))
    else:
        skipped["ss-shared"] = f"no adapter {recorded_path(adapters / shared_name)}"
    fine_tune = None
    if (adapters / f"{task}-lora").exists():
        m, fine_tune = _fused(base, f"{task}-lora")
        methods.append(Method("lora-ar", our_decoder(m, tok, mode="ar"), adapter_size(m)))
    else:
        skipped["lora-ar"] = f"no adapter {recorded_path(adapters / f'{task}-lora')}"
    if (adapters / f"{task}-tuned").exists():
        m, tuned = _fused(base, f"{task}-tuned")
        same = fine_tune is not None and _equal(tuned, fine_tune)
        methods.append(Method("ss-tuned", our_decoder(m, tok), adapter_size(m),
                              reproduces="lora-ar" if same else None))
        if not same:
            skipped["ss-tuned output check"] = f"its fine-tune is not {task}-lora's"
    else:
        skipped["ss-tuned"] = f"no adapter {recorded_path(adapters / f'{task}-tuned')}"
    return methods


def _fused(base: nn.Module, adapter: str) -> tuple[nn.Module, dict[str, mx.array]]:
    """``base`` with ``adapter`` fused (:func:`~mlx_specstream.pool.with_adapter`), and its fine-tune's
    weights, read before fusing folds them away."""
    model = with_adapter(base, adapter)
    weights = fine_tune_weights(model)
    fuse_adapter(model)
    return model, weights


def _equal(a: dict[str, mx.array], b: dict[str, mx.array]) -> bool:
    return a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]).item() for k in a)


RESULT_FILES = ("results.json", "results.md", "results.png")


def is_our_result(path: Path) -> bool:
    """A results file of this project's: ``results.json`` by its meta; ``results.md`` and
    ``results.png`` by the sha256 that the ``results.json`` beside them records (results of
    before 2026-11-28 recorded none: there, results.md by its first line, which names the run
    results.json records, results.png by matplotlib's mark)."""
    summary = path.with_name("results.json")
    if not is_results_json(summary):
        return False
    if path.name == "results.json":
        return True
    meta = json.loads(summary.read_text())["meta"]
    data = path.read_bytes()
    if isinstance(meta.get("files"), dict):
        return meta["files"].get(path.name) == hashlib.sha256(data).hexdigest()
    if path.suffix == ".md":  # its first line names the run results.json records
        return data.startswith(f"`{meta.get('command')}` — {meta.get('date')}".encode())
    return data.startswith(b"\x89PNG") and b"Matplotlib" in data[:4096]


def check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Fail before the run if ``out_dir`` holds results that ``overwrite`` may not replace:
    earlier results of ours need ``overwrite``; files of the same names that are not ours are
    never replaced. Other files in ``out_dir`` are left alone."""
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    for name in RESULT_FILES:
        check_replaceable_file(out_dir / name, overwrite, is_our_result)
    check_writable(out_dir, "the results")


def prompts_file(data: str | Path, say: Callable[[str], None] = print) -> Path:
    """The JSONL file ``bench --data`` reads: ``data`` itself, or in a data directory its
    ``test.jsonl``, else its ``valid.jsonl`` (said: held out from training, though it may have chosen
    the adapter kept)."""
    check_path(data, "{data}", OptionError, "give a JSONL file or a data directory")
    data = Path(data)
    if data.is_file():
        return data
    if not data.is_dir():
        raise DataError(f"{data}: no such data file or directory")
    for name in (TEST_FILE, VALID_FILE):
        if (data / name).exists() and not (data / name).is_file():
            raise no_file(data, name)
        if (data / name).is_file():
            if name != TEST_FILE:
                say(f"{data} has no {TEST_FILE}: timing the prompts of {name}")
            return data / name
    raise no_file(data, TEST_FILE, VALID_FILE, hint=" (give a directory that holds one, or a JSONL file)")


def _data_name(path: Path) -> str:
    """A user's data set by name: its directory's for ``test.jsonl``/``valid.jsonl``, else the file's."""
    return path.parent.name if path.name in (TEST_FILE, VALID_FILE) else path.stem


def read_prompts(path: Path, tok, n: int, chat_template: bool = False, vocab_size: int | None = None,
                 limit: int | None = None, say: Callable[[str], None] = print, *,
                 system_prompt: str | None = None) -> tuple[list[list[int]], list[str]]:
    """The first ``n`` prompts of a JSONL file and the completions they are judged against, in
    the formats ``train`` reads (``prompt``/``completion`` as text or token ids, ``messages``: the
    conversation up to its last reply; ``chat_template`` wraps text prompts in a user turn, after
    ``system_prompt``'s, as ``train``/``generate --chat-template`` do), each row checked as
    ``train`` checks it (token ids in the model's ``vocab_size``, the prompt and a token within the
    ``limit`` it holds), so a bad row is said with its line before anything is timed.
    A ``text`` row has no prompt: skipped, and said (``say``), as prompts outside the model's chat
    template and prompts without a completion to judge them against are."""
    prompts, refs, skipped, plain = [], [], 0, 0
    for line, row in read_jsonl(path):
        if len(prompts) == n:
            break
        if isinstance(row, dict) and "text" in row and not {"prompt", "completion", "messages"} & set(row):
            skipped += 1
            continue
        where = f"{path}:{line}"
        ex = encode_row(row, tok, chat_template=chat_template, system=system_prompt, add_eos=False,
                        where=where)
        check_ids(ex.tokens, vocab_size, where)
        if limit is not None and ex.n_prompt >= limit:
            raise DataError(f"{where}: {prompt_too_long(ex.n_prompt, limit)}")
        prompts.append(ex.tokens[:ex.n_prompt])
        # the reply's text: a chat row's tokens end its turn as the template does (<|im_end|>)
        reply = row["messages"][-1].get("content") if "messages" in row else row.get("completion")
        if reply is None and "messages" in row:  # a reply that only calls tools: no text to judge
            reply = ""
        if isinstance(reply, list) and "messages" not in row:  # token ids: an EOS ends them, not the text
            while reply and reply[-1] in tok.eos_token_ids:
                reply = reply[:-1]
            refs.append(tok.decode(reply))
        else:
            refs.append(message_text(reply, where))
        plain += isinstance(row.get("prompt"), str) and not chat_template
    if skipped:
        say(f"{path}: skipped {_count(skipped, 'text row')} (no prompt to time)")
    if not prompts:
        raise DataError(f"{path}: no prompts (bench reads 'prompt'/'completion' and 'messages' rows)")
    if len(prompts) < n:
        say(f"{path} has {_count(len(prompts), 'prompt')}, fewer than the {n} asked for: running all of them")
    if plain and has_chat_template(tok):
        say(outside_template(str(path), plain))
    if unjudged := sum(not r.strip() for r in refs):
        say(f"{path}: {_count(unjudged, 'prompt')} of {len(refs)} {'has' if unjudged == 1 else 'have'} "
            "no completion to judge the "
            + ("outputs against: no exact match" if unjudged == len(refs) else "output against: exact match "
               f"over the other {len(refs) - unjudged}"))
    return prompts, refs


def run_bench(model_path: str | Path, task: str | None, n: int, max_tokens: int, out_dir: str | Path,
              draft_path: str | Path | None = None, data: str | Path | None = None,
              adapters: list[str] | None = None, chat_template: bool = False,
              system_prompt: str | None = None, command: str | None = None,
              methods: list[Method] | None = None, overwrite: bool = False, repeats: int = REPEATS,
              clock: Callable[[], float] = time.perf_counter,
              say: Callable[[str], None] = lambda msg: print(f"bench: {msg}", file=sys.stderr)) -> dict:
    """Run every method on the first ``n`` test prompts; write results.json, results.md, PNG.

    ``task``: the project's data set and adapters (``sql``, ``code``) and its metric; None: ``sql``'s
    adapters where ``adapters`` are not given, and plain exact match and edit similarity. ``data``:
    a user's prompts (:func:`prompts_file`, :func:`read_prompts`, with ``chat_template`` and
    ``system_prompt`` as ``train`` reads them) instead of the task's test split.
    ``adapters``: a user's adapters instead of the project's (:func:`adapter_methods`).
    ``methods`` replaces the standard set (those marked ``plain_ar`` compete for the speed
    reference; a method's ``reproduces`` names the one whose output it must equal); ``overwrite``
    replaces the results of an earlier run in ``out_dir``; ``repeats`` runs per (prompt, method),
    timed by ``clock``; ``say`` takes the notes (a data set's skipped rows, a busy machine).
    Everything is checked before a model loads."""
    for name, value in (("repeats", repeats), ("n", n), ("max_tokens", max_tokens)):
        check_count(name, value)
    if task not in (None, *TASKS):
        raise OptionError(f"{{task}} must be {' or '.join(TASKS)}, not {task!r}")
    if data is None:  # the project's prompts: their task's, judged by its rule
        task = task or "sql"
    model_path = model_dir(model_path)
    check_path(out_dir, "{out_dir}", OptionError, "give a directory for the results")
    out_dir = Path(out_dir)
    if adapters is not None:
        adapters = check_adapters(model_path, adapters)
    check_switch("chat_template", chat_template)
    check_system_prompt(system_prompt, chat_template)
    check_out_dir(out_dir, overwrite)
    test = prompts_file(data, say) if data is not None else project_data(task) / TEST_FILE
    if not test.is_file():
        raise FileNotFoundError(f"{test}: no test data (run scripts/make_data.py)")
    tok = load_tokenizer(model_path)
    if tok is None:
        raise FileNotFoundError(f"{model_path}: no tokenizer files (tokenizer.json ...): the benchmark "
                                "needs them to encode its prompts")
    config = read_model_config(model_path)
    limit = max_positions(config)
    # a bad row is said before the models load
    prompts, refs = read_prompts(test, tok, n, chat_template, config.get("vocab_size"), limit, say,
                                 system_prompt=system_prompt)
    # every method stops where the model's context ends (ours do; mlx-lm's would run on past it)
    budgets = [min(max_tokens, limit - len(p)) if limit else max_tokens for p in prompts]
    skipped = {}
    if methods is None:
        methods, skipped = build_methods(model_path, task or "sql", draft_path, adapters)
    load_before = os.getloadavg()[0]
    if load_before > BUSY_LOAD_PER_CORE * cores():
        say(f"the machine is busy (1-minute load average {load_before:.1f} on {_count(cores(), 'core')}); "
            "timings will be noisy, though the ratios between methods hold better")
    with terminate_cleanly():  # SIGTERM stops the run as Ctrl-C does: said, its bar closed
        time_methods(methods, prompts, budgets, repeats, clock, desc=f"bench {task or _data_name(test)}")
    results = summarize(methods, task, refs, tok.decode)
    meta = run_meta(
        command, load_average_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
        versions=_versions(), model=recorded_path(model_path), task=task, data=recorded_path(test),
        chat_template=chat_template, system_prompt=system_prompt,
        prompts=len(prompts), max_tokens=max_tokens, repeats=repeats, reference=reference(methods).name,
        bootstrap=BOOTSTRAP, skipped=skipped,
        node_cost=default_node_costs(), prune_threshold=PRUNE_THRESHOLD)
    meta = write_results(out_dir, meta, results, overwrite=overwrite)
    return {"meta": meta, "results": results}


def speed_summary(methods: list[Method]) -> list[dict]:
    """One speed record per method from its records: tokens per pass and per second, speed against
    :func:`reference` with its 95% interval (and whether it lies within ±10%), and for a method that
    ``reproduces`` another whether every output equals that one's (``identical_to_ar``,
    ``compared_with``); ``per_prompt`` keeps each prompt's best time, every run's time, tokens, passes."""
    ref, by_name = reference(methods), {m.name: m for m in methods}
    results = []
    for m in methods:
        ntok = int(_tokens(m).sum())
        ratio, lo, hi = speedup(m, ref)
        rec = {
            "method": m.name,
            "mean_accepted_tokens": round(ntok / max(sum(r["calls"] for r in m.records), 1), 3),
            "tokens_per_s": round(ntok / _times(m).sum(), 2),
            "speedup": round(ratio, 3),
            "speedup_ci95": [round(lo, 3), round(hi, 3)],
            "generated_tokens": ntok,
        }
        enough = m is ref or len(m.records) >= MIN_BOOTSTRAP_PROMPTS
        rec["interval_within_10pct"] = interval_ok(rec) and enough
        if m.reproduces:
            same = _same(m, by_name[m.reproduces])
            rec["identical_to_ar"], rec["compared_with"] = all(same), m.reproduces
            rec["identical_prompts"] = f"{sum(same)}/{len(same)}"
        rec["per_prompt"] = [{"best_s": round(r["time"], 6), "times_s": [round(t, 6) for t in r["times"]],
                              "tokens": len(r["tokens"]), "calls": r["calls"]} for r in m.records]
        results.append(rec)
    return results


def summarize(methods: list[Method], task: str, refs: list[str],
              decode: Callable[[list[int]], str]) -> list[dict]:
    """:func:`speed_summary` of each method with its task metrics, extra parameters and peak memory."""
    return [{**rec, **task_metrics(task, [decode(r["tokens"]) for r in m.records], refs),
             "extra_params": m.extra_params,
             "peak_memory_mb": round(max(r["peak"] for r in m.records) / 2**20, 1)}
            for m, rec in zip(methods, speed_summary(methods))]


def _versions() -> dict[str, str]:
    """Versions of the packages whose code is timed."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("mlx", "mlx-lm", "mlx-specstream", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def _count(n: int, noun: str) -> str:
    """``1 prompt``, ``8 prompts``."""
    return f"{n} {noun}{'s' * (n != 1)}"


def _subject(meta: dict) -> str:
    """What a run timed: its task and its prompts' file (runs before 2026-11-28 recorded the task
    alone; a user's data has no task)."""
    return ", ".join(f"{said} {meta[key]}" for key, said in (("task", "task"), ("data", "prompts"))
                     if meta.get(key))


def _through_template(meta: dict) -> str:
    """How the prompts were sent, where the chat template wrapped them."""
    if not meta.get("chat_template"):
        return ""
    system = meta.get("system_prompt")
    return " through the chat template" + (f" (system prompt {json.dumps(system)})" if system else "")


def results_markdown(meta: dict, results: list[dict]) -> str:
    """``results.md``: the run in one line, the table, the warnings and what was skipped."""
    keys = ["method", "mean_accepted_tokens", "tokens_per_s", "speedup", "95% interval", "exact_match"]
    if any("edit_similarity" in r for r in results):
        keys.append("edit_similarity")
    keys += ["extra_params", "peak_memory_mb", "identical_to_ar"]
    device = "" if meta.get("device", "cpu") == "cpu" else f"{meta['device']}, "
    versions = meta.get("versions", {})
    ran_in = f" (in {meta['cwd']})" if meta.get("cwd", ".") != "." else ""  # where the command runs again
    lines = [f"`{meta['command']}`{ran_in} — {meta['date']}; {_subject(meta)}, model {meta.get('model')}; "
             f"{meta.get('processor')}, {meta['machine']}, {device}MLX {meta['mlx']}, "
             f"mlx-lm {versions.get('mlx-lm', '?')}, BLAS {meta['blas']}, {meta.get('cpus')} CPUs (load "
             f"before/after: {meta.get('load_average_1m')}); source {meta.get('commit')}; "
             f"{_count(meta['prompts'], 'prompt')}{_through_template(meta)}, "
             f"max {meta['max_tokens']} tokens, "
             f"{'best of ' * (meta['repeats'] != 1)}{_count(meta['repeats'], 'run')} per prompt; "
             f"speed-up against `{meta['reference']}` (the fastest plain AR decoder of the run whose "
             "outputs equal ours)",
             ""]
    cells = []
    for r in results:
        lo, hi = r["speedup_ci95"]
        cell = {k: r.get(k, "") for k in keys}
        cell["95% interval"] = f"{lo:.2f}–{hi:.2f}" + ("" if r["interval_within_10pct"] else " ⚠")
        if r.get("compared_with", "ar") != "ar":  # another model's AR output (a tuned adapter's)
            cell["identical_to_ar"] = f"{r['identical_to_ar']} (to {r['compared_with']})"
        cells.append(cell)
    lines.append(markdown_table({k: k for k in keys}, cells))
    flagged = [r["method"] for r in results if not r["interval_within_10pct"]]
    if flagged and meta["prompts"] < MIN_BOOTSTRAP_PROMPTS:
        lines.append(f"\n⚠ 95% interval over fewer than {MIN_BOOTSTRAP_PROMPTS} prompts, which bounds "
                     f"nothing: {', '.join(flagged)} (more prompts, --n, give an interval)")
    elif flagged:
        lines.append(f"\n⚠ 95% interval wider than ±{MAX_HALF_WIDTH:.0%} of the speed-up: "
                     f"{', '.join(flagged)} (more prompts, --n, or runs, --repeats, narrow it)")
    for name, why in meta["skipped"].items():
        lines.append(f"\nSkipped {name}: {why}")
    lines.append(LEGEND)
    return "\n".join(lines) + "\n"


LEGEND = """
- mean_accepted_tokens: generated tokens (EOS not counted) per forward pass, the prompt's pass
  included, so plain AR reads just under 1.
- speedup: the method's tokens per second over the reference's, each from the summed fastest runs
  of its prompts; 95% interval: a bootstrap over the prompts (⚠: not within ±10%, or too few prompts to say).
- identical_to_ar: every output the same as plain AR's (or the named decoder's); blank where the
  method is not lossless."""


def write_results(out_dir: Path, meta: dict, results: list[dict], *, overwrite: bool) -> dict:
    """``results.json``, ``results.md`` and ``results.png`` (with matplotlib), written together
    (:func:`~mlx_specstream.outputs.write_files_atomic`: an interrupted or failed write leaves the
    earlier set, and no folder it made); ``results.json`` records the others' sha256, by which a
    later ``--overwrite`` knows them for this project's (:func:`is_our_result`). What is there is
    judged again as the files go in place (:func:`check_out_dir` ran before the run, which may
    take minutes). Returns the meta written."""
    files = {"results.md": results_markdown(meta, results).encode()}
    png = results_plot(meta, results)
    if png is not None:
        files["results.png"] = png
    meta = {**meta, "files": {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}}
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    created = make_parents(out_dir)
    try:  # an earlier run's plot goes with the rest of its set
        write_files_atomic(out_dir, {"results.json": results_text(meta, results).encode(), **files},
                           remove=[n for n in RESULT_FILES if n not in files and n != "results.json"],
                           check=lambda path: check_replaceable_file(path, overwrite, is_our_result))
    except BaseException:
        remove_empty(created)
        raise
    return meta


def results_plot(meta: dict, results: list[dict]) -> bytes | None:
    """The PNG of ``results``: speed-ups with their intervals, tokens per pass (None without
    matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["method"] for r in results]
    speed = np.array([r["speedup"] for r in results])
    err = np.abs(np.array([r["speedup_ci95"] for r in results]).T - speed)  # rows: below, above
    axes[0].barh(names, speed, xerr=err.tolist(), color="tab:blue", ecolor="black", capsize=3)
    axes[0].axvline(1.0, color="gray", lw=1)
    axes[0].set_xlabel(f"speed-up vs {meta['reference']} (same run, 95% interval)")
    axes[1].barh(names, [r["mean_accepted_tokens"] for r in results], color="tab:green")
    axes[1].set_xlabel("mean tokens per forward pass")
    for ax in axes:
        ax.invert_yaxis()
    said = [f"model {model_name(str(meta.get('model')))}", _subject(meta), _count(meta["prompts"], "prompt")]
    lines = ["; ".join(filter(None, said)),
             f"{meta['date']}, {meta.get('processor')}, BLAS {meta['blas']}"]
    fig.suptitle("\n".join(textwrap.fill(line, 120) for line in lines), fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()
