import numpy as np
import pytest

from mlx_specstream.tree import (
    ancestor_bits,
    ancestors,
    best_size,
    build_tree,
    chain,
    positions,
    reorder,
    stream_mask,
    tree_mask,
)


def test_full_tree_size_and_bfs_order():
    levels = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    scores = [[-0.1, -1.0, -2.0]] * 3
    t = build_tree(5, levels, scores, budget=1000)
    assert len(t) == 1 + 3 + 9 + 27
    assert t.tokens[0] == 5 and t.parents[0] == -1
    assert np.all(np.diff(t.depths) >= 0)  # breadth-first
    assert np.all(t.parents[1:] < np.arange(1, len(t)))  # parents first
    for v in range(1, len(t)):
        assert t.tokens[v] in levels[t.depths[v] - 1]
        assert t.depths[v] == t.depths[t.parents[v]] + 1


def test_budget_keeps_best_paths_and_is_ancestor_closed():
    levels = [[1, 2], [3, 4], [5, 6]]
    scores = [[-0.1, -3.0], [-0.2, -0.3], [-0.1, -5.0]]
    t = build_tree(0, levels, scores, budget=5)
    assert len(t) == 5
    # best path scores: 1 (-0.1), 1-3 (-0.3), 1-4 (-0.4), 1-3-5 (-0.4)
    paths = set()
    for v in range(len(t)):
        p, toks = v, []
        while p >= 0:
            toks.append(int(t.tokens[p]))
            p = t.parents[p]
        paths.add(tuple(reversed(toks)))
    assert paths == {(0,), (0, 1), (0, 1, 3), (0, 1, 4), (0, 1, 3, 5)}


def test_best_size_maximises_expected_tokens_per_cost():
    logp = np.log([1.0, 0.9, 0.5, 0.1])  # root (score 0), then path probabilities, best first
    # m nodes: (1 + sum of the m-1 best probabilities) / (1 + 0.2 (m-1)): 1, 1.583, 1.714, 1.562
    assert best_size(logp, 0.2) == 3
    assert best_size(logp, 0.0) == 4  # free nodes: all of them
    assert best_size(logp, 0.95) == 1  # a node costs nearly a pass: the root alone
    assert best_size([0.0] * 6, 0.5) == 6  # certain drafts are always worth running
    assert best_size([0.0, -20.0, -30.0], 0.01) == 1  # hopeless drafts never are
    rng = np.random.default_rng(0)
    for _ in range(50):  # against brute force
        p = np.sort(rng.random(rng.integers(1, 12)))[::-1]
        c = float(rng.random())
        ratios = [(1 + p[: m - 1].sum()) / (1 + c * (m - 1)) for m in range(1, len(p) + 2)]
        assert best_size(np.log(np.concatenate([[1.0], p])), c) == int(np.argmax(ratios)) + 1


def test_node_cost_cuts_the_tree_to_its_best_nodes():
    levels = [[1, 2], [3, 4], [5, 6]]
    scores = [[-0.1, -3.0], [-0.2, -0.3], [-0.1, -5.0]]
    full = build_tree(0, levels, scores, budget=15)
    # path log-probabilities, best first: 1 -0.1, 1-3 -0.3, 1-4 -0.4, 1-3-5 -0.4, 1-4-5 -0.5, 2 -3.0;
    # tokens per cost at 0.5 a node: 1, 1.27, 1.32, 1.33, 1.33 (m = 5), 1.31, ...
    t = build_tree(0, levels, scores, budget=15, node_cost=0.5)
    assert len(t) == best_size([0.0, -0.1, -0.3, -0.4, -0.4, -0.5, -3.0], 0.5) == 5
    assert sorted(map(tuple, zip(t.tokens, t.depths))) == [(0, 0), (1, 1), (3, 2), (4, 2), (5, 3)]
    assert len(full) == 15 and len(build_tree(0, levels, scores, budget=15, node_cost=10.0)) == 1
    assert set(map(tuple, zip(t.tokens, t.depths))) <= set(map(tuple, zip(full.tokens, full.depths)))
    for v in range(1, len(t)):
        assert 0 <= t.parents[v] < v


def test_chain_mode_is_a_path():
    t = build_tree(7, [[1], [2], [3]], [[-1.0]] * 3, budget=32)
    assert t.tokens.tolist() == [7, 1, 2, 3] and t.parents.tolist() == [-1, 0, 1, 2]


def test_budget_one_is_root_only():
    t = build_tree(7, [[1, 2]], [[-1.0, -2.0]], budget=1)
    assert len(t) == 1
    with pytest.raises(ValueError):
        build_tree(7, [], [], budget=0)


def test_ancestors_and_bits():
    parents = np.array([-1, 0, 0, 1, 1, 2])
    a = ancestors(parents)
    assert a[3].tolist() == [True, True, False, True, False, False]
    assert a[5].tolist() == [True, False, True, False, False, True]
    bits = ancestor_bits(parents)
    assert bits.shape == (6, 1)
    for i in range(6):
        assert [(int(bits[i, 0]) >> j) & 1 for j in range(6)] == a[i].astype(int).tolist()
    big = chain(list(range(40)))
    b = ancestor_bits(big.parents)
    assert b.shape == (40, 2) and int(b[39, 1]) == (1 << 8) - 1 and int(b[39, 0]) == 0xFFFFFFFF


def test_tree_mask_and_positions():
    parents = np.array([-1, 0, 0, 1])
    m = np.array(tree_mask(parents, 3))
    assert m.shape == (4, 7) and m[:, :3].all()
    assert m[3, 3:].tolist() == [True, True, False, True]
    assert np.array(positions(np.array([0, 1, 1, 2]), 10)).tolist() == [10, 11, 11, 12]


