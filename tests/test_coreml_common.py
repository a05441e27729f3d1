"""Shared harness of the Core ML tests: record the MLX engine's forward passes, replay them
through the torch graph or a saved package, and compare (no tests in this file)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from mlx_specstream import runner
from mlx_specstream.coreml_driver import commit_inputs, prefill_chunks, tree_inputs
from mlx_specstream.engine import DecodeOptions, Decoder
from mlx_specstream.kv_cache import KVCache
from mlx_specstream.runner import MLXRunner
from mlx_specstream.tree import chain


class Fp16KVCache(KVCache):
    """The engine's cache with keys/values rounded to fp16, as a Core ML state holds them."""

    def append(self, k, v):
        return super().append(k.astype(mx.float16).astype(k.dtype), v.astype(mx.float16).astype(v.dtype))


@contextlib.contextmanager
def fp16_kv():
    """Make the MLX engine store its KV cache in fp16 (values), like the package's state."""
    orig = runner.make_cache
    runner.make_cache = lambda model: [Fp16KVCache() for _ in model.layers]
    try:
        yield
    finally:
        runner.make_cache = orig


@dataclass
class Recording:
    tokens: list[int]
    passes: list[dict] = field(default_factory=list)  # tree, n, out, path


def record_engine(model, prompt, *, max_tokens=24, tree_budget=16, fp16_state=False, **opts) -> Recording:
    """Run the MLX ``Decoder`` (streams="tree") and record every forward pass and commit."""
    rec = Recording([])
    orig_forward, orig_commit = runner.forward, MLXRunner.commit

    def forward(model, tree, caches, n, **kw):
        out = orig_forward(model, tree, caches, n, **kw)
        rec.passes.append({"tree": tree, "n": n, "out": out})
        return out

    def commit(self, path):
        rec.passes[-1]["path"] = list(path)
        return orig_commit(self, path)

    runner.forward, MLXRunner.commit = forward, commit
    try:
        with fp16_kv() if fp16_state else contextlib.nullcontext():
            dec = Decoder(model, list(prompt), DecodeOptions(max_tokens=max_tokens, tree_budget=tree_budget,
                                                             streams="tree", **opts))
            rec.tokens = [t for s in dec.steps() for t in s.tokens]
    finally:
        runner.forward, MLXRunner.commit = orig_forward, orig_commit
    return rec


def replay(run, rec: Recording, prompt, *, tree_size, chunk, context, accept_max, logits=True) -> dict:
    """Feed the recorded passes to ``run(function, inputs) -> outputs`` (a package or the torch
    graph) and compare with the engine's outputs. Returns the largest errors seen."""
    prompt = list(prompt)
    first = rec.passes[0]["out"]
    err = {"prefill": 0.0, "main": 0.0, "stream": 0.0, "steps": 0}
    for inputs in prefill_chunks(prompt[:-1], chunk, context):
        out = run("prefill", inputs)
        last = int(inputs["start"][0] + inputs["length"][0] - 1)
        ref = np.array(first.main_logits[last].astype(mx.float32))
        if "main_logits" in out:
            err["prefill"] = max(err["prefill"], float(np.abs(out["main_logits"][0] - ref).max()))
        if np.sort(ref)[-1] - np.sort(ref)[-2] > 1e-3:
            assert int(out["main_token"][0]) == int(ref.argmax())
    steps = [(chain([prompt[-1]]), len(prompt) - 1, None)] + [(p["tree"], p["n"], p) for p in rec.passes[1:]]
    prev: list[int] = []
    for k, (tree, n, p) in enumerate(steps):
        out = run("step", {**tree_inputs(tree, n, tree_size), **commit_inputs(prev, accept_max)})
        if k == 0:
            ro, kept = first, np.array([0])
            ref_main = np.array(ro.main_logits[-1:].astype(mx.float32))
            ref_streams = _np(ro.stream_logits)
            prev = [0]
        else:
            ro, kept = p["out"], p["out"].kept
            got_kept = np.nonzero(out["node_kept"][: len(tree)])[0]
            assert np.array_equal(got_kept, kept), f"step {k}: kept {got_kept} vs engine {kept}"
            ref_main = np.array(ro.main_logits.astype(mx.float32))
            ref_streams = _np(ro.stream_logits)
            prev = [int(i) for i in kept[p["path"]]]
        if logits:
            err["main"] = max(err["main"], float(np.abs(out["main_logits"][kept] - ref_main).max()))
            if ref_streams is not None:
                diff = np.abs(out["stream_logits"][kept] - ref_streams).max()
                err["stream"] = max(err["stream"], float(diff))
        clear = _margins(ref_main) > 1e-3
        assert np.array_equal(out["main_token"][kept][clear], ref_main.argmax(-1)[clear]), f"step {k}"
        if ref_streams is not None:
            branch = out["stream_tokens"].shape[-1]
            top = np.argsort(-ref_streams, axis=-1, kind="stable")[..., :branch]
            got = out["stream_tokens"][kept][:, : ref_streams.shape[1]]
            # candidates closer than 1e-2 in logit may swap ranks (fp16 keys and values; 2e-3 seen)
            clear_ranks = _rank_margins(ref_streams, branch) > 1e-2
            assert np.array_equal(got[clear_ranks], top[clear_ranks]), f"step {k}: stream top-k differ"
        err["steps"] += 1
    return err


def _np(a):
    return None if a is None else np.array(a.astype(mx.float32))


def _margins(logits: np.ndarray) -> np.ndarray:
    s = np.sort(logits, axis=-1)
    return s[..., -1] - s[..., -2]


def _rank_margins(logits: np.ndarray, k: int) -> np.ndarray:
    """(..., k): how far the r-th largest logit stands from its neighbours in rank (the smaller
    gap), for the top ``k``: a candidate whose rank a small error cannot change has a margin."""
    s = -np.sort(-logits, axis=-1)[..., : k + 1]
    below = s[..., :-1] - s[..., 1:]
    above = np.concatenate([np.full(below[..., :1].shape, np.inf), below[..., :-1]], axis=-1)
    return np.minimum(below, above)


def torch_runner(graph):
    """``run(function, inputs)`` over a :class:`SpecStreamGraph` (fp32 cache for parity)."""
    import torch

    from mlx_specstream.convert.torch_graph import (
        PREFILL_INPUTS,
        STEP_INPUTS,
        prefill_output_names,
        step_output_names,
    )

    def run(function, inputs):
        graph.mode = function
        names = PREFILL_INPUTS if function == "prefill" else STEP_INPUTS
        outs = prefill_output_names(graph.gc) if function == "prefill" else step_output_names(graph.gc)
        with torch.no_grad():
            res = graph(*[torch.from_numpy(np.asarray(inputs[n])) for n in names])
        return {k: v.numpy() for k, v in zip(outs, res)}

    return run


def first_difference(a, b) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a),
                                                                                                         len(b)))


WORDS = ["<unk>", "</s>"] + [f"w{i}" for i in range(62)]


def write_tokenizer(path, vocab_size: int = 64) -> None:
    """A tiny word-level ``tokenizer.json`` (ids 0..vocab_size-1; ``</s>`` is EOS)."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS[:vocab_size])}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "unk_token": "<unk>"}))
