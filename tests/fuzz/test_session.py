"""The fuzzing loop over a compiler with a planted bug: the bug found, shrunk once, its
repeats counted, and nothing reported once it is known."""

import os

import pytest
import torch

from minicomp.fuzz.check import ERROR, MISMATCH, torch_backend
from minicomp.fuzz.generate import generate
from minicomp.fuzz.ops import TABLE
from minicomp.fuzz.program import Case, InputSpec, Layout, Program, Ref, Step
from minicomp.fuzz.session import Session, draw_cases
from minicomp.fuzz.worker import InProcess, load_compiler

PLANTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "planted.py")
# Enough programs for several to multiply.
SEEDS = range(200)


def _session(**kwargs) -> Session:
    runner = InProcess(load_compiler(f"{PLANTED}:miscompute_mul", None))
    return Session(runner, ("cpu", "cuda-emu"), shrink_seconds=20, **kwargs)


@pytest.fixture(scope="module")
def report():
    return _session().run(SEEDS)


def test_a_planted_bug_is_found_once_and_then_counted_as_repeats(report):
    assert report.programs == len(SEEDS)
    assert report.cases == 2 * len(SEEDS)
    # Each finding is one op that multiplies: `a * b`, and `x * torch.arange(n)` too.
    assert "mul" in {f.case.program.steps[0].op for f in report.findings}
    for finding in report.findings:
        [step] = finding.case.program.steps
        assert " * " in TABLE[step.op].template
        assert finding.outcome.status == MISMATCH
        assert finding.targets == ("cpu", "cuda-emu")
        assert not finding.in_pytorch
    assert sum(f.repeats for f in report.findings) > 0


def test_known_findings_are_not_reported_again(report):
    again = _session(known=[f.signature for f in report.findings]).run(SEEDS)
    assert not again.findings
    assert sum(again.known.values()) == sum(f.repeats + 1 for f in report.findings)


def test_the_cases_of_a_seed_are_the_same_every_time():
    program = generate(3)
    cases = draw_cases(3, program, ("cpu", "cuda-emu"))
    assert cases == draw_cases(3, program, ("cpu", "cuda-emu"))
    assert [case.target for case in cases] == ["cpu", "cuda-emu"]


def test_a_failure_aot_eager_shares_is_put_down_to_pytorch():
    # Writing through a view of an expanded input: AOTAutograd cannot copy it back.
    expanded = InputSpec("a", (1, 2), torch.int8, seed=1, layout=Layout("expanded", (1,)))
    steps = (Step("v0", "unbind", (Ref("a"), 1, -1)), Step("v1", "sub_", (Ref("v0"), 1)))
    case = Case(Program((expanded,), steps, ("v1",)), "cpu")
    runner = InProcess(torch_backend("aot_eager"))
    outcome = runner.run(case)
    assert outcome.status == ERROR

    session = Session(runner, ("cpu",), shrink_seconds=10)
    session.finding(case, outcome)

    [finding] = session.report.findings
    assert finding.in_pytorch
