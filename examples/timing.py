"""Timing for the examples: pinned threads, warm-up, backends interleaved round by round.

A machine shared with other work drifts while a benchmark runs; timing each backend in its own
block puts that drift into the comparison. Here every round runs each function once, in turn,
and the speed-up is the median of the per-round ratios, with their spread.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minicomp.bench.stats import Spread, round_ratios


def pin_threads(count: int | None) -> int:
    """Run PyTorch's CPU work on `count` threads (default: the cores this process may use)."""
    if count is None:
        count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    torch.set_num_threads(count)
    return count


@dataclass
class Timings:
    """Per-round times in milliseconds, by function name."""

    ms: dict[str, list[float]]

    def median(self, name: str) -> float:
        """The median time of `name`, in milliseconds."""
        return statistics.median(self.ms[name])

    def speedup(self, baseline: str, name: str) -> tuple[float, float, float]:
        """How many times faster `name` ran than `baseline`: the median of the per-round
        ratios, and their lowest and highest (as `minicomp bench` takes them)."""
        spread = Spread.of(round_ratios(self.ms[baseline], self.ms[name]))
        return spread.median, spread.low, spread.high


def _now_ms(cuda: bool) -> float:
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() * 1e3


def interleaved(fns: dict[str, Callable], x: torch.Tensor, rounds: int, warmup: int = 3) -> Timings:
    """Time each of `fns` on `x`: `warmup` untimed calls each, then `rounds` rounds that call
    every function once."""
    cuda = x.is_cuda
    for fn in fns.values():
        for _ in range(warmup):
            fn(x)
    ms: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = _now_ms(cuda)
            fn(x)
            ms[name].append(_now_ms(cuda) - start)
    return Timings(ms)
