"""What the decode loop needs from a model: a :class:`Runner` runs the forward passes of one
generation over its own KV cache (docs/design.md#decode-step). The loop (``engine.Decoder``)
drafts, builds trees, verifies, samples, counts and emits; a runner only computes.

- :class:`MLXRunner`: an MLX model (``streams.forward``, the deferred ``streams.stream_pass``,
  ``KVCache.commit``).
- ``coreml_driver.PackageRunner``: an exported Core ML package (``prefill`` chunks, then ``step``,
  which commits the previous accepted path inside the package; fixed tree size, in-place pruning).

Shapes below: M is the number of tree nodes that survived the last pass's pruning, V the
vocabulary, gamma the streams drafted with (``start``), k the candidates per stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .adapter import AdapterConfig
from .errors import AdapterError
from .kv_cache import make_cache, rows_to_keep
from .ngrams import NgramTable
from .streams import ForwardOut, forward, forward_batch, stream_pass, stream_pass_batch
from .tree import Tree, chain


class Runner:
    """The forward passes of one generation (one at a time) over one KV cache of length ``n``."""

    adapter_config: AdapterConfig | None = None  # streams, mode, default branch / budget / pruning
    ngrams: NgramTable | None = None  # the adapter's n-gram drafts (ngrams.py), if it has them
    limit: int | None = None  # tokens the context holds, prompt and generated together
    limit_source: str = "the model's context"  # where ``limit`` comes from, as errors say it
    vocab_size: int | None = None  # token ids the model reads: 0 .. vocab_size - 1
    eos_token_ids: frozenset[int] = frozenset()  # EOS it knows without a tokenizer (a package's)
    tree_size: int | None = None  # nodes every pass runs (padded), which bounds the tree budget
    max_depth: int | None = None  # deepest draft node whose accepted path the runner can commit
    # Cost of one more tree node relative to a one-node pass, per stream policy offered ("tree":
    # streams on every node; "deferred": a stream pass for the accepted node only); None: the
    # costs measured on this machine (engine.default_node_costs), both policies.
    node_costs: dict[str, float] | None = None

    def check(self, temperature: float, branch: int | None, tree_budget: int | None,
              prune_threshold: float | None) -> None:
        """Refuse, in one line, options this runner cannot serve."""

    def start(self, prompt: list[int], gamma: int, deferred: bool) -> None:
        """Empty the cache, run ``prompt`` (streams on its last token only, ``gamma`` of them; 0:
        none) and commit it. The last pass then reads as a one-node tree: the last prompt token."""
        raise NotImplementedError

    def step(self, tree: Tree, prune_threshold: float) -> Tree:
        """Run a draft tree whose root sits at position ``n``; return the nodes that survived
        pruning, re-indexed breadth-first (node 0 the root). Their K/V wait for :meth:`commit`."""
        raise NotImplementedError

    def discard(self) -> None:
        """Forget a pass that failed, so that the next one starts from the committed cache."""

    def commit(self, path: list[int]) -> None:
        """Keep the K/V of ``path`` (surviving nodes, from the root) at ``n, n+1, ...``; drop the
        rest of the last pass. ``n`` grows by ``len(path)``."""
        raise NotImplementedError

    def main_tokens(self) -> np.ndarray:
        """(M,) int: argmax of the main stream's next-token logits per surviving node."""
        raise NotImplementedError

    def main_logits(self) -> np.ndarray:
        """(M, V) float32: the main stream's next-token logits per surviving node."""
        raise NotImplementedError

    def stream_topk(self, node: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """((gamma, k) token ids, (gamma, k) log-probabilities), best first per stream, of the
        streams of surviving ``node``; called after :meth:`commit`, for its last node."""
        raise NotImplementedError

    def stream_logits(self, node: int) -> np.ndarray:
        """(gamma, V) float32: the stream logits of surviving ``node`` (as for stream_topk)."""
        raise NotImplementedError


class MLXRunner(Runner):
    """An MLX model with its stream adapter (if any); ``caches`` per layer, ``n`` rows committed."""

    def __init__(self, model):
        self.model = model
        self.adapter_config = getattr(model, "adapter_config", None)
        self.ngrams = getattr(model, "adapter_ngrams", None)
        self.limit = getattr(model, "max_positions", None)
        self.vocab_size = model.config.get("vocab_size") if hasattr(model, "config") else None

    def current(self):
        """The model, as long as it has the adapter this generation started with: a generator
        resumed after ``load_adapter``, ``detach`` or ``train`` on its model would mix two."""
        if getattr(self.model, "adapter_config", None) is not self.adapter_config:
            raise AdapterError("the model's adapter changed during this generation (load_adapter, detach "
                               "or train): start a new one")
        return self.model

    def start(self, prompt: list[int], gamma: int, deferred: bool) -> None:
        self.gamma, self.deferred = gamma, deferred
        self.caches, self.n = make_cache(self.model), 0
        self.out = out = self._run(chain(prompt), "last", 0.0)
        self.commit(list(range(len(prompt))))
        last = len(prompt) - 1
        self.out = ForwardOut(chain(prompt[-1:]), np.array([last]), out.main_logits[last:], out.stream_logits,
                              np.zeros(len(out.stream_nodes), np.int64), out.prune_layer,
                              None if out.msa_input is None else out.msa_input[last:])

    def step(self, tree: Tree, prune_threshold: float) -> Tree:
        self.out = self._run(tree, "all", prune_threshold)
        return self.out.tree

    @property
    def out(self) -> ForwardOut:
        return self._out

    @out.setter
    def out(self, out: ForwardOut) -> None:
        """A new pass: deferred stream logits computed for the last one no longer apply."""
        self._out, self.ready_streams = out, None

    @property
    def pass_gamma(self) -> int:
        """Streams in a tree pass: none when they are deferred to a pass of their own."""
        return 0 if self.deferred else self.gamma

    def _run(self, tree: Tree, stream_nodes: str, prune_threshold: float) -> ForwardOut:
        out = forward(self.current(), tree, self.caches, self.n, gamma=self.pass_gamma,
                      stream_nodes=stream_nodes, prune_threshold=prune_threshold)
        mx.eval(out.main_logits, out.stream_logits if out.stream_logits is not None else [])
        return out

    def discard(self) -> None:
        """Drop whatever a pass left in the cache after the committed ``n`` rows."""
        for cache in self.caches:
            cache.trim(cache.offset - self.n)

    def queue_greedy(self, token: mx.array) -> tuple[mx.array, mx.array]:
        """Pipelined greedy decoding (``Decoder._greedy_ar_steps``): queue a one-node pass of
        ``token`` (1,) at ``n``, still on the device (the previous pass's argmax), committed in
        place, and its argmax; returns (argmax (1,), logits (1, V)), neither read yet."""
        out = forward(self.current(), chain([0]), self.caches, self.n, tokens=token)  # token: ``token``
        self.n += 1
        nxt = mx.argmax(out.main_logits, axis=-1).astype(mx.int32)
        mx.async_eval(nxt)
        return nxt, out.main_logits

    def drop_queued(self) -> None:
        """Forget the last queued greedy pass (the one behind EOS, or behind a forbidden token)."""
        self.n -= 1
        self.discard()

    def commit(self, path: list[int]) -> None:
        """Layers below the pruning layer index the tree as fed, the others the pruned one."""
        upper = np.asarray(path)
        lower = rows_to_keep(self.out.kept[upper])
        upper = rows_to_keep(upper)
        for i, cache in enumerate(self.caches):
            cache.commit(self.n, lower if i < self.out.prune_layer else upper)
        self.n += len(path)

    def main_tokens(self) -> np.ndarray:
        return np.array(mx.argmax(self.out.main_logits, axis=-1))

    def main_logits(self) -> np.ndarray:
        return np.array(self.out.main_logits.astype(mx.float32))

    def _streams(self, node: int) -> mx.array:
        out = self.out
        if self.deferred and self.ready_streams is not None and self.ready_streams[0] == node:
            logits = self.ready_streams[1]  # computed in a batch (run_passes)
        elif self.deferred:
            logits = stream_pass(self.current(), out.msa_input[node], self.caches, self.n, self.gamma)
        else:
            logits = out.stream_logits[int(np.nonzero(out.stream_nodes == node)[0][0]), : self.gamma]
        return logits.astype(mx.float32)

    def stream_topk(self, node: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        return top_logprobs(np.array(self._streams(node)), k)

    def stream_logits(self, node: int) -> np.ndarray:
        return np.array(self._streams(node))


def logsumexp(logits: np.ndarray) -> np.ndarray:
    """log(sum(exp(row))) of each row of ``logits`` (n, V), as (n, 1): what a row's logits less it
    are its log-probabilities."""
    m = logits.max(axis=-1, keepdims=True)
    return m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))


