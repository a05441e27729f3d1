"""Decoding with an exported Core ML package (``specstream-mlx convert --to coreml``).

:class:`PackageRunner` is a :class:`~mlx_specstream.runner.Runner`: the engine's own decode loop
(:class:`mlx_specstream.engine.Decoder`: drafting from the streams and prompt lookup, the tree,
verification, sampling, statistics; stop strings through :func:`mlx_specstream.api.responses`)
runs with the package doing the forward passes.
``start`` prefills the prompt but its last token in chunks and runs the last prompt token as a
one-node tree; ``step`` flattens a tree to the package's fixed size and runs the package's
``step``, which first commits the previous accepted path inside the model (streams on every node,
pruning in place, ``node_kept``); greedy drafts read its top-``branch`` stream tokens, sampling its
stream logits.

The package runs on Core ML through coremltools on macOS 15+, and on the reference evaluator
(:mod:`mlx_specstream.convert.mil_eval`, numpy, slow) everywhere else; :attr:`PackageRunner.backend`
says which.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .adapter import AdapterConfig
from .api import MLX_LM_NAMES, GenerationResult, StreamResponse, generate, stream_generate
from .errors import PackageError, check_keywords
from .ngrams import NGRAMS_FILE, NgramTable
from .runner import Runner
from .tree import Tree, ancestors, chain, reorder


@dataclass
class PackageInfo:
    """The settings an exported package records in its user metadata."""

    gamma: int
    msa_layers: int
    branch: int
    tree_size: int
    accept_max: int
    context: int
    chunk: int
    vocab_size: int
    sampling: bool
    mode: str
    adapter: str
    tokenizer: str
    eos_token_ids: frozenset[int]
    precision: str
    q_bits: int
    max_positions: int = 0  # the model's own limit (0: not recorded, packages before it was)

    @classmethod
    def from_metadata(cls, meta: dict[str, str], path: Path) -> PackageInfo:
        if meta.get("specstream.format") is None:
            raise PackageError(f"{path}: not a Speculative Streaming package (no specstream metadata)")
        try:
            return cls(
                gamma=int(meta["specstream.gamma"]), msa_layers=int(meta["specstream.msa_layers"]),
                branch=int(meta["specstream.branch"]), tree_size=int(meta["specstream.tree_size"]),
                accept_max=int(meta["specstream.accept_max"]), context=int(meta["specstream.context"]),
                chunk=int(meta["specstream.chunk"]), vocab_size=int(meta["specstream.vocab_size"]),
                sampling=meta.get("specstream.sampling") == "1", mode=meta.get("specstream.mode", ""),
                adapter=meta.get("specstream.adapter", ""), tokenizer=meta.get("specstream.tokenizer", ""),
                eos_token_ids=frozenset(json.loads(meta.get("specstream.eos_token_ids", "[]"))),
                precision=meta.get("specstream.precision", ""), q_bits=int(meta.get("specstream.q_bits", 0)),
                max_positions=int(meta.get("specstream.max_positions", 0)))
        except (KeyError, ValueError) as e:
            raise PackageError(f"{path}: incomplete specstream metadata ({e})") from None

    @property
    def _slots_hold(self) -> int:
        """Tokens the cache slots hold: less a step's tree, whose first node and accepted path's
        end (2) are tokens of the text."""
        return self.context - self.tree_size + 2

    @property
    def holds(self) -> int:
        """Tokens of prompt and text the package holds: what its slots hold, at most the model's
        own context (the MLX engine's limit)."""
        return min(self._slots_hold, self.max_positions or self._slots_hold)

    @property
    def holds_said(self) -> str:
        """Where :attr:`holds` comes from, as messages say it."""
        if self.holds < self._slots_hold:
            return "the model's context"
        return (f"the package's context ({self.context} cache slots, less a step's tree of "
                f"{self.tree_size}, plus 2)")

    @property
    def said(self) -> str:
        """What ``generate --verbose`` says of the package: its adapter and weights."""
        adapter = (f"adapter {self.adapter or '(unnamed)'} ({self.mode}, γ = {self.gamma})" if self.gamma
                   else "no adapter: the base model")
        weights = f"int{self.q_bits} weights, " if self.q_bits else ""
        return (f"{adapter}; {weights}{self.precision or 'float16'} compute, a tree of {self.tree_size} "
                "nodes a step")


def core_ml_available() -> bool:
    """True where coremltools can run predictions (macOS with its native library)."""
    if platform.system() != "Darwin":
        return False
    try:
        from coremltools import libcoremlpython  # noqa: F401
    except Exception:
        return False
    return True


class PackageRunner(Runner):
    """Calls the package's ``prefill`` and ``step`` functions on one KV-cache state; the decode
    loop's runner for one generation at a time.

    ``backend``: "coreml" (macOS), "reference" (the numpy evaluator) or "auto".
    ``compute_units`` (Core ML only): "cpu_and_gpu" (default), "cpu_only", "all",
    "cpu_and_ne" — the Neural Engine is offered but fragile with states and blockwise int4.

    Fixed at export: the adapter, its streams and pruning, ``tree_size`` nodes per step (the
    tree budget's bound), top-``branch`` stream tokens, and ``accept_max``, the longest path a
    step can commit (so drafts, prompt-lookup chains included, are at most ``accept_max - 1``
    deep). A step writes ``tree_size`` cache slots after the ``n`` committed ones, so the context
    holds ``context - tree_size + 2`` tokens (the last root is never cached).
    """

    def __init__(self, path: str | Path, backend: str = "auto", compute_units: str = "cpu_and_gpu"):
        self.path = Path(path)
        if not (self.path / "Manifest.json").is_file():
            said = "not an .mlpackage (no Manifest.json)" if self.path.exists() else "no such .mlpackage"
            raise PackageError(f"{self.path}: {said}")
        if backend == "auto":
            backend = "coreml" if core_ml_available() else "reference"
        if backend not in ("coreml", "reference"):
            raise PackageError(f"backend must be 'coreml', 'reference' or 'auto', not '{backend}'")
        if backend == "coreml" and not core_ml_available():
            raise PackageError("backend 'coreml' runs packages on macOS (coremltools' native library); here "
                               "'reference' (the package evaluator) or 'auto'")
        self.backend = backend
        from .convert.mil_eval import Package, coremltools, read_metadata

        if backend == "reference":
            self._pkg = Package(self.path)
            self.metadata = self._pkg.metadata
        else:
            ct = coremltools("running a Core ML package")

            units = {"cpu_and_gpu": ct.ComputeUnit.CPU_AND_GPU, "cpu_only": ct.ComputeUnit.CPU_ONLY,
                     "all": ct.ComputeUnit.ALL, "cpu_and_ne": ct.ComputeUnit.CPU_AND_NE}
            if compute_units not in units:
                raise PackageError(f"compute units must be one of {', '.join(units)}")
            self.metadata = read_metadata(self.path)
            self._models = {f: ct.models.MLModel(str(self.path), function_name=f,
                                                 compute_units=units[compute_units])
                            for f in ("prefill", "step")}
        self.info = info = PackageInfo.from_metadata(self.metadata, self.path)
        if info.gamma:
            self.adapter_config = AdapterConfig(mode=info.mode, gamma=info.gamma, msa_layers=info.msa_layers,
                                                branch=info.branch, tree_budget=info.tree_size)
        self.limit, self.limit_source = info.holds, info.holds_said
        self.vocab_size, self.eos_token_ids = info.vocab_size, info.eos_token_ids
        self.tree_size, self.max_depth = info.tree_size, info.accept_max - 1
        self.node_costs = {"tree": 0.0}  # a step costs the same at any tree size (padded)
        self.reset()

    def reset(self) -> None:
        """A fresh (zeroed) KV-cache state."""
        if self.backend == "reference":
            self.state = self._pkg.new_state()
        else:  # states are shared by the functions of one package (same declarations)
            self.state = self._models["step"].make_state()

    def __call__(self, function: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.backend == "reference":
            return self._pkg.predict(inputs, self.state, function=function)
        out = self._models[function].predict(inputs, state=self.state)
        return {k: np.asarray(v) for k, v in out.items()}

    @property
    def description(self) -> str:
        if self.backend == "coreml":
            return "Core ML (coremltools)"
        return "the reference evaluator (numpy; Core ML needs macOS 15+)"

    # -- the decode loop's runner ---------------------------------------------------------------
    def check(self, temperature: float, branch: int | None, tree_budget: int | None,
              prune_threshold: float | None) -> None:
        info = self.info
        if temperature > 0 and not info.sampling:
            raise PackageError("this package was exported for greedy decoding only "
                               "(export with --sampling for --temp > 0)")
        if branch is not None and branch > info.branch:
            raise PackageError(f"branch {branch}: the package drafts at most {info.branch} tokens per stream")
        if tree_budget is not None and tree_budget > info.tree_size:
            raise PackageError(f"tree budget {tree_budget}: the package runs trees of at most "
                               f"{info.tree_size} nodes")
        if prune_threshold is not None:
            raise PackageError("a package prunes with the threshold it was exported with")

    def start(self, prompt: list[int], gamma: int, deferred: bool) -> None:
        self.reset()
        self.gamma = gamma
        for inputs in prefill_chunks(prompt[:-1], self.info.chunk, self.info.context):
            self("prefill", inputs)
        self.n, self._pending = len(prompt) - 1, []
        self.step(chain(prompt[-1:]), 0.0)
        self.commit([0])

    def step(self, tree: Tree, prune_threshold: float) -> Tree:
        """The package prunes as exported (``prune_threshold`` is the engine's, unused)."""
        inputs = {**tree_inputs(tree, self.n, self.info.tree_size),
                  **commit_inputs(self._pending, self.info.accept_max)}
        self._out = self("step", inputs)
        kept = np.nonzero(self._out["node_kept"][: len(tree)])[0]
        if len(kept) == 0 or kept[0] != 0:
            raise PackageError("the package pruned the root of a tree (corrupt outputs?)")
        self._kept = kept
        return reorder(tree, kept) if len(kept) < len(tree) else tree

    def commit(self, path: list[int]) -> None:
        """Held until the next ``step``, which commits it inside the package."""
        self._pending = self._kept[path].tolist()
        self.n += len(path)

    def main_tokens(self) -> np.ndarray:
        return self._out["main_token"][self._kept]

    def main_logits(self) -> np.ndarray:
        return self._out["main_logits"][self._kept].astype(np.float32)

    def stream_topk(self, node: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        v = self._kept[node]
        return (self._out["stream_tokens"][v, : self.gamma, :k],
                self._out["stream_logprobs"][v, : self.gamma, :k].astype(np.float64))

    def stream_logits(self, node: int) -> np.ndarray:
        return self._out["stream_logits"][self._kept[node], : self.gamma].astype(np.float32)


# -- fixed-size inputs -----------------------------------------------------------------------
def tree_inputs(tree: Tree, n: int, size: int) -> dict[str, np.ndarray]:
    """The ``step`` inputs of a tree at cache length ``n``, padded to ``size`` nodes."""
    m = len(tree)
    if m > size:
        raise PackageError(f"a tree of {m} nodes does not fit the package's tree size {size}")
    tokens = np.zeros(size, np.int32)
    tokens[:m] = tree.tokens
    positions = np.full(size, n, np.int32)
    positions[:m] = n + np.asarray(tree.depths)
    mask = np.zeros((size, size), np.int32)
    mask[:m, :m] = ancestors(np.asarray(tree.parents))
    valid = np.zeros(size, np.int32)
    valid[:m] = 1
    return {"tokens": tokens, "positions": positions, "tree_mask": mask, "valid": valid}


def commit_inputs(path: list[int], size: int) -> dict[str, np.ndarray]:
    """The previous step's accepted path (node indices), padded to ``size``."""
    if len(path) > size:
        raise PackageError(f"an accepted path of {len(path)} nodes exceeds the package's {size}")
    accepted = np.zeros(size, np.int32)
    accepted[: len(path)] = path
    return {"accepted": accepted, "n_accepted": np.array([len(path)], np.int32)}


def prefill_chunks(tokens: list[int], chunk: int, context: int) -> Iterator[dict[str, np.ndarray]]:
    """``prefill`` inputs covering ``tokens`` at positions 0..; a final chunk that would run past
    the context is moved back (it rewrites some cached rows with the same values)."""
    s = 0
    while s < len(tokens):
        end = min(s + chunk, len(tokens))
        start = s if s + chunk <= context else max(0, end - chunk)
        part = tokens[start:end]
        buf = np.zeros(chunk, np.int32)
        buf[: len(part)] = part
        yield {"tokens": buf, "start": np.array([start], np.int32), "length": np.array([len(part)], np.int32)}
        s = end


def load_package(path: str | Path, backend: str = "auto", compute_units: str = "cpu_and_gpu"):
    """``(runner, tokenizer)`` for a package; the tokenizer (None if absent) and the adapter's
    n-gram drafts come from the ``NAME.tokenizer`` directory beside ``NAME.mlpackage`` (or, for a
    package renamed alone, the directory named when it was written)."""
    from .convert.coreml_export import tokenizer_dir
    from .tokenizer import load_tokenizer

    runner = PackageRunner(path, backend, compute_units)
    tok = None
    if runner.info.tokenizer:
        path = Path(path)
        tried = [tokenizer_dir(path)] if path.name.endswith(".mlpackage") else []
        tok_dir = next((d for d in (*tried, path.parent / runner.info.tokenizer) if d.is_dir()), None)
        if tok_dir is not None:
            tok = load_tokenizer(tok_dir)
            if tok is None:
                raise PackageError(f"{tok_dir}: holds no tokenizer files (tokenizer.json, ...): export the "
                                   "package again")
            if (tok_dir / NGRAMS_FILE).is_file():  # the exported adapter's n-gram drafts
                try:
                    runner.ngrams = NgramTable.load(tok_dir / NGRAMS_FILE)
                except ValueError as e:
                    raise PackageError(str(e)) from None
    return runner, tok


# the options of api.stream_generate a package serves: its adapter, streams and pruning are fixed
PACKAGE_OPTIONS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "mode", "branch",
                   "tree_budget", "lookup", "ngrams", "sql_names", "constraint", "logprobs")
FIXED_AT_EXPORT = {name: "fixed when the package was exported" for name in
                   ("gamma", "prune_threshold", "streams", "node_cost")}


def _package_options(caller: str, runner: PackageRunner, tokenizer, prompt, options: dict) -> dict:
    """``options`` checked against what the package serves; ``mode="ss"`` is ``"ar"`` on a
    package without streams."""
    check_keywords(caller, options, PACKAGE_OPTIONS, {**MLX_LM_NAMES, **FIXED_AT_EXPORT})
    if isinstance(prompt, str) and tokenizer is None:
        raise PackageError(f"{runner.path}: no tokenizer beside the package; pass token ids")
    if (options.get("sql_names") or options.get("constraint") is not None
            or options.get("logprobs") is not None) and not runner.info.sampling:
        # a constraint and log-probabilities read the logits
        raise PackageError("this package was exported for greedy decoding only (export with "
                           "--sampling for --sql-names, --tool-choice, a constraint or logprobs)")
    if options.get("mode", "ss") == "ss" and not runner.info.gamma:
        options = {**options, "mode": "ar"}
    return options


def stream_package(runner: PackageRunner, tokenizer, prompt, *, stop: str | list[str] | None = None,
                   **options) -> Iterator[StreamResponse]:
    """:func:`api.stream_generate` over a package: per package call, the tokens accepted and their
    text; ``prompt`` is text or token ids; the options of :data:`PACKAGE_OPTIONS`."""
    options = _package_options("stream_package", runner, tokenizer, prompt, options)
    return stream_generate(runner, tokenizer, prompt, stop=stop, **options)


def generate_package(runner: PackageRunner, tokenizer, prompt, *, stop: str | list[str] | None = None,
                     **options) -> GenerationResult:
    """:func:`api.generate` over a package (options as :func:`stream_package`)."""
    options = _package_options("generate_package", runner, tokenizer, prompt, options)
    return generate(runner, tokenizer, prompt, stop=stop, **options)


__all__ = ["PackageError", "PackageInfo", "PackageRunner",
           "commit_inputs", "core_ml_available", "generate_package", "load_package", "prefill_chunks",
           "stream_package", "tree_inputs"]
