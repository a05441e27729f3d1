"""The CPU emulator of Metal kernels (mlx_specstream.kernels.emulator) against numpy."""

import mlx.core as mx
import numpy as np
import pytest

from mlx_specstream.kernels import EmulatedKernel, KernelRuntimeError, MetalCompileError, metal_kernel
from mlx_specstream.kernels.emulator import bf16_bits_to_float, float_to_bf16_bits

SCHEDULES = ["forward", "reverse", "random", "simdgroups", "simdgroups-reverse"]


def kernel(name, inputs, outputs, source, **kw):
    return metal_kernel(name, inputs, outputs, source, backend="emulator", **kw)


def test_auto_backend_is_the_emulator_without_metal():
    if mx.metal.is_available():
        pytest.skip("this machine has Metal")
    assert isinstance(metal_kernel("k", ["a"], ["b"], "b[0] = a[0];"), EmulatedKernel)
    with pytest.raises(ValueError, match="needs MLX on a Metal device"):  # one line in the CLI
        metal_kernel("k", ["a"], ["b"], "b[0] = a[0];", backend="metal")


def test_elementwise_matches_mlx_and_signature_matches_mlx(capsys):
    src = """
        uint elem = thread_position_in_grid.x;
        T tmp = inp[elem];
        out[elem] = metal::exp(tmp);
    """
    k = kernel("myexp", ["inp"], ["out"], src)
    for dtype in (mx.float32, mx.float16):
        a = mx.random.normal(shape=(4, 17), key=mx.random.key(1)).astype(dtype)
        (b,) = k(inputs=[a], template=[("T", dtype)], grid=(a.size, 1, 1), threadgroup=(32, 1, 1),
                 output_shapes=[a.shape], output_dtypes=[dtype], verbose=dtype == mx.float32)
        ref = np.array(mx.exp(a).astype(mx.float32))
        np.testing.assert_allclose(b.astype(np.float32), ref, rtol=1e-6 if dtype == mx.float32 else 1e-3)
    printed = capsys.readouterr().out
    assert "[[kernel]] void custom_kernel_myexp_float_float_float(" in printed
    assert "const device float* inp [[buffer(0)]]" in printed
    assert "device float* out [[buffer(1)]]" in printed
    assert "uint3 thread_position_in_grid [[thread_position_in_grid]]) {" in printed
    assert 'template [[host_name("custom_kernel_myexp_float_float_float")]]' in printed


def test_signature_rules_scalars_constants_shapes_templates():
    src = "out[0] = a[0] + s + float(b_ndim) + float(a_shape[0]) + float(N) + float(FLAG);"
    k = kernel("sig", ["a", "b", "s"], ["out"], src)
    a = np.ones(12, np.float32)
    b = np.ones((2, 3), np.int32)
    text = k.metal_source(inputs=[a, b, 2.0], output_dtypes=[mx.float32],
                          template=[("N", 3), ("FLAG", True), ("T", mx.float16)])
    assert text.startswith("template <int N, bool FLAG, typename T>\n")
    assert "custom_kernel_sig_3_1_float16_t_float_int32_tc_floats_float(" in text
    assert "  const device float* a [[buffer(0)]],\n  const constant int* a_shape [[buffer(1)]],\n" in text
    assert "const constant int32_t* b [[buffer(2)]],\n  const constant int& b_ndim [[buffer(3)]]," in text
    assert "const constant float& s [[buffer(4)]]," in text
    assert "a_strides" not in text and "b_shape" not in text
    (out,) = k(inputs=[a, b, 2.0], template=[("N", 3), ("FLAG", True), ("T", mx.float16)],
               grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,)], output_dtypes=[mx.float32])
    assert out[0] == 1 + 2 + 2 + 12 + 3 + 1


def test_strided_inputs_with_elem_to_loc():
    src = """
        uint elem = thread_position_in_grid.x;
        int64_t loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        out[elem] = inp[loc] * 10.0f;
    """
    base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    view = base.transpose(2, 0, 1)[:, 1:, ::2]  # non-contiguous, with a reversed-free step
    for contiguous in (False, True):
        k = kernel("strided", ["inp"], ["out"], src, ensure_row_contiguous=contiguous)
        (out,) = k(inputs=[view], grid=(view.size, 1, 1), threadgroup=(16, 1, 1),
                   output_shapes=[view.shape], output_dtypes=[mx.float32])
        np.testing.assert_array_equal(out, view * 10)


