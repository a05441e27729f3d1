"""Speculative streams: stream-identifier embeddings, stream initialisation, the early-exit
pruning adapter, and the forward pass of a draft tree through tree-masked and multi-stream
attention layers (docs/design.md#multi-stream-architecture).

Lossless mode: main rows never see stream rows and the stream adapters touch stream rows only,
so the main stream computes exactly the base model. Shared mode: a LoRA adapts every row of
every layer and main rows also see their own node's streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from . import layout
from .kernels.attention import AttentionPlan, BatchPlan
from .tree import Tree, positions, reorder


class StreamAdapter(nn.Module):
    """P (gamma x h), optional low-rank stream init f_eta, and the pruning adapter o_theta."""

    def __init__(self, hidden: int, gamma: int, init_rank: int, prune_rank: int,
                 key: mx.array | None = None, scale: float = 0.02):
        super().__init__()
        k1, k2, k3, k4 = mx.random.split(key if key is not None else mx.random.key(0), 4)
        self.stream_embed = mx.random.normal((gamma, hidden), key=k1) * scale
        if init_rank:
            self.init_a = mx.random.normal((hidden, init_rank), key=k2) * hidden**-0.5
            self.init_b = mx.zeros((init_rank, hidden))
        self.prune_a = mx.random.normal((hidden, prune_rank), key=k3) * hidden**-0.5
        self.prune_b = mx.random.normal((prune_rank, hidden), key=k4) * (scale / prune_rank)

    @property
    def gamma(self) -> int:
        return self.stream_embed.shape[0]

    def init_streams(self, h: mx.array, gamma: int) -> mx.array:
        """Stream rows ``f(M_t) + P_j`` for j = 1..gamma, node-major: (B, K, h) -> (B, K*gamma, h)."""
        if "init_a" in self:
            h = h + (h @ self.init_a) @ self.init_b
        s = h[:, :, None, :] + self.stream_embed[None, None, :gamma].astype(h.dtype)
        return s.reshape(h.shape[0], -1, h.shape[-1])

    def early_exit(self, h: mx.array) -> mx.array:
        """o_theta: a low-rank residual map before the LM head gives early-exit logits."""
        return h + (h @ self.prune_a) @ self.prune_b


@dataclass
class ForwardOut:
    tree: Tree  # the nodes that survived pruning (re-indexed)
    kept: np.ndarray  # their indices in the tree that was passed in
    main_logits: mx.array  # (M1, V): next-token logits per surviving node
    stream_logits: mx.array | None  # (K, gamma, V) for the stream nodes, or None
    stream_nodes: np.ndarray  # indices (into the surviving tree) of the nodes with streams
    prune_layer: int  # layers below hold all input nodes in their cache, the rest `kept`
    msa_input: mx.array | None = None  # (M1, h) main hidden states entering layer N - N_s


def transition_probs(model, adapter: StreamAdapter, h: mx.array, tree: Tree) -> np.ndarray:
    """Early-exit probability of each node's token given its parent (1.0 for the root)."""
    logits = model.head(adapter.early_exit(h[0]))
    logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    parents = np.maximum(tree.parents, 0)
    picked = logp[mx.array(parents), mx.array(tree.tokens)]
    out = np.exp(np.array(picked.astype(mx.float32)))
    out[tree.parents < 0] = 1.0
    return out


def check_prune_threshold(threshold: float) -> None:
    """A transition probability to prune below: in [0, 1] (0: no pruning; 1: only certain nodes
    stay). The one rule for decoding and export."""
    from .errors import OptionError

    if not 0 <= threshold <= 1:  # NaN fails too
        raise OptionError(f"{{prune_threshold}} must be in [0, 1], not {threshold}")


