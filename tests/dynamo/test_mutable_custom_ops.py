"""Custom ops that mutate their arguments reach minicomp as auto_functionalized_v2: the plan
calls it (on copies of what the op mutates) and compiles the ops around it."""

import pytest
import torch
from helpers import assert_same, clone_inputs, compile_minicomp

from minicomp.dynamo.backend import recording


@torch.library.custom_op("minicomp_tests::add_one_", mutates_args=("x",))
def add_one_(x: torch.Tensor) -> None:
    x.add_(1)


@add_one_.register_fake
def _(x):
    return None


@torch.library.custom_op("minicomp_tests::tripled_into", mutates_args=("out",))
def tripled_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    out.copy_(x * 3)
    return x + 1


@tripled_into.register_fake
def _(x, out):
    return torch.empty_like(x)


def mutate_an_intermediate(x):
    y = x * 2
    add_one_(y)
    return y + 1


def mutate_a_slice(x):
    y = x * 2
    add_one_(y[1:])
    return y.sum(0)


def mutate_an_output_argument(x):
    out = torch.empty_like(x)
    r = tripled_into(x.sin(), out)
    return out * r


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn", [mutate_an_intermediate, mutate_a_slice, mutate_an_output_argument])
def test_mutable_custom_op(fn, dynamic, target):
    torch.manual_seed(0)
    compiled = compile_minicomp(fn, target, dynamic=dynamic)
    records = []
    with recording(records):
        for rows in (4, 6):
            x = torch.randn(rows, 3)
            assert_same(compiled(*clone_inputs((x,))), fn(x), rtol=1e-6, atol=1e-6)
    assert any(r.kernels for r in records), "nothing around the custom op was compiled"


def test_mutated_input_is_written_back(target):
    def bump_then_double(x):
        add_one_(x)
        return x * 2

    x = torch.randn(5)
    x_ref = x.clone()
    expected = bump_then_double(x_ref)
    assert_same(compile_minicomp(bump_then_double, target)(x), expected)
    assert_same(x, x_ref)
