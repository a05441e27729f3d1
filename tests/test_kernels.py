"""Tree and multi-stream attention kernels (metal/*.metal) run by the CPU emulator of Metal, against
the pure-MLX reference: a dense mask from tree.py and mx.fast.scaled_dot_product_attention."""

import itertools

import mlx.core as mx
import numpy as np
import pytest
from helpers import tiny_model

from mlx_specstream import tree
from mlx_specstream.kernels import attention as A
from mlx_specstream.kernels.attention import (
    AttentionPlan,
    multistream_attention,
    planned_attention,
    tree_attention,
)
from mlx_specstream.kernels.emulator import SCHEDULES

TOL = {mx.float32: 2e-5, mx.float16: 4e-3, mx.bfloat16: 3e-2}


def random_tree(m, rng):
    return np.array([-1] + [int(rng.integers(0, i)) for i in range(1, m)])


def largest_tree(rng, budget=64):
    levels = [list(rng.choice(1000, 4, replace=False)) for _ in range(4)]
    scores = [sorted(np.log(rng.dirichlet(np.ones(4))), reverse=True) for _ in range(4)]
    t = tree.build_tree(7, levels, scores, budget)
    assert len(t) == budget
    return t.parents


def tensors(rng, shape, dtype):
    return mx.array(rng.normal(size=shape).astype(np.float32)).astype(dtype)


def make_case(parents, n_prefix, heads, kv_heads, dim, dtype, stream_nodes=None, gamma=0, shared=False,
              seed=0):
    rng = np.random.default_rng(seed)
    parents = np.asarray(parents, np.int64)
    m = len(parents)
    if stream_nodes is None:
        plan = AttentionPlan.for_tree(parents, n_prefix)
    elif m == 0:
        plan = AttentionPlan.deferred(n_prefix, gamma)
    else:
        plan = AttentionPlan.for_streams(parents, n_prefix, stream_nodes, gamma, shared)
    q = tensors(rng, (1, heads, plan.n_rows, dim), dtype)
    k = tensors(rng, (1, kv_heads, n_prefix + m, dim), dtype)
    v = tensors(rng, (1, kv_heads, n_prefix + m, dim), dtype)
    ks = vs = None
    if plan.has_streams:
        ks = tensors(rng, (1, kv_heads, plan.n_stream_rows, dim), dtype)
        vs = tensors(rng, (1, kv_heads, plan.n_stream_rows, dim), dtype)
    return plan, q, k, v, ks, vs


def reference(plan, q, k, v, ks, vs, scale):
    """float32 dense attention with the mask tree.py builds."""
    m = plan.n_nodes
    parents = plan.parents
    if not plan.has_streams:
        mask = tree.tree_mask(parents, plan.n_prefix)
    elif m == 0:
        g = plan.gamma
        mask = mx.concatenate([mx.ones((g, plan.n_prefix), mx.bool_), mx.tril(mx.ones((g, g), mx.bool_))], 1)
    else:
        mask = tree.stream_mask(parents, plan.n_prefix, plan.stream_nodes, plan.gamma, plan.shared)
    f = [None if x is None else x.astype(mx.float32) for x in (q, k, v, ks, vs)]
    keys = f[1] if ks is None else mx.concatenate([f[1], f[3]], axis=2)
    values = f[2] if vs is None else mx.concatenate([f[2], f[4]], axis=2)
    return mx.fast.scaled_dot_product_attention(f[0], keys, values, scale=scale, mask=mask)


def check(case, splits=None, schedules=("forward",)):
    plan, q, k, v, ks, vs = case
    scale = q.shape[-1] ** -0.5
    ref = reference(plan, q, k, v, ks, vs, scale)
    outs = []
    for schedule in schedules:
        old = A.set_backend("emulator")
        from mlx_specstream.kernels import emulator

        saved = emulator.set_defaults(schedule=schedule)
        try:
            out = planned_attention(q, k, v, ks, vs, plan, scale, splits=splits)
        finally:
            emulator.set_defaults(**saved)
            A.set_backend(old)
        assert out.dtype == q.dtype and out.shape == q.shape
        err = float(mx.abs(out.astype(mx.float32) - ref).max())
        assert err <= TOL[q.dtype], f"max abs error {err:.2e} > {TOL[q.dtype]:.0e} ({schedule})"
        outs.append(np.array(out.astype(mx.float32)))
    for o in outs[1:]:  # the result does not depend on how threads interleave
        np.testing.assert_array_equal(o, outs[0])
    dense = planned_attention(q, k, v, ks, vs, plan, scale, backend="mlx")
    assert float(mx.abs(dense.astype(mx.float32) - ref).max()) <= TOL[q.dtype]


# ---- the default (fast) set of emulated cases ------------------------------------------------

