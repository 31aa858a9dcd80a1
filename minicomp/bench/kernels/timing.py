"""Timing kernels fairly: inputs that defeat the L2 cache, CUDA-graph replays timed with
CUDA events (the host's wall clock in a CPU rehearsal), every backend timed in each round in
turn so that clock drift and a noisy neighbour hit them alike, and medians with their spread.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


def copies_beyond_l2(make: Callable[[], tuple], device: str, most: int = 16) -> list:
    """Argument tuples from `make()` to rotate through: on a GPU enough that together they
    exceed twice its L2 cache, so no backend is timed on a warm cache; on the host two (a
    rehearsal checks the procedure, not the numbers)."""
    first = make()
    if device != "cuda":
        return [first, make()]
    nbytes = sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    count = max(1, min(most, math.ceil(2 * l2 / max(nbytes, 1))))
    return [first] + [make() for _ in range(count - 1)]


class GraphClock:
    """Times `inner` calls captured in one CUDA graph, replayed between two CUDA events:
    launch gaps and the host's Python stay out of a kernel's time, for every backend alike."""

    name = "cuda-graph replay, CUDA events"

    def prepare(self, fn: Callable, copies: list, inner: int) -> Callable[[], float]:
        """Warm `fn` up, capture it, and return a sampler: one replay, seconds per call."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for args in copies[:3]:  # lazy handles and workspaces, outside the capture
                fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(inner):
                fn(*copies[i % len(copies)])
        graph.replay()
        torch.cuda.synchronize()

        def sample() -> float:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / inner

        sample.graph = graph  # keeps the graph (and its memory pool) alive with the sampler
        return sample


class WallClock:
    """Times `inner` calls with the host's clock: the CPU rehearsal's stand-in for GraphClock."""

    name = "host wall clock (rehearsal)"

    def prepare(self, fn: Callable, copies: list, inner: int) -> Callable[[], float]:
        """Warm `fn` up and return a sampler: `inner` calls, seconds per call."""
        for args in copies[:2]:
            fn(*args)

        def sample() -> float:
            start = time.perf_counter()
            for i in range(inner):
                fn(*copies[i % len(copies)])
            return (time.perf_counter() - start) / inner

        return sample


def clock_for(device: str) -> GraphClock | WallClock:
    """The clock that times kernels on `device` ("cuda", or the host for anything else)."""
    return GraphClock() if device == "cuda" else WallClock()


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median of the rounds and the quartiles around it."""

    median: float
    q1: float
    q3: float
    rounds: int

    @classmethod
    def of(cls, values: list[float]) -> Timing:
        """The timing of a list of samples."""
        if len(values) >= 2:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        else:
            q1 = q3 = values[0]
        return cls(statistics.median(values), q1, q3, len(values))

    @property
    def spread(self) -> float:
        """The interquartile range relative to the median (0.05: the middle half of the
        rounds lies within 5% of the median's size)."""
        return (self.q3 - self.q1) / self.median if self.median > 0 else math.inf


def interleaved(samplers: dict[str, Callable[[], float]], rounds: int) -> dict[str, Timing]:
    """Each sampler once per round, in turn, for `rounds` rounds; their timings by name."""
    samples: dict[str, list[float]] = {name: [] for name in samplers}
    for _ in range(max(1, rounds)):
        for name, sample in samplers.items():
            samples[name].append(sample())
    return {name: Timing.of(values) for name, values in samples.items()}