def prune(tree: Tree, trans: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of the nodes kept: a node goes when its transition probability is below
    ``threshold`` or its parent went. The root always stays."""
    keep = np.ones(len(tree), bool)
    for v in range(1, len(tree)):
        keep[v] = keep[tree.parents[v]] and trans[v] >= threshold
    return np.nonzero(keep)[0]


def forward(model, tree: Tree, caches, n_prefix: int, *, gamma: int = 0,
            stream_nodes: str = "all", prune_threshold: float = 0.0,
            tokens: mx.array | None = None) -> ForwardOut:
    """Run a draft tree through the model, appending main-stream K/V to ``caches``.

    ``gamma`` streams are inserted at layer N - N_s on ``stream_nodes`` ("all" surviving
    nodes or only the "last" one, as in a prefill); gamma 0 runs the base model. A shared-mode
    adapter always runs all its streams; its prefill too puts them on the last prompt token
    only (extended paper, appendices G and I: prompts carry no streams, as in training).
    Pruning happens at the adapter's pruning layer when ``prune_threshold > 0``.
    ``tokens`` (M,) replaces ``tree.tokens`` as the input while still on the device (pipelined
    decoding feeds a pass's argmax to the next pass before the host has read it).
    """
    adapter = getattr(model, "adapter", None)
    cfg = getattr(model, "adapter_config", None)
    layers = model.layers
    n_layers = len(layers)
    shared = adapter is not None and cfg.mode == "shared"
    if shared:
        gamma = cfg.gamma
    if adapter is not None and gamma > adapter.gamma:
        raise ValueError(f"the adapter has {adapter.gamma} streams, {gamma} were asked for")
    msa_start = cfg.msa_start(n_layers) if adapter is not None else n_layers
    prune_at = cfg.prune_layer if adapter is not None else n_layers
    use_streams = adapter is not None and gamma > 0

    tokens = mx.array(tree.tokens[None].astype(np.int32)) if tokens is None else tokens[None]
    pos = positions(tree.depths, n_prefix)
    h = model.embed(tokens, pos)
    mask = AttentionPlan.for_tree(tree.parents, n_prefix) if len(tree) > 1 else None
    kept = np.arange(len(tree))
    stop_plain = msa_start if use_streams else n_layers
    msa_input = None
    for i in range(stop_plain + 1):
        if i == prune_at and prune_threshold > 0 and len(tree) > 1:
            trans = transition_probs(model, adapter, h, tree)
            kept = prune(tree, trans, prune_threshold)
            if len(kept) < len(tree):
                tree = reorder(tree, kept)
                h = h[:, mx.array(kept.astype(np.int32))]
                pos = positions(tree.depths, n_prefix)
                mask = AttentionPlan.for_tree(tree.parents, n_prefix) if len(tree) > 1 else None
        if i == msa_start:
            msa_input = h[0]
        if i < stop_plain:
            h = layers[i](h, pos, mask, caches[i] if caches else None)
    if not use_streams:
        return ForwardOut(tree, kept, model.head(h[0]), None, np.zeros(0, np.int64),
                          min(prune_at, n_layers), msa_input)

    snodes = np.arange(len(tree)) if stream_nodes == "all" else np.array([len(tree) - 1])
    streams = adapter.init_streams(h[:, mx.array(snodes.astype(np.int32))], gamma)
    h = mx.concatenate([h, streams], axis=1)
    pos = positions(tree.depths, n_prefix, snodes, gamma)
    mask = AttentionPlan.for_streams(tree.parents, n_prefix, snodes, gamma, shared)
    m = len(tree)
    for i in range(msa_start, n_layers):
        h = layers[i](h, pos, mask, caches[i] if caches else None, n_main=m)
    logits = model.head(h[0])
    return ForwardOut(tree, kept, logits[:m], logits[m:].reshape(len(snodes), gamma, -1), snodes,
                      min(prune_at, n_layers))


def forward_batch(model, trees: list[Tree], caches: list[list], n_prefix: list[int], *,
                  gamma: int = 0) -> list[ForwardOut]:
    """:func:`forward` of B draft trees of B sequences, each with its own caches and length, in one
    batched pass (no pruning; streams, when ``gamma`` > 0, on every node).

    The trees are padded to the largest, M nodes (a padding node is token 0 at the sequence's
    next position): tokens (B, M), then M * gamma stream rows, node-major, so that every row
    index means the same in every sequence and one (B, T) batch runs through each layer. The
    attention runs per sequence with its own plan and cache (:class:`BatchPlan`); the padding
    rows are never cached. Returns each sequence's :class:`ForwardOut`, as :func:`forward` would.
    """
    adapter = getattr(model, "adapter", None)
    cfg = getattr(model, "adapter_config", None)
    layers = model.layers
    if adapter is not None and cfg.mode == "shared":
        gamma = cfg.gamma
    use_streams = adapter is not None and gamma > 0
    msa_start = cfg.msa_start(len(layers)) if adapter is not None else len(layers)
    sizes = [len(t) for t in trees]
    m = max(sizes)
    node_pos = np.array([[n + d for d in t.depths] + [n] * (m - len(t)) for t, n in zip(trees, n_prefix)])
    tokens = np.array([list(t.tokens) + [0] * (m - len(t)) for t in trees], np.int32)
    pos = mx.array(node_pos.astype(np.int32))
    plan = BatchPlan([AttentionPlan.for_tree(t.parents, n) if len(t) > 1 else None
                      for t, n in zip(trees, n_prefix)], sizes, [0] * len(trees), m)
    h = model.embed(mx.array(tokens), pos)
    msa_input, n_main = None, None
    for i, layer in enumerate(layers):
        if i == msa_start:
            msa_input = h
            if use_streams:
                h = mx.concatenate([h, adapter.init_streams(h, gamma)], axis=1)
                pos = mx.array(layout.pass_positions(node_pos, np.arange(m), gamma).astype(np.int32))
                plan = BatchPlan([AttentionPlan.for_streams(t.parents, n, np.arange(len(t)), gamma,
                                                            cfg.mode == "shared")
                                  for t, n in zip(trees, n_prefix)], sizes, [k * gamma for k in sizes], m)
                n_main = m
        h = layer(h, pos, plan, [c[i] for c in caches], n_main=n_main)
    logits = model.head(h)
    outs = []
    for b, (t, k) in enumerate(zip(trees, sizes)):
        streams = logits[b, m:m + k * gamma].reshape(k, gamma, -1) if use_streams else None
        outs.append(ForwardOut(t, np.arange(k), logits[b, :k], streams,
                               np.arange(k) if use_streams else np.zeros(0, np.int64), len(layers),
                               None if msa_input is None or use_streams else msa_input[b, :k]))
    return outs


def stream_pass(model, h_node: mx.array, caches, n: int, gamma: int) -> mx.array:
    """Stream logits (gamma, V) of one node whose main stream is already cached at n - 1.

    ``h_node`` (h,) is the node's main hidden state entering layer N - N_s. Lossless mode only:
    there the main stream never sees streams, so streams of just the last accepted node can be
    computed after verification (deferred streams) instead of for every tree node.
    """
    return stream_pass_batch(model, h_node[None], [caches], [n], gamma)[0]


def stream_pass_batch(model, h_nodes: mx.array, caches: list[list], n: list[int], gamma: int) -> mx.array:
    """:func:`stream_pass` of B nodes of B sequences (each with its own caches and length) in one
    batched pass: h_nodes (B, h) -> stream logits (B, gamma, V)."""
    adapter, cfg = model.adapter, model.adapter_config
    layers = model.layers
    h = adapter.init_streams(h_nodes[:, None], gamma)
    pos = mx.array(layout.stream_positions(np.array(n)[:, None] - 1, gamma).astype(np.int32))
    if len(n) == 1:  # one sequence: its own plan and cache, (T,) positions
        pos, mask, per_layer = pos[0], AttentionPlan.deferred(n[0], gamma), caches[0]
    else:
        mask = BatchPlan([AttentionPlan.deferred(k, gamma) for k in n], [0] * len(n), [gamma] * len(n), 0)
        per_layer = [list(c) for c in zip(*caches)]
    for i in range(cfg.msa_start(len(layers)), len(layers)):
        h = layers[i](h, pos, mask, per_layer[i], n_main=0)
    return model.head(h)
