"""Run cases in a child process, so that a crash (SIGSEGV, SIGFPE, abort) or a hang is an
outcome of the case that caused it, not the end of the fuzzing run."""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import shutil
import signal
import tempfile
import traceback

from minicomp.fuzz.check import (
    CRASH,
    HANG,
    INTERNAL,
    Compiler,
    Outcome,
    minicomp_compiler,
    run_case,
    torch_backend,
)
from minicomp.fuzz.program import Case

_LOG_TAIL = 3000


def load_compiler(spec: str, cache_dir: str | None) -> Compiler:
    """The Compiler named by `spec`: "minicomp", or "path/to/file.py:name" (tests plant bugs)."""
    if spec == "minicomp":
        return minicomp_compiler(cache_dir)
    path, _, name = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location("_fuzz_compiler", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return getattr(module, name)


def _serve(conn, log_path: str, compiler_spec: str, cache_dir: str | None) -> None:
    # What the compiled code prints, and the last words of a crash, go to the log.
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    compilers = {None: load_compiler(compiler_spec, cache_dir)}
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        case, backend = request
        if backend not in compilers:
            compilers[backend] = torch_backend(backend)
        try:
            outcome = run_case(case, compilers[backend])
        except Exception as e:
            outcome = Outcome(INTERNAL, type(e).__name__, traceback.format_exc())
        conn.send(outcome)


class Worker:
    """A child process that runs cases one after another, started again after one dies."""

    def __init__(
        self, *, cache_dir: str | None = None, compiler: str = "minicomp", timeout: float = 300.0
    ):
        self.cache_dir, self.compiler, self.timeout = cache_dir, compiler, timeout
        self._context = multiprocessing.get_context("spawn")
        self._process = None
        self._conn = None
        self._log_dir = tempfile.mkdtemp(prefix="minicomp-fuzz-log-")
        self._log_path = os.path.join(self._log_dir, "worker.log")
        self.starts = 0

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        self._process = self._context.Process(
            target=_serve,
            args=(child, self._log_path, self.compiler, self.cache_dir),
            daemon=True,
        )
        self._process.start()
        child.close()
        self._conn = parent
        self.starts += 1

    def _log_tail(self, offset: int) -> str:
        try:
            with open(self._log_path, errors="replace") as f:
                f.seek(offset)
                return f.read()[-_LOG_TAIL:]
        except OSError:
            return ""

    def run(self, case: Case, backend: str | None = None) -> Outcome:
        """The outcome of a case, a crash or a hang included; with `backend`, compiled by that
        PyTorch backend instead."""
        if self._process is None or not self._process.is_alive():
            self._start()
        offset = os.path.getsize(self._log_path) if os.path.exists(self._log_path) else 0
        self._conn.send((case, backend))
        if self._conn.poll(self.timeout):
            try:
                return self._conn.recv()
            except EOFError:
                pass
        else:
            self.stop()
            message = f"no answer within {self.timeout:.0f} s\n{self._log_tail(offset)}"
            return Outcome(HANG, "hang", message.strip(), self.timeout)
        self._process.join(5)
        code = self._process.exitcode
        self.stop()
        pattern = _death(code)
        return Outcome(CRASH, pattern, f"process died: {pattern}\n{self._log_tail(offset)}".strip())

    def restart(self) -> None:
        """Start the next case in a fresh process."""
        self.stop()

    def stop(self) -> None:
        """End the child process, if any."""
        if self._process is not None:
            if self._process.is_alive():
                try:
                    self._conn.send(None)
                    self._process.join(2)
                except (BrokenPipeError, OSError):
                    pass
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
            self._conn.close()
        self._process = self._conn = None

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self._log_dir, ignore_errors=True)


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


class InProcess:
    """Runs cases in this process, for compilers that cannot crash it (planted bugs in tests)."""

    def __init__(self, compiler: Compiler):
        self.compiler = compiler

    def run(self, case: Case, backend: str | None = None) -> Outcome:
        """The outcome of a case; with `backend`, compiled by that PyTorch backend instead."""
        return run_case(case, self.compiler if backend is None else torch_backend(backend))
