import numpy as np

from mlx_specstream.streams import prune
from mlx_specstream.tree import build_tree
from mlx_specstream.verify import probabilities, residual_accept, sample, verify_greedy, verify_sampling


def tree():
    # root 9; level 1: 1, 2; level 2: 3, 4 under each
    return build_tree(9, [[1, 2], [3, 4]], [[-0.1, -0.2], [-0.1, -0.2]], budget=7)


def test_verify_greedy_follows_argmax():
    t = tree()
    argmax = np.zeros(len(t), int)
    argmax[0] = 2  # root predicts 2
    v2 = int(np.nonzero((t.tokens == 2) & (t.depths == 1))[0][0])
    argmax[v2] = 4
    v24 = int(np.nonzero((t.parents == v2) & (t.tokens == 4))[0][0])
    argmax[v24] = 7
    path, nxt = verify_greedy(t, argmax)
    assert path == [0, v2, v24] and nxt == 7


def test_verify_greedy_rejects_everything():
    t = tree()
    argmax = np.full(len(t), 5)
    assert verify_greedy(t, argmax) == ([0], 5)


def test_prune_drops_subtrees_never_root():
    t = tree()
    trans = np.ones(len(t))
    v1 = int(np.nonzero((t.tokens == 1) & (t.depths == 1))[0][0])
    trans[v1] = 0.01
    trans[0] = 0.0  # the root is never pruned
    keep = prune(t, trans, 0.05)
    assert 0 in keep and v1 not in keep
    assert all(t.parents[k] != v1 for k in keep)
    assert len(keep) == len(t) - 3


def test_probabilities_top_p():
    p = probabilities(np.log(np.array([[0.5, 0.3, 0.15, 0.05]])), 1.0, top_p=0.7)
    np.testing.assert_allclose(p[0], [0.625, 0.375, 0, 0])
    p = probabilities(np.log(np.array([[0.5, 0.3, 0.2]])), 1.0, top_p=0.01)
    np.testing.assert_allclose(p[0], [1, 0, 0])
    assert np.allclose(probabilities(np.zeros((2, 4)), 0.5).sum(-1), 1)


def test_a_tiny_temperature_is_greedy_not_nan():
    """Logits over a temperature of 1e-310 overflow to inf: shifted by their maximum first, the
    distribution is the argmax's (split between ties), with no NaN."""
    import warnings

    logits = np.array([[1.0, 3.0, 2.0, 3.0], [0.5, -1.0, 0.0, 0.25]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = probabilities(logits, 1e-310)
    assert np.array_equal(p, [[0, 0.5, 0, 0.5], [1, 0, 0, 0]])
    assert np.allclose(probabilities(logits, 1.0).sum(-1), 1.0)


def test_sample_and_residual_edge_cases():
    rng = np.random.default_rng(0)
    assert sample(np.array([0.0, 1.0, 0.0]), rng) == 1
    p = np.array([0.2, 0.8])
    tok, _ = residual_accept(p, [1], np.array([0.2, 0.8]), rng)  # p == q: always accepted
    assert tok == 1
    tok, resid = residual_accept(np.array([1.0, 0.0]), [1, 1], np.array([0.0, 1.0]), rng)
    assert tok is None and resid[0] == 1.0


def test_verify_sampling_accepts_draft_without_node_as_next_root():
    t = build_tree(9, [[1]], [[-0.1]], budget=1)  # the draft was cut by the budget
    p = np.zeros((1, 3))
    p[0, 1] = 1.0
    q = np.array([0.0, 1.0, 0.0])
    path, nxt = verify_sampling(t, p, [[1]], [q], np.random.default_rng(0))
    assert path == [0] and nxt == 1
