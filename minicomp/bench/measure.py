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
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch._dynamo
import torch._dynamo.utils
from torch._subclasses.fake_tensor import is_fake

from minicomp.backends.cpu import compiler
from minicomp.backends.cuda import nvrtc
from minicomp.bench import stats
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
# The references a speed-up is taken against, and the fields each one gives a row: the median
# of the per-round ratios, their quartiles and extremes (stats.py).
SPEEDUP_BASES = ("eager", "inductor")
SPEEDUP_SUFFIXES = ("", "_q1", "_q3", "_min", "_max")


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


def time_call(fn: Callable, inputs: tuple, device: str) -> float:
    """Milliseconds of one call: CUDA events around it on the GPU (launch overhead included,
    as a caller sees it), perf_counter on the CPU."""
    if device == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*inputs)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    start_s = time.perf_counter()
    fn(*inputs)
    return (time.perf_counter() - start_s) * 1e3


Timer = Callable[[Callable, tuple, str], float]


def time_rounds(
    fns: dict[str, Callable], inputs: tuple, rounds: int, device: str, timer: Timer = time_call
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Time every callable once per round for `rounds` rounds, without gradients, the order
    rotating by one each round (round 1: a, b, c; round 2: b, c, a...) so that no backend
    always runs first or right after the same neighbour. Returns each one's milliseconds per
    round and, for one that raised or made Dynamo compile again (its time would include a
    compile), the error; it is left out of the later rounds."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    errors: dict[str, str] = {}
    names = list(fns)
    graphs = torch._dynamo.utils.counters["stats"]
    with torch.no_grad():
        for r in range(rounds):
            shift = r % len(names) if names else 0
            for name in names[shift:] + names[:shift]:
                if name in errors:
                    continue
                before = graphs["unique_graphs"]
                try:
                    ms = timer(fns[name], inputs, device)
                except Exception as err:  # the row says so; the other backends go on
                    errors[name] = f"while timed: {type(err).__name__}: {err}"[:ERROR_CHARS]
                    continue
                if graphs["unique_graphs"] != before:
                    errors[name] = "while timed: Dynamo compiled the model again (a guard failed)"
                    continue
                samples[name].append(ms)
    return samples, errors


def live_cpu_storages() -> dict[int, int]:
    """The CPU tensor storages Python objects refer to now: data pointer -> bytes. Views
    share their base's storage, so each storage counts once; fake and meta tensors (a
    compiler's tracing leftovers) hold no memory and are left out."""
    gc.collect()
    found: dict[int, int] = {}
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor) or is_fake(obj):
            continue
        try:
            if obj.device.type != "cpu" or obj.is_meta:
                continue
            storage = obj.untyped_storage()
            if storage.data_ptr():
                found[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # sparse, mkldnn: no plain storage
            continue
    return found


def call_peak_bytes(fn: Callable, inputs: tuple) -> int | None:
    """The most bytes of tensors one call had allocated at once through PyTorch's CPU
    allocator (its output included), from the profiler's memory events; None where the
    profiler gives none. The profiler's start and stop lines on stderr (Kineto's log, read
    when it first starts) are silenced unless KINETO_LOG_LEVEL is set."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # above its highest level: none printed
    activity = torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity], profile_memory=True) as prof:
        out = fn(*inputs)
        del out
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        return None
    events = [
        (e.start_ns(), e.nbytes())
        for e in results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    ]
    live = peak = 0
    for _, nbytes in sorted(events):
        live += nbytes
        peak = max(peak, live)
    return peak


class MemoryMeter:
    """The peak memory a backend's calls take, above what was in use before it compiled.

    On CUDA (method "cuda-max-allocated"): torch.cuda.max_memory_allocated during the calls
    made inside `calls()`, minus torch.cuda.memory_allocated when the meter was made (before
    the compile): activations, workspaces and what the backend keeps allocated (static
    buffers, CUDA-graph pools).

    On the CPU (method "cpu-tensors"): the bytes of CPU tensors the backend keeps between
    calls (storages live after its calls that were not before the compile: workspaces,
    frozen weights), plus the peak of one more call's own allocations through PyTorch's CPU
    allocator (torch.profiler's memory events). It counts tensors, as the CUDA numbers do;
    what the C library's malloc holds outside tensors is not counted.
    """

    def __init__(self, device: str):
        self.device = device
        self.peak_bytes: int | None = None
        self.method = "cuda-max-allocated" if device == "cuda" else "cpu-tensors"
        self._base = 0
        self._before: dict[int, int] = {}
        if device == "cuda":
            torch.cuda.synchronize()
            self._base = torch.cuda.memory_allocated()
        else:
            self._before = live_cpu_storages()

    @contextlib.contextmanager
    def calls(self) -> Iterator[None]:
        """Measure the calls made inside (on the GPU; the CPU weighs one call, `weigh`)."""
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        yield
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = max(0, torch.cuda.max_memory_allocated() - self._base)

    def weigh(self, fn: Callable, inputs: tuple) -> None:
        """On the CPU: what `fn` keeps, plus what one more call of it allocates."""
        if self.device == "cuda":
            return
        kept = sum(n for p, n in live_cpu_storages().items() if p not in self._before)
        call = call_peak_bytes(fn, inputs)
        if call is None:
            self.method = "unavailable"
        else:
            self.peak_bytes = kept + call


@contextlib.contextmanager
def _cache_env(backend: Backend, cache_dir: str) -> Iterator[None]:
    """Point the backend at its own on-disk cache under `cache_dir` while inside (Inductor
    reads its folder from the environment at each use, as fresh_cache() sets it; minicomp
    and Hidet take theirs in `make`)."""
    if backend.cache != "inductor":
        yield
        return
    folder = os.path.join(cache_dir, "inductor")
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "triton")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _forget_in_memory(backend: Backend) -> None:
    """Drop what the backend keeps in this process (not Dynamo's caches: see `prepared`),
    so its next compile reads only its disk cache, as a new process would."""
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
        **{f"latency_ms{s}": None for s in ("", "_q1", "_q3", "_min", "_max")},
        "repeats": 0,
        **{f"speedup_vs_{b}{s}": None for b in SPEEDUP_BASES for s in SPEEDUP_SUFFIXES},
        **{f"speedup_vs_{b}_noisy": None for b in SPEEDUP_BASES},
        "compile_s_cold": None,
        "compile_s_warm": None,
        "peak_mem_bytes": None,
        "memory_method": None,
        "graphs": None,
        "kernel_count": None,
        "aten_calls": None,
        "fallback_ops": None,
    }


@dataclass
class Prepared:
    """A backend compiled, checked and warmed up on one model: its row so far (no timings)
    and the callable to time, None when it failed (the row says why)."""

    row: dict
    fn: Callable | None


@dataclass(frozen=True)
class Model:
    """What every backend runs: the model, its inputs and eager's output for them."""

    module: torch.nn.Module
    inputs: tuple
    expected: torch.Tensor


@contextlib.contextmanager
def prepared(
    backends: list[Backend],
    model: Model,
    *,
    device: str,
    warmup: int,
    options: dict | None = None,
    warm: bool = True,
    on_backend: Callable[[str], None] | None = None,
) -> Iterator[dict[str, Prepared]]:
    """Every backend compiled, checked, warmed up and weighed on `model`, ready to be timed
    together inside the block; `options` are extra minicomp options.

    First each backend compiles cold, in an empty on-disk cache of its own and with its
    in-memory caches cleared; Dynamo is reset after each, and the compiled model dropped.
    Then, after one more reset, each compiles warm from its disk cache, in turn: that is the
    callable timed. They must all stay valid while the others compile, so Dynamo is not
    reset between them (a torch.compile with other settings is another backend to it, so it
    compiles again), and the caller resets it after the block. Without `warm`, the cold
    compile is the one kept. `on_backend(name)` is told as each backend starts its turn.
    """
    told = on_backend or (lambda name: None)
    rows = {b.name: empty_row(b.name) for b in backends}
    for row in rows.values():
        row["tolerance"] = tolerance(model.expected.dtype)
    with contextlib.ExitStack() as stack:
        dirs = {
            b.name: stack.enter_context(tempfile.TemporaryDirectory(prefix="minicomp-bench-"))
            for b in backends
        }
        failed: set[str] = set()
        if warm:
            for b in backends:
                if b.cache == "none":
                    continue
                told(f"{b.name} (cold)")
                torch._dynamo.reset()
                cold = _guarded(
                    rows[b.name], device, _cold, b, model, dirs[b.name], device, options
                )
                if cold is None:
                    failed.add(b.name)
                del cold
            torch._dynamo.reset()
        cells = {}
        for b in backends:
            fn = None
            if b.name not in failed:
                told(b.name)
                fn = _guarded(
                    rows[b.name], device, _ready, b, model, dirs[b.name], device, warmup,
                    options, warm,
                )  # fmt: skip
            cells[b.name] = Prepared(rows[b.name], fn)
        yield cells


def _guarded(row: dict, device: str, step: Callable, *args):
    """`step(row, *args)`; on an exception, the row says what failed and this returns None."""
    try:
        with torch.no_grad():
            return step(row, *args)
    except Exception as err:  # the row says what failed; the run goes on
        row["status"], row["passed"] = "error", False
        row["error"] = f"{type(err).__name__}: {err}"[:ERROR_CHARS]
        return None
    finally:
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()


def _cold(row, backend, model, cache_dir, device, options) -> Callable:
    """The cold compile, its time, statistics and output checked; returns the callable."""
    _forget_in_memory(backend)
    if backend.cache == "inductor":
        from torch._inductor import metrics  # Inductor loads when measured

        metrics.reset()
    records: list = []
    with _cache_env(backend, cache_dir), recording(records):
        compiled = backend.make(model.module, cache_dir, dict(options or {}))
        out, row["compile_s_cold"] = first_call(compiled, model.inputs, device)
    row.update(_compile_stats(backend, records))
    _check(row, out, model.expected)
    return compiled


def _ready(row, backend, model, cache_dir, device, warmup, options, warm) -> Callable:
    """The compile that is timed (warm; cold without `warm`), checked, warmed up and weighed;
    returns its callable."""
    meter = MemoryMeter(device)  # before the compile: what the compiled model keeps counts
    if warm or backend.cache == "none":
        _forget_in_memory(backend)
        with _cache_env(backend, cache_dir):
            fn = backend.make(model.module, cache_dir, dict(options or {}))
            out, first_s = first_call(fn, model.inputs, device)
        if backend.cache != "none":
            row["compile_s_warm"] = first_s
        _check(row, out, model.expected)
        del out
    else:
        fn = _cold(row, backend, model, cache_dir, device, options)
    with _cache_env(backend, cache_dir), meter.calls():
        for _ in range(max(1, warmup)):
            fn(*model.inputs)
    meter.weigh(fn, model.inputs)
    row["peak_mem_bytes"], row["memory_method"] = meter.peak_bytes, meter.method
    return fn


def _check(row: dict, out: torch.Tensor, expected: torch.Tensor) -> None:
    """Compare a compile's first output with eager's; the row keeps the worst error seen."""
    error = relative_error(out, expected)
    row["max_rel_err"] = max(error, row["max_rel_err"] or 0.0)
    row["passed"] = row["max_rel_err"] <= row["tolerance"]
    row["status"] = "pass" if row["passed"] else "mismatch"


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
    """One backend alone, prepared and timed (runner.py times several together)."""
    try:
        with prepared(
            [backend], Model(model, inputs, expected), device=device, warmup=warmup,
            options=options, warm=warm,
        ) as cells:  # fmt: skip
            cell = cells[backend.name]
            if cell.fn is not None:
                samples, errors = time_rounds({backend.name: cell.fn}, inputs, repeats, device)
                record_timings([cell.row], samples, errors)
            return cell.row
    finally:
        torch._dynamo.reset()


def record_timings(
    rows: list[dict],
    samples: dict[str, list[float]],
    errors: dict[str, str] | None = None,
    noisy_spread: float = stats.NOISY_SPREAD,
) -> None:
    """Fill in the rows' latencies and speed-ups from interleaved rounds (`time_rounds`):
    each backend's median milliseconds with their spread, and its speed-up over eager and
    over Inductor as the median of the per-round ratios with theirs, flagged noisy beyond
    `noisy_spread` (stats.Spread.noisy). A backend that failed while timed becomes an error."""
    errors = errors or {}
    by_name = {r["backend"]: r for r in rows}
    for name, error in errors.items():
        if name in by_name:
            by_name[name].update(status="error", passed=False, error=error)
    for r in rows:
        times = samples.get(r["backend"])
        if not times or r["backend"] in errors:
            continue
        spread = stats.Spread.of(times)
        r.update(
            latency_ms=spread.median, latency_ms_q1=spread.q1, latency_ms_q3=spread.q3,
            latency_ms_min=spread.low, latency_ms_max=spread.high, repeats=len(times),
        )  # fmt: skip
    for base in SPEEDUP_BASES:
        reference = by_name.get(base)
        if reference is None or not reference["passed"] or reference["latency_ms"] is None:
            continue
        for r in rows:
            if not r["passed"] or r["latency_ms"] is None:
                continue
            ratios = stats.round_ratios(samples[base], samples[r["backend"]])
            if not ratios:
                continue
            spread = stats.Spread.of(ratios)
            key = f"speedup_vs_{base}"
            r.update({
                key: spread.median, f"{key}_q1": spread.q1, f"{key}_q3": spread.q3,
                f"{key}_min": spread.low, f"{key}_max": spread.high,
                f"{key}_noisy": spread.noisy(noisy_spread),
            })  # fmt: skip
