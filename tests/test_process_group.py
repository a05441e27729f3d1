"""Local data-parallel processes (``process_group.py``): the sum every process gets, the cores
shared out, and a failing process reported instead of waited for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_specstream import blas
from mlx_specstream.process_group import PeerStopped, run_local

SHAPES = {"float32": (3, 1000, 7), "int32": (5, 11), "bfloat16": (64,)}


def _mine(rank: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(rank)
    if dtype == "int32":
        return rng.integers(-1000, 1000, SHAPES[dtype]).astype(np.int32)
    return rng.standard_normal(SHAPES[dtype]).astype(np.float32)


def _sum_job(out: str, distributed) -> None:
    r = distributed.rank()
    got = {}
    for dtype in SHAPES:
        x = mx.array(_mine(r, dtype)).astype(getattr(mx, dtype))
        s = distributed.all_sum(x)
        assert s.dtype == x.dtype and s.shape == x.shape
        got[dtype] = np.array(s.astype(mx.float32) if dtype == "bfloat16" else s)
    got["threads"] = np.array(blas.set_threads(1) or 0)
    np.savez(os.path.join(out, f"rank{r}.npz"), **got)


def test_every_process_gets_the_same_sum(tmp_path):
    n = 3
    run_local(n, _sum_job, {"out": str(tmp_path)})
    got = [np.load(tmp_path / f"rank{r}.npz") for r in range(n)]
    for dtype in ("float32", "int32"):
        want = _mine(0, dtype)
        for r in range(1, n):
            want = want + _mine(r, dtype)  # rank order, in the dtype: what rank 0 adds
        for g in got:
            assert g[dtype].dtype == want.dtype and np.array_equal(g[dtype], want)
    assert all(np.array_equal(g["bfloat16"], got[0]["bfloat16"]) for g in got)
    want = sum(_mine(r, "bfloat16") for r in range(n))
    assert np.allclose(got[0]["bfloat16"], want, rtol=2e-2, atol=2e-2)  # bfloat16 rounding
    if blas.active_blas() in ("openblas", "mkl"):  # each process has its share of the cores
        cores = len(os.sched_getaffinity(0))
        assert [int(g["threads"]) for g in got] == [max(1, cores // n)] * n


def _fail_job(error: Exception, distributed) -> None:
    if distributed.rank() == 2:
        raise error
    for _ in range(3):
        distributed.all_sum(mx.ones(4))


@pytest.mark.parametrize("error, says", [(ValueError("bad input"), "process 2 of 3 failed: bad input$"),
                                         (KeyError("bug"), "process 2 of 3 failed: KeyError: 'bug'$")])
def test_a_failing_process_is_reported_not_waited_for(error, says):
    """Rank 0 says which process failed and why (its traceback too, unless the error is of the
    ``quiet`` kinds: bad input, which rank 0 would meet alike)."""
    t = time.perf_counter()
    with pytest.raises(PeerStopped, match=says):
        run_local(3, _fail_job, {"error": error}, quiet=(ValueError,))
    assert time.perf_counter() - t < 25


def _killed_job(distributed) -> None:
    if distributed.rank() == 1:
        from tqdm import tqdm

        tqdm(total=2, disable=True)  # as training's steps hold one
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends a process: no word
    for _ in range(3):
        distributed.all_sum(mx.ones(4))


def test_a_killed_process_is_said_in_one_line():
    with pytest.raises(PeerStopped, match="process 1 of 2 ended without saying why"):
        run_local(2, _killed_job, {})


def test_a_killed_process_leaves_no_semaphore_behind(tmp_path):
    """A process killed outright cannot free a semaphore (tqdm's lock was one): the resource
    tracker then warns of it under the one-line error when the run's process exits."""
    script = tmp_path / "script.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                      "import mlx_specstream\nfrom mlx_specstream.process_group import run_local\n"
                      "from test_process_group import _killed_job\n"
                      "try:\n    run_local(2, _killed_job, {})\nexcept Exception as e:\n    print(e)\n")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert "ended without saying why" in res.stdout and "leaked" not in res.stderr, res.stderr


def _first_fails_job(distributed) -> None:
    if distributed.rank() == 0:
        raise ValueError("the first process fails")
    distributed.all_sum(mx.ones(4))


def test_the_others_stop_when_the_first_fails():
    t = time.perf_counter()
    with pytest.raises(ValueError, match="the first process fails"):
        run_local(2, _first_fails_job, {})
    assert time.perf_counter() - t < 25  # run_local waits up to 30 s before it kills a process


def test_run_local_needs_two_processes():
    with pytest.raises(ValueError, match="at least 2"):
        run_local(1, _fail_job, {"error": ValueError()})


