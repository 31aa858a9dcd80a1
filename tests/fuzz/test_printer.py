"""Programs printed as Python: readable source that runs and gives what the program means."""

import textwrap

import torch

from minicomp.fuzz.check import MISMATCH, Outcome, check_against_eager
from minicomp.fuzz.generate import generate
from minicomp.fuzz.printer import program_source
from minicomp.fuzz.program import (
    Case,
    Index,
    InputSpec,
    Layout,
    ListOf,
    Program,
    Ref,
    Slice,
    Step,
    TensorLiteral,
)
from minicomp.fuzz.regression import known_signatures, regression_source, save
from minicomp.fuzz.run import load, trace

PROGRAM = Program(
    inputs=(
        InputSpec("a", (4, 3), torch.float32, seed=5, layout=Layout("permuted", (1, 0))),
        InputSpec("b", (3,), torch.float16, seed=6, requires_grad=True),
        InputSpec("c", (2,), torch.int64, seed=7, high=4),
    ),
    steps=(
        Step("v0", "add", (Ref("a"), Ref("b"))),
        Step("v1", "sum", (Ref("v0"), (1,), True)),
        Step("v2", "cat", (ListOf((Ref("v1"), Ref("v1"))), 0)),
        Step("v3", "index_select", (Ref("v0"), 0, TensorLiteral((3, 0)))),
        Step(None, "setitem", (Ref("v3"), Index((Slice(None, None, 2), 1)), 0.5)),
        Step("v4", "index_tensor", (Ref("v0"), Index((Ref("c"),)))),
    ),
    outputs=("v2", "v3", "v4"),
)


def test_a_program_prints_as_plain_python():
    assert program_source(PROGRAM) == textwrap.dedent(
        """\
        def fn(a, b, c):
            v0 = a + b
            v1 = v0.sum(dim=(1,), keepdim=True)
            v2 = torch.cat([v1, v1], dim=0)
            v3 = v0.index_select(0, torch.tensor([3, 0]))
            v3[::2, 1] = 0.5
            v4 = v0[c]
            return v2, v3, v4


        def make_inputs():
            gen = torch.Generator()
            a = torch.randn(3, 4, generator=gen.manual_seed(5)).t()
            b = torch.randn(3, dtype=torch.float16, generator=gen.manual_seed(6)).requires_grad_()
            c = torch.randint(0, 4, (2,), generator=gen.manual_seed(7))
            return a, b, c
        """
    )


def test_printed_source_computes_what_the_steps_do():
    for seed in range(40):
        program = generate(seed)
        fn, make_inputs = load(program)
        outputs = fn(*make_inputs())
        values = trace(program)
        for name, output in zip(program.outputs, outputs):
            torch.testing.assert_close(output, values[name], equal_nan=True)


def _eager(fn, target, dynamic):
    return fn


def test_a_saved_regression_is_a_test_that_runs(tmp_path):
    case = Case(PROGRAM, "cpu", backward=True)
    outcome = Outcome(MISMATCH, "output values", "output 0: wrong")
    path = save(case, outcome, ("cpu", "cuda-emu"), str(tmp_path), seed=3)
    namespace = {"__name__": "regression"}
    exec(compile(open(path).read(), path, "exec"), namespace)
    # With eager standing in for minicomp, the check passes.
    check_against_eager(
        namespace["fn"], namespace["make_inputs"], target="cpu", backward=True, compiler=_eager
    )
    [signature] = known_signatures(str(tmp_path))
    assert signature.targets == ("cpu", "cuda-emu")
    assert signature.ops == ("add", "cat", "index_select", "index_tensor", "setitem", "sum")
    assert signature.matches(
        "cpu", outcome, {"add", "cat", "index_select", "index_tensor", "setitem", "sum", "exp"}
    )
    assert not signature.matches("cpu", outcome, {"add", "cat"})


def test_regression_source_names_the_xfail_reason_and_targets():
    case = Case(PROGRAM, "cuda-emu")
    outcome = Outcome(MISMATCH, "output stride", "output 0: strides (1, 2) != (2, 1)")
    reason = "the cat's result is contiguous where eager's keeps the layout of its inputs " * 3
    text = regression_source(case, outcome, ("cuda-emu",), reason=reason)
    assert "@pytest.mark.xfail(strict=True, raises=AssertionError, reason=REASON)" in text
    assert '@pytest.mark.parametrize("target", ["cuda-emu"])' in text
    assert "target=target, dynamic=False, backward=False)" in text
    namespace = {}
    exec(compile(text, "regression", "exec"), namespace)
    assert namespace["REASON"] == reason
    assert max(len(line) for line in text.splitlines()) <= 100
