"""What the GPU benchmarks share: inputs that defeat the L2 cache, CUDA-graph timing, and a
fresh minicomp compile at a search space."""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import subprocess
import time
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


def device_info() -> dict:
    """The GPU, torch, date and commit a result was measured with."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "device": props.name,
        "l2_bytes": props.L2_cache_size,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
    }


def report_geomeans(rows: list[dict], levels: list[int], against: str) -> None:
    """Print, per search space, the geometric mean of minicomp's TFLOP/s over the baseline's."""
    for level in levels:
        ratios = [
            r[f"mc{level}_tflops"] / r["torch_tflops"] for r in rows if f"mc{level}_tflops" in r
        ]
        if ratios:
            geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            print(f"search space {level}: geometric mean {geo:.2f}x {against} over {len(ratios)}")


def write_json(path: str | None, info: dict, args, rows: list[dict]) -> None:
    """Save the run (device info, arguments, rows) as JSON at `path`, when one is given."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({**info, "args": vars(args), "rows": rows}, f, indent=1)
        f.write("\n")


def measure_levels(
    row: dict,
    fn,
    copies: list[tuple],
    expected,
    flops: float,
    levels: list[int],
    args,
    cache_dir: str,
    inspect: Callable[[list], dict] | None = None,
) -> None:
    """Fill `row` with minicomp's results at each search space of `levels`: the first call's
    error against `expected` (relative to its largest element), the median time, the tuning
    time over search space 0, and the TFLOP/s of every `*_s` time in the row (the baseline's
    too). `inspect(records)` adds fields from the first call's compile records."""
    from minicomp.dynamo.backend import recording

    first_call = {}
    for level in levels:
        torch._dynamo.reset()
        compiled = compile_minicomp(fn, level, cache_dir, args.tune_budget)
        records: list = []
        t0 = time.perf_counter()
        try:
            with recording(records):
                got = compiled(*copies[0])
            torch.cuda.synchronize()
            first_call[level] = time.perf_counter() - t0
            if inspect is not None:
                row.update({f"mc{level}_{k}": v for k, v in inspect(records).items()})
            scale = float(expected.abs().max()) or 1.0
            row[f"mc{level}_max_rel_err"] = float((got.float() - expected).abs().max()) / scale
            row[f"mc{level}_s"] = time_graph(compiled, copies, args.inner, args.repeat)
        except Exception as e:  # report it and carry on with the other shapes
            row[f"mc{level}_error"] = f"{type(e).__name__}: {e}"[:300]
    for level in levels:
        if level and 0 in first_call and level in first_call:
            row[f"mc{level}_tune_s"] = max(0.0, first_call[level] - first_call[0])
    for key in [k for k in row if k.endswith("_s") and not k.endswith("tune_s")]:
        row[key.removesuffix("_s") + "_tflops"] = flops / row[key] / 1e12
