"""Host time per call of a graph of many small kernels: what launching costs each backend,
with and without minicomp's CUDA graphs. The tensors are tiny, so the GPU's work is
negligible and the time is the host's: Python, the plan, the launches."""

from __future__ import annotations

import functools
import time

import torch
import torch._dynamo

STEPS = 50


def many_kernels(x, steps: int = STEPS):
    # Each step is a row reduction and its epilogue: one kernel each.
    for k in range(steps):
        x = x - x.amax(dim=-1, keepdim=True) * (0.5 + k / 100)
    return x


def _per_call(fn, x, calls: int, device: str) -> float:
    for _ in range(5):
        fn(x)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


def measure(
    device: str, target: str, cache_dir: str, calls: int = 1000, steps: int = STEPS
) -> dict:
    """Microseconds per call of the graph of `steps` kernels (50 unless a rehearsal asks for
    fewer) under each backend, as one row."""
    x = torch.randn(16, 64, device=device)
    variants = [("eager", None), ("inductor", "inductor")]
    variants.append(("minicomp", {"target": target, "cuda_graphs": False}))
    if device == "cuda":
        variants.append(("minicomp, CUDA graphs", {"target": target, "cuda_graphs": True}))
    row = {"kind": "overhead", "graph": f"{steps} row reductions on 16x64", "calls": calls}
    graph = functools.partial(many_kernels, steps=steps)
    for label, how in variants:
        torch._dynamo.reset()
        if how is None:
            fn = graph
        elif how == "inductor":
            fn = torch.compile(graph)
        else:
            options = {**how, "cache_dir": cache_dir, "fallback": "error"}
            fn = torch.compile(graph, backend="minicomp", options=options)
        try:
            row[f"{label} us"] = _per_call(fn, x, calls, device) * 1e6
        except Exception as err:  # one backend failing leaves the others' numbers
            row[f"{label} error"] = f"{type(err).__name__}: {err}"[:300]
    return row
