"""The machine a bench runs on: the cores it may use, the threads it times with, its load."""

from __future__ import annotations

import os

import torch


def usable_cores() -> int:
    """The cores this process may run on: its affinity set where the OS has one (a container
    or `taskset` narrows it), else every core."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The number of runnable processes averaged over the last minute, None where the OS
    does not say."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def load_warning(load: float | None, cores: int, when: str) -> str | None:
    """A warning when `load` exceeds the cores: then other work shares the cores with every
    timing, and the rounds spread (the table flags the cells it made noisy)."""
    if load is None or load <= cores:
        return None
    return (
        f"warning: the load average {when} was {load:.1f}, more than the {cores} cores this "
        "process may use: other work competed for the cores while timing, so expect "
        "noisy cells (marked !)"
    )


def set_threads(count: int) -> None:
    """Time with `count` threads. torch.set_num_threads sets OpenMP's count, which eager's
    ATen, Inductor's kernels and minicomp's share: the kernels each compiler builds load
    PyTorch's libgomp (the same soname) rather than a second runtime. OMP_NUM_THREADS tells
    the processes started from here (compile workers) the same."""
    os.environ["OMP_NUM_THREADS"] = str(count)
    torch.set_num_threads(count)
