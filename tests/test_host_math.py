"""NumPy versions of the training step's exponential-heavy operations (kernels/host_math.py)
against MLX's own operations: values and gradients, float32 tolerance."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from mlx_specstream.kernels import host_math


def close(a, b, tol=2e-5):
    a, b = np.array(a), np.array(b)
    np.testing.assert_allclose(a, b, atol=tol * max(1.0, float(np.abs(b).max())), rtol=tol)


def mlx_ce(logits, targets):
    picked = mx.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
    return mx.logsumexp(logits, axis=-1) - picked


@pytest.mark.parametrize("n", [3, 700])  # one thread, and rows split between threads
def test_cross_entropy_value_and_gradient(n):
    rng = np.random.default_rng(0)
    logits = mx.array(rng.normal(0, 4, (n, 512)).astype(np.float32))
    targets = mx.array(rng.integers(0, 512, n).astype(np.int32))
    w = mx.array(rng.uniform(0, 1, n).astype(np.float32))

    def loss(x, ce):
        return (ce(x, targets) * w).sum()

    with host_math.enabled():
        got, g_got = mx.value_and_grad(lambda x: loss(x, host_math.cross_entropy))(logits)
    ref, g_ref = mx.value_and_grad(lambda x: loss(x, mlx_ce))(logits)
    close(got, ref)
    close(g_got, g_ref)
    x = np.array(logits, np.float64)  # float64 oracle of the per-row values
    lse = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    with host_math.enabled():
        close(host_math.cross_entropy(logits, targets), lse - x[np.arange(n), np.array(targets)])


def test_silu_value_and_gradient():
    x = mx.array(np.random.default_rng(1).normal(0, 30, (64, 1024)).astype(np.float32))  # overflowing exp(-x)
    with host_math.enabled():
        got, g_got = mx.value_and_grad(lambda x: (host_math.silu(x) ** 2).sum())(x)
    ref, g_ref = mx.value_and_grad(lambda x: (nn.silu(x) ** 2).sum())(x)
    close(got, ref)
    close(g_got, g_ref)
    assert np.isfinite(np.array(g_got)).all()


@pytest.mark.parametrize("mask_kind", ["none", "2d", "4d"])
def test_attention_value_and_gradients(mask_kind):
    rng = np.random.default_rng(2)
    B, H, Hkv, T, S, D = 2, 6, 2, 5, 9, 16
    q, k, v = (mx.array(rng.normal(0, 1, s).astype(np.float32))
               for s in ((B, H, T, D), (B, Hkv, S, D), (B, Hkv, S, D)))
    mask = None
    if mask_kind == "2d":
        mask = mx.array(np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T)
    elif mask_kind == "4d":  # a different mask per sequence; every row sees key 0
        m = rng.uniform(size=(B, 1, T, S)) < 0.5
        m[..., 0] = True
        mask = mx.array(m)
    probe = mx.array(rng.normal(0, 1, (B, H, T, D)).astype(np.float32))

    def loss(f, q, k, v):
        return (f(q, k, v) * probe).sum()

    def host(q, k, v):
        return host_math.attention(q, k, v, mask, 0.25)

    def ref(q, k, v):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)

    with host_math.enabled():
        out = host(q, k, v)
        grads = mx.grad(lambda *a: loss(host, *a), argnums=(0, 1, 2))(q, k, v)
    close(out, ref(q, k, v))
    for got, want in zip(grads, mx.grad(lambda *a: loss(ref, *a), argnums=(0, 1, 2))(q, k, v)):
        close(got, want)


def test_enabled_is_scoped():
    assert not host_math.active()
    with pytest.raises(RuntimeError):
        with host_math.enabled():
            assert host_math.active() == (mx.default_device() == mx.cpu)
            with host_math.enabled(False):
                assert not host_math.active()
            raise RuntimeError
    assert not host_math.active()


def test_prefill_sized_inference_softmax_runs_on_the_host(monkeypatch):
    """``attention.sdpa`` outside training: a pass bigger than a decode step (a prefill) takes the
    NumPy softmax on a CPU, a decode-sized one keeps MLX's; both equal the MLX attention, and
    ``set_allowed(False)`` gives MLX's result exactly."""
    from mlx_specstream.kernels.attention import FOLD_MAX_ROWS, sdpa

    rng = np.random.default_rng(5)
    calls = []
    real = host_math._attention_probs_host
    monkeypatch.setattr(host_math, "_attention_probs_host", lambda *a: calls.append(1) or real(*a))
    for T in (FOLD_MAX_ROWS, FOLD_MAX_ROWS + 8):
        S = T + 20
        q, k, v = (mx.array(rng.normal(0, 1, s).astype(np.float32))
                   for s in ((1, 6, T, 16), (1, 2, S, 16), (1, 2, S, 16)))
        mask = mx.array(np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T)
        ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
        calls.clear()
        close(sdpa(q, k, v, mask, 0.25), ref)
        assert len(calls) == (T > FOLD_MAX_ROWS and mx.default_device() == mx.cpu)
        if T > FOLD_MAX_ROWS:
            old = host_math.set_allowed(False)
            try:
                assert mx.array_equal(sdpa(q, k, v, mask, 0.25), ref).item()
            finally:
                host_math.set_allowed(old)


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16])
def test_low_precision_prefill_attention_keeps_fp32_accuracy(dtype):
    """A prefill of an fp16 or bf16 model: the scores, probabilities and their sum run in fp32, so
    large scores neither overflow fp16 (NaN) nor round to bf16's few bits; the output, in the
    model's dtype, is within its rounding of fp32 attention over the same inputs."""
    from mlx_specstream.kernels.attention import FOLD_MAX_ROWS, sdpa

    rng = np.random.default_rng(0)
    T, S, D = FOLD_MAX_ROWS + 8, FOLD_MAX_ROWS + 28, 128
    shared = rng.normal(size=(1, 1, 1, D)) * 12  # q·k up to ~2e4: past fp16's range unscaled
    q = mx.array(shared + rng.normal(size=(1, 4, T, D))).astype(dtype)
    k = mx.array(shared + rng.normal(size=(1, 2, S, D))).astype(dtype)
    v = mx.array(rng.normal(size=(1, 2, S, D))).astype(dtype)
    mask = mx.array(np.arange(S)[None, :] <= np.arange(T)[:, None] + S - T)
    f32 = [x.astype(mx.float32) for x in (q, k, v)]
    truth = mx.fast.scaled_dot_product_attention(*f32, scale=D**-0.5, mask=mask)
    got = sdpa(q, k, v, mask, D**-0.5)
    assert got.dtype == dtype
    assert float(mx.abs(got.astype(mx.float32) - truth).max()) < (0.005 if dtype == mx.float16 else 0.02)


