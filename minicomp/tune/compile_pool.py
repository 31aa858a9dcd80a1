"""Compiling many kernel sources at once in worker processes (the tuner's candidates).

A job is a picklable callable taking one source (for CUDA, `functools.partial(compile_cuda,
arch=..., cache_dir=..., library=...)`, the library being the NVRTC file the asking process
loaded, so that workers build under the same cache keys): it runs in a worker for its effect,
filling the on-disk compile cache, so the process that asked loads each result as a cache hit
afterwards.

Workers are plain `python -c` subprocesses speaking length-prefixed pickles over their stdin
and stdout, kept for the life of the process (each imports torch once, about a second).
multiprocessing's spawn and forkserver methods are avoided on purpose: their workers import
the parent's `__main__` script, which re-runs a user's unguarded top-level training code in
every worker; and fork is unsafe in a process that holds CUDA and threads.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import logging
import math
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

BUDGET_SPENT = "not compiled: the tuning budget was spent"
_HEADER = struct.Struct("<Q")
_WORKER_CODE = "from minicomp.tune.compile_pool import serve; serve()"


def run_job(job: Callable[[str], Any], source: str) -> str | None:
    """Run `job` on `source`; None, or the error as text (a backend's exception class may not
    survive pickling back)."""
    try:
        job(source)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the compile worker exited")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the compile worker exited")
    return pickle.loads(data)


def serve() -> None:
    """A worker's main loop: read (job, source) pairs, answer run_job's result, until EOF."""
    # The protocol owns the real stdout; anything a job prints goes to stderr instead.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = sys.stdin.buffer
    while True:
        try:
            job, source = _receive(requests)
        except EOFError:
            return
        _send(replies, run_job(job, source))


class _Worker:
    """One worker subprocess."""

    def __init__(self):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )

    def run(self, job: Callable[[str], Any], source: str) -> str | None:
        _send(self.proc.stdin, (job, source))
        return _receive(self.proc.stdout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


_idle: list[_Worker] = []
_idle_lock = threading.Lock()


def _take() -> _Worker:
    with _idle_lock:
        if _idle:
            return _idle.pop()
    return _Worker()


def _give(worker: _Worker) -> None:
    with _idle_lock:
        _idle.append(worker)


def _compile_one(job: Callable[[str], Any], source: str) -> str | None:
    worker = _take()
    try:
        result = worker.run(job, source)
    except (OSError, EOFError, pickle.PickleError):
        worker.close()
        raise
    _give(worker)
    return result


@atexit.register
def shutdown() -> None:
    """Stop the idle workers (at exit, or to free them); busy ones stop after their job."""
    with _idle_lock:
        workers = list(_idle)
        _idle.clear()
    for worker in workers:
        worker.close()


def compile_parallel(
    job: Callable[[str], Any],
    sources: Sequence[str],
    *,
    workers: int,
    deadline: float = math.inf,
    clock: Callable[[], float] = time.monotonic,
    on_done: Callable[[int], None] | None = None,
) -> list[str | None]:
    """Run `job` (picklable) on every source, `workers` at a time in worker processes; per
    source, None or the error. Sources not done by `deadline` (a `clock` time) get the error
    BUDGET_SPENT. When workers cannot run here, it compiles in this process instead."""
    results: list[str | None] = [BUDGET_SPENT] * len(sources)
    if not sources or clock() >= deadline:
        return results
    workers = max(1, min(workers, len(sources)))
    threads = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="minicomp-cc")
    futures = {threads.submit(_compile_one, job, s): i for i, s in enumerate(sources)}
    timeout = None if deadline == math.inf else max(0.0, deadline - clock())
    failed: Exception | None = None
    try:
        for done, future in enumerate(concurrent.futures.as_completed(futures, timeout), 1):
            try:
                results[futures[future]] = future.result()
            except (OSError, EOFError, pickle.PickleError) as e:
                failed = e
                results[futures[future]] = run_job(job, sources[futures[future]])
            if on_done is not None:
                on_done(done)
    except concurrent.futures.TimeoutError:
        pass  # what is still compiling finishes in the background; its result is dropped
    finally:
        threads.shutdown(wait=False, cancel_futures=True)
    if failed is not None:
        log.info("minicomp: a compile worker failed (%s); compiled in this process", failed)
    return results
