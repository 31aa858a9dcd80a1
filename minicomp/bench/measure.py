"""One backend on one model configuration: compile cold and warm, check, time, weigh.

A cell's result is a flat dict (one JSON row). Every failure is caught and kept in the row
with its error text, so one backend failing never stops a run.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import math
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch._dynamo

from minicomp.backends.cpu import compiler
from minicomp.backends.cuda import nvrtc
from minicomp.bench.options import BACKEND_NAMES
from minicomp.dynamo.backend import recording
from minicomp.ir.graph import ExternOp

# Pass/fail: the largest absolute difference from eager, divided by the largest magnitude of
# eager's output, must not exceed this. Both sides compute in the same dtype, so this bounds
# the accumulated rounding: f32 runs agree to ~1e-5 over tens of layers (different summation
# orders), so 1e-3 leaves room for long models while catching any real bug. f16 has an 11-bit
# significand (a rounding is 4.9e-4 relative): 1e-2 is about 20 roundings at the output's
# largest element, what dozens of layers each rounding an intermediate at a different point
# (fused kernels keep f32 where eager rounds to f16) can add up to. bf16 has 8 bits (3.9e-3
# per rounding), so the same count of roundings is 8x larger: 5e-2.
TOLERANCES = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}
ERROR_CHARS = 600


@dataclass(frozen=True)
class Backend:
    """A way to run a model: `make(model, cache_dir, options)` returns a callable (eager: the
    model); `options` are extra minicomp options (a target), which other backends ignore."""

    name: str
    make: Callable[[torch.nn.Module, str, dict], Callable]
    cache: str  # whose on-disk cache cold/warm refers to: none, inductor, minicomp, hidet
    requires: str | None = None  # a module that must be importable

    def missing(self) -> str | None:
        """Why this backend cannot run here, or None."""
        if self.requires and importlib.util.find_spec(self.requires) is None:
            return f"needs {self.requires}, which is not installed"
        return None


def _minicomp(level: int) -> Callable:
    def make(model, cache_dir, extra):
        options = {**extra, "search_space": level, "cache_dir": cache_dir}
        return torch.compile(model, backend="minicomp", options=options, dynamic=False)

    return make


def _inductor(mode: str | None) -> Callable:
    return lambda model, cache_dir, extra: torch.compile(model, mode=mode, dynamic=False)


def _hidet(model, cache_dir, extra):
    import hidet  # optional: installed where Hidet is measured

    hidet.option.cache_dir(cache_dir)
    return torch.compile(model, backend="hidet", dynamic=False)


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("eager", lambda model, cache_dir, extra: model, "none"),
        Backend("inductor", _inductor(None), "inductor"),
        Backend("inductor-reduce-overhead", _inductor("reduce-overhead"), "inductor"),
        Backend("inductor-max-autotune", _inductor("max-autotune"), "inductor"),
        Backend("minicomp-ss0", _minicomp(0), "minicomp"),
        Backend("minicomp-ss2", _minicomp(2), "minicomp"),
        Backend("hidet", _hidet, "hidet", requires="hidet"),
    )
}
assert tuple(BACKENDS) == BACKEND_NAMES, "options.BACKEND_NAMES lists the backends in order"


def tolerance(dtype: torch.dtype) -> float:
    """The largest error relative to the output's scale that passes, for outputs in dtype."""
    return TOLERANCES.get(dtype, TOLERANCES[torch.float32])


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected|, over the elements where expected is finite;
    infinite when the two disagree on which elements are not finite (NaN, inf)."""
    if actual.shape != expected.shape:
        return math.inf
    a, e = actual.detach().double(), expected.detach().double()
    finite = torch.isfinite(e)
    same_specials = torch.equal(torch.isfinite(a), finite) and torch.equal(
        torch.isnan(a), torch.isnan(e)
    )
    if not same_specials or not bool(torch.equal(a[torch.isinf(e)], e[torch.isinf(e)])):
        return math.inf
    if not bool(finite.any()):
        return 0.0
    scale = float(e[finite].abs().max())
    diff = float((a[finite] - e[finite]).abs().max())
    return diff / scale if scale > 0 else diff


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_calls(fn: Callable, inputs: tuple, repeats: int, device: str) -> list[float]:
    """Milliseconds of `repeats` calls, one at a time: CUDA events around each call on the
    GPU (launch overhead included, as a caller sees it), perf_counter on the CPU."""
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            start_s = time.perf_counter()
            fn(*inputs)
            samples.append((time.perf_counter() - start_s) * 1e3)
    return samples


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryMeter:
    """Peak memory of the calls made inside it, above what was in use when it began.

    On CUDA, torch.cuda.max_memory_allocated (method "cuda-max-allocated"); on the CPU, the
    resident set size sampled every millisecond from /proc/self/statm by a thread (method
    "rss-sampled"), which sees what the allocator returned to the system, not what it reuses.
    """

    def __init__(self, device: str, base: int | None = None):
        self.device = device
        self.base = base
        self.peak_bytes: int | None = None
        self.method = "cuda-max-allocated" if device == "cuda" else "rss-sampled"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak = 0

    def __enter__(self) -> MemoryMeter:
        if self.device == "cuda":
            torch.cuda.synchronize()
            if self.base is None:
                self.base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            return self
        self.base = _rss_bytes()
        if self.base is None:
            self.method = "unavailable"
            return self
        self._peak = self.base
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            rss = _rss_bytes()
            if rss is not None and rss > self._peak:
                self._peak = rss

    def __exit__(self, *exc) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = max(0, torch.cuda.max_memory_allocated() - self.base)
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            rss = _rss_bytes() or 0
            self.peak_bytes = max(0, max(self._peak, rss) - self.base)


@contextlib.contextmanager
def _fresh_cache(backend: Backend) -> Iterator[str]:
    """An empty on-disk cache for the backend, kept for the warm compile and then removed."""
    with tempfile.TemporaryDirectory(prefix="minicomp-bench-") as cache_dir:
        if backend.cache == "inductor":
            from torch._inductor.utils import fresh_cache  # Inductor loads when measured

            with fresh_cache(dir=cache_dir):
                yield cache_dir
        else:
            yield cache_dir


def _forget_in_memory(backend: Backend) -> None:
    """Drop what the backend keeps in this process, so the warm compile reads the disk cache
    as a new process would."""
    torch._dynamo.reset()
    if backend.cache == "inductor":
        from torch._inductor.utils import clear_caches  # Inductor loads when measured

        clear_caches()
    elif backend.cache == "minicomp":
        compiler.clear_memory_cache()
        nvrtc.clear_memory_cache()


def first_call(fn: Callable, inputs: tuple, device: str) -> tuple[torch.Tensor, float]:
    """`fn(*inputs)` and the seconds it took, the device synchronised on both sides (a first
    call: the compile included)."""
    _sync(device)
    start = time.perf_counter()
    out = fn(*inputs)
    _sync(device)
    return out, time.perf_counter() - start


def _compile_stats(backend: Backend, records: list) -> dict:
    """Kernel count, ATen calls and fallback ops of a compile, where the backend says them."""
    if backend.cache == "minicomp":
        return minicomp_stats(records)
    if backend.cache == "inductor":
        from torch._inductor import metrics  # Inductor loads when measured

        return {"kernel_count": int(metrics.generated_kernel_count)}
    return {}


def minicomp_stats(records: list) -> dict:
    """What minicomp's compile records say: graphs, kernels, the ATen ops it ran as ATen calls
    (op -> reason; zero-copy views excluded, they cost nothing) and how many calls those are."""
    fallbacks: dict[str, str] = {}
    calls = kernels = 0

    for r in records:
        kernels += len(r.kernels)
        if r.error:
            fallbacks.setdefault("<whole graph>", r.error[:ERROR_CHARS])
        for n in r.graph.nodes if r.graph is not None else ():
            if isinstance(n, ExternOp) and not getattr(n.target, "is_view", False):
                calls += 1
                fallbacks.setdefault(n.name, n.reason)
    return {
        "graphs": len(records),
        "kernel_count": kernels,
        "aten_calls": calls,
        "fallback_ops": dict(sorted(fallbacks.items())),
    }


def empty_row(backend: str) -> dict:
    """A cell's row with every field present (None until measured)."""
    return {
        "backend": backend,
        "status": "error",
        "passed": False,
        "error": None,
        "max_rel_err": None,
        "tolerance": None,
        "latency_ms": None,
        "latency_ms_min": None,
        "latency_ms_max": None,
        "repeats": 0,
        "speedup_vs_eager": None,
        "speedup_vs_inductor": None,
        "compile_s_cold": None,
        "compile_s_warm": None,
        "peak_mem_bytes": None,
        "memory_method": None,
        "graphs": None,
        "kernel_count": None,
        "aten_calls": None,
        "fallback_ops": None,
    }