def _interrupted_at_start_job(out: str, distributed) -> None:
    """Rank 0 signals the others at once, as a Ctrl-C at the terminal does while they still
    start, after noting whether each ignores SIGINT then (bit 2 of /proc's SigIgn)."""
    import multiprocessing

    if distributed.rank() == 0:
        ignored = []
        for p in multiprocessing.active_children():
            if p.name.startswith("specstream-train-"):
                mask = open(f"/proc/{p.pid}/status").read().split("SigIgn:")[1].split()[0]
                ignored.append(bool(int(mask, 16) & 1 << (signal.SIGINT - 1)))
                os.kill(p.pid, signal.SIGINT)
        with open(out, "w") as f:
            f.write(repr(ignored))
    distributed.all_sum(mx.ones(4))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_a_ctrl_c_while_the_processes_start_is_no_traceback(capfd, tmp_path):
    """A Ctrl-C that reaches a started process while spawn still imports its modules does not end
    it with a traceback from inside multiprocessing (nor kill it before it can say anything): it
    is ignored there, and rank 0, which the terminal signals too, stops the run. Here only the
    started process is signalled: the run goes on."""
    outside = signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal
    try:
        run_local(2, _interrupted_at_start_job, {"out": str(tmp_path / "ignored")})
    finally:
        signal.signal(signal.SIGINT, outside)
    assert (tmp_path / "ignored").read_text() == "[True]"
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_a_script_without_the_main_guard_runs(tmp_path):
    """A user's script that calls run_local (train with processes=2) at its top level, without
    the ``if __name__ == "__main__":`` guard spawn asks for: the processes do not run the script
    again (which would start processes of their own, a RuntimeError in each)."""
    script = tmp_path / "script.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                      "import mlx_specstream\nfrom mlx_specstream.process_group import run_local\n"
                      "from test_process_group import _sum_job\n"
                      f"run_local(2, _sum_job, {{'out': {str(tmp_path)!r}}})\nprint('done')\n")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout == "done\n" and "Traceback" not in res.stderr, res.stderr
    assert (tmp_path / "rank1.npz").is_file()
    # what only the script defines cannot reach them: said so by rank 0
    script.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                      "import mlx_specstream\nfrom mlx_specstream.process_group import run_local\n"
                      "from test_process_group import _sum_job\nclass Mine(str): pass\n"
                      f"run_local(2, _sum_job, {{'out': Mine({str(tmp_path)!r})}})\n")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "an object defined in the calling script" in res.stderr, res.stderr


def _differ_job(out: str, distributed) -> None:
    from mlx_specstream.process_group import ProcessesDiffer, check_same

    check_same(distributed, "the same", {"a": 1})  # alike: nothing said
    try:
        check_same(distributed, "the step to resume", {"step": 7 if distributed.rank() == 0 else None})
    except ProcessesDiffer as e:
        with open(os.path.join(out, f"rank{distributed.rank()}"), "w") as f:
            f.write(str(e))
        raise


def test_processes_that_read_otherwise_all_stop_saying_so(tmp_path):
    """Under mlx.launch each process reads its own disk: one that finds no checkpoint where the
    first resumes from step 7 would wait in other collectives forever. Every process stops."""
    from mlx_specstream.process_group import ProcessesDiffer

    with pytest.raises(ProcessesDiffer, match="do not agree on the step to resume: process 1 read otherwise"):
        run_local(2, _differ_job, {"out": str(tmp_path)})
    time.sleep(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]


def _distill_job(out: str, cache_on: int, distributed) -> None:
    """Self-distillation where only process ``cache_on`` finds the cache of an earlier run."""
    from helpers import tiny_model

    from mlx_specstream import batch
    from mlx_specstream.data import Dataset, Example
    from mlx_specstream.distill import distill_dataset

    decoded = []
    real = batch.greedy_batches

    def counted(model, prompts, *args):  # the prompts this process has the model continue
        decoded.extend(prompts)
        return real(model, prompts, *args)

    batch.greedy_batches = counted
    model = tiny_model()
    ds = Dataset([Example(list(range(1 + i, 9 + i)), 4) for i in range(6)])
    cache = Path(out) / f"cache{distributed.rank()}.jsonl"
    if distributed.rank() != cache_on:
        cache.unlink(missing_ok=True)
    got = distill_dataset(model, ds, None, 32, 4, key={"k": 1}, cache=cache, group=distributed,
                          progress=False)
    np.save(os.path.join(out, f"tokens{distributed.rank()}.npy"), np.array([e.tokens for e in got.examples]))
    np.save(os.path.join(out, f"decoded{distributed.rank()}.npy"), np.array(len(decoded)))


def test_self_distillation_takes_the_first_process_cache(tmp_path):
    """The first process reads the cache of continuations and the others take it: under
    mlx.launch another machine's disk holds none (the first writes it), and processes that
    disagree on what is left to make would sum tables of other shapes."""
    import shutil

    from helpers import tiny_model

    from mlx_specstream.data import Dataset, Example
    from mlx_specstream.distill import distill_dataset

    ds = Dataset([Example(list(range(1 + i, 9 + i)), 4) for i in range(6)])
    want = distill_dataset(tiny_model(), ds, None, 32, 4, key={"k": 1}, cache=tmp_path / "cache0.jsonl",
                           progress=False)
    shutil.copy(tmp_path / "cache0.jsonl", tmp_path / "cache1.jsonl")
    for cache_on, decoded in ((0, 0), (1, 6)):  # rank 0's cache counts: with none, all is made again
        run_local(2, _distill_job, {"out": str(tmp_path), "cache_on": cache_on})
        for r in (0, 1):
            assert np.load(tmp_path / f"tokens{r}.npy").tolist() == [e.tokens for e in want.examples]
        assert sum(int(np.load(tmp_path / f"decoded{r}.npy")) for r in (0, 1)) == decoded


def test_a_lost_peer_is_told_from_other_errors():
    from mlx_specstream.process_group import peer_lost

    assert peer_lost(RuntimeError("[ring] connection to a peer was lost"))
    assert not peer_lost(RuntimeError("[ring] invalid group size"))
    assert not peer_lost(ValueError("[ring] peer"))
