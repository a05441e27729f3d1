"""KV cache built for speculation: append n rows, commit a subset to contiguous slots, trim.

The model test is the cache invariant: after a tree of drafts is appended and an accepted path
committed, the cache equals the cache of the accepted tokens run through the model from scratch.
"""

import mlx.core as mx
import numpy as np
import pytest
from helpers import tiny_model

from mlx_specstream.kv_cache import STEP, KVCache, make_cache


def rows(n, start=0, heads=2, dim=8):
    """(1, heads, n, dim) keys whose values encode their row index, and matching values."""
    r = mx.arange(start, start + n, dtype=mx.float32)[None, None, :, None]
    k = mx.broadcast_to(r, (1, heads, n, dim)) + mx.arange(dim, dtype=mx.float32) / 100
    return k, -k


def row_ids(cache):
    k, v = cache.state
    assert np.array_equal(np.array(v), -np.array(k))
    return [int(x) for x in np.array(k[0, 0, :, 0])]


def test_append_returns_all_valid_rows():
    c = KVCache(step=4)
    k, v = c.append(*rows(3))
    assert k.shape == (1, 2, 3, 8) and c.offset == 3 and c.keys.shape[2] == 4
    k, v = c.append(*rows(2, 3))
    assert k.shape == (1, 2, 5, 8) and row_ids(c) == [0, 1, 2, 3, 4]
    assert np.array_equal(np.array(k), np.array(c.state[0]))


def test_growth_past_step_keeps_contents():
    c = KVCache(step=4)
    for i in range(11):  # one row at a time, across several reallocations
        c.append(*rows(1, i))
        assert c.keys.shape[2] % 4 == 0 and c.keys.shape[2] >= c.offset
    assert row_ids(c) == list(range(11)) and c.keys.shape[2] == 12
    c.append(*rows(9, 11))  # many rows at once, past more than one step
    assert row_ids(c) == list(range(20)) and c.keys.shape[2] == 20
    assert KVCache().step == STEP


def test_trim():
    c = KVCache(step=4)
    c.append(*rows(6))
    assert c.trim(2) == 2 and row_ids(c) == [0, 1, 2, 3]
    c.append(*rows(3, 10))  # appends overwrite the trimmed rows
    assert row_ids(c) == [0, 1, 2, 3, 10, 11, 12]
    assert c.trim(100) == 7 and c.offset == 0


@pytest.mark.parametrize("keep", [[0, 2, 3], [1, 4], [0], [4, 1], [], [0, 1, 2, 3, 4]])
def test_commit_moves_rows_to_contiguous_slots(keep):
    c = KVCache(step=4)
    c.append(*rows(3))
    c.append(*rows(5, 100))  # a flattened tree of 5 nodes after a 3-row prefix
    c.commit(3, keep)
    assert row_ids(c) == [0, 1, 2] + [100 + i for i in keep]
    c.append(*rows(1, 7))  # the next step writes right after the committed rows
    assert row_ids(c)[-1] == 7 and c.offset == 3 + len(keep) + 1


def test_commit_accepts_an_mx_array():
    c = KVCache()
    c.append(*rows(6))
    c.commit(2, mx.array([3, 1]))
    assert row_ids(c) == [0, 1, 5, 3]


# --- against the model --------------------------------------------------------------------

# A draft tree of 5 nodes: 0 is the root, 1 and 2 its children, 3 a child of 2, 4 a child of 1.
PARENTS = [-1, 0, 0, 2, 1]
TOKENS = [7, 11, 13, 17, 19]


def depth(i):
    return 0 if PARENTS[i] < 0 else 1 + depth(PARENTS[i])


def ancestors(i):
    return {i} | (ancestors(PARENTS[i]) if PARENTS[i] >= 0 else set())


def tree_mask(n_prefix):
    """Boolean (5, n_prefix + 5): every node sees the prefix, its ancestors and itself."""
    m = np.zeros((len(PARENTS), n_prefix + len(PARENTS)), dtype=bool)
    m[:, :n_prefix] = True
    for i in range(len(PARENTS)):
        for a in ancestors(i):
            m[i, n_prefix + a] = True
    return mx.array(m)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", seed=3)


def from_scratch(model, tokens, step=STEP):
    cache = [KVCache(step=step) for _ in model.layers]
    logits = model(mx.array([tokens]), cache=cache)
    return cache, np.array(logits[0])


def assert_same_cache(a, b, tol=1e-5):
    for ca, cb in zip(a, b):
        assert ca.offset == cb.offset
        for x, y in zip(ca.state, cb.state):
            assert np.abs(np.array(x) - np.array(y)).max() < tol


@pytest.mark.parametrize("path", [[0, 2, 3], [0, 1, 4], [0, 2], [0], []])
@pytest.mark.parametrize("step", [STEP, 4])
def test_tree_commit_equals_recomputed_cache(llama, path, step):
    """Append a whole tree (positions n + depth, tree mask), commit an accepted path: the cache
    equals the cache of prompt + accepted tokens computed from scratch, and decoding goes on
    identically. ``step=4`` makes the tree append reallocate the cache."""
    prompt = [3, 1, 4, 1, 5, 9]
    n = len(prompt)
    cache, _ = from_scratch(llama, prompt, step)
    positions = mx.array([n + depth(i) for i in range(len(PARENTS))])
    tree_logits = np.array(llama(mx.array([TOKENS]), cache=cache, mask=tree_mask(n),
                                 positions=positions)[0])
    assert cache[0].offset == n + len(PARENTS)
    for c in cache:
        c.commit(n, path)
    accepted = [TOKENS[i] for i in path]
    ref_cache, ref_logits = from_scratch(llama, prompt + accepted)
    assert_same_cache(cache, ref_cache)
    # each tree node's logits are those of its path decoded one token after another
    for j, node in enumerate(path):
        assert np.abs(tree_logits[node] - ref_logits[n + j]).max() < 1e-4
    nxt = mx.array([[2]])
    a = np.array(llama(nxt, cache=cache))
    b = np.array(llama(nxt, cache=ref_cache))
    assert np.abs(a - b).max() < 1e-4
    assert_same_cache(cache, ref_cache)


def test_trim_then_decode_equals_recomputed(llama):
    """Trimming rejected rows and decoding on equals never having appended them."""
    cache = make_cache(llama)
    llama(mx.array([[3, 1, 4, 1, 5]]), cache=cache)
    llama(mx.array([[9, 2, 6]]), cache=cache)
    for c in cache:
        assert c.trim(3) == 3
    out = np.array(llama(mx.array([[8]]), cache=cache))
    ref_cache, ref = from_scratch(llama, [3, 1, 4, 1, 5, 8])
    assert_same_cache(cache, ref_cache)
    assert np.abs(out[0, -1] - ref[-1]).max() < 1e-4