def test_one_node_tree_gqa1_fp32_d64():
    check(make_case([-1], 45, 4, 4, 64, mx.float32))


def test_full_depth_chain_gqa4_fp16_d80():
    check(make_case(np.arange(-1, 23), 33, 8, 2, 80, mx.float16, seed=1))


def test_largest_tree_gqa8_bf16_d96():
    check(make_case(largest_tree(np.random.default_rng(2)), 100, 8, 1, 96, mx.bfloat16, seed=2))


def test_lossless_streams_gqa4_fp32_d128():
    rng = np.random.default_rng(3)
    check(make_case(random_tree(10, rng), 50, 4, 1, 128, mx.float32, np.arange(10), 3, False, seed=3))


def test_shared_streams_on_some_nodes_fp16_d64_any_schedule():
    rng = np.random.default_rng(4)
    case = make_case(random_tree(7, rng), 31, 4, 4, 64, mx.float16, np.array([0, 2, 3, 6]), 4, True, seed=4)
    check(case, schedules=tuple(SCHEDULES))


def test_deferred_streams_of_a_cached_token_bf16_d128():
    check(make_case(np.zeros(0), 77, 8, 2, 128, mx.bfloat16, np.array([-1]), 4, seed=5))


def test_split_keys_with_streams_in_the_last_split():
    rng = np.random.default_rng(6)
    case = make_case(random_tree(12, rng), 300, 8, 2, 64, mx.float32, np.arange(12), 2, True, seed=6)
    check(case, splits=3)


def test_split_keys_of_a_batch():
    """Each split's partial output of each sequence lands in its own place (B = 2)."""
    rng = np.random.default_rng(9)
    parents = random_tree(7, rng)
    n_prefix, B, H, Hkv, D = 300, 2, 4, 2, 64
    plan = AttentionPlan.for_streams(parents, n_prefix, np.arange(7), 2, True)
    q, k, v, ks, vs = (rng.normal(size=s).astype(np.float32) for s in (
        (B, H, plan.n_rows, D), (B, Hkv, n_prefix + 7, D), (B, Hkv, n_prefix + 7, D),
        (B, Hkv, plan.n_stream_rows, D), (B, Hkv, plan.n_stream_rows, D)))
    anc, rows = plan.kernel_inputs(on_device=False)
    out = A.run_kernel("emulator", q, k, v, ks, vs, anc, rows, n_prefix, 7, plan.n_stream_rows, D**-0.5,
                       splits=3)
    ref = reference(plan, *(mx.array(x) for x in (q, k, v, ks, vs)), D**-0.5)
    assert float(mx.abs(out - ref).max()) < 2e-5


def test_small_heads_fp16_d16():
    rng = np.random.default_rng(10)
    check(make_case(random_tree(6, rng), 23, 4, 2, 16, mx.float16, np.arange(6), 2, True, seed=10))


def test_auto_keeps_the_dense_path_for_what_the_kernel_does_not_run(monkeypatch):
    """On a Metal device ``auto`` runs the kernel, but heads it does not support (Gemma 3's 256) and
    a pass without rows take the dense path (here, with Metal pretended, anything else would fail)."""
    monkeypatch.setattr(A, "metal_available", lambda: True)
    monkeypatch.setattr(A, "_metal_passes_self_check", lambda: True)
    plan, q, k, v, ks, vs = make_case([-1, 0, 0], 5, 2, 1, 256, mx.float32, np.arange(3), 2, False)
    ref = planned_attention(q, k, v, ks, vs, plan, 0.1, backend="mlx")
    assert mx.array_equal(planned_attention(q, k, v, ks, vs, plan, 0.1, backend="auto"), ref).item()
    empty = AttentionPlan.for_tree(np.array([], np.int64), 5)
    q0 = mx.zeros((1, 2, 0, 64))
    k0 = v0 = mx.zeros((1, 1, 5, 64))
    assert planned_attention(q0, k0, v0, None, None, empty, 0.1, backend="emulator").shape == (1, 2, 0, 64)


