"""Run one case, the program eagerly and compiled by minicomp, and classify the outcome: pass,
mismatch (a wrong answer), error (minicomp raised), eager-only error, or invalid (eager and
minicomp both raise: not a program to judge)."""

from __future__ import annotations

import inspect
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch._dynamo

from minicomp.fuzz.compare import Mismatch, compare_results
from minicomp.fuzz.program import Case
from minicomp.fuzz.run import (
    Result,
    dtypes_computed,
    evaluate,
    forward,
    gradients,
    load,
    result,
)
from minicomp.fuzz.signature import error_pattern, innermost

PASS = "pass"
MISMATCH = "mismatch"
ERROR = "error"
EAGER_ONLY_ERROR = "eager-only-error"
INVALID = "invalid"
CRASH = "crash"
HANG = "hang"
INTERNAL = "internal"  # the fuzzer itself failed: a bug of the fuzzer, not of minicomp
# The outcomes that are findings: something for minicomp to fix (or, eager-only, to explain).
FINDINGS = (MISMATCH, ERROR, EAGER_ONLY_ERROR, CRASH, HANG)

# fn, target, dynamic -> the compiled fn
Compiler = Callable[[Callable, str, bool], Callable]


@dataclass(frozen=True)
class Outcome:
    """How one case ended. `pattern` identifies the failure across programs (see signature)."""

    status: str
    pattern: str = ""
    message: str = ""
    seconds: float = 0.0


def minicomp_compiler(cache_dir: str | None = None) -> Compiler:
    """A Compiler that runs torch.compile with minicomp, fallback="error", after a reset."""

    def compile_with_minicomp(fn: Callable, target: str, dynamic: bool) -> Callable:
        torch._dynamo.reset()
        options = {"target": target, "fallback": "error"}
        if cache_dir is not None:
            options["cache_dir"] = cache_dir
        return torch.compile(fn, backend="minicomp", options=options, dynamic=dynamic)

    return compile_with_minicomp


def torch_backend(backend: str) -> Compiler:
    """A Compiler that runs torch.compile with one of PyTorch's backends (such as aot_eager,
    Dynamo and AOTAutograd without minicomp), after a reset."""

    def compile_with(fn: Callable, target: str, dynamic: bool) -> Callable:
        torch._dynamo.reset()
        return torch.compile(fn, backend=backend, dynamic=dynamic)

    return compile_with


def _reference(fn: Callable, make_inputs: Callable, backward: bool) -> Result | None:
    try:
        return evaluate(fn, make_inputs, backward=backward, upcast=True)
    except Exception:
        return None


def differences(
    fn: Callable,
    make_inputs: Callable,
    actual: Result,
    expected: Result,
    backward: bool,
    names: tuple = (),
) -> Mismatch | None:
    """The difference of a compiled run from eager that a float64 run does not excuse."""
    precision = dtypes_computed(fn, make_inputs)
    mismatch = compare_results(actual, expected, names=names, precision=precision)
    if mismatch is None or mismatch.kind != "values":
        return mismatch
    reference = _reference(fn, make_inputs, backward)
    if reference is None:
        return mismatch
    return compare_results(actual, expected, reference, names, precision)


def _minicomp_frames(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/minicomp/" in f.filename and "/fuzz/" not in f.filename]
    return "\n".join(f"  {f.filename}:{f.lineno} in {f.name}" for f in ours[-4:])


def _error_message(exc: BaseException, phase: str) -> str:
    inner = innermost(exc)
    text = f"{phase}: {type(inner).__name__}: {inner}".strip()
    frames = _minicomp_frames(inner)
    return f"{text}\n{frames}" if frames else text


def _run_compiled(compiler: Compiler, fn: Callable, case: Case, make_inputs: Callable):
    phase = "compiling or running the forward"
    try:
        compiled = compiler(fn, case.target, case.dynamic)
        call = forward(compiled, make_inputs)
        phase = "compiling or running the backward"
        return result(call, gradients(call) if case.backward else None), None
    except Exception as e:
        return None, (e, phase)


def run_case(case: Case, compiler: Compiler) -> Outcome:
    """The outcome of one case: eager against the compiled program."""
    start = time.perf_counter()
    fn, make_inputs = load(case.program)
    names = tuple(spec.name for spec in case.program.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            expected, eager_error = evaluate(fn, make_inputs, backward=case.backward), None
        except Exception as e:
            expected, eager_error = None, e
        actual, failure = _run_compiled(compiler, fn, case, make_inputs)
        seconds = time.perf_counter() - start
        if eager_error is not None:
            status = INVALID if failure is not None else EAGER_ONLY_ERROR
            return Outcome(status, error_pattern(eager_error), str(eager_error), seconds)
        if failure is not None:
            exc, phase = failure
            return Outcome(ERROR, error_pattern(exc), _error_message(exc, phase), seconds)
        mismatch = differences(fn, make_inputs, actual, expected, case.backward, names)
    seconds = time.perf_counter() - start
    if mismatch is None:
        return Outcome(PASS, seconds=seconds)
    pattern = f"{mismatch.section} {mismatch.kind}"
    return Outcome(MISMATCH, pattern, mismatch.message, seconds)


def check_against_eager(
    fn: Callable,
    make_inputs: Callable,
    *,
    target: str,
    dynamic: bool = False,
    backward: bool = False,
    compiler: Compiler | None = None,
) -> None:
    """Compile fn with minicomp and compare it with eager on make_inputs() (the gradients
    too with `backward`): raises what compiling or running raises, or AssertionError with
    the difference. A saved fuzz regression is one call of this."""
    compiler = compiler or minicomp_compiler()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = evaluate(fn, make_inputs, backward=backward)
        actual = evaluate(compiler(fn, target, dynamic), make_inputs, backward=backward)
        names = tuple(inspect.signature(fn).parameters)
        mismatch = differences(fn, make_inputs, actual, expected, backward, names)
    if mismatch is not None:
        raise AssertionError(f"minicomp on {target} differs from eager: {mismatch.message}")
