"""The shrinker: a failing program cut down to the op that fails, keeping the failure's kind."""

import os

import torch

from minicomp.fuzz.check import ERROR, MISMATCH, run_case
from minicomp.fuzz.printer import function_source
from minicomp.fuzz.program import Case, InputSpec, Layout, Program, Ref, Step
from minicomp.fuzz.shrink import canonical_names, drop_steps, shrink
from minicomp.fuzz.worker import InProcess, load_compiler

PLANTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "planted.py")

TEN_STEPS = Program(
    inputs=(
        InputSpec("a", (4, 6), torch.float32, seed=1, layout=Layout("permuted", (1, 0))),
        InputSpec("b", (6,), torch.float16, seed=2, requires_grad=True),
        InputSpec("c", (4, 1), torch.float32, seed=3),
    ),
    steps=(
        Step("v0", "sin", (Ref("a"),)),
        Step("v1", "add", (Ref("v0"), Ref("b"))),
        Step("v2", "sum", (Ref("v1"), (1,), True)),
        Step("v3", "relu", (Ref("v1"),)),
        Step("v4", "exp", (Ref("c"),)),
        Step("v5", "mul", (Ref("v3"), Ref("v2"))),
        Step("v6", "transpose", (Ref("v5"), 0, 1)),
        Step("v7", "tanh", (Ref("v6"),)),
        Step("v8", "sub", (Ref("v7"), 1)),
        Step("v9", "mean", (Ref("v8"), (0,), False)),
    ),
    outputs=("v9", "v4"),
)


def _runner(name: str) -> InProcess:
    return InProcess(load_compiler(f"{PLANTED}:{name}", None))


def test_a_planted_wrong_multiplication_shrinks_to_the_multiplication_alone():
    runner = _runner("miscompute_mul")
    case = Case(TEN_STEPS, "cpu", dynamic=True, backward=True)
    outcome = runner.run(case)
    assert outcome.status == MISMATCH

    small, small_outcome, _ = shrink(case, outcome, runner.run)

    assert (small_outcome.status, small_outcome.pattern) == (outcome.status, outcome.pattern)
    assert function_source(small.program) == "def fn(a, b):\n    v0 = a * b\n    return (v0,)\n"
    assert [(s.shape, s.dtype) for s in small.program.inputs] == [((1, 1), torch.float32)] * 2
    assert not small.dynamic and not small.backward


def test_a_planted_error_shrinks_to_the_op_that_raises():
    runner = _runner("refuse_exp")
    case = Case(TEN_STEPS, "cuda-emu")
    outcome = runner.run(case)
    assert (outcome.status, outcome.pattern) == (
        ERROR,
        "NotImplementedError: no lowering for aten.exp",
    )

    small, _, _ = shrink(case, outcome, runner.run)

    assert [step.op for step in small.program.steps] == ["exp"]


def test_a_dropped_step_still_read_becomes_an_input_like_it():
    program = drop_steps(TEN_STEPS, set(range(0, 5)))
    names = [spec.name for spec in program.inputs]
    assert names == ["v2", "v3", "v4"]
    assert [spec.shape for spec in program.inputs] == [(4, 1), (4, 6), (4, 1)]
    # v3 came from b, which requires grad; the stand-ins keep that.
    assert [spec.requires_grad for spec in program.inputs] == [True, True, False]
    assert [s.dtype for s in program.inputs] == [torch.float32] * 3


def test_canonical_names_number_inputs_and_values_in_order():
    program = canonical_names(drop_steps(TEN_STEPS, set(range(0, 7))))
    assert function_source(program) == (
        "def fn(a, b):\n"
        "    v0 = torch.tanh(a)\n"
        "    v1 = v0 - 1\n"
        "    v2 = v1.mean(dim=(0,), keepdim=False)\n"
        "    return v2, b\n"
    )


def test_a_program_that_passes_is_left_as_it_is():
    runner = InProcess(lambda fn, target, dynamic: fn)
    case = Case(TEN_STEPS, "cpu")
    assert run_case(case, runner.compiler).status == "pass"
