"""The processes of a data-parallel training run and their one collective, ``all_sum``.

Two kinds of group, one interface (``rank()``, ``size()``, ``all_sum(x)``):

* :class:`DistributedGroup`: ``mx.distributed`` under ``mlx.launch`` (ring or MPI; across machines).
* :class:`LocalGroup`: N processes on this machine, started by :func:`run_local`
  (``train(processes=N)``, ``specstream-mlx train --processes N``). They talk through pipes, whose
  reads block in the kernel: a waiting process leaves its core to the others, where the ring
  backend's transport threads spin (on 2 cores they took the cores the training needed).

How ``LocalGroup.all_sum`` sums, for N = 3::

    rank 1: send x1 to rank 0 ─┐                     ┌─> receive s (rank 1 and 2)
    rank 2: send x2 to rank 0 ─┼─> rank 0: s = x0 + x1 + x2 ─┤
                               │  (in rank order)    └─> rank 0 keeps s

Every process gets the same array, bit for bit (one process adds, in one order), so N processes
apply the same update. A process that stops closes its pipes; the others' next ``all_sum`` then
raises :class:`PeerStopped` (on rank 0 with the failed process's error) instead of waiting forever.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection

import mlx.core as mx
import numpy as np

from . import blas
from .machine import cores


class PeerStopped(RuntimeError):
    """Another process of the group stopped (it failed, or was interrupted)."""


class ProcessesDiffer(ValueError):
    """The processes of a run read different inputs (under ``mlx.launch``: machines whose disks
    hold other data, or no checkpoint), which would send them into different collectives."""


def check_same(group, what: str, value) -> None:
    """Raise :class:`ProcessesDiffer` on every process of ``group`` unless ``value`` (JSON, or
    said by ``str``) is the same on all of them: what each process read for itself, checked
    before the work it decides, where processes that disagree would wait on each other forever.
    Example: rank 1 resuming from step 0 while rank 0 resumes from step 7."""
    if group is None:
        return
    digest = hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).digest()
    rows = np.zeros((group.size(), 8), np.int32)  # one row each: the sum is every process's digest
    rows[group.rank()] = np.frombuffer(digest[:16], np.uint16)
    rows = np.array(group.all_sum(mx.array(rows)))
    other = next((r for r in range(1, group.size()) if not np.array_equal(rows[r], rows[0])), None)
    if other is not None:
        raise ProcessesDiffer(f"the run's processes do not agree on {what}: process {other} read otherwise "
                              "than process 0 (under mlx.launch every machine needs the same model, data "
                              "and run folder: a shared disk)")


def peer_lost(e: BaseException) -> bool:
    """Whether ``e`` is MLX's distributed backend losing another process of the run (it stopped):
    a RuntimeError from ``mlx.launch``'s backends ("[ring] connection to a peer was lost"), raised
    where a collective is evaluated."""
    said = str(e) if isinstance(e, RuntimeError) else ""
    return said.startswith(("[ring]", "[mpi]", "[jaccl]")) and "peer" in said


class DistributedGroup:
    """An ``mx.distributed`` group (``mlx.launch``)."""

    def __init__(self, group):
        self.group = group

    def rank(self) -> int:
        return self.group.rank()

    def size(self) -> int:
        return self.group.size()

    def all_sum(self, x: mx.array) -> mx.array:
        return mx.distributed.all_sum(x, group=self.group)


class LocalGroup:
    """Process ``rank`` of ``size`` on this machine. Rank 0 holds a pipe to every other process
    (and one on which each says why it failed); the others hold one pipe, to rank 0."""

    def __init__(self, rank: int, size: int, links: list[Connection], errors: list[Connection] = ()):
        self._rank, self._size, self.links, self.errors = rank, size, links, list(errors)

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def all_sum(self, x: mx.array) -> mx.array:
        """The sum of every process's ``x`` (same shape and dtype everywhere), on every process."""
        dtype = x.dtype
        a = np.array(x.astype(mx.float32) if dtype == mx.bfloat16 else x)  # NumPy has no bfloat16
        if self._rank == 0:
            for r, link in enumerate(self.links, 1):
                a = a + np.frombuffer(self._receive(link, r), a.dtype).reshape(a.shape)
            for r, link in enumerate(self.links, 1):
                self._send(link, a, r)
        else:
            self._send(self.links[0], a, 0)
            a = np.frombuffer(self._receive(self.links[0], 0), a.dtype).reshape(a.shape)
        return mx.array(a).astype(dtype)

    def _send(self, link: Connection, a: np.ndarray, peer: int) -> None:
        try:
            link.send_bytes(np.ascontiguousarray(a))
        except OSError as e:
            raise self._stopped(peer) from e

    def _receive(self, link: Connection, peer: int) -> bytes:
        try:
            return link.recv_bytes()
        except (EOFError, OSError) as e:
            raise self._stopped(peer) from e

    def _stopped(self, peer: int) -> PeerStopped:
        if self._rank != 0:
            return PeerStopped("the first training process stopped")
        why = self.errors[peer - 1] if peer - 1 < len(self.errors) else None
        try:
            if why is not None and why.poll(5):  # it says why before it exits
                return PeerStopped(f"training process {peer} of {self._size} failed: {why.recv()}")
        except (EOFError, OSError):  # it ended without a word: killed (out of memory, a signal)
            return PeerStopped(f"training process {peer} of {self._size} ended without saying why: killed "
                               "(out of memory?), or what it was given did not load there (an object "
                               "defined in the calling script, which it does not run: see any error above)")
        return PeerStopped(f"training process {peer} of {self._size} stopped: see its error above")


