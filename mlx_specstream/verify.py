"""Verification of a draft tree against the main stream (docs/design.md#verification).

Greedy: walk from the root while some child carries the main stream's argmax at its parent.
Sampling: at each node, try the drafts of the next level in the order they were drawn, with
multi-candidate speculative sampling (Stratos' notes §2, SpecInfer): accept draft x with
probability min(1, p(x)/q(x)), otherwise p <- norm(max(p - q, 0)) and try the next draft; if
every draft is rejected, sample the residual. The drafts of one level are i.i.d. draws from the
stream distribution q, so the emitted tokens are distributed exactly as the base model's p. A
prompt-lookup draft is a deterministic candidate (q one-hot), tried first on its path.
An accepted draft that has no node (pruned, or cut by the budget) ends the path: it becomes the
next root, unverified beyond itself.
"""

from __future__ import annotations

import numpy as np

from .tree import Tree


def verify_greedy(tree: Tree, argmax: np.ndarray) -> tuple[list[int], int]:
    """(accepted path of node indices starting at the root, the next root token)."""
    v, path = 0, [0]
    while True:
        target = int(argmax[v])
        child = tree.child(v, target)
        if child is None:
            return path, target
        v = child
        path.append(v)


def verify_sampling(tree: Tree, p: np.ndarray, draws: list[list[int]], q: list[np.ndarray],
                    rng: np.random.Generator, chain: list[int] = ()) -> tuple[list[int], int]:
    """Multi-candidate rejection sampling over the tree; ``p`` is (M, V) target probabilities,
    ``draws[d]`` the draws of level d+1 from ``q[d]``. ``chain`` holds deterministic drafts along
    one path (a prompt-lookup continuation, q one-hot): at a node on that path its next token is
    tried first, then the level's draws against the residual."""
    v, path, on_chain = 0, [0], True
    while True:
        d = int(tree.depths[v])
        residual = p[v]
        accepted = None
        if on_chain and d < len(chain):
            accepted, residual = residual_accept(residual, [chain[d]], None, rng)
        if accepted is None and d < len(draws):
            accepted, residual = residual_accept(residual, draws[d], q[d], rng)
        if accepted is None:
            return path, sample(residual, rng)
        on_chain = on_chain and d < len(chain) and accepted == chain[d]
        child = tree.child(v, accepted)
        if child is None:
            return path, accepted
        v = child
        path.append(v)


def residual_accept(p: np.ndarray, draws: list[int], q: np.ndarray | None, rng: np.random.Generator):
    """Try ``draws`` (i.i.d. from q; q None: deterministic drafts, q one-hot at each) in order;
    return (accepted token or None, residual p)."""
    p = p.astype(np.float64)
    for x in draws:
        qx = 1.0 if q is None else q[x]
        if rng.random() * qx < p[x]:  # accept with probability min(1, p/q)
            return int(x), p
        if q is None:  # max(p - onehot(x), 0)
            p = p.copy()
            p[x] = 0.0
        else:
            p = np.maximum(p - q, 0.0)
        total = p.sum()
        if total <= 0.0:  # p <= q everywhere means p == q: the residual is never needed
            return int(x), p
        p = p / total
    return None, p


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector (inverse CDF, robust to rounding)."""
    c = np.cumsum(p, dtype=np.float64)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))


def probabilities(logits: np.ndarray, temperature: float, top_p: float = 1.0, top_k: int = 0,
                  min_p: float = 0.0) -> np.ndarray:
    """Sampling distribution of logits (..., V): at a temperature, then cut to the ``top_k`` most
    likely tokens (0: all), to the nucleus ``top_p``, and to the tokens at least ``min_p`` times
    as likely as the most likely one, in that order (transformers' order of its warpers). Every
    cut keeps the most likely token; ties at the ``top_k`` boundary keep the lower ids."""
    z = logits.astype(np.float64)
    with np.errstate(over="ignore"):  # shifted first: a tiny temperature gives -inf, not inf - inf
        z = (z - z.max(-1, keepdims=True)) / temperature
    p = np.exp(z)
    p /= p.sum(-1, keepdims=True)
    if not (top_k or top_p < 1.0 or min_p > 0.0):
        return p
    order = np.argsort(-p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, -1)
    keep_sorted = np.ones_like(sorted_p, bool)
    if top_k:
        keep_sorted[..., top_k:] = False
        sorted_p = np.where(keep_sorted, sorted_p, 0.0)
        sorted_p /= sorted_p.sum(-1, keepdims=True)
    if top_p < 1.0:
        before = np.cumsum(sorted_p, -1) - sorted_p
        keep_sorted &= before < top_p  # always keeps the most likely token
    if min_p > 0.0:
        keep_sorted &= sorted_p >= min_p * sorted_p[..., :1]
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, -1)
    p = np.where(keep, p, 0.0)
    p /= p.sum(-1, keepdims=True)
    return p