THREADGROUP_SUM = """
    uint tid = thread_index_in_threadgroup;
    threadgroup float buf[BLOCK];
    buf[tid] = inp[thread_position_in_grid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) {
            buf[tid] += buf[tid + s];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (tid == 0) {
        out[threadgroup_position_in_grid.x] = buf[0];
    }
"""


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_threadgroup_reduction(schedule):
    x = np.random.default_rng(0).normal(size=6 * 128).astype(np.float32)
    k = kernel("tgsum", ["inp"], ["out"], THREADGROUP_SUM)
    (out,) = k(inputs=[x], template=[("BLOCK", 128)], grid=(x.size, 1, 1), threadgroup=(128, 1, 1),
               output_shapes=[(6,)], output_dtypes=[mx.float32], schedule=schedule)
    np.testing.assert_allclose(out, x.reshape(6, 128).sum(1), rtol=1e-5, atol=1e-5)


def test_missing_barrier_gives_a_wrong_result():
    """Thread i writes its value, then reads thread i+1's without a barrier in between. Threads
    run until they block, in thread order: thread i reads before thread i+1 has written, so it
    gets the poison (NaN) threadgroup memory starts with."""
    racy = """
        uint tid = thread_index_in_threadgroup;
        threadgroup float buf[64];
        buf[tid] = inp[thread_position_in_grid.x];
        BARRIER
        out[thread_position_in_grid.x] = buf[(tid + 1) % 64];
    """
    x = np.arange(128, dtype=np.float32)
    expected = np.roll(x.reshape(2, 64), -1, axis=1).ravel()
    run = dict(inputs=[x], grid=(128, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(128,)],
               output_dtypes=[mx.float32])
    good = kernel("with_barrier", ["inp"], ["out"],
                  racy.replace("BARRIER", "threadgroup_barrier(mem_flags::mem_threadgroup);"))
    bad = kernel("missing_barrier", ["inp"], ["out"], racy.replace("BARRIER", ""))
    for schedule in SCHEDULES:
        np.testing.assert_array_equal(good(**run, schedule=schedule)[0], expected)
    (wrong,) = bad(**run, schedule="forward")
    assert np.isnan(wrong).sum() == 126  # every thread but the last of each group read poison
    (wrong,) = bad(**run, schedule="reverse")
    assert np.isnan(wrong).sum() == 2  # now the last thread of each group reads poison


def test_a_simdgroup_that_runs_ahead_shows_a_missing_barrier_between_simdgroups():
    """Simdgroup r loads a shared tile in round r, every simdgroup sums it; without the barrier after
    the sums, simdgroup 1 may load round 1's tile while simdgroup 0 still reads round 0's. Schedules
    that move every simdgroup in step never show it; one that lets simdgroup 1 run ahead does."""
    racy = """
        uint sg = simdgroup_index_in_threadgroup, lane = thread_index_in_simdgroup;
        threadgroup float tile[32];
        float acc = 0.0f;
        for (uint round = 0; round < 2; ++round) {
            if (sg == round) tile[lane] = inp[round * 32 + lane];
            threadgroup_barrier(mem_flags::mem_threadgroup);
            acc += simd_sum(tile[lane]);
            BARRIER
        }
        out[thread_index_in_threadgroup] = acc;
    """
    x = np.random.default_rng(2).normal(size=64).astype(np.float32)
    run = dict(inputs=[x], grid=(64, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(64,)],
               output_dtypes=[mx.float32])
    good = kernel("tile_with_barrier", ["inp"], ["out"],
                  racy.replace("BARRIER", "threadgroup_barrier(mem_flags::mem_threadgroup);"))
    bad = kernel("tile_missing_barrier", ["inp"], ["out"], racy.replace("BARRIER", ""))
    for schedule in SCHEDULES:
        np.testing.assert_allclose(good(**run, schedule=schedule)[0], np.full(64, x.sum()), rtol=1e-5)
    right = {s: np.allclose(bad(**run, schedule=s)[0], x.sum(), rtol=1e-5) for s in SCHEDULES}
    assert right == {"forward": True, "reverse": True, "random": True, "simdgroups": True,
                     "simdgroups-reverse": False}, right


