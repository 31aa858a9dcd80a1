"""Shrink a failing case to a minimal one that fails the same way (same status and pattern):
fewer outputs and steps (delta debugging over the op list; a dropped step's result becomes an
input), then smaller and plainer inputs, then a plainer run (no backward, static shapes)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from minicomp.fuzz.check import Outcome
from minicomp.fuzz.program import (
    CONTIGUOUS,
    Case,
    Index,
    InputSpec,
    ListOf,
    Program,
    Ref,
    Step,
    step_refs,
)
from minicomp.fuzz.run import trace

Run = Callable[[Case], Outcome]


def _valid(program: Program) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trace(program)
        except Exception:
            return False
    return True


def tidy(program: Program) -> Program:
    """The program without inputs nothing reads and with each output once."""
    read = {name for step in program.steps for name in step_refs(step)} | set(program.outputs)
    inputs = tuple(spec for spec in program.inputs if spec.name in read)
    outputs = tuple(dict.fromkeys(program.outputs))
    return Program(inputs, program.steps, outputs)


def _promoted(spec_name: str, value: torch.Tensor, seed: int) -> InputSpec:
    high = None
    if not value.is_floating_point() and value.dtype != torch.bool and value.numel():
        # An index stays in bounds when its stand-in keeps to the values it had.
        if int(value.min()) >= 0:
            high = int(value.max()) + 1
    requires_grad = value.is_floating_point() and value.requires_grad
    return InputSpec(
        spec_name, tuple(value.shape), value.dtype, seed, requires_grad=requires_grad, high=high
    )


def drop_steps(program: Program, drop: set[int]) -> Program | None:
    """The program without the steps at `drop`; a dropped result still read becomes an input
    of the same shape and dtype. None when the program does not run eagerly."""
    try:
        values = trace(program)
    except Exception:
        return None
    kept = [step for i, step in enumerate(program.steps) if i not in drop]
    read = {name for step in kept for name in step_refs(step)} | set(program.outputs)
    inputs = list(program.inputs)
    for i in sorted(drop):
        out = program.steps[i].out
        if out is not None and out in read:
            inputs.append(_promoted(out, values[out], 7919 + i))
    return tidy(Program(tuple(inputs), tuple(kept), program.outputs))


def _map_refs(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, Ref):
        return Ref(names.get(value.name, value.name))
    if isinstance(value, ListOf):
        return ListOf(tuple(_map_refs(item, names) for item in value.items))
    if isinstance(value, Index):
        return Index(tuple(_map_refs(item, names) for item in value.items))
    if isinstance(value, tuple):
        return tuple(_map_refs(item, names) for item in value)
    return value


def canonical_names(program: Program) -> Program:
    """The program with inputs named a, b, c... in the order the steps first read them, and
    results v0, v1... in order."""
    reads = [name for step in program.steps for name in step_refs(step)] + list(program.outputs)
    first_read = {name: k for k, name in reversed(list(enumerate(reads)))}
    ordered = sorted(program.inputs, key=lambda spec: first_read.get(spec.name, len(reads)))
    letters = "abcdefghijklmnopqrstuvwxyz"
    names = {
        spec.name: letters[i] if i < len(letters) else f"x{i}" for i, spec in enumerate(ordered)
    }
    outs = [step.out for step in program.steps if step.out is not None]
    names.update({out: f"v{i}" for i, out in enumerate(outs)})
    inputs = tuple(replace(spec, name=names[spec.name]) for spec in ordered)
    steps = tuple(
        Step(names.get(step.out) if step.out else None, step.op, _map_refs(step.args, names))
        for step in program.steps
    )
    return Program(inputs, steps, tuple(names.get(o, o) for o in program.outputs))


class _Shrinker:
    def __init__(self, case: Case, outcome: Outcome, run: Run, deadline: float):
        self.best, self.outcome = case, outcome
        self.signature = (outcome.status, outcome.pattern)
        self.run, self.deadline = run, deadline
        self.tried: set[Case] = {case}
        self.runs = 0

    def out_of_time(self) -> bool:
        """Whether shrinking must stop."""
        return time.monotonic() > self.deadline

    def attempt(self, candidate: Case | None) -> bool:
        """Keep candidate if it fails the same way as the case being shrunk."""
        if candidate is None or self.out_of_time():
            return False
        candidate = replace(candidate, program=tidy(candidate.program))
        if candidate in self.tried or not candidate.program.outputs:
            return False
        self.tried.add(candidate)
        if not _valid(candidate.program):
            return False
        self.runs += 1
        outcome = self.run(candidate)
        if (outcome.status, outcome.pattern) != self.signature:
            return False
        self.best, self.outcome = candidate, outcome
        return True

    def with_program(self, program: Program | None) -> Case | None:
        """The best case so far with another program (None stays None)."""
        return None if program is None else replace(self.best, program=program)

    def truncate(self) -> bool:
        """Cut the program after the first step whose result alone fails the same way."""
        program = self.best.program
        for k, step in enumerate(program.steps[:-1]):
            out = step.out if step.out is not None else step_refs(step)[0]
            cut = drop_steps(
                Program(program.inputs, program.steps, (out,)),
                set(range(k + 1, len(program.steps))),
            )
            if self.attempt(self.with_program(cut)):
                return True
        return False

    def single_output(self) -> bool:
        """Keep one output of several."""
        program = self.best.program
        if len(program.outputs) < 2:
            return False
        for out in program.outputs:
            if self.attempt(self.with_program(replace(program, outputs=(out,)))):
                return True
        return False

    def drop_chunks(self) -> bool:
        """Delta debugging over the steps: drop chunks of halving size, last ones first."""
        progress = False
        size = max(len(self.best.program.steps) // 2, 1)
        while size >= 1 and not self.out_of_time():
            start = len(self.best.program.steps) - size
            while start >= 0:
                program = self.best.program
                chunk = set(range(start, min(start + size, len(program.steps))))
                if len(chunk) < len(program.steps) and self.attempt(
                    self.with_program(drop_steps(program, chunk))
                ):
                    progress = True
                start -= size
            size //= 2
        return progress

    def plainer_run(self) -> bool:
        """Turn off backward, then dynamic shapes."""
        progress = False
        for field in ("backward", "dynamic"):
            if getattr(self.best, field):
                progress |= self.attempt(replace(self.best, **{field: False}))
        return progress

    def plainer_inputs(self) -> bool:
        """Make each input in turn simpler: contiguous, no grad, float32, smaller."""
        progress = False
        for name in [spec.name for spec in self.best.program.inputs]:
            for simpler in _simpler_specs(self._spec(name)):
                program = self.best.program
                inputs = tuple(simpler if s.name == name else s for s in program.inputs)
                if self.attempt(self.with_program(replace(program, inputs=inputs))):
                    progress = True
                    break
        return progress

    def _spec(self, name: str) -> InputSpec:
        return next(s for s in self.best.program.inputs if s.name == name)

    def shrink(self) -> None:
        """Run the passes in turn until none makes progress or the time is up."""
        passes = (
            self.truncate,
            self.single_output,
            self.drop_chunks,
            self.plainer_run,
            self.plainer_inputs,
        )
        progress = True
        while progress and not self.out_of_time():
            progress = False
            for shrink_pass in passes:
                progress |= shrink_pass()


def _simpler_specs(spec: InputSpec) -> list[InputSpec]:
    """Simpler variants of an input, the simplest kinds of change first."""
    out = []
    if spec.layout != CONTIGUOUS:
        out.append(replace(spec, layout=CONTIGUOUS))
    if spec.requires_grad:
        out.append(replace(spec, requires_grad=False))
    if spec.dtype.is_floating_point and spec.dtype != torch.float32:
        out.append(replace(spec, dtype=torch.float32))
    for d, size in enumerate(spec.shape):
        for smaller in dict.fromkeys((1, 2, size // 2)):
            if 0 < smaller < size:
                shape = spec.shape[:d] + (smaller,) + spec.shape[d + 1 :]
                out.append(replace(spec, shape=shape))
    return out


def shrink(
    case: Case, outcome: Outcome, run: Run, *, seconds: float = 120.0
) -> tuple[Case, Outcome, int]:
    """A minimal case failing like `case` did (same status and pattern), its outcome and the
    number of candidates run; stops improving after `seconds`."""
    shrinker = _Shrinker(case, outcome, run, time.monotonic() + seconds)
    shrinker.shrink()
    best, best_outcome = shrinker.best, shrinker.outcome
    renamed = replace(best, program=canonical_names(best.program))
    if renamed != best:
        renamed_outcome = run(renamed)
        if (renamed_outcome.status, renamed_outcome.pattern) == shrinker.signature:
            best, best_outcome = renamed, renamed_outcome
    return best, best_outcome, shrinker.runs
