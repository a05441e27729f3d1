"""Pass-by-pass scheduling of concurrent generations on one thread, their passes batched.

Every active request is a generator from :func:`~mlx_specstream.api.responses` over its own
batched :class:`~mlx_specstream.engine.Decoder` (own KV cache, tree, sampler and statistics):
it yields a :class:`~mlx_specstream.runner.PassRequest` before each forward pass and a
:class:`~mlx_specstream.api.StreamResponse` after it. Each round, the scheduler thread advances
every active request to its next pass, then runs all those passes as one batch
(:func:`~mlx_specstream.runner.run_passes`: one forward per model), so requests join and leave
between passes and no request waits for another to finish. All MLX work of the server runs on
this thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .api import StreamResponse
from .errors import OptionError
from .runner import PassRequest, run_passes

# emit(response, error): called on the scheduler thread after each pass; (None, None) at the end.
Emit = Callable[[StreamResponse | None, BaseException | None], None]


@dataclass
class Job:
    responses: Iterator[StreamResponse | PassRequest]
    emit: Emit
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Drop the request before its next pass (e.g. the client went away)."""
        self.cancelled.set()


class Scheduler:
    """Batched rounds over at most ``max_active`` generations; more wait in a queue."""

    def __init__(self, max_active: int = 16):
        if max_active < 1:
            raise OptionError(f"{{max_active}} must be >= 1, not {max_active}")
        self.max_active = max_active
        self._waiting: queue.Queue[Job | None] = queue.Queue()
        self._active: list[Job] = []
        self._thread = threading.Thread(target=self._loop, name="specstream-scheduler", daemon=True)
        self._stopping = False
        self._aborting = False

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot; not those whose client has gone (dropped when their turn comes)."""
        with self._waiting.mutex:
            return sum(job is not None and not job.cancelled.is_set() for job in self._waiting.queue)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        if self._stopping:
            raise RuntimeError("the scheduler is stopping")
        self._waiting.put(job)

    def stop(self, timeout: float | None = None) -> None:
        """Finish every submitted request, then end the thread."""
        self._stopping = True
        self._waiting.put(None)
        self._thread.join(timeout)

    def abort(self, timeout: float | None = None) -> None:
        """Drop every request, running or waiting, before its next pass, then end the thread (a
        forced stop: the process can exit without MLX work in flight)."""
        self._aborting = True
        self.stop(timeout)

    def _admit(self) -> bool:
        """Move waiting jobs into free slots (blocking while idle); False once told to stop and
        nothing is left."""
        while len(self._active) < self.max_active:
            try:
                job = self._waiting.get(block=not self._active)
            except queue.Empty:
                return True
            if job is None:
                if self._active or not self._waiting.empty():
                    self._waiting.put(None)  # finish what is left first
                    return True
                return False
            self._active.append(job)
        return True

    def _loop(self) -> None:
        """Each round moves every active request one decode step: its deferred stream pass (if
        it has one) in a batch with the others', then its tree pass in a batch with all others'."""
        while self._admit():
            waiting = self._advance_all(self._active)
            streams = [(job, request) for job, request in waiting if request.tree is None]
            if streams:
                self._run(streams)
                waiting = [w for w in waiting if w[1].tree is not None] + self._advance_all(
                    [job for job, _ in streams if job in self._active])
            self._run(waiting)

    def _advance_all(self, jobs: list[Job]) -> list[tuple[Job, PassRequest]]:
        """Each job up to its next pass; the jobs that are done leave the active list."""
        waiting = []
        for job in list(jobs):
            try:
                request = self._advance(job)
            except Exception:  # its caller is gone (e.g. the event loop closed): drop it
                request = None
            if request is None:
                self._active.remove(job)
            else:
                waiting.append((job, request))
        return waiting

    def _run(self, waiting: list[tuple[Job, PassRequest]]) -> None:
        """The passes of all waiting jobs as one batch; if that fails, each alone (from its
        committed cache), so that one bad request fails alone."""
        try:
            run_passes([request for _, request in waiting])
            return
        except Exception:
            pass
        for job, request in waiting:
            try:
                request.runner.discard()
                run_passes([request])
            except Exception as e:
                self._active.remove(job)
                try:  # its caller may be gone (the event loop closed): the thread goes on regardless
                    job.emit(None, e)
                    job.responses.close()
                except Exception:
                    pass

    def _advance(self, job: Job) -> PassRequest | None:
        """Run ``job`` up to its next forward pass, emitting what it produced on the way; return
        that pass, or None when the job is done (finished, failed or cancelled)."""
        while True:
            if job.cancelled.is_set() or self._aborting:
                job.responses.close()
                return None
            try:
                item = next(job.responses)
            except StopIteration:
                job.emit(None, None)
                return None
            except Exception as e:  # one bad request must not stop the others
                job.emit(None, e)
                return None
            if isinstance(item, PassRequest):
                return item
            job.emit(item, None)
            if item.finish_reason is not None:
                job.emit(None, None)
                return None