def measure(
    backend: Backend,
    model: torch.nn.Module,
    inputs: tuple,
    expected: torch.Tensor,
    *,
    device: str,
    repeats: int,
    warmup: int,
    options: dict | None = None,
    warm: bool = True,
) -> dict:
    """Compile (cold, then warm unless `warm` is false), check against `expected`, time and
    weigh one backend; `options` are extra minicomp options."""
    row = empty_row(backend.name)
    row["tolerance"] = tolerance(expected.dtype)
    try:
        with torch.no_grad():
            _measure(row, backend, model, inputs, expected, device, repeats, warmup, options, warm)
    except Exception as err:  # the row says what failed; the run goes on
        row["status"], row["passed"] = "error", False
        row["error"] = f"{type(err).__name__}: {err}"[:ERROR_CHARS]
    finally:
        torch._dynamo.reset()
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def _measure(row, backend, model, inputs, expected, device, repeats, warmup, options, warm):
    extra = dict(options or {})
    errors = []
    with _fresh_cache(backend) as cache_dir:
        fn = None
        if backend.cache != "none":
            torch._dynamo.reset()
            if backend.cache == "inductor":
                from torch._inductor import metrics  # Inductor loads when measured

                metrics.reset()
            records: list = []
            with recording(records):
                compiled = backend.make(model, cache_dir, extra)
                out, row["compile_s_cold"] = first_call(compiled, inputs, device)
            row.update(_compile_stats(backend, records))
            errors.append(relative_error(out, expected))
            del out
            if warm:
                del compiled
                _forget_in_memory(backend)
                gc.collect()
            else:
                fn = compiled
        if device == "cuda":
            torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated() if device == "cuda" else None
        if fn is None:
            fn = backend.make(model, cache_dir, extra)
            out, first_s = first_call(fn, inputs, device)
            if backend.cache != "none":
                row["compile_s_warm"] = first_s
            errors.append(relative_error(out, expected))
            del out
        meter = MemoryMeter(device, base)
        with meter:
            for _ in range(max(1, warmup)):
                fn(*inputs)
        row["peak_mem_bytes"], row["memory_method"] = meter.peak_bytes, meter.method
        samples = time_calls(fn, inputs, repeats, device)
    row["max_rel_err"] = max(errors)
    row["passed"] = row["max_rel_err"] <= row["tolerance"]
    row["status"] = "pass" if row["passed"] else "mismatch"
    if samples:
        row["latency_ms"] = statistics.median(samples)
        row["latency_ms_min"], row["latency_ms_max"] = min(samples), max(samples)
        row["repeats"] = len(samples)
