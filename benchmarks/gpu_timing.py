"""What the GPU benchmarks share: inputs that defeat the L2 cache, CUDA-graph timing, and a
fresh minicomp compile at a search space."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import torch


def copies_beyond_l2(make: Callable[[], tuple], nbytes: int, most: int = 16) -> list[tuple]:
    """Enough argument tuples from `make()` (each `nbytes` large) to rotate through that
    together they exceed twice the L2 cache."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    copies = max(1, min(most, math.ceil(2 * l2 / nbytes)))
    return [make() for _ in range(copies)]


def time_graph(fn, copies: list[tuple], inner: int, repeat: int) -> float:
    """Median seconds of one call of `fn`, replaying a CUDA graph of `inner` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in copies[:3]:  # warm up outside the capture (lazy handles, workspaces)
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(inner):
            fn(*copies[i % len(copies)])
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3 / inner)
    return statistics.median(samples)


def compile_minicomp(fn, level: int, cache_dir: str, tune_budget: int):
    """A fresh torch.compile of `fn` by minicomp for the GPU at search space `level`, without
    its own CUDA graphs (the benchmark's graph replaces them)."""
    options = {
        "search_space": level,
        "tune_budget": tune_budget,
        "cuda_graphs": False,
        "target": "cuda",
        "fallback": "error",
        "cache_dir": cache_dir,
    }
    return torch.compile(fn, backend="minicomp", options=options, dynamic=False)
