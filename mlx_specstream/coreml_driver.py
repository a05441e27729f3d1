"""Host decode loop over an exported Core ML package (``specstream-mlx convert --to coreml``).

The same Speculative Streaming loop as :class:`mlx_specstream.engine.Decoder` with
``streams="tree"``, with the package doing the forward passes: prefill the prompt but its last
token in chunks, run the last prompt token as a one-node tree (its main stream gives the first
root, its streams the first draft), then repeat: build the draft tree (``tree.build_tree``),
flatten it to the package's fixed size, run ``step`` (which first commits the previous accepted
path inside the model), verify (``verify.verify_greedy`` / ``verify_sampling``) on the nodes that
survived pruning, emit, and draft again from the last accepted node's streams.

The package runs on Core ML through coremltools on macOS 15+, and on the reference evaluator
(:mod:`mlx_specstream.convert.mil_eval`, numpy, slow) everywhere else; :attr:`PackageRunner.backend`
says which.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .api import StreamResponse
from .engine import DecodeOptions, Decoder, Stats, Step
from .tree import Tree, ancestors, build_tree, chain, reorder
from .verify import probabilities, sample, verify_greedy, verify_sampling


class PackageError(ValueError):
    """Not a Speculative Streaming Core ML package, or a request it cannot serve."""


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
                precision=meta.get("specstream.precision", ""), q_bits=int(meta.get("specstream.q_bits", 0)))
        except (KeyError, ValueError) as e:
            raise PackageError(f"{path}: incomplete specstream metadata ({e})") from None


def core_ml_available() -> bool:
    """True where coremltools can run predictions (macOS with its native library)."""
    if platform.system() != "Darwin":
        return False
    try:
        from coremltools import libcoremlpython  # noqa: F401
    except Exception:
        return False
    return True


class PackageRunner:
    """Calls the package's ``prefill`` and ``step`` functions on one KV-cache state.

    ``backend``: "coreml" (macOS), "reference" (the numpy evaluator) or "auto".
    ``compute_units`` (Core ML only): "cpu_and_gpu" (default), "cpu_only", "all",
    "cpu_and_ne" — the Neural Engine is offered but fragile with states and blockwise int4.
    """

    def __init__(self, path: str | Path, backend: str = "auto", compute_units: str = "cpu_and_gpu"):
        self.path = Path(path)
        if not (self.path / "Manifest.json").is_file():
            raise PackageError(f"{self.path}: no such .mlpackage")
        if backend == "auto":
            backend = "coreml" if core_ml_available() else "reference"
        if backend not in ("coreml", "reference"):
            raise PackageError(f"backend must be 'coreml', 'reference' or 'auto', not '{backend}'")
        self.backend = backend
        from .convert.mil_eval import Package, read_metadata

        if backend == "reference":
            self._pkg = Package(self.path)
            self.metadata = self._pkg.metadata
        else:
            import coremltools as ct

            units = {"cpu_and_gpu": ct.ComputeUnit.CPU_AND_GPU, "cpu_only": ct.ComputeUnit.CPU_ONLY,
                     "all": ct.ComputeUnit.ALL, "cpu_and_ne": ct.ComputeUnit.CPU_AND_NE}
            if compute_units not in units:
                raise PackageError(f"compute units must be one of {', '.join(units)}")
            self.metadata = read_metadata(self.path)
            self._models = {f: ct.models.MLModel(str(self.path), function_name=f,
                                                 compute_units=units[compute_units])
                            for f in ("prefill", "step")}
        self.info = PackageInfo.from_metadata(self.metadata, self.path)
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


@dataclass
class _Draft:
    levels: list[list[int]]
    scores: list[list[float]]
    draws: list[list[int]]
    q: list[np.ndarray]


class PackageDecoder:
    """One generation over a package; iterate :meth:`steps` (yields engine ``Step`` objects)."""

    def __init__(self, runner: PackageRunner, prompt: list[int], opts: DecodeOptions):
        info = runner.info
        if not prompt:
            raise ValueError("the prompt is empty")
        if opts.temperature < 0 or not 0 < opts.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        if opts.temperature > 0 and not info.sampling:
            raise PackageError("this package was exported for greedy decoding only "
                               "(export with --sampling for --temp > 0)")
        if opts.mode not in ("ss", "ar"):
            raise ValueError(f"a Core ML package decodes with mode 'ss' or 'ar', not '{opts.mode}'")
        self.runner, self.info, self.opts = runner, info, opts
        self.prompt, self.limit = list(prompt), None  # the package checks its own context
        self.gamma = info.gamma if opts.mode == "ss" else 0
        self.branch = min(opts.branch or info.branch, info.branch)
        self.budget = min(opts.tree_budget or info.tree_size, info.tree_size)
        room = info.context - info.tree_size + 1
        if len(self.prompt) > room:
            raise PackageError(f"a prompt of {len(self.prompt)} tokens does not fit the package's context "
                               f"of {info.context} (at most {room} tokens)")
        self.rng = np.random.default_rng(opts.seed)
        self.stats = Stats(prompt_tokens=len(prompt))

    # -- pieces -------------------------------------------------------------------------------
    def _step(self, tree: Tree, n: int, prev_path: list[int]) -> dict[str, np.ndarray]:
        inputs = {**tree_inputs(tree, n, self.info.tree_size),
                  **commit_inputs(prev_path, self.info.accept_max)}
        return self.runner("step", inputs)

    def _target(self, out: dict, rows: np.ndarray) -> np.ndarray:
        if self.opts.temperature == 0:
            return out["main_token"][rows]
        return probabilities(out["main_logits"][rows].astype(np.float32), self.opts.temperature,
                             self.opts.top_p)

    def _draft(self, out: dict, node: int) -> _Draft:
        """Candidates per level from the streams of ``node`` (an index into the padded tree)."""
        if self.gamma == 0:
            return _Draft([], [], [], [])
        k = self.branch
        if self.opts.temperature == 0:
            ids = out["stream_tokens"][node, : self.gamma, :k]
            lps = out["stream_logprobs"][node, : self.gamma, :k].astype(np.float64)
            return _Draft(ids.tolist(), lps.tolist(), [], [])
        q = probabilities(out["stream_logits"][node, : self.gamma].astype(np.float32),
                          self.opts.temperature, self.opts.top_p)
        levels, scores, draws = [], [], []
        for j in range(self.gamma):
            d = [sample(q[j], self.rng) for _ in range(k)]
            uniq = list(dict.fromkeys(d))
            levels.append(uniq)
            scores.append([float(np.log(q[j][t])) for t in uniq])
            draws.append(d)
        return _Draft(levels, scores, draws, list(q))

    def _emit(self, tokens, accepted, rejected, emitted) -> Step:
        return Decoder._emit(self, tokens, accepted, rejected, emitted)

    # -- the loop -------------------------------------------------------------------------------
    def steps(self) -> Iterator[Step]:
        info, opts, stats = self.info, self.opts, self.stats
        self.runner.reset()
        t0 = time.perf_counter()
        prompt = self.prompt
        for inputs in prefill_chunks(prompt[:-1], info.chunk, info.context):
            self.runner("prefill", inputs)
        n = len(prompt) - 1
        out = self._step(chain([prompt[-1]]), n, [])
        target = self._target(out, np.array([0]))
        root = int(target[0]) if opts.temperature == 0 else sample(target[0], self.rng)
        draft = self._draft(out, 0)
        prev_path, n = [0], n
        stats.prefill_time = time.perf_counter() - t0
        stats.model_time = 0.0

        t_step = time.perf_counter()
        step = self._emit([root], [], [], 0)
        emitted = len(step.tokens)
        stats.decode_time += time.perf_counter() - t_step
        yield step
        while step.finished is None:
            t_step = time.perf_counter()
            n += len(prev_path)
            if n + info.tree_size > info.context:
                yield Step([], [], [], "length")
                return
            tree = build_tree(root, draft.levels, draft.scores, self.budget) if self.gamma else chain([root])
            t_model = time.perf_counter()
            out = self._step(tree, n, prev_path)
            stats.model_time += time.perf_counter() - t_model
            kept = np.nonzero(out["node_kept"][: len(tree)])[0]
            if len(kept) == 0 or kept[0] != 0:
                raise PackageError("the package pruned the root of a tree (corrupt outputs?)")
            pruned = reorder(tree, kept) if len(kept) < len(tree) else tree
            target = self._target(out, kept)
            if opts.temperature == 0:
                path, root = verify_greedy(pruned, target)
            else:
                path, root = verify_sampling(pruned, target, draft.draws, draft.q, self.rng)
            stats.calls += 1
            stats.tree_nodes += len(tree)
            stats.kept_nodes += len(pruned)
            stats.accepted_lengths[len(path)] += 1
            accepted = pruned.tokens[path[1:]].tolist()
            rejected = [lv[0] for lv in draft.levels[len(path) - 1:]] if draft.levels else []
            prev_path = kept[path].tolist()
            draft = self._draft(out, prev_path[-1])
            step = self._emit(accepted + [root], accepted, rejected, emitted)
            emitted += len(step.tokens)
            stats.decode_time += time.perf_counter() - t_step
            yield step


@dataclass
class PackageResult:
    tokens: list[int]
    text: str
    stats: Stats
    finish_reason: str | None
    backend: str


def load_package(path: str | Path, backend: str = "auto", compute_units: str = "cpu_and_gpu"):
    """``(runner, tokenizer)`` for a package; the tokenizer (None if absent) comes from the
    ``NAME.tokenizer`` directory written beside it."""
    from .tokenizer import load_tokenizer

    runner = PackageRunner(path, backend, compute_units)
    tok = None
    if runner.info.tokenizer:
        tok_dir = Path(path).parent / runner.info.tokenizer
        if tok_dir.is_dir():
            tok = load_tokenizer(tok_dir)
    return runner, tok


def stream_package(runner: PackageRunner, tokenizer, prompt, *, max_tokens: int = 256,
                   temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, mode: str = "ss",
                   branch: int | None = None, tree_budget: int | None = None) -> Iterator[StreamResponse]:
    """Yield, per package call, the tokens accepted and their text (as :func:`api.stream_generate`);
    ``prompt`` is text or token ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise PackageError(f"{runner.path}: no tokenizer beside the package; pass token ids")
        ids = tokenizer.encode(prompt)
    else:
        ids = [int(t) for t in prompt]
    eos = frozenset(tokenizer.eos_token_ids) if tokenizer is not None else runner.info.eos_token_ids
    opts = DecodeOptions(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed, mode=mode,
                         branch=branch, tree_budget=tree_budget, eos_token_ids=eos, streams="tree")
    dec = PackageDecoder(runner, ids, opts)
    detok = tokenizer.detokenizer() if tokenizer is not None else None
    for step in dec.steps():
        piece = "".join(detok.add_token(t) for t in step.tokens) if detok else ""
        if detok and step.finished:
            piece += detok.finalize()
        yield StreamResponse(step.tokens, piece, step.accepted, step.rejected, step.finished, dec.stats)


def generate_package(runner: PackageRunner, tokenizer, prompt, **options) -> PackageResult:
    """A whole completion from a package (options as :func:`stream_package`)."""
    steps = list(stream_package(runner, tokenizer, prompt, **options))
    return PackageResult([t for s in steps for t in s.tokens], "".join(s.text for s in steps),
                         steps[-1].stats, steps[-1].finish_reason, runner.backend)


__all__ = ["PackageDecoder", "PackageError", "PackageInfo", "PackageResult", "PackageRunner",
           "commit_inputs", "core_ml_available", "generate_package", "load_package", "prefill_chunks",
           "stream_package", "tree_inputs"]