def test_an_interrupt_leaves_the_workers_usable():
    """A KeyboardInterrupt while a call waits for its parts (a notebook's "interrupt kernel")
    leaves the workers serving the next call, and a part's error reaches the caller (a walkthrough
    saw a thread pool's lock left taken hang every later call)."""
    import signal
    import threading
    import time

    from mlx_specstream.kernels import host_math

    if host_math._pool is None or threading.current_thread() is not threading.main_thread():
        pytest.skip("one core: no workers")
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        for at in (1e-6, 0.01, 0.05):  # interrupted while parts are put, or while they run
            with pytest.raises(KeyboardInterrupt):
                signal.setitimer(signal.ITIMER_REAL, at)
                host_math._pool.map(lambda i: time.sleep(0.05), list(range(40)))
                time.sleep(1)  # (where the parts were all done before the signal came)
            started = time.perf_counter()
            assert host_math._pool.map(lambda i: i * 2, [1, 2, 3]) == [2, 4, 6]
            assert time.perf_counter() - started < 30  # (the parts left behind: 40 × 0.05 s / threads)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    with pytest.raises(ZeroDivisionError):
        host_math._pool.map(lambda i: 1 / i, [1, 0])


def test_a_forked_process_has_workers_of_its_own():
    """The workers start in the process that first calls them: a child forked after the parent's
    calls gets its own (threads do not survive a fork; a review saw the child wait for ever)."""
    import os
    import signal

    from mlx_specstream.kernels import host_math

    if host_math._pool is None or not hasattr(os, "fork"):
        pytest.skip("one core, or no fork")
    assert host_math._pool.map(lambda i: i + 1, [1, 2]) == [2, 3]  # started here
    pid = os.fork()
    if pid == 0:  # the child: a result within 10 s, or the alarm's status
        signal.alarm(10)
        os._exit(0 if host_math._pool.map(lambda i: i * 2, [1, 2]) == [2, 4] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
