"""Where counted launches go: a recording session collects every launch a counted cuda-emu
build runs while it is open (the `lens` option builds them; `minicomp profile` opens one)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from minicomp.backends.cuda.emu import LaunchSample
from minicomp.ir.func import Function


@dataclass(frozen=True)
class CountedLaunch:
    """One launch: the kernel's IR, the CUDA source it was built from (without counters: what
    NVRTC compiles), and what the emulator counted."""

    function: Function
    source: str
    sample: LaunchSample


@dataclass
class LensSession:
    """The counted launches, in the order they ran. With ``sample_only`` a counted launch runs
    only its sampled blocks: estimates of large problems in seconds, but the kernels' outputs
    are left uncomputed (for kernels on random inputs whose control flow and addresses do not
    depend on the data, such as the templates at benchmark shapes)."""

    launches: list[CountedLaunch] = field(default_factory=list)
    sample_only: bool = False


_sessions: list[LensSession] = []
_lock = threading.Lock()


@contextlib.contextmanager
def recording(*, sample_only: bool = False) -> Iterator[LensSession]:
    """A session that receives every counted launch until the block ends."""
    session = LensSession(sample_only=sample_only)
    with _lock:
        _sessions.append(session)
    try:
        yield session
    finally:
        with _lock:
            _sessions.remove(session)


def sample_only() -> bool:
    """Whether an open session asks counted launches to run only their sampled blocks."""
    with _lock:
        return any(s.sample_only for s in _sessions)


def record(function: Function, source: str, sample: LaunchSample) -> None:
    """Give a counted launch to every open session."""
    launch = CountedLaunch(function, source, sample)
    with _lock:
        for session in _sessions:
            session.launches.append(launch)
