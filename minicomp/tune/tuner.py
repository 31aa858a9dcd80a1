"""The tuner: picks a template's parameters for one problem by compiling and timing candidates.

`tune()` is called by a scheduler once per template instance (a matmul with its epilogue, ...):

1. At search space 0, or where kernels cannot be timed (no runner: the cpu target), it returns
   the template's heuristic config without measuring anything. On cuda-emu (or with the
   cost_model option "lens") the runner is tune/lens_runner.py's: its "timer" is the
   performance lens's estimate, and the choice says it came from the model.
2. It looks the problem up in the tuning database; a record tuned at this search space or a
   larger one is returned at once, and no other candidate is built.
3. Otherwise it instantiates the template's candidates, compiles them in parallel (a process
   pool around the runner's compile job: NVRTC, which caches each cubin on disk, so loading
   one in this process afterwards is a cache hit), checks each one's outputs against the
   heuristic config's kernel on random inputs, and times the ones that pass, along with the
   ATen implementation when the runner has one. The fastest wins and is stored.

Everything target-specific -- rendering, compiling, loading, making inputs, running ATen --
sits behind the injected :class:`Runner` (tune/cuda_runner.py is the cuda target's),
so this module imports no backend. The time budget (the ``tune_budget`` option) bounds one
call: candidates not measured when it runs out are skipped, and the best one so far wins.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tqdm import tqdm

from minicomp.config import Options
from minicomp.ir.func import Function
from minicomp.tune.compile_pool import compile_parallel

log = logging.getLogger(__name__)

DEFAULT_BUDGET_S = {1: 30.0, 2: 300.0}
"""Seconds one tune() call may spend per search space when the tune_budget option is unset."""
MAX_WORKLOAD_COPIES = 32
"""The most input copies timing rotates through (small problems stay partly L2-resident)."""
# Reserved keys of a stored config: the search space it was tuned at (database.LEVEL_KEY),
# and whether ATen won.
_LEVEL_KEY = "_search_space"
_ATEN_KEY = "_aten"
_ATEN_TIME_KEY = "_aten_time_us"


class Template(Protocol):
    """What the tuner needs of a template (schedule/templates/ defines the real ones).

    A config is a small frozen dataclass (or a dict) of the template's parameters. A template
    may define ``encode(config) -> dict`` and ``decode(dict) -> config`` to control how its
    configs are stored; by default dataclass fields are stored by name.
    """

    name: str

    def candidates(self, problem: Any, level: int) -> list: ...

    def heuristic(self, problem: Any) -> Any: ...

    def instantiate(self, problem: Any, config: Any) -> Function: ...

    def signature(self, problem: Any) -> str: ...


@dataclass
class Workload:
    """The arguments of one kernel launch: tensors read, tensors written, then scalars."""

    inputs: list
    outputs: list
    scalars: list = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.inputs, *self.outputs))


Launch = Callable[[Workload], None]
Timer = Callable[[Launch, Sequence[Workload]], float]


class Runner(Protocol):
    """What the tuner needs to build and run the kernels of one problem on one device.

    ``arch`` is the database key's architecture ("sm_90"). ``compile_job`` is a picklable
    callable taking a rendered source, run in worker processes to fill the compile cache
    (None: compile in ``load`` only). ``load`` builds a kernel from its source (a cache hit
    after the pool compiled it) and returns a callable launching it on a workload.
    ``workload(seed)`` makes fresh random arguments; ``aten``, when not None, is the ATen
    candidate: it writes the same outputs into ``workload.outputs`` with PyTorch operators
    (for a matrix product, torch.matmul and then the epilogue), is checked like any
    candidate, and is timed by the same timer, so whether the fused template beats it is
    measured. ``l2_bytes`` sizes the input rotation; ``timer`` measures seconds per launch
    (None: CUDA events).

    A runner that estimates instead of measuring has ``model``, naming the model ("the lens's
    estimate on H100 SXM"), and ``verifies``: False when its candidates are too large to run
    whole, so they are ranked without being checked against the heuristic config's outputs.
    """

    arch: str
    l2_bytes: int
    compile_job: Callable[[str], Any] | None
    aten: Launch | None
    timer: Timer | None

    def render(self, kernel: Function) -> str: ...

    def load(self, kernel: Function, source: str) -> Launch: ...

    def workload(self, seed: int) -> Workload: ...


@dataclass(frozen=True)
class Choice:
    """What the tuner decided for one problem.

    ``config`` is the template config to instantiate. ``how`` says where it came from:
    "heuristic" (nothing measured), "database" (a stored record), "tuned" (measured) or
    "estimated" (ranked by ``model``, the runner's cost model, without a GPU). ``aten`` is true
    when the ATen implementation measured faster than every template config (``config`` is
    then the best template config, for a caller that cannot run ATen there). ``why`` is why
    the caller picked the template (schedule.templates.template_choice), "" when unsaid.
    """

    config: Any
    how: str
    aten: bool = False
    time_us: float | None = None
    aten_time_us: float | None = None
    candidates: int = 0
    rejected: int = 0
    seconds: float = 0.0
    model: str | None = None
    why: str = ""

    def describe(self) -> str:
        """How the config was chosen, in a few words (what explain prints), after why the
        template was."""
        how = self._how()
        return f"template: {self.why}; config: {how}" if self.why else how

    def _how(self) -> str:
        if self.how == "heuristic":
            return "the template's heuristic (search space 0: nothing measured)"
        if self.how == "database":
            basis = f"{self.model}, " if self.model else "measured "
            return f"a stored tuning record ({basis}{self.time_us:.1f} us)"
        best = f"best of {self.candidates} candidates, {self.time_us:.1f} us"
        if self.aten:
            best = f"ATen measured faster ({self.aten_time_us:.1f} us) than the {best}"
        if self.how == "estimated":
            return f"ranked by {self.model}: {best} (estimated, not measured)"
        return f"measured: {best}"


def budget_seconds(options: Options, level: int) -> float:
    """The time one tune() call may take: the tune_budget option, or the level's default;
    infinity for tune_budget=0."""
    budget = getattr(options, "tune_budget", None)
    if budget is None:
        return DEFAULT_BUDGET_S.get(level, DEFAULT_BUDGET_S[2])
    return math.inf if budget == 0 else float(budget)


_noticed: set[str] = set()
_noticed_lock = threading.Lock()


def notice_untuned(target_name: str, level: int) -> None:
    """Say once per process and target that search space `level` falls back to heuristics."""
    if level <= 0:
        return
    with _noticed_lock:
        if target_name in _noticed:
            return
        _noticed.add(target_name)
    log.warning(
        "minicomp: search_space=%d needs a CUDA GPU to time kernels; target %s picks every "
        "schedule by heuristics (search_space=0)",
        level,
        target_name,
    )


def fusion_signature(op: Any) -> str:
    """A short hash of what a fused group computes, independent of its values' names (the
    fusion part of a tuning record's key)."""
    from minicomp.ir.printer import op_str

    names = [v.name for v in (*op.inputs, *op.outputs)]
    text = op_str(op)
    if names:
        renames = {n: f"v{i}" for i, n in enumerate(names)}
        pattern = r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len)[::-1]) + r")\b"
        text = re.sub(pattern, lambda m: renames[m.group(1)], text)
    text = re.sub(r"\b" + re.escape(op.name) + r"\b", "op", text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tune(
    template: Template,
    problem: Any,
    *,
    options: Options,
    runner: Runner | None,
    level: int | None = None,
    fusion: str = "",
    database: Any = None,
    progress: bool | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Choice:
    """Pick `template`'s config for `problem` (see the module docstring).

    ``level`` defaults to the search_space option; ``runner`` None means kernels cannot be
    timed here (level 0 with a notice). ``fusion`` is the fused group's signature (see
    :func:`fusion_signature`). ``database`` defaults to the one under the cache_dir option.
    ``progress`` shows a progress bar on stderr (default: when stderr is a terminal or the
    verbose option is set).
    """
    level = options.search_space if level is None else level
    heuristic = template.heuristic(problem)
    if level <= 0:
        return Choice(heuristic, "heuristic")
    if runner is None:
        notice_untuned(options.target, level)
        return Choice(heuristic, "heuristic")
    if database is None:
        from minicomp.tune.database import TuningDatabase, default_path

        database = TuningDatabase(default_path(options.cache_dir))
    signature = template.signature(problem)

    def valid(record) -> bool:
        # A record is data, not trust: its config must be one this template could have chosen.
        from minicomp.tune.database import MAX_LEVEL

        config = decode_config(template, heuristic, record.config)
        return config == heuristic or config in template.candidates(problem, MAX_LEVEL)

    record = database.safe_lookup(template.name, signature, fusion, runner.arch, valid=valid)
    if record is not None and record.config.get(_LEVEL_KEY, 0) >= level:
        return _from_record(template, heuristic, record, getattr(runner, "model", None))
    if progress is None:
        progress = options.verbose > 0 or _isatty(sys.stderr)
    search = _Search(template, problem, heuristic, runner, options, level, clock, progress)
    choice = search.run()
    if choice.how in ("tuned", "estimated"):
        try:
            _store(database, template, signature, fusion, runner.arch, level, choice)
        except (TypeError, ValueError) as e:  # a config JSON cannot hold: keep the choice
            log.warning("minicomp: tuning result of %s not stored: %s", template.name, e)
    return choice


def _isatty(stream: Any) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# -- storing configs -----------------------------------------------------------------------


def encode_config(template: Template, config: Any) -> dict:
    """A template config as the JSON object the database stores."""
    if hasattr(template, "encode"):
        return dict(template.encode(config))
    if dataclasses.is_dataclass(config):
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    if isinstance(config, dict):
        return dict(config)
    raise TypeError(f"cannot store a config of type {type(config).__name__}: {config!r}")


def decode_config(template: Template, heuristic: Any, data: dict) -> Any:
    """The template config a stored JSON object describes (the inverse of encode_config)."""
    data = {k: v for k, v in data.items() if not k.startswith("_")}
    if hasattr(template, "decode"):
        return template.decode(data)
    if dataclasses.is_dataclass(heuristic):
        return type(heuristic)(**{k: _tuples(v) for k, v in data.items()})
    return data


def _tuples(value: Any) -> Any:
    # JSON turns a config's tuples into lists; frozen configs need them hashable again.
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _from_record(template: Template, heuristic: Any, record: Any, model: str | None) -> Choice:
    return Choice(
        decode_config(template, heuristic, record.config),
        "database",
        aten=bool(record.config.get(_ATEN_KEY, False)),
        time_us=record.time_us,
        aten_time_us=record.config.get(_ATEN_TIME_KEY),
        candidates=record.candidates,
        seconds=0.0,
        model=model,
    )


def _store(database, template, signature, fusion, arch, level, choice: Choice) -> None:
    from minicomp.tune.database import Record

    config = encode_config(template, choice.config)
    config[_LEVEL_KEY] = level
    if choice.aten_time_us is not None:
        config[_ATEN_KEY] = choice.aten
        config[_ATEN_TIME_KEY] = choice.aten_time_us
    best = min(t for t in (choice.time_us, choice.aten_time_us) if t is not None)
    database.safe_store(
        Record(
            template=template.name,
            signature=signature,
            fusion=fusion,
            arch=arch,
            config=config,
            time_us=best,
            candidates=choice.candidates,
            tuning_seconds=choice.seconds,
        )
    )


# -- the search ----------------------------------------------------------------------------


@dataclass
class _Candidate:
    config: Any
    kernel: Function | None = None
    source: str = ""
    launch: Launch | None = None
    error: str = ""
    time_s: float | None = None


class _Search:
    """One tuning run: build the candidates, check them, time them, keep the fastest."""

    def __init__(self, template, problem, heuristic, runner, options, level, clock, progress):
        self.template = template
        self.problem = problem
        self.runner = runner
        self.options = options
        self.level = level
        self.clock = clock
        self.start = clock()
        self.deadline = self.start + budget_seconds(options, level)
        configs = _unique([heuristic, *template.candidates(problem, level)])
        self.candidates = [_Candidate(c) for c in configs]
        name = f"{template.name} {template.signature(problem)}"
        self.bar = ProgressBar(name, len(configs), self.deadline, clock, enabled=progress)
        self.timer = runner.timer or cuda_event_timer
        self.rejected = 0

    def left(self) -> float:
        return self.deadline - self.clock()

    def run(self) -> Choice:
        self.build()
        reference = self.candidates[0]
        verifies = getattr(self.runner, "verifies", True)
        try:
            if reference.error:
                raise RuntimeError(reference.error)
            check = self.runner.workload(0)
            if verifies:
                reference.launch(check)
            expected = [t.clone() for t in check.outputs]
            workloads = self.timing_workloads(check)
            reference.time_s = self.timer(reference.launch, workloads)
        except Exception as e:
            # The heuristic kernel is what search space 0 would use: let the normal build
            # report why it fails.
            log.info("minicomp: not tuning %s: its heuristic kernel failed: %s", self.bar.name, e)
            self.bar.close("the heuristic kernel failed")
            return Choice(reference.config, "heuristic", seconds=self.clock() - self.start)
        aten_s = None
        if self.runner.aten is not None:
            aten_s = self.measure(self.runner.aten, check, expected, workloads, "aten")
        measured = 1
        for i, cand in enumerate(self.candidates[1:], start=1):
            self.bar.update(i, self.best_us(aten_s))
            if self.left() <= 0:
                log.info("minicomp: tuning budget spent after %d candidates", i)
                break
            if cand.error:
                continue
            try:
                cand.launch = self.runner.load(cand.kernel, cand.source)
            except Exception as e:
                cand.error = f"{type(e).__name__}: {e}"
                continue
            cand.time_s = self.measure(cand.launch, check, expected, workloads, cand.config)
            measured += cand.time_s is not None
        return self.finish(measured, aten_s)

    def measure(self, launch, check, expected, workloads, what) -> float | None:
        """Seconds per launch of a candidate computing the right outputs, else None (a
        runner that cannot verify its candidates ranks them unchecked)."""
        verifies = getattr(self.runner, "verifies", True)
        if verifies and not self.passes(launch, check, expected, what):
            return None
        try:
            return self.timer(launch, workloads)
        except Exception as e:
            log.info("minicomp: candidate %s failed while timed: %s", what, e)
            self.rejected += 1
            return None

    def finish(self, measured: int, aten_s: float | None) -> Choice:
        timed = [c for c in self.candidates if c.time_s is not None]
        best = min(timed, key=lambda c: c.time_s)
        aten = aten_s is not None and aten_s < best.time_s
        self.bar.update(len(self.candidates), self.best_us(aten_s))
        self.bar.close(f"{'ATen' if aten else 'best'} {self.best_us(aten_s):.1f} us")
        model = getattr(self.runner, "model", None)
        return Choice(
            best.config,
            "estimated" if model else "tuned",
            aten=aten,
            time_us=best.time_s * 1e6,
            aten_time_us=None if aten_s is None else aten_s * 1e6,
            candidates=measured + (aten_s is not None),
            rejected=self.rejected,
            seconds=self.clock() - self.start,
            model=model,
        )

    def best_us(self, aten_s: float | None = None) -> float:
        times = [c.time_s for c in self.candidates if c.time_s is not None]
        times += [aten_s] if aten_s is not None else []
        return min(times) * 1e6 if times else math.nan

    def build(self) -> None:
        """Instantiate and render every candidate, compile them in parallel, load the
        heuristic one (the reference)."""
        for cand in self.candidates:
            try:
                cand.kernel = self.template.instantiate(self.problem, cand.config)
                cand.source = self.runner.render(cand.kernel)
            except Exception as e:
                cand.error = f"{type(e).__name__}: {e}"
        todo = [c for c in self.candidates if not c.error]
        if self.runner.compile_job is not None and len(todo) > 1:
            workers = self.options.parallel_compile or os.cpu_count() or 1
            errors = compile_parallel(
                self.runner.compile_job,
                [c.source for c in todo],
                workers=workers,
                deadline=self.deadline,
                clock=self.clock,
                on_done=lambda done: self.bar.update(done, math.nan, "compiled"),
            )
            # The reference is loaded (compiled here if need be) whatever the pool said.
            for cand, error in zip(todo, errors):
                if cand is not self.candidates[0]:
                    cand.error = error or ""
        ref = self.candidates[0]
        if not ref.error:
            try:
                ref.launch = self.runner.load(ref.kernel, ref.source)
            except Exception as e:
                ref.error = f"{type(e).__name__}: {e}"
        for cand in self.candidates:
            if cand.error and self.options.verbose > 1:
                log.warning("minicomp: candidate %s dropped: %s", cand.config, cand.error)

    def timing_workloads(self, first: Workload) -> list[Workload]:
        """Copies of the inputs to rotate through, together over twice the L2 cache, so no
        launch finds its operands left in L2 by the previous one."""
        size = max(first.nbytes, 1)
        copies = min(MAX_WORKLOAD_COPIES, max(1, math.ceil(2 * self.runner.l2_bytes / size)))
        return [first] + [self.runner.workload(seed) for seed in range(1, copies)]

    def passes(self, launch: Launch, check: Workload, expected: list, what: Any) -> bool:
        """Whether `launch` computes `expected` on `check` (its outputs poisoned first)."""
        for t in check.outputs:
            t.fill_(math.nan if t.dtype.is_floating_point else -1)
        try:
            launch(check)
        except Exception as e:
            log.info("minicomp: candidate %s failed to run: %s", what, e)
            self.rejected += 1
            return False
        ok = all(outputs_match(o, e) for o, e in zip(check.outputs, expected))
        if not ok:
            self.rejected += 1
            if self.options.verbose:
                log.warning("minicomp: candidate %s computes wrong results; rejected", what)
        return ok


def _unique(configs: Sequence[Any]) -> list[Any]:
    seen, out = set(), []
    for c in configs:
        key = repr(c)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


# Largest error allowed, relative to the largest magnitude of the reference output: loose
# enough for another summation order and TF32 inputs, far below what a wrong kernel gives.
# A float8 result may round one ulp apart: its machine epsilon.
_TOLERANCE = {
    "float16": 1e-2,
    "bfloat16": 4e-2,
    "float32": 5e-3,
    "float64": 1e-9,
    "float8_e4m3fn": 0.125,
    "float8_e5m2": 0.25,
    "float8_e4m3fnuz": 0.125,
    "float8_e5m2fnuz": 0.25,
}


def outputs_match(out: Any, ref: Any) -> bool:
    """Whether a candidate's output tensor equals the reference's within its dtype's
    tolerance (exactly, for integers and booleans); NaN must match NaN."""
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return False
    if not ref.dtype.is_floating_point:
        return bool((out == ref).all())
    o, r = out.double(), ref.double()
    nan = r.isnan()
    if not bool((o.isnan() == nan).all()):
        return False
    finite = r.isfinite()
    if not bool((o[~finite & ~nan] == r[~finite & ~nan]).all()):
        return False
    if not bool(finite.any()):
        return True
    o, r = o[finite], r[finite]
    scale = max(float(r.abs().max()), 1e-30)
    tol = _TOLERANCE.get(str(ref.dtype).removeprefix("torch."), 5e-3)
    return float((o - r).abs().max()) <= tol * scale


# -- timing --------------------------------------------------------------------------------


def cuda_event_timer(
    launch: Launch,
    workloads: Sequence[Workload],
    *,
    warmup_s: float = 0.005,
    repeats: int = 20,
    min_repeat_s: float = 1e-4,
) -> float:
    """The median seconds of one launch, timed with CUDA events on the current stream.

    After a warm-up, each of `repeats` measurements times enough launches (rotating through
    `workloads`) to last `min_repeat_s`, so the events' resolution does not dominate.
    """
    import torch

    def timed(count: int, first: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(count):
            launch(workloads[(first + i) % len(workloads)])
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / count

    estimate = max(timed(3, 0), 1e-7)
    timed(max(1, math.ceil(warmup_s / estimate)), 0)
    inner = max(1, math.ceil(min_repeat_s / estimate))
    samples = [timed(inner, r * inner) for r in range(repeats)]
    return statistics.median(samples)


# -- progress ------------------------------------------------------------------------------


class ProgressBar:
    """Tuning's progress on stderr: the kernel, candidates done of all, the best time, the
    time left (the estimate, capped by the budget).

    On a terminal it is a tqdm bar, redrawn in place and cleared by the summary line; elsewhere
    (when enabled, for verbose logs) a plain line at most once a second.
    """

    FORMAT = "{desc} |{bar}| {n_fmt}/{total_fmt}{postfix}"  # postfix: ", measured, ..."

    def __init__(self, name, total, deadline, clock, *, enabled: bool, stream=None):
        self.name = name if len(name) <= 60 else name[:57] + "..."
        self.total = total
        self.deadline = deadline
        self.clock = clock
        self.enabled = enabled
        self.stream = stream
        self.start = clock()
        self.last = -math.inf
        self.shown = False
        self._bar = None

    def _out(self):
        return self.stream if self.stream is not None else sys.stderr

    def _status(self, done: int, best_us: float, what: str, now: float) -> str:
        elapsed = now - self.start
        estimate = elapsed / done * (self.total - done) if done else math.inf
        left = max(0.0, min(estimate, self.deadline - now))
        left_text = "?" if math.isinf(left) else f"{left:.0f}s"
        best = "" if math.isnan(best_us) else f", best {best_us:.1f} us"
        return f"{what}{best}, ~{left_text} left"

    def update(self, done: int, best_us: float, what: str = "measured") -> None:
        """Show `done` of the candidates `what` (measured, compiled) and the best time."""
        if not self.enabled:
            return
        now = self.clock()
        status = self._status(done, best_us, what, now)
        self.shown = True
        if _isatty(self._out()):
            if self._bar is None:
                self._bar = tqdm(
                    total=self.total, desc=f"tuning {self.name}", file=self._out(),
                    bar_format=self.FORMAT, leave=False, dynamic_ncols=True,
                )  # fmt: skip
            self._bar.n = done
            self._bar.set_postfix_str(status)  # redraws
            return
        if now - self.last < 1.0 and done < self.total:
            return
        self.last = now
        filled = round(20 * done / max(self.total, 1))
        bar = "#" * filled + "." * (20 - filled)
        self._out().write(f"tuning {self.name} [{bar}] {done}/{self.total} {status}\n")
        self._out().flush()

    def close(self, summary: str) -> None:
        """End with a line summing up the outcome (the bar, if any, cleared)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elapsed = self.clock() - self.start
        line = f"tuned {self.name}: {summary} ({self.total} candidates, {elapsed:.1f}s)"
        self._out().write(line + "\n")
        self._out().flush()