@pytest.mark.parametrize("shared", [False, True])
def test_stream_mask_rules(shared):
    parents, gamma, n = np.array([-1, 0, 0]), 2, 2
    snodes = np.array([0, 1, 2])
    m = np.array(stream_mask(parents, n, snodes, gamma, shared))
    M = 3
    assert m.shape == (M + 3 * gamma, n + M + 3 * gamma)
    main_sees_streams = m[:M, n + M:]
    if shared:
        for v in range(M):
            row = main_sees_streams[v]
            assert row.tolist() == [v == s for s in range(M) for _ in range(gamma)]
    else:
        assert not main_sees_streams.any()
    # stream (node 1, j=1) sees cache, ancestors {0, 1}, and stream (1, 1) only
    r = M + 1 * gamma + 0
    assert m[r, :n].all() and m[r, n:n + M].tolist() == [True, True, False]
    assert m[r, n + M:].tolist() == [False, False, True, False, False, False]
    r2 = M + 1 * gamma + 1  # (node 1, j=2) also sees (1, 1)
    assert m[r2, n + M:].tolist() == [False, False, True, True, False, False]
    pos = np.array(positions(np.array([0, 1, 1]), n, snodes, gamma)).tolist()
    assert pos == [2, 3, 3, 3, 4, 4, 5, 4, 5]


def _paths(t):
    """Each node of ``t`` as its path of tokens from the root."""
    out = []
    for v in range(len(t)):
        toks, u = [], v
        while u >= 0:
            toks.append(int(t.tokens[u]))
            u = int(t.parents[u])
        out.append(tuple(reversed(toks)))
    return out


def test_cut_tree_is_the_best_prefix_of_the_whole_tree():
    """Against brute force: the cut tree holds the best ``best_size`` nodes of the uncut one (by
    path score), whatever the drafts and the chain; and each node's child lookup finds it."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        depth, k = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        levels = [[int(t) for t in rng.choice(9, k, replace=False)] for _ in range(depth)]
        scores = [sorted(np.log(rng.random(k)).tolist(), reverse=True) for _ in range(depth)]
        chain_ = [int(t) for t in rng.integers(0, 9, int(rng.integers(0, 6)))]
        chain_scores = np.log(rng.random(len(chain_))).tolist()
        cost, budget = float(rng.random() * 0.5), int(rng.integers(2, 40))
        full = build_tree(0, levels, scores, budget, 0.0, chain_, chain_scores)
        cut = build_tree(0, levels, scores, budget, cost, chain_, chain_scores)
        score = {}  # path -> score, from the uncut tree's parents
        for path in _paths(full):
            parent = score.get(path[:-1], 0.0)
            d = len(path) - 1
            if d == 0:
                score[path] = 0.0
                continue
            cands = dict(zip(levels[d - 1], scores[d - 1])) if d <= depth else {}
            if d <= len(chain_) and path[1:] == tuple(chain_[:d]):
                cands[chain_[d - 1]] = max(cands.get(chain_[d - 1], -np.inf), chain_scores[d - 1])
            score[path] = parent + cands[path[-1]]
        ranked = sorted(score.values(), reverse=True)
        m = best_size(ranked, cost)
        assert len(cut) == m
        assert sorted(score[p] for p in _paths(cut)) == sorted(ranked[:m])
        for v in range(1, len(cut)):
            assert cut.child(int(cut.parents[v]), int(cut.tokens[v])) == v
            assert cut.depths[v] == cut.depths[cut.parents[v]] + 1 and cut.parents[v] < v


def test_reorder_requires_parents():
    t = build_tree(0, [[1, 2], [3]], [[-1.0, -2.0], [-1.0]], budget=10)
    sub = reorder(t, [0, 2, 4])
    assert sub.parents.tolist()[0] == -1
    with pytest.raises(ValueError):
        reorder(t, [0, 3])  # node 3's parent is missing


def test_chain_candidates_merge_into_the_tree():
    """A prompt-lookup chain joins the stream candidates: shared tokens are one node (the higher
    score), the chain's nodes get their next chain token, and the budget ranks both by path score."""
    t = build_tree(7, [[1, 2], [3]], [[-0.1, -0.5], [-0.2]], budget=16, chain=[2, 5],
                   chain_scores=[-0.05, -0.05])
    paths = {tuple(t.tokens[[v for v in _path(t, u)]]) for u in range(len(t))}
    assert paths == {(7,), (7, 1), (7, 2), (7, 1, 3), (7, 2, 3), (7, 2, 5)}
    # the chain's token 2 now outranks stream token 1: with room for 3 nodes, 2 and its chain child
    small = build_tree(7, [[1, 2], [3]], [[-0.1, -0.5], [-0.2]], budget=3, chain=[2, 5],
                       chain_scores=[-0.01, -0.01])
    assert sorted(small.tokens.tolist()) == [2, 5, 7]
    # a chain alone is a path (the lookup baseline)
    alone = build_tree(7, [], [], budget=4, chain=[4, 4, 9, 1, 2], chain_scores=[0.0] * 5)
    assert alone.tokens.tolist() == [7, 4, 4, 9] and alone.parents.tolist() == [-1, 0, 1, 2]


def _path(t, v):
    out = [v]
    while t.parents[out[-1]] >= 0:
        out.append(int(t.parents[out[-1]]))
    return out[::-1]


def test_best_below_follows_the_best_children():
    tree = build_tree(7, [[1, 2], [3, 4]], [[-0.1, -2.0], [-0.2, -3.0]], budget=7)
    assert tree.best_below(0) == [1, 3]  # the root's best child, then its best
    v = tree.child(0, 2)
    assert tree.best_below(v) == [3]
    assert tree.best_below(tree.child(v, 4)) == []  # a leaf: nothing ran below it
