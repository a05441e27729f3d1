"""The multi-stream layout, stated once: the rows of a pass, their rotary positions, and which
keys each row sees (docs/design.md#masks, #stream-positions).

A pass has main rows, one per *node* (a tree node, or a token of a training sequence), and gamma
stream rows for each of K *stream nodes*, laid out node-major after the main rows: stream j
(1-based) of stream node s is stream row ``s*gamma + j - 1``. The rule:

- **positions**: stream j of a node at position t sits at ``t + j`` (it stands for the token j
  places ahead and predicts position t + j + 1);
- **main keys**: a stream row sees the main keys its node sees (``sees``: by ancestry in a tree,
  :func:`keys_by_ancestry`, or by position in a sequence, :func:`keys_by_position`; a chain's
  ancestors are exactly the earlier positions, so both agree on a chain);
- **stream keys**: stream (s, j) sees streams (s, 1..j) of its own node, stream keys
  ``[s*gamma, s*gamma + j)``; stream rows are never seen by another node's rows;
- **shared mode**: the main row of a stream node that is marked ``own`` also sees all gamma of its
  own streams (lossless main rows never see a stream: they compute the base model).

The rule is one table, :func:`rows`: per row of a pass, the node it belongs to (whose main keys
it sees, and whose position it starts from), how many positions ahead of that node it sits, and
the range of stream keys it sees. Every representation derives from it: the dense boolean masks
of the engine (:func:`pass_mask`: ``tree.tree_mask``, ``tree.stream_mask``, deferred streams),
the rotary positions (:func:`pass_positions`: ``tree.positions``, ``streams.stream_pass``), the
Metal kernel's row table (``kernels.attention.row_table``: the table's node and stream-key
columns), the training layouts (``objective.segment_layout``, ``objective.shared_layout``) and the
Core ML graph's step mask and positions (``convert/torch_graph.py``). All functions are pure
numpy; leading batch axes broadcast.

Worked example: a chain of 3 nodes at positions 5, 6, 7 after 5 cached keys, streams on the
last two nodes (stream_nodes [1, 2]), gamma 2, shared. Rows: main 0, 1, 2, then stream rows
(1,1) (1,2) (2,1) (2,2) at positions 7 8 8 9. Keys: 5 cached, 3 main, 4 stream; ``pass_mask``::

    row         cache  main   streams
    main 0      11111  100    0000
    main 1      11111  110    1100     (shared: its own streams)
    main 2      11111  111    0011
    (1,1)       11111  110    1000
    (1,2)       11111  110    1100
    (2,1)       11111  111    0010
    (2,2)       11111  111    0011
"""

from __future__ import annotations

import numpy as np


def ancestors(parents: np.ndarray) -> np.ndarray:
    """Boolean (M, M): ``a[i, j]`` iff node j is node i or one of its ancestors (parents first)."""
    m = len(parents)
    a = np.eye(m, dtype=bool)
    for i in range(m):
        p = parents[i]
        if p >= 0:
            a[i] |= a[p]
    return a


def keys_by_ancestry(parents: np.ndarray, n_prefix: int) -> np.ndarray:
    """Main keys (M, n_prefix + M) a tree node sees: the cache, its ancestors and itself."""
    a = ancestors(parents)
    return np.concatenate([np.ones((len(parents), n_prefix), bool), a], axis=1)


def keys_by_position(t: np.ndarray, n_keys: int) -> np.ndarray:
    """Main keys (..., L, n_keys) the token at position t sees in a sequence: keys 0..t."""
    return np.arange(n_keys) <= np.asarray(t)[..., None]


# columns of the table :func:`rows` returns
NODE, AHEAD, LO, COUNT = range(4)


def stream_owners(nodes: np.ndarray, gamma: int) -> np.ndarray:
    """The node of each stream row (..., K*gamma), node-major."""
    return np.repeat(np.asarray(nodes), gamma, axis=-1)


def stream_index(k: int, gamma: int) -> np.ndarray:
    """j (1-based) of each stream row (K*gamma,), node-major."""
    return np.tile(np.arange(1, gamma + 1), k)