def test_metal_asked_for_without_metal_is_one_line(tmp_path):
    """``MLX_SPECSTREAM_ATTENTION=metal`` on a machine without Metal: one error line, no traceback."""
    import os
    import subprocess
    import sys

    if mx.metal.is_available():
        pytest.skip("Metal is available here")
    env = {**os.environ, "MLX_SPECSTREAM_ATTENTION": "metal"}
    r = subprocess.run([sys.executable, "-m", "mlx_specstream.cli", "generate", "--mode", "ar", "-p", "hi",
                        "-n", "2"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1, r.stderr


def test_long_cache_picks_splits_by_itself():
    assert A.choose_splits(1505, 4) > 1
    check(make_case(np.arange(-1, 4), 1500, 4, 4, 64, mx.float16, seed=7))


def test_strided_inputs_as_metal_sees_cache_slices():
    """Metal gets the cache slices and transposed projections as they are (ensure_row_contiguous
    is off): the kernel must index through the strides."""
    rng = np.random.default_rng(8)
    parents = random_tree(9, rng)
    n_prefix, B, H, Hkv, D, cap = 40, 2, 4, 2, 64, 96
    plan = AttentionPlan.for_streams(parents, n_prefix, np.arange(9), 2, False)
    R = plan.n_rows
    q = rng.normal(size=(B, R, H, D)).astype(np.float32).transpose(0, 2, 1, 3)  # (B, H, R, D) view
    cache_k = rng.normal(size=(B, Hkv, cap, D)).astype(np.float32)
    cache_v = rng.normal(size=(B, Hkv, cap, D)).astype(np.float32)
    k, v = cache_k[:, :, : n_prefix + 9], cache_v[:, :, : n_prefix + 9]
    proj = rng.normal(size=(B, R, Hkv, D)).astype(np.float32).transpose(0, 2, 1, 3)
    ks = proj[:, :, 9:]
    vs = np.ascontiguousarray(proj[:, :, 9:][..., ::-1])[..., ::-1]  # negative last stride
    assert not q.flags.c_contiguous and not k.flags.c_contiguous and not ks.flags.c_contiguous
    anc, rows = plan.kernel_inputs(on_device=False)
    out = A.run_kernel("emulator", q, k, v, ks, vs, anc, rows, n_prefix, 9, plan.n_stream_rows, D**-0.5)
    ref = reference(plan, *(mx.array(np.ascontiguousarray(x)) for x in (q, k, v, ks, vs)), D**-0.5)
    assert float(mx.abs(out - ref).max()) < 2e-5


# ---- visibility bookkeeping (pure numpy, no kernel) --------------------------------------------

def visibility_from_rows(plan):
    """The mask the kernel computes, from its inputs (anc bits and the row table)."""
    m, n, s = plan.n_nodes, plan.n_prefix, plan.n_stream_rows
    anc = A.unpack_bits(plan.anc_bits, m)
    rows = plan.rows
    mask = np.zeros((plan.n_rows, n + m + s), bool)
    mask[:, :n] = True
    for i, (node, lo, cnt) in enumerate(rows):
        if m:
            mask[i, n : n + m] = anc[node]
        mask[i, n + m + lo : n + m + lo + cnt] = True
    return mask


@pytest.mark.parametrize("seed", range(20))
def test_row_table_and_bits_give_tree_masks(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 70))
    parents = random_tree(m, rng)
    np.testing.assert_array_equal(A.parents_from_bits(tree.ancestor_bits(parents), m), parents)
    n = int(rng.integers(0, 50))
    plan = AttentionPlan.for_tree(parents, n)
    np.testing.assert_array_equal(visibility_from_rows(plan), np.array(tree.tree_mask(parents, n)))
    gamma = int(rng.integers(1, 5))
    nodes = np.sort(rng.choice(m, int(rng.integers(1, m + 1)), replace=False))
    for shared in (False, True):
        plan = AttentionPlan.for_streams(parents, n, nodes, gamma, shared)
        expected = np.array(tree.stream_mask(parents, n, nodes, gamma, shared))
        np.testing.assert_array_equal(visibility_from_rows(plan), expected)
        np.testing.assert_array_equal(np.array(plan.mask), expected)


def test_backend_switch_and_validation():
    old = A.set_backend("mlx")
    try:
        assert A.set_backend("mlx") == "mlx"  # the one set before
        if not mx.metal.is_available():
            assert A.resolve("auto") == "mlx"
            with pytest.raises(ValueError, match="needs MLX on a Metal device"):  # one line in the CLI
                A.resolve("metal")
        with pytest.raises(ValueError):
            A.set_backend("cuda")
    finally:
        A.set_backend(old)
    plan, q, k, v, ks, vs = make_case([-1, 0, 0], 5, 2, 1, 64, mx.float32, np.arange(3), 2, False)
    with pytest.raises(ValueError, match="stream keys"):
        planned_attention(q, k, v, None, None, plan, 0.1, backend="mlx")
    with pytest.raises(ValueError, match="rows"):
        planned_attention(q[:, :, :3], k, v, ks, vs, plan, 0.1, backend="mlx")
    # the public entry points on the dense path
    bits = tree.ancestor_bits(np.array([-1, 0, 0]))
    ref = reference(plan, q, k, v, ks, vs, 0.1)
    got = multistream_attention(q, k, v, ks, vs, 5, bits, np.arange(3), 2, False, 0.1, backend="mlx")
    assert float(mx.abs(got - ref).max()) < 1e-6
    tplan, tq, tk, tv, _, _ = make_case([-1, 0, 0], 5, 2, 1, 64, mx.float32)
    got = tree_attention(tq, tk, tv, 5, bits, 0.1, backend="mlx")
    assert float(mx.abs(got - reference(tplan, tq, tk, tv, None, None, 0.1)).max()) < 1e-6


# ---- the engine with its attention routed through the emulated kernels --------------------------

def _lossless_on_emulated_kernels(n_tokens=40):
    from mlx_specstream.adapter import new_adapter
    from mlx_specstream.api import generate

    model = tiny_model("llama", seed=3, scale=2.0)
    new_adapter(model, gamma=3, msa_layers=2, seed=1)
    prompt = [5, 9, 2, 7]
    ar = generate(model, None, prompt, max_tokens=n_tokens, mode="ar")
    old = A.set_backend("emulator")
    before = A.calls["emulator"]
    try:
        outs = [generate(model, None, prompt, max_tokens=n_tokens, branch=2, tree_budget=12, streams=s,
                         node_cost=0.0)  # the whole budget, whatever this machine's node cost
                for s in ("tree", "deferred")]
    finally:
        A.set_backend(old)
    assert A.calls["emulator"] > before, "attention did not go through the emulated kernels"
    for ss in outs:
        assert ss.tokens == ar.tokens
    assert max(max(ss.stats.accepted_lengths) for ss in outs) >= 2  # drafts were accepted

    # shared mode (main rows also see their node's streams): kernels == dense path
    new_adapter(model, mode="shared", gamma=3, msa_layers=2, seed=2)
    runs = {}
    for backend in ("mlx", "emulator"):
        old = A.set_backend(backend)
        try:
            runs[backend] = generate(model, None, prompt, max_tokens=n_tokens, branch=2, tree_budget=12)
        finally:
            A.set_backend(old)
    assert runs["emulator"].tokens == runs["mlx"].tokens


def test_engine_with_emulated_kernels():
    """Output token-identical to AR with every tree pass's attention on the emulated kernels
    (through the engine's own hook: base.attention given an AttentionPlan)."""
    _lossless_on_emulated_kernels()


# ---- the full sweep ----------------------------------------------------------------------------

SWEEP = list(itertools.product(["float32", "float16", "bfloat16"], [64, 80, 96, 128], [1, 4, 8],
                               ["tree", "lossless", "shared"]))


@pytest.mark.slow
@pytest.mark.parametrize("dtype,dim,gqa,mode", SWEEP)
def test_sweep(dtype, dim, gqa, mode):
    dtype = getattr(mx, dtype)
    rng = np.random.default_rng(dim + gqa)
    parents = random_tree(int(rng.integers(1, 40)), rng)
    n_prefix = int(rng.integers(0, 200))
    nodes = None if mode == "tree" else np.sort(rng.choice(len(parents), min(len(parents), 8), replace=False))
    check(make_case(parents, n_prefix, 2 * gqa, 2, dim, dtype, nodes, 3, mode == "shared", seed=dim))


@pytest.mark.parametrize("rows", [1, 4, 20, 40])
@pytest.mark.parametrize("mask_kind", ["none", "2d-bool", "4d-bool", "2d-additive", "per-head"])
@pytest.mark.parametrize("cuda", [False, True])
def test_sdpa_with_folded_groups_equals_plain_sdpa(rows, mask_kind, cuda, monkeypatch):
    """Folding the query heads of a KV group into the rows changes nothing but the speed; nor does
    the plain-matmul attention that decode passes run on CUDA (``matmul_attention``, taken here as
    on an NVIDIA GPU: its fp32 arithmetic is the CPU's)."""
    from mlx_specstream.kernels.attention import sdpa

    monkeypatch.setattr(A, "on_cuda", lambda: cuda)
    used = []
    monkeypatch.setattr(A, "matmul_attention", lambda *a, f=A.matmul_attention: used.append(1) or f(*a))
    rng = np.random.default_rng(rows)
    B, H, Hkv, S, D = 2, 6, 2, 37 + rows, 16
    q = mx.array(rng.normal(size=(B, H, rows, D)).astype(np.float32))
    k, v = (mx.array(rng.normal(size=(B, Hkv, S, D)).astype(np.float32)) for _ in range(2))
    see = rng.random((B, 1, rows, S)) < 0.7
    see[..., -1] = True  # no empty row
    mask = {"none": None, "2d-bool": mx.array(see[0, 0]), "4d-bool": mx.array(see),
            "2d-additive": mx.array(np.where(see[0, 0], 0.0, -np.inf).astype(np.float32)),
            "per-head": mx.array(np.broadcast_to(see, (B, H, rows, S)))}[mask_kind]
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    np.testing.assert_allclose(np.array(sdpa(q, k, v, mask, 0.25)), np.array(want), atol=2e-6)
    assert bool(used) == (cuda and rows > 1 and mask_kind != "per-head")
