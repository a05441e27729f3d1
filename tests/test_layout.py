"""The multi-stream layout is one rule (mlx_specstream/layout.py) with many uses: the engine's tree
passes, the Metal kernel's row table, the training layouts and the Core ML graph."""

import numpy as np
import pytest

from mlx_specstream import layout, tree
from mlx_specstream.data import Example
from mlx_specstream.kernels import attention
from mlx_specstream.objective import segment_layout, shared_layout
from mlx_specstream.train_batches import Batch

PARENTS = np.array([-1, 0, 0, 1, 1, 2, 3])
DEPTHS = np.array([0, 1, 1, 2, 2, 2, 3])


def oracle(parents, n_prefix, stream_nodes, gamma, shared, own_count=None):
    """The mask of docs/design.md#masks written row by row; ``own_count(j)``: how many of its own
    streams stream j sees (the rule: j)."""
    own_count = own_count or (lambda j: j)
    m, k = len(parents), len(stream_nodes)
    anc = [{v} for v in range(m)]
    for v in range(m):
        if parents[v] >= 0:
            anc[v] |= anc[parents[v]]
    r = m + k * gamma
    mask = np.zeros((r, n_prefix + r), bool)
    mask[:, :n_prefix] = True
    for v in range(m):
        mask[v, [n_prefix + u for u in anc[v]]] = True
    for s, v in enumerate(stream_nodes):
        first = n_prefix + m + s * gamma
        if shared:
            mask[v, first:first + gamma] = True
        for j in range(1, gamma + 1):
            row = m + s * gamma + j - 1
            mask[row, [n_prefix + u for u in anc[v]]] = True
            mask[row, first:first + own_count(j)] = True
    return mask


def kernel_visibility(parents, n_prefix, stream_nodes, gamma, shared):
    """The dense mask the kernel's inputs describe: ancestor bits of the row's node, the cache,
    and the row's stream-key range."""
    rows = attention.row_table(len(parents), stream_nodes, gamma, shared)
    a = layout.ancestors(parents)
    k = len(stream_nodes) * gamma
    out = np.zeros((len(rows), n_prefix + len(parents) + k), bool)
    for i, (node, lo, count) in enumerate(rows):
        out[i, :n_prefix] = True
        out[i, n_prefix:n_prefix + len(parents)] = a[node]
        out[i, n_prefix + len(parents) + lo:n_prefix + len(parents) + lo + count] = True
    return out


def test_worked_example_of_the_docstring():
    sees = layout.keys_by_ancestry(np.array([-1, 0, 1]), 5)
    mask = layout.pass_mask(sees, [1, 2], 2, own=True).astype(int)
    rows = ["".join(map(str, r)) for r in mask]
    assert rows == ["11111" "100" "0000", "11111" "110" "1100", "11111" "111" "0011",
                    "11111" "110" "1000", "11111" "110" "1100", "11111" "111" "0010", "11111" "111" "0011"]
    assert layout.pass_positions(np.array([5, 6, 7]), [1, 2], 2).tolist() == [5, 6, 7, 7, 8, 8, 9]


@pytest.mark.parametrize("shared", [False, True])
def test_tree_mask_and_kernel_rows_follow_the_rule(shared):
    for nodes in (np.arange(7), np.array([6]), np.array([1, 4, 6])):
        expected = oracle(PARENTS, 5, nodes, 3, shared)
        np.testing.assert_array_equal(np.array(tree.stream_mask(PARENTS, 5, nodes, 3, shared)), expected)
        np.testing.assert_array_equal(kernel_visibility(PARENTS, 5, nodes, 3, shared), expected)


@pytest.mark.parametrize("n_prefix", [0, 4])
def test_training_layout_equals_the_tree_pass_of_a_chain(n_prefix):
    """Lossless training's stream rows of positions t are the stream rows of a tree pass over a
    chain of the same tokens; shared training's pass is the shared tree pass of the chain."""
    L, g = 6, 3
    chain = tree.chain(np.arange(L))
    nodes = np.arange(L)
    t = n_prefix + nodes[None]  # (1, L)
    pos, mask = segment_layout(t, g, n_prefix + L)
    tree_mask = np.array(tree.stream_mask(chain.parents, n_prefix, nodes, g, False))
    tree_pos = np.array(tree.positions(chain.depths, n_prefix, nodes, g))
    np.testing.assert_array_equal(np.array(mask)[0, 0], tree_mask[L:])
    np.testing.assert_array_equal(np.array(pos)[0], tree_pos[L:])
    # a subset of the stream rows, closed under the stream keys they see: those rows and keys
    rows = np.array([0, 1, 2, 3, 4, 6])
    sub_pos, sub_mask = segment_layout(t, g, n_prefix + L, rows)
    keys = np.concatenate([np.arange(n_prefix + L), n_prefix + L + rows])
    np.testing.assert_array_equal(np.array(sub_mask)[0, 0], tree_mask[L:][rows][:, keys])
    np.testing.assert_array_equal(np.array(sub_pos)[0], tree_pos[L:][rows])

    batch = Batch.of([Example(list(range(1, L + 2)), 1)])  # streams on positions 0..L-1 of L+1
    pos, mask = shared_layout(batch, g)
    chain = tree.chain(np.arange(L + 1))
    expected = np.array(tree.stream_mask(chain.parents, 0, nodes, g, True))
    np.testing.assert_array_equal(np.array(mask)[0, 0], expected)
    np.testing.assert_array_equal(np.array(pos), np.array(tree.positions(chain.depths, 0, nodes, g)))