def test_missing_barrier_in_a_reduction_is_caught():
    x = np.random.default_rng(1).normal(size=4 * 128).astype(np.float32)
    racy = THREADGROUP_SUM.replace(
        "        threadgroup_barrier(mem_flags::mem_threadgroup);\n    }", "    }")
    assert racy != THREADGROUP_SUM
    k = kernel("tgsum_racy", ["inp"], ["out"], racy)
    outs = [k(inputs=[x], template=[("BLOCK", 128)], grid=(x.size, 1, 1), threadgroup=(128, 1, 1),
              output_shapes=[(4,)], output_dtypes=[mx.float32], schedule=s)[0] for s in SCHEDULES]
    ref = x.reshape(4, 128).sum(1)
    assert any(not np.allclose(o, ref, rtol=1e-4, atol=1e-4) for o in outs)


SIMD = """
    uint i = thread_position_in_grid.x;
    uint lane = thread_index_in_simdgroup;
    float v = inp[i];
    int iv = int(v);
    out[i * 12 + 0] = simd_sum(v);
    out[i * 12 + 1] = simd_max(v);
    out[i * 12 + 2] = simd_min(v);
    out[i * 12 + 3] = simd_prefix_inclusive_sum(v);
    out[i * 12 + 4] = simd_prefix_exclusive_sum(v);
    out[i * 12 + 5] = simd_shuffle(v, (lane + 5) % 32);
    out[i * 12 + 6] = simd_shuffle_up(v, 3);
    out[i * 12 + 7] = simd_shuffle_down(v, 3);
    out[i * 12 + 8] = simd_shuffle_xor(v, 6);
    out[i * 12 + 9] = simd_broadcast(v, 9);
    out[i * 12 + 10] = float(simd_or(1 << (iv % 8)));
    float4 w = simd_sum(float4(v, 1.0f, 2.0f * v, -v));
    out[i * 12 + 11] = w.x + 10.0f * w.y + 100.0f * w.z + 1000.0f * w.w;
"""


def simd_reference(x, n_threads_per_group):
    rows = []
    for g0 in range(0, len(x), n_threads_per_group):
        group = x[g0 : g0 + n_threads_per_group]
        for s0 in range(0, len(group), 32):
            sg = group[s0 : s0 + 32]
            n = len(sg)
            for lane in range(n):
                v = sg[lane]
                orv = 0
                for u in sg:
                    orv |= 1 << (int(u) % 8)
                rows.append([
                    sg.sum(), sg.max(), sg.min(), sg[: lane + 1].sum(), sg[:lane].sum(),
                    sg[(lane + 5) % 32] if (lane + 5) % 32 < n else np.nan,
                    sg[lane - 3] if lane >= 3 else v,
                    (sg[lane + 3] if lane + 3 < n else np.nan) if lane + 3 < 32 else v,
                    sg[lane ^ 6] if (lane ^ 6) < n else np.nan,
                    sg[9] if n > 9 else np.nan,
                    orv,
                    sg.sum() + 10 * n + 100 * 2 * sg.sum() - 1000 * sg.sum(),
                ])
    return np.array(rows, np.float64)


@pytest.mark.parametrize("schedule", ["forward", "random"])
def test_simd_reductions_and_shuffles(schedule):
    # 2 threadgroups of 80 threads: simdgroups of 32, 32 and a partial one of 16 lanes
    x = np.random.default_rng(2).integers(0, 50, size=160).astype(np.float32)
    k = kernel("simd_ops", ["inp"], ["out"], SIMD)
    (out,) = k(inputs=[x], grid=(160, 1, 1), threadgroup=(80, 1, 1), output_shapes=[(160, 12)],
               output_dtypes=[mx.float32], schedule=schedule)
    np.testing.assert_allclose(out, simd_reference(x, 80), rtol=1e-6)  # NaN: shuffle from no lane


def test_simd_lane_bug_is_visible():
    """A reduction by shuffles that uses the wrong lane gives a wrong sum."""
    src = """
        float v = inp[thread_position_in_grid.x];
        for (ushort off = 16; off > 0; off /= 2) {
            v += SHUFFLE;
        }
        out[thread_position_in_grid.x] = v;
    """
    x = np.random.default_rng(3).normal(size=64).astype(np.float32)
    ref = np.repeat(x.reshape(2, 32).sum(1), 32)
    good = kernel("xor_sum", ["inp"], ["out"], src.replace("SHUFFLE", "simd_shuffle_xor(v, off)"))
    bad = kernel("xor_sum_bad", ["inp"], ["out"], src.replace("SHUFFLE", "simd_shuffle_down(v, off)"))
    run = dict(inputs=[x], grid=(64, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(64,)],
               output_dtypes=[mx.float32])
    np.testing.assert_allclose(good(**run)[0], ref, rtol=1e-5, atol=1e-5)
    wrong = bad(**run)[0]
    np.testing.assert_allclose(wrong[::32], ref[::32], rtol=1e-5, atol=1e-5)  # lane 0 is right
    assert not np.allclose(wrong, ref, rtol=1e-5, atol=1e-5)  # the other lanes are not


