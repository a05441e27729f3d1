"""Self-distillation: the base model's own greedy continuations of the training prompts, which is
what verification accepts, so a lossless adapter's streams learn them instead of the data."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np

from .data import Dataset, Example
from .outputs import write_text_atomic
from .tokenizer import eos_ids


def distill_budget(e: Example, max_seq_len: int, distill_tokens: int) -> int:
    """Tokens the base may write for ``e``: as many as its completion has, or ``distill_tokens``
    for a prompt given alone (an empty completion holds only EOS); within ``max_seq_len``."""
    want = e.n_targets if e.n_targets > 1 else distill_tokens
    return max(1, min(want, max_seq_len - e.n_prompt))


def _gathered(group, rows: dict[int, list[int]], n: int, width: int) -> dict[int, list[int]]:
    """Every process's ``rows`` (example index -> tokens, at most ``width - 1``; each index held by
    one process at most), on every process: one table summed over the processes, a row's first
    column its length + 1."""
    table = np.zeros((n, width), np.int32)
    for i, c in rows.items():  # each row is written by one process: the sum is that row
        table[i, 0], table[i, 1: len(c) + 1] = len(c) + 1, c  # (0: no row)
    table = np.array(group.all_sum(mx.array(table)))
    return {int(i): table[i, 1: table[i, 0]].tolist() for i in np.flatnonzero(table[:, 0])}


def distill_dataset(model, dataset: Dataset, tokenizer, max_seq_len: int, distill_tokens: int = 64, *,
                    key: dict | None = None, indices: list[int] | None = None, cache: Path | None = None,
                    group=None, desc: str = "self-distill", progress: bool = True, say=None) -> Dataset:
    """The dataset with the completions of ``indices`` (default: all) replaced by the base model's
    own greedy continuations of their prompts (:func:`distill_budget` tokens, up to EOS), decoded
    in batches; the other examples are left as given (a run visits only them).

    With ``cache`` (a JSON-lines file), each finished batch is appended to it, and continuations
    it already holds are reused, by an interrupted run resumed or a longer run of the same data:
    its first line is a digest of ``key`` (the base model, settings), the prompts and the budgets.
    With several processes (``group``) the first reads and writes the cache, the others take what it
    read (under ``mlx.launch`` another machine's disk may hold none), and the batches are shared
    out and gathered.
    """
    from tqdm import tqdm

    from .batch import greedy_batches

    rank, size = (group.rank(), group.size()) if group is not None else (0, 1)
    eos = eos_ids(tokenizer)
    prompts = [e.tokens[: e.n_prompt] for e in dataset.examples]
    budgets = [distill_budget(e, max_seq_len, distill_tokens) for e in dataset.examples]
    digest = hashlib.sha256(json.dumps([key, prompts, budgets]).encode()).hexdigest()
    done: dict[int, list[int]] = {}
    torn = False
    if cache is not None and rank == 0 and cache.is_file():
        lines = cache.read_text().splitlines()
        if lines and lines[0] == digest:
            for line in lines[1:]:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # the last line of an interrupted run
                    torn = True
                    break
                done[row["i"]] = row["completion"]
    width = max(budgets, default=0) + 1  # a row of the tables below: length, tokens
    # what the first process read, on every process (where it read any: a fresh run's is none)
    if size > 1 and cache is not None and group.all_sum(mx.array([len(done)])).item():
        done = _gathered(group, done, len(prompts), width)
    write = cache is not None and rank == 0
    if write and (torn or not done):  # rows appended after a torn line would never be read
        cache.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cache, digest + "\n" + "".join(json.dumps({"i": i, "completion": c}) + "\n"
                                                         for i, c in done.items()))
    wanted = range(len(prompts)) if indices is None else indices
    todo = [i for i in wanted if i not in done]
    if todo and say is not None:
        said = [f"{len(wanted) - len(todo)} reused from {cache}"] if len(todo) < len(wanted) else []
        if len(wanted) < len(prompts):
            said.append(f"of {len(prompts)} examples, the run reaches {len(wanted)}")
        say(f"{desc}: the base model writes its own continuations of {len(todo)} prompts"
            + (f" ({'; '.join(said)})" if said else ""))
    batch = 16
    mine = [i for k in range(rank * batch, len(todo), size * batch) for i in todo[k: k + batch]]
    fresh: dict[int, list[int]] = {}

    def keep(rows: list[tuple[int, list[int]]]) -> None:
        fresh.update(rows)
        if write:
            with cache.open("a") as f:
                f.write("".join(json.dumps({"i": i, "completion": c}) + "\n" for i, c in rows))

    shown = desc + (f" (process 0's share, of {size})" if size > 1 else "")  # its own bar
    with tqdm(total=sum(budgets[i] for i in mine), desc=shown, unit="tok", leave=False,  # closed on Ctrl-C
              disable=not progress or rank != 0 or not mine) as bar:  # no empty bar where all is reused
        for ids, outs in greedy_batches(model, [prompts[i] for i in mine], [budgets[i] for i in mine],
                                        eos, batch):
            keep([(mine[j], out) for j, out in zip(ids, outs)])
            bar.update(sum(budgets[mine[j]] for j in ids))
    if size > 1:  # gather every process's continuations
        gathered = _gathered(group, fresh, len(prompts), width)
        keep([(i, gathered[i]) for i in todo if i not in fresh])
    done.update(fresh)
    wanted = set(wanted)
    examples = [replace(e, tokens=prompts[i] + done[i]) if i in wanted else e
                for i, e in enumerate(dataset.examples)]
    out = replace(dataset, examples=examples, notes=list(dataset.notes))
    if wanted:
        out.notes.append(f"{desc}: completions replaced by the base model's greedy continuations")
    return out