def torch_graph_layout(cmask, T, G, shared, positions):
    torch = pytest.importorskip("torch")
    from mlx_specstream.convert.torch_graph import SpecStreamGraph

    graph = SpecStreamGraph.__new__(SpecStreamGraph)  # only its layout methods, no weights
    graph.__dict__["gc"] = type("GC", (), {"tree_size": T, "gamma": G, "shared": shared})()
    mask = SpecStreamGraph._stream_mask(graph, torch.from_numpy(cmask)).numpy()
    pos = SpecStreamGraph._pass_positions(graph, torch.from_numpy(positions.astype(np.int32))).numpy()
    return mask, pos


def uses(shared):
    """(mask, positions) of every use of the layout on one tree with streams on every node."""
    g, n = 2, 3
    m = len(PARENTS)
    nodes = np.arange(m)
    out = {"tree": (np.array(tree.stream_mask(PARENTS, n, nodes, g, shared)),
                    np.array(tree.positions(DEPTHS, n, nodes, g))),
           "kernel": (kernel_visibility(PARENTS, n, nodes, g, shared), None)}
    cmask = layout.keys_by_ancestry(PARENTS, n)
    out["coreml"] = torch_graph_layout(cmask, m, g, shared, n + DEPTHS)
    chain = tree.chain(np.arange(m))
    if shared:  # m + 1 tokens, prompt 1: streams on positions 0..m-1, main rows see them
        pos, mask = shared_layout(Batch.of([Example(list(range(1, m + 2)), 1)]), g)
        out["train"] = (np.array(mask)[0, 0], np.array(pos))
        chain = tree.chain(np.arange(m + 1))
        out["chain"] = (np.array(tree.stream_mask(chain.parents, 0, nodes, g, True)),
                        np.array(tree.positions(chain.depths, 0, nodes, g)))
    else:
        pos, mask = segment_layout(nodes[None], g, m)
        out["train"] = (np.array(mask)[0, 0], np.array(pos)[0])
        full = np.array(tree.stream_mask(chain.parents, 0, nodes, g, False))
        out["chain"] = (full[m:], np.array(tree.positions(chain.depths, 0, nodes, g))[m:])
    return out


@pytest.mark.parametrize("shared", [False, True])
def test_a_changed_rule_shows_up_in_every_use(shared, monkeypatch):
    """Change the rule in layout.rows alone (streams one position further ahead, each seeing all
    streams of its node): the engine, the kernel, training and the Core ML graph all follow."""
    before = uses(shared)
    rule = layout.rows

    def changed(*args, **kwargs):
        r = rule(*args, **kwargs).copy()
        stream = r[..., layout.AHEAD] > 0
        r[..., layout.AHEAD] += stream
        r[..., layout.COUNT] = np.where(stream, args[2], r[..., layout.COUNT])
        return r

    monkeypatch.setattr(layout, "rows", changed)
    after = uses(shared)
    g, n, m = 2, 3, len(PARENTS)
    expected = oracle(PARENTS, n, np.arange(m), g, shared, own_count=lambda j: g)
    np.testing.assert_array_equal(after["tree"][0], expected)
    np.testing.assert_array_equal(after["kernel"][0], expected)
    np.testing.assert_array_equal(after["coreml"][0], expected)
    np.testing.assert_array_equal(after["tree"][1], before["tree"][1] + (np.arange(m + m * g) >= m))
    np.testing.assert_array_equal(after["coreml"][1], after["tree"][1])
    np.testing.assert_array_equal(after["train"][0], after["chain"][0])
    np.testing.assert_array_equal(after["train"][1], after["chain"][1])
    for use in ("tree", "kernel", "coreml", "train"):
        assert not np.array_equal(after[use][0], before[use][0]), use
    assert not np.array_equal(after["train"][1], before["train"][1])


def test_deferred_streams_see_the_cache_and_their_own_earlier_streams():
    plan = attention.AttentionPlan.deferred(4, 3)
    expected = np.concatenate([np.ones((3, 4), bool), np.tril(np.ones((3, 3), bool))], axis=1)
    np.testing.assert_array_equal(np.array(plan.mask), expected)
    assert plan.rows.tolist() == [[0, 0, 1], [0, 0, 2], [0, 0, 3]]
    assert layout.stream_positions(np.array([3]), 3).tolist() == [4, 5, 6]


def test_the_models_causal_mask_is_the_position_rule():
    from mlx_specstream.arch.base import causal_mask

    for n, offset in ((1, 0), (5, 0), (3, 7)):
        rule = layout.keys_by_position(np.arange(offset, offset + n), offset + n)
        np.testing.assert_array_equal(np.array(causal_mask(n, offset)), rule)