def test_half_and_bfloat_types():
    """Conversions round to nearest even exactly like numpy (half) and MLX (bfloat16), and
    arithmetic in T rounds every operation back to T."""
    src = """
        uint i = thread_position_in_grid.x;
        T a = inp[i];
        T b = T(3);
        T c = a * b + T(1);      // two roundings in T
        out[i] = c;
        wide[i] = float(a) * 3.0f + 1.0f;
        back[i] = static_cast<T>(wide[i]);
    """
    k = kernel("types16", ["inp"], ["out", "wide", "back"], src)
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.normal(size=500) * 100, [0.0, -0.0, 65504.0, 1e-7, 6e-5, np.inf, -np.inf]])
    for dtype in (mx.float16, mx.bfloat16):
        a = mx.array(x.astype(np.float32)).astype(dtype)
        out, wide, back = k(inputs=[a], template=[("T", dtype)], grid=(a.size, 1, 1),
                            threadgroup=(64, 1, 1), output_shapes=[a.shape] * 3,
                            output_dtypes=[dtype, mx.float32, dtype])
        af = np.array(a.astype(mx.float32))
        expect_c = np.array(((a * 3).astype(dtype) + 1).astype(mx.float32))  # MLX rounds in dtype too
        np.testing.assert_array_equal(out.astype(np.float32), expect_c)
        np.testing.assert_array_equal(wide, af * 3 + 1)
        expect_back = np.array(mx.array(af * 3 + 1).astype(dtype).astype(mx.float32))
        np.testing.assert_array_equal(back.astype(np.float32), expect_back)


def test_half_conversion_is_exhaustively_exact():
    src = """
        uint i = thread_position_in_grid.x;
        half h = as_type<half>(bits[i]);
        decoded[i] = float(h);
        encoded[i] = as_type<ushort>(half(wide[i]));
    """
    k = kernel("half_bits", ["bits", "wide"], ["decoded", "encoded"], src)
    bits = np.arange(65536, dtype=np.uint16)
    with np.errstate(over="ignore"):
        check_half_bits(k, bits)


def check_half_bits(k, bits):
    wide = np.random.default_rng(5).normal(size=65536).astype(np.float32) * np.float32(2.0) ** (
        np.random.default_rng(6).integers(-30, 18, size=65536)).astype(np.float32)
    decoded, encoded = k(inputs=[bits, wide], grid=(65536, 1, 1), threadgroup=(256, 1, 1),
                         output_shapes=[(65536,), (65536,)], output_dtypes=[mx.float32, mx.uint16])
    np.testing.assert_array_equal(decoded, bits.view(np.float16).astype(np.float32))
    np.testing.assert_array_equal(encoded, wide.astype(np.float16).view(np.uint16))
    bf = float_to_bf16_bits(wide)
    np.testing.assert_array_equal(bf, np.array(mx.array(wide).astype(mx.bfloat16).view(mx.uint16)))
    np.testing.assert_array_equal(bf16_bits_to_float(bf), np.array(mx.array(wide).astype(mx.bfloat16)
                                                                   .astype(mx.float32)))


def test_partial_threadgroups_and_grid_attributes():
    src = """
        uint3 p = thread_position_in_grid;
        uint i = (p.z * threads_per_grid.y + p.y) * threads_per_grid.x + p.x;
        out[i * 6 + 0] = threads_per_threadgroup.x;
        out[i * 6 + 1] = threads_per_threadgroup.y;
        out[i * 6 + 2] = threadgroups_per_grid.x;
        out[i * 6 + 3] = thread_index_in_threadgroup;
        out[i * 6 + 4] = threadgroup_position_in_grid.y;
        out[i * 6 + 5] = dispatch_threads_per_threadgroup.x;
    """
    k = kernel("grid_attrs", ["dummy"], ["out"], src)
    (out,) = k(inputs=[np.zeros(1, np.float32)], grid=(10, 3, 2), threadgroup=(4, 2, 1),
               output_shapes=[(60, 6)], output_dtypes=[mx.uint32])
    out = out.reshape(2, 3, 10, 6)
    assert out[0, 0, 9, 0] == 2 and out[0, 0, 0, 0] == 4  # last group along x has 2 threads
    assert out[0, 2, 0, 1] == 1 and out[0, 0, 0, 1] == 2  # and along y 1
    assert (out[..., 2] == 3).all() and (out[..., 5] == 4).all()
    assert out[0, 1, 9, 3] == 1 + 1 * 2  # x=1, y=1 in a 2x2 group
    assert out[0, 2, 5, 4] == 1


