"""The fuzzing loop: programs from consecutive seeds, each run a few ways, until the seeds or
the time run out; findings shrunk, told apart from known and repeated ones, and tallied."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from minicomp.fuzz.check import CRASH, FINDINGS, INTERNAL, Outcome
from minicomp.fuzz.generate import generate
from minicomp.fuzz.program import Case, Program
from minicomp.fuzz.regression import Signature, signature_of
from minicomp.fuzz.shrink import shrink

# Of the programs with an input that requires grad, the share whose run takes gradients too.
BACKWARD_SHARE = 0.35
DYNAMIC_SHARE = 0.4


@dataclass
class Finding:
    """A failure, shrunk: the minimal case, its outcome, where it was found, and the targets
    its minimal program fails on the same way."""

    case: Case
    outcome: Outcome
    found: Case
    targets: tuple[str, ...]
    # The minimal case fails the same way compiled by PyTorch's aot_eager backend: the bug is
    # in Dynamo or AOTAutograd, not in minicomp.
    in_pytorch: bool = False
    repeats: int = 0  # later programs that failed the same way

    @property
    def signature(self) -> Signature:
        """What the finding is known by when it is seen again."""
        return signature_of(self.case, self.outcome, self.targets)


@dataclass
class Report:
    """What a fuzzing run did: programs and cases run, outcomes by status, findings."""

    programs: int = 0
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    known: Counter = field(default_factory=Counter)  # saved regressions seen again, by pattern
    seconds: float = 0.0
    last_seed: int | None = None


def draw_cases(seed: int, program: Program, targets: Iterable[str]) -> list[Case]:
    """The runs of a seed's program: one per target, with dynamic shapes for some and the
    backward for some of the programs that have an input requiring grad."""
    rng = random.Random(seed * 2 + 1)
    has_grad = any(spec.requires_grad for spec in program.inputs)
    backward = has_grad and rng.random() < BACKWARD_SHARE
    return [Case(program, name, rng.random() < DYNAMIC_SHARE, backward, seed) for name in targets]


def _ops(program: Program) -> set[str]:
    return {step.op for step in program.steps}


class Session:
    """One fuzzing run over a Runner (a Worker, or anything with `run(case) -> Outcome`)."""

    def __init__(
        self,
        runner,
        targets: tuple[str, ...],
        *,
        known: Iterable[Signature] = (),
        shrink_seconds: float = 120.0,
        on_event: Callable[[str, object], None] | None = None,
    ):
        self.runner, self.targets = runner, tuple(targets)
        self.known = list(known)
        self.shrink_seconds = shrink_seconds
        self.on_event = on_event or (lambda kind, value: None)
        self.report = Report()

    def run(self, seeds: Iterable[int], *, seconds: float | None = None) -> Report:
        """Fuzz the programs of `seeds` in order, starting none after `seconds`."""
        start = time.monotonic()
        for seed in seeds:
            if seconds is not None and time.monotonic() - start > seconds:
                break
            self.program(seed)
            self.report.seconds = time.monotonic() - start
            self.on_event("progress", self.report)
        self.report.seconds = time.monotonic() - start
        return self.report

    def program(self, seed: int) -> None:
        """Run the cases of one seed's program."""
        self.report.programs += 1
        self.report.last_seed = seed
        try:
            program = generate(seed)
        except Exception as e:
            # A bug of the generator: told, not fatal to a long run.
            self.report.statuses[INTERNAL] += 1
            self.on_event("internal", f"seed {seed}: generate: {type(e).__name__}: {e}")
            return
        for case in draw_cases(seed, program, self.targets):
            outcome = self.runner.run(case)
            if outcome.status == CRASH:
                outcome = self._confirm_crash(case, outcome)
            self.report.cases += 1
            self.report.statuses[outcome.status] += 1
            if outcome.status == INTERNAL:
                self.on_event("internal", f"seed {seed}: {outcome.message}")
            if outcome.status in FINDINGS:
                self.finding(case, outcome)

    def _confirm_crash(self, case: Case, outcome: Outcome) -> Outcome:
        # Alone in a fresh process: a crash that needs earlier programs says so.
        again = self.runner.run(case)
        if again.status == CRASH:
            return again
        note = "\n(the process died running this program after others; alone it did not)"
        return Outcome(CRASH, outcome.pattern + " after earlier programs", outcome.message + note)

    def finding(self, case: Case, outcome: Outcome) -> None:
        """Record a failing case: as a known one, a repeat, or a new finding shrunk."""
        ops = _ops(case.program)
        for signature in self.known:
            if signature.matches(case.target, outcome, ops):
                self.report.known[outcome.pattern] += 1
                return
        for finding in self.report.findings:
            if finding.signature.matches(case.target, outcome, ops):
                finding.repeats += 1
                return
        self.on_event("shrinking", (case, outcome))
        small, small_outcome, _ = shrink(
            case, outcome, self.runner.run, seconds=self.shrink_seconds
        )
        targets = self._failing_targets(small, small_outcome)
        reference = self.runner.run(small, backend="aot_eager")
        in_pytorch = (reference.status, reference.pattern) == (
            small_outcome.status,
            small_outcome.pattern,
        )
        new = Finding(small, small_outcome, case, targets, in_pytorch)
        for finding in self.report.findings:
            if finding.signature.matches(case.target, small_outcome, _ops(small.program)):
                finding.repeats += 1
                return
        self.report.findings.append(new)
        self.on_event("finding", new)

    def _failing_targets(self, case: Case, outcome: Outcome) -> tuple[str, ...]:
        failing = []
        for name in self.targets:
            if name == case.target:
                failing.append(name)
                continue
            other = self.runner.run(Case(case.program, name, case.dynamic, case.backward))
            if (other.status, other.pattern) == (outcome.status, outcome.pattern):
                failing.append(name)
        return tuple(failing)
