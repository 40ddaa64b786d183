"""A deadline on user code that runs in-process: a chat template's rendering, a user's tool.

`within(fn, seconds, what)` runs `fn()` in a daemon worker thread and waits at most `seconds`. Past the
deadline it raises `DeadlineExceeded` naming `what`, and the caller goes on (an `ask` exits with
one line, a round serves its other calls). Why a thread and not a process or a signal: a chat
template renders thousands of times per training step (a process per rendering costs more than the
rendering), `signal.alarm` works only on the main thread (rollout workers are not), and Jinja's
sandbox bounds `range()` but not nested loops. With `interrupt=True` (pure Python such as a
compiled Jinja template) the stuck thread is also sent an exception at its next bytecode
(`PyThreadState_SetAsyncExc`), so a template that loops forever stops burning a core; a tool
(which may be in the middle of I/O) is left to finish on its own, its result thrown away. A daemon
thread never keeps the process from exiting.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

from searchrl.errors import SearchRLError

T = TypeVar("T")


class DeadlineExceeded(SearchRLError):
    """User code ran past its deadline; the message names it. `still_running`: the thread that
    was left with it (alive until the code returns, unless it was interrupted)."""

    still_running: threading.Thread | None = None


class _Abandoned(BaseException):
    """Raised inside a worker whose result nobody waits for any more."""


class _Worker:
    """A daemon thread that runs one job at a time for one calling thread (a thread per call
    would cost ~0.5 ms, ten times a rendering)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="searchrl-deadline")
        self.thread.start()

    def _loop(self) -> None:
        try:
            while (job := self.jobs.get()) is not None:
                fn, box, done = job
                try:
                    box["value"] = fn()
                except _Abandoned:
                    return
                except BaseException as exc:  # noqa: BLE001 - handed to the caller as it is
                    box["error"] = exc
                finally:
                    done.set()
        except _Abandoned:  # arrived between jobs
            return


_local = threading.local()


def within(fn: Callable[[], T], seconds: float | None, what: str, *, interrupt: bool = False) -> T:
    """`fn()`, or `DeadlineExceeded` ("WHAT did not finish within N s") once `seconds` pass;
    None or <= 0: no deadline (called here). Exceptions of `fn` are raised as they are."""
    if not seconds or seconds <= 0:
        return fn()
    worker = getattr(_local, "worker", None)
    if worker is None or not worker.thread.is_alive():
        worker = _local.worker = _Worker()
    box: dict[str, object] = {}
    done = threading.Event()
    worker.jobs.put((fn, box, done))
    if not done.wait(seconds):
        _local.worker = None  # this one stays with the job; the next call gets a new one
        worker.jobs.put(None)  # and it ends once the job returns
        if interrupt and worker.thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.thread.ident), ctypes.py_object(_Abandoned))
        exc = DeadlineExceeded(f"{what} did not finish within {seconds:g} s")
        exc.still_running = worker.thread
        raise exc
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