def barrier(group) -> None:
    """Wait until every process of ``group`` (a :class:`LocalGroup` or :class:`DistributedGroup`)
    gets here; nothing to wait for when ``group`` is None (one process)."""
    if group is not None:
        mx.eval(group.all_sum(mx.array(1.0)))


def threads_each(n: int) -> int:
    """BLAS threads for each of ``n`` processes: this process's cores shared out."""
    return max(1, cores() // n)


def _worker(rank: int, size: int, link: Connection, why: Connection, fn: Callable, kwargs: dict,
            quiet: tuple, interruptible: bool) -> None:
    try:
        if interruptible:  # Ctrl-C, ignored while the process started (run_local), stops it from here on
            signal.signal(signal.SIGINT, signal.default_int_handler)
        # SIGTERM (to the whole group) outside the steps, which handle it themselves (self-distillation,
        # say): as Ctrl-C, so the process ends through its finalizers, not with its semaphores leaked
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        # progress bars' lock a thread's: tqdm's own is a semaphore, which a process killed outright
        # (kill -9, out of memory) leaves to the resource tracker, which warns of it at exit
        from tqdm import tqdm
        tqdm.set_lock(threading.RLock())
        blas.set_threads(threads_each(size))
        fn(**kwargs, distributed=LocalGroup(rank, size, [link]))
    except (PeerStopped, KeyboardInterrupt):  # rank 0 says why, once
        raise SystemExit(1) from None
    except Exception as e:
        try:
            why.send(str(e) if isinstance(e, quiet) else f"{type(e).__name__}: {e}")
        except OSError:  # rank 0 has stopped already (on the same bad input, say)
            pass
        if isinstance(e, quiet):  # bad input: rank 0 says it in one line
            raise SystemExit(1) from None
        raise  # anything else: its traceback too


@contextmanager
def _script_left_out() -> Iterator[None]:
    """While processes are spawned, the caller's main module hidden from ``spawn``, which would
    run its script again in each of them: its top level, which calls ``train`` without the
    ``if __name__ == "__main__":`` guard that spawn asks for, would start processes of its own
    (a RuntimeError in each), and whatever else it does would be done again. They run this
    package's code only."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    file, spec = main.__dict__.pop("__file__", None), getattr(main, "__spec__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__spec__ = spec
        if file is not None:
            main.__file__ = file


def run_local(n: int, fn: Callable, kwargs: dict, worker_kwargs: dict | None = None,
              quiet: tuple[type[Exception], ...] = ()):
    """``fn(**kwargs, distributed=group)`` in this process (rank 0) and in ``n - 1`` processes
    started for it (``spawn``: ``fn`` and the keyword arguments must pickle, by modules other
    than the caller's script, which those processes do not run; ``worker_kwargs`` replace some of
    them there, e.g. callbacks). The cores are shared out: each process uses
    ``cores // n`` BLAS threads. Returns rank 0's result. If a started process fails, rank 0's
    next ``all_sum`` raises :class:`PeerStopped` with its error (a traceback too, unless the error
    is one of ``quiet``); when rank 0 returns or raises, the others are stopped and waited for.
    """
    if n < 2:
        raise ValueError(f"run_local needs at least 2 processes, not {n}")
    ctx = multiprocessing.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(n - 1)]
    whys = [ctx.Pipe(duplex=False) for _ in range(n - 1)]  # (rank 0 reads, the process writes)
    procs = []
    before = None
    try:
        # the processes start with Ctrl-C ignored (of this process's signal settings, a spawned one
        # inherits only that a signal is ignored): one pressed while spawn imports their modules (the terminal
        # signals them all) would end them with a traceback from inside multiprocessing. This
        # process ignores it too until they have started (blocking it here would not hold it: another
        # of this process's threads would take it): a Ctrl-C then is lost, the next one stops the run
        main = threading.current_thread() is threading.main_thread()
        interruptible = callable(signal.getsignal(signal.SIGINT))
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            with _script_left_out():
                for r in range(1, n):
                    args = (r, n, pipes[r - 1][1], whys[r - 1][1], fn, kwargs | (worker_kwargs or {}), quiet,
                            interruptible)
                    procs.append(ctx.Process(target=_worker, daemon=True, name=f"specstream-train-{r}",
                                             args=args))
                    procs[-1].start()
        finally:
            if main:  # a handler installed outside Python: the default stands in for it
                signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
        for _, theirs in pipes + whys:
            theirs.close()  # only the child holds its end: its exit is seen as the end of the pipe
        before = blas.set_threads(threads_each(n))
        return fn(**kwargs, distributed=LocalGroup(0, n, [ours for ours, _ in pipes],
                                                   [ours for ours, _ in whys]))
    finally:
        for ours, theirs in pipes + whys:
            ours.close()
            theirs.close()
        for p in procs:
            if p.pid is None:  # never started (the start raised)
                continue
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()
        if before is not None:
            blas.set_threads(before)