def test_scalar_inputs_templates_and_atomics():
    src = """
        uint i = thread_position_in_grid.x;
        if (i < n) {
            atomic_fetch_add_explicit(&hist[bins[i] % NBINS], weight, memory_order_relaxed);
        }
    """
    k = kernel("hist", ["bins", "n", "weight"], ["hist"], src, atomic_outputs=True)
    bins = np.random.default_rng(7).integers(0, 100, size=1000).astype(np.int32)
    (hist,) = k(inputs=[bins, 900, 0.5], template=[("NBINS", 7)], grid=(1024, 1, 1),
                threadgroup=(128, 1, 1), output_shapes=[(7,)], output_dtypes=[mx.float32], init_value=0,
                workers=2)
    np.testing.assert_allclose(hist, 0.5 * np.bincount(bins[:900] % 7, minlength=7))


def test_compile_errors_cite_the_kernel_lines():
    src = "uint i = thread_position_in_grid.x;\nfloat y = inp[i];\nout[i] = y + undefined_name;\n"
    k = kernel("broken", ["inp"], ["out"], src)
    with pytest.raises(MetalCompileError, match=r"broken\.metal:3:"):
        k(inputs=[np.zeros(4, np.float32)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
          output_shapes=[(4,)], output_dtypes=[mx.float32])
    hdr = "inline float helper(float x) {\n  return x +;\n}\n"
    k = kernel("broken_header", ["inp"], ["out"], "out[0] = helper(inp[0]);", header=hdr)
    with pytest.raises(MetalCompileError, match=r"broken_header\.header:2:"):
        k(inputs=[np.zeros(4, np.float32)], grid=(1, 1, 1), threadgroup=(1, 1, 1),
          output_shapes=[(1,)], output_dtypes=[mx.float32])


def test_undefined_behaviour_is_reported():
    run = dict(inputs=[np.zeros(64, np.float32)], grid=(64, 1, 1), threadgroup=(64, 1, 1),
               output_shapes=[(64,)], output_dtypes=[mx.float32])
    early_return = kernel("early_return", ["inp"], ["out"], """
        uint i = thread_position_in_grid.x;
        if (i >= 60) return;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        out[i] = inp[i];
    """)
    with pytest.raises(KernelRuntimeError, match="threadgroup_barrier reached by 60 of 64"):
        early_return(**run)
    too_big = kernel("too_big", ["inp"], ["out"], """
        threadgroup float big[9000];
        big[thread_index_in_threadgroup] = 1.0f;
        out[thread_position_in_grid.x] = big[0];
    """)
    with pytest.raises(KernelRuntimeError, match="32768"):
        too_big(**run)
    overflow = kernel("overflow", ["inp"], ["out"], "out[thread_position_in_grid.x + 1] = 1.0f;")
    with pytest.raises(KernelRuntimeError, match="past the end of output `out`"):
        overflow(**run)
    with pytest.raises(KernelRuntimeError, match="1024"):
        overflow(**{**run, "threadgroup": (2048, 1, 1), "grid": (4096, 1, 1)})
    divergent = kernel("divergent", ["inp"], ["out"], """
        uint lane = thread_index_in_simdgroup;
        float v = lane < 16 ? simd_sum(1.0f) : simd_max(2.0f);
        out[thread_position_in_grid.x] = v;
    """)
    with pytest.raises(KernelRuntimeError, match="divergent simdgroup functions"):
        divergent(**run)


def test_outputs_start_poisoned_or_at_init_value():
    k = kernel("partial_write", ["inp"], ["out"], "if (thread_position_in_grid.x % 2 == 0) "
               "out[thread_position_in_grid.x] = inp[thread_position_in_grid.x];")
    run = dict(inputs=[np.ones(8, np.float32)], grid=(8, 1, 1), threadgroup=(8, 1, 1),
               output_shapes=[(8,)], output_dtypes=[mx.float32])
    assert np.isnan(k(**run)[0][1::2]).all()
    np.testing.assert_array_equal(k(**run, init_value=3.0)[0], [1, 3] * 4)