def rows(m: int, stream_nodes: np.ndarray, gamma: int, own: bool | np.ndarray = False,
         main_rows: bool = True) -> np.ndarray:
    """The rows of a pass, (..., R, 4) int64 with columns ``NODE, AHEAD, LO, COUNT``: the node a row
    belongs to (it sees that node's main keys), how many positions ahead of the node it sits, and
    the stream keys ``[LO, LO + COUNT)`` it sees.

    Rows ``[M main | K*gamma stream]`` (only the stream rows when ``main_rows`` is False).
    ``stream_nodes`` (K,): indices of the M nodes that carry streams. ``own``: whether main rows
    see their own streams (shared mode), one bool or per node (..., M). Main row v: (v, 0, 0, 0),
    or (v, 0, s*gamma, gamma) when v is stream node s and ``own``. Stream row (s, j):
    (stream_nodes[s], j, s*gamma, j).
    """
    nodes = np.asarray(stream_nodes, np.int64)
    k = len(nodes)
    stream = np.stack([stream_owners(nodes, gamma), stream_index(k, gamma),
                       stream_owners(np.arange(k) * gamma, gamma), stream_index(k, gamma)], axis=-1)
    if not main_rows:
        return stream
    own = np.asarray(own, bool)
    lead = own.shape[:-1] if own.ndim else ()
    main = np.zeros((*lead, m, 4), np.int64)
    main[..., NODE] = np.arange(m)
    sees_own = np.take(np.broadcast_to(own, (*lead, m)), nodes, axis=-1)[..., None]  # (..., K, 1)
    main[..., nodes, LO:] = np.stack([np.arange(k) * gamma, np.full(k, gamma)], axis=-1) * sees_own
    return np.concatenate([main, np.broadcast_to(stream, (*lead, *stream.shape))], axis=-2)


def pass_positions(node_pos: np.ndarray, stream_nodes: np.ndarray | None, gamma: int,
                   main_rows: bool = True) -> np.ndarray:
    """Rotary positions (..., R) of a pass's rows: the position of the row's node (``node_pos``
    (..., M)) plus how far ahead it sits; without streams, ``node_pos`` itself."""
    node_pos = np.asarray(node_pos)
    if stream_nodes is None or not gamma:
        return node_pos
    r = rows(node_pos.shape[-1], stream_nodes, gamma, main_rows=main_rows)
    return np.take(node_pos, r[:, NODE], axis=-1) + r[:, AHEAD]


def stream_positions(t: np.ndarray, gamma: int) -> np.ndarray:
    """Rotary positions (..., K*gamma) of the stream rows of nodes at positions t (..., K): t + j."""
    t = np.asarray(t)
    return pass_positions(t, np.arange(t.shape[-1]), gamma, main_rows=False)


def range_mask(ranges: np.ndarray, n: int) -> np.ndarray:
    """Boolean (..., rows, n) from per-row key ranges (..., rows, 2) ``[lo, lo + count)``."""
    lo, count = ranges[..., :1], ranges[..., 1:]
    cols = np.arange(n)
    return (cols >= lo) & (cols < lo + count)


def pass_mask(sees: np.ndarray, stream_nodes: np.ndarray, gamma: int, own: bool | np.ndarray = False,
              main_rows: bool = True) -> np.ndarray:
    """Boolean mask of a multi-stream pass, (..., R, N + K*gamma): rows as in :func:`rows`, keys
    ``[N main | K*gamma stream]``; only the stream rows when ``main_rows`` is False (their main
    keys are already in a cache).

    ``sees`` (..., M, N): the main keys each node sees; ``stream_nodes`` (K,): indices of the
    nodes (axis -2 of ``sees``) that carry streams; ``own`` as in :func:`rows`.
    """
    sees = np.asarray(sees, bool)
    r = rows(sees.shape[-2], stream_nodes, gamma, own, main_rows)
    lead = np.broadcast_shapes(sees.shape[:-2], r.shape[:-2])
    r = np.broadcast_to(r, (*lead, *r.shape[-2:]))
    main = np.take_along_axis(np.broadcast_to(sees, (*lead, *sees.shape[-2:])), r[..., NODE, None], axis=-2)
    return np.concatenate([main, range_mask(r[..., LO:], len(stream_nodes) * gamma)], axis=-1)