def top_logprobs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` likeliest tokens of each row of ``logits`` (n, V) and their log-probabilities,
    best first (k = 1: the first of tied tokens, as an argmax). On the host: a CPU's MLX computes
    ``exp`` several times slower than NumPy, and a stream top-k runs every decode step (~0.25 ms of
    MLX against ~0.05 ms for γ = 4, V = 4,096)."""
    top = (np.argmax(logits, axis=-1)[:, None] if k == 1
           else np.argpartition(-logits, k - 1, axis=-1)[:, :k])
    vals = np.take_along_axis(logits, top, axis=-1) - logsumexp(logits)
    order = np.argsort(-vals, axis=-1, kind="stable")
    return np.take_along_axis(top, order, -1), np.take_along_axis(vals, order, -1)


@dataclass(eq=False)
class PassRequest:
    """A pass a decode loop hands to its caller instead of running it (``Decoder(...,
    batched=True)``), so that the passes of several generations run as one batch
    (:func:`run_passes`). A tree pass: ``kept`` is filled in with what :meth:`Runner.step`
    returns. ``tree`` None: the deferred stream pass of surviving node ``node``, after
    :meth:`Runner.commit`; its logits wait in the runner for ``stream_topk``/``stream_logits``."""

    runner: Runner
    tree: Tree | None
    prune_threshold: float = 0.0
    node: int = 0
    kept: Tree | None = None


def run_passes(requests: list[PassRequest]) -> None:
    """Run the requested passes: those of MLX runners over the same model and the same streams
    (and no pruning) as one batched pass (``streams.forward_batch``, ``stream_pass_batch``); any
    other, or one alone, as the runner runs it by itself."""
    groups: dict[tuple, list[PassRequest]] = {}
    for req in requests:
        r = req.runner
        if isinstance(r, MLXRunner) and req.prune_threshold == 0:
            groups.setdefault((id(r.model), req.tree is None, r.pass_gamma), []).append(req)
        elif req.tree is not None:
            req.kept = r.step(req.tree, req.prune_threshold)
    for (_, streams_only, gamma), group in groups.items():
        runners = [req.runner for req in group]
        if streams_only:
            if len(group) > 1:
                h = mx.stack([r.out.msa_input[req.node] for req, r in zip(group, runners)])
                logits = stream_pass_batch(runners[0].current(), h, [r.caches for r in runners],
                                           [r.n for r in runners], runners[0].gamma)
                mx.eval(logits)
                for b, (req, r) in enumerate(zip(group, runners)):
                    r.ready_streams = (req.node, logits[b])
        elif len(group) == 1:
            group[0].kept = runners[0].step(group[0].tree, 0.0)
        else:
            outs = forward_batch(runners[0].current(), [req.tree for req in group],
                                 [r.caches for r in runners], [r.n for r in runners], gamma=gamma)
            mx.eval([[o.main_logits, o.stream_logits, o.msa_input] for o in outs])
            for req, r, out in zip(group, runners, outs):
                r.out, req.kept = out, out.tree
