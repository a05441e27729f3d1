"""Draft trees as flat arrays, and the masks and positions that run them in one forward pass.

A tree is flattened breadth-first (parents before children); node 0 is the root. Node ``v`` at
depth ``d`` sits at position ``n + d`` after ``n`` cached tokens and sees the cache, its
ancestors and itself. All functions here are pure (numpy in, numpy/mx out).

The rows, positions and visibility of a multi-stream pass follow :mod:`mlx_specstream.layout`
(main rows of the M nodes, then stream rows node-major; stream ``j`` of a node at ``t`` sits at
``t + j``); the functions here apply it to a tree.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import cached_property

import mlx.core as mx
import numpy as np

from . import layout
from .layout import ancestors

# The largest k candidates per stream and nodes per tree: beyond any tree that pays, and a bound on
# drafting's work (build_tree's heap holds up to budget × k candidates) and on a tree pass's rows.
TREE_LIMITS = {"branch": 256, "tree_budget": 1024}


def check_tree_sizes(**sizes: int) -> None:
    """``branch`` and ``tree_budget`` in 1..:data:`TREE_LIMITS`: the one rule for adapters,
    decoding and export (an :class:`~mlx_specstream.errors.OptionError` naming the option)."""
    from .errors import OptionError

    for name, value in sizes.items():
        if value < 1:
            raise OptionError(f"{{{name}}} must be >= 1, not {value}")
        if value > TREE_LIMITS[name]:
            raise OptionError(f"{{{name}}} must be at most {TREE_LIMITS[name]}, not {value}")


@dataclass(frozen=True)
class Tree:
    tokens: np.ndarray  # (M,) token ids, tokens[0] is the root
    parents: np.ndarray  # (M,) parent index, -1 for the root
    depths: np.ndarray  # (M,)

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, v: int, token: int) -> int | None:
        """The child of node ``v`` that holds ``token`` (the first, should there be two), or None."""
        return self._child_index.get((v, token))

    def best_below(self, v: int) -> list[int]:
        """The tokens under node ``v`` through each node's first child, the best-scored one
        (:func:`build_tree` lays children out best first): after a pass whose accepted path ended at
        ``v``, the best draft it ran and rejected (none where ``v`` is a leaf)."""
        first = self._first_child
        out = []
        while (v := first.get(v)) is not None:
            out.append(int(self.tokens[v]))
        return out

    @cached_property
    def _first_child(self) -> dict[int, int]:
        first: dict[int, int] = {}
        for v, parent in enumerate(self.parents.tolist()):
            first.setdefault(parent, v)
        return first

    @cached_property
    def _child_index(self) -> dict[tuple[int, int], int]:
        index: dict[tuple[int, int], int] = {}
        for v, key in enumerate(zip(self.parents.tolist(), self.tokens.tolist())):
            index.setdefault(key, v)
        return index


def chain(tokens) -> Tree:
    """A path: every token is the child of the previous one (a prompt, or a chain draft)."""
    n = len(tokens)
    return Tree(np.asarray(tokens, np.int64), np.arange(-1, n - 1), np.arange(n))


def build_tree(root: int, levels: list[list[int]], scores: list[list[float]], budget: int,
               node_cost: float = 0.0, chain: list[int] = (), chain_scores: list[float] = ()) -> Tree:
    """Tree of drafts under ``root``: every node at depth j-1 gets ``levels[j-1]`` as children,
    and the nodes of ``chain`` (a path under the root, e.g. a prompt-lookup continuation) get
    their next chain token too.

    ``scores[j-1][i]`` is the log-probability of ``levels[j-1][i]``, ``chain_scores[j-1]`` that of
    ``chain[j-1]``; a token that is both a stream candidate and the chain's is one node with the
    higher score. With more nodes than ``budget`` the best nodes by path score (sum of
    log-probabilities from the root, as in EAGLE-2's re-ranking) are kept; scores only decrease
    along a path, so the kept set always contains each kept node's parent. Ties go to the
    earlier-expanded node. With ``node_cost`` > 0 the tree is cut further to the size
    :func:`best_size` picks.

    Example: root 7, levels [[1, 2], [3]], chain [2, 5]: nodes 7; 1, 2 (depth 1); then 3 under
    1, and 3 and 5 under 2 (the chain's node 2 also gets its chain child 5).
    """
    if budget < 1:
        raise ValueError("tree budget must be >= 1")
    tokens, parents, depths = [root], [-1], [0]
    heap: list[tuple[float, int, int, int, int, bool]] = []  # (-score, seq, parent, depth, token, on chain)
    seq = 0

    def push_children(parent: int, depth: int, score: float, on_chain: bool) -> None:
        nonlocal seq
        cands: dict[int, float] = {}
        if depth < len(levels):
            for t, s in zip(levels[depth], scores[depth]):
                cands.setdefault(t, s)
        if on_chain and depth < len(chain):
            t = chain[depth]
            cands[t] = max(cands.get(t, -np.inf), chain_scores[depth])
        for t, s in cands.items():
            follows = on_chain and depth < len(chain) and t == chain[depth]
            heapq.heappush(heap, (-(score + s), seq, parent, depth + 1, t, follows))
            seq += 1

    push_children(0, 0, 0.0, True)
    gain = 1.0  # expected tokens of the nodes taken so far (best_size's rule, applied as they come)
    while heap and len(tokens) < budget:
        neg, _, parent, depth, t, on_chain = heapq.heappop(heap)
        p = math.exp(-neg)
        if node_cost > 0 and not _pays(p, gain, len(tokens), node_cost):
            break  # nodes come best first, so no later one pays either
        gain += p
        tokens.append(t)
        parents.append(parent)
        depths.append(depth)
        push_children(len(tokens) - 1, depth, -neg, on_chain)
    order = sorted(range(len(tokens)), key=lambda v: (depths[v], v))  # breadth-first; parents first
    new_index = {v: i for i, v in enumerate(order)}
    return Tree(np.array([tokens[v] for v in order], np.int64),
                np.array([new_index.get(parents[v], -1) for v in order], np.int64),
                np.array([depths[v] for v in order], np.int64))


def best_size(path_scores, node_cost: float) -> int:
    """How many nodes of a draft tree to run, root first and the others by descending path score
    (``path_scores`` in that order, as :func:`build_tree` takes its nodes; the rule relies on it).

    A node is accepted with the probability of its whole path, ``exp(score)``, if the drafts are
    calibrated, so m nodes advance ``1 + sum of those probabilities`` tokens in expectation (the
    accepted nodes form a path and the root is always kept). A pass over m nodes costs
    ``1 + node_cost * (m - 1)`` one-node passes. Returns the m with the most tokens per unit
    cost: small trees where the draft is unsure or extra rows are dear (a CPU), the whole
    budget where they are nearly free.
    """
    return _cut(path_scores, node_cost)[0]


def best_rate(path_scores, node_cost: float) -> float:
    """The expected tokens per unit of cost of the tree :func:`best_size` picks."""
    m, gain = _cut(path_scores, node_cost)
    return gain / pass_cost(m, node_cost)


def pass_cost(nodes: int, node_cost: float) -> float:
    """The cost of a pass over ``nodes`` tree nodes, in one-node passes: ``1 + node_cost·(nodes − 1)``."""
    return 1.0 + node_cost * (nodes - 1)


def _pays(p: float, gain: float, m: int, node_cost: float) -> bool:
    """Whether one more node, of path probability ``p``, raises the expected tokens per unit of cost
    of ``m`` nodes that advance ``gain`` tokens: ``(gain + p) / cost(m + 1) > gain / cost(m)``.
    With path probabilities in descending order the rate rises to its maximum and then falls (each
    new rate lies between the last one and ``p / node_cost``), so the first node that does not pay
    ends the tree."""
    return p * pass_cost(m, node_cost) > node_cost * gain


def _cut(path_scores, node_cost: float) -> tuple[int, float]:
    """``(m, expected tokens)`` of the best prefix of ``path_scores`` (root first, descending)."""
    m, gain = 1, 1.0
    for s in list(path_scores)[1:]:
        p = math.exp(s)
        if not _pays(p, gain, m, node_cost):
            break
        m, gain = m + 1, gain + p
    return m, gain


def reorder(tree: Tree, order) -> Tree:
    """The sub-tree of the nodes in ``order`` (which must contain each node's parent first)."""
    order = np.asarray(order, np.int64)
    new_index = np.full(len(tree), -1, np.int64)
    new_index[order] = np.arange(len(order))
    parents = tree.parents[order]
    new_parents = np.where(parents < 0, -1, new_index[np.maximum(parents, 0)])
    if np.any((parents >= 0) & (new_parents < 0)) or np.any(new_parents >= np.arange(len(order))):
        raise ValueError("a kept node's parent is missing or comes after it")
    return Tree(tree.tokens[order], new_parents, tree.depths[order])


def ancestor_bits(parents: np.ndarray) -> np.ndarray:
    """The ancestor matrix packed as uint32 words per node (bit j%32 of word j//32)."""
    a = ancestors(parents)
    m = len(parents)
    words = (m + 31) // 32
    padded = np.zeros((m, words * 32), dtype=bool)
    padded[:, :m] = a
    bits = padded.reshape(m, words, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)
    return bits.sum(-1).astype(np.uint32)


def tree_mask(parents: np.ndarray, n_prefix: int) -> mx.array:
    """Boolean (M, n_prefix + M): every node sees the cache prefix, its ancestors and itself."""
    return mx.array(layout.keys_by_ancestry(parents, n_prefix))


def stream_mask(parents: np.ndarray, n_prefix: int, stream_nodes: np.ndarray, gamma: int,
                shared: bool) -> mx.array:
    """Boolean mask of a multi-stream pass over a tree (``layout.pass_mask``; main keys by ancestry).

    Main row v: cache, ancestors of v and v; in shared mode also every stream of v.
    Stream row (s, j): cache, ancestors of s and s, and streams (s, 1..j).
    """
    return mx.array(layout.pass_mask(layout.keys_by_ancestry(parents, n_prefix), stream_nodes, gamma,
                                     own=shared))


def positions(depths: np.ndarray, n_prefix: int, stream_nodes: np.ndarray | None = None,
              gamma: int = 0) -> mx.array:
    """Rotary positions of the main rows (n + depth) then of the stream rows (t + j)."""
    pos = layout.pass_positions(n_prefix + np.asarray(depths), stream_nodes, gamma)
    return mx.array(pos.astype(np.int32))
