"""Creation lowerings evaluated with numpy and compared with eager PyTorch."""

import pytest
import torch
from helpers_shape import check, lower, rand, refuses

from minicomp.ir import types as T
from minicomp.ir.evaluate import evaluate
from minicomp.ir.expr import size_var
from minicomp.ops.registry import LoweringContext, lowering_for

aten = torch.ops.aten
prims = torch.ops.prims
DTYPES = [torch.float32, torch.int64, torch.bool, torch.float16, torch.int32]


@pytest.mark.parametrize("dtype", DTYPES)
def test_full_zeros_ones(dtype):
    value = True if dtype == torch.bool else 3
    check(aten.full.default, [2, 3], value, dtype=dtype)
    check(aten.full.default, [], value, dtype=dtype)
    check(aten.full.default, [0, 4], value, dtype=dtype)
    check(aten.zeros.default, [3, 1], dtype=dtype)
    check(aten.ones.default, [4], dtype=dtype)
    x = rand(2, 5, dtype=dtype)
    check(aten.full_like.default, x, value)
    check(aten.zeros_like.default, x)
    check(aten.ones_like.default, x)
    check(aten.new_full.default, x, [3], value)
    check(aten.new_zeros.default, x, [1, 2])
    check(aten.new_ones.default, x, [2])


def test_full_float_values():
    check(aten.full.default, [3], -2.5)
    check(aten.full.default, [3], float("inf"))
    check(aten.full.default, [3], float("nan"))
    check(aten.full.default, [2], 2.7, dtype=torch.int64)
    check(aten.full_like.default, rand(2, dtype=torch.int64), 2.5, dtype=torch.float64)
    check(aten.scalar_tensor.default, 1.5)
    check(aten.scalar_tensor.default, 3, dtype=torch.int64)
    check(aten.scalar_tensor.default, True, dtype=torch.bool)


def test_full_symbolic():
    check(aten.full.default, [7, 2], 1.5, sym={"s0": 7})
    # A symbolic fill value (a SymInt argument) arrives as an i64 expression.
    ctx = LoweringContext("out", ((2,),), (T.f32,))
    c = lowering_for(aten.full.default)(ctx, [2], size_var("s0") * 2)
    assert c.dtype == T.f32
    assert evaluate(c, {}, {"s0": 5}).tolist() == [10.0, 10.0]
    assert evaluate(c, {}, {"s0": 3}).tolist() == [6.0, 6.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_is_any_value(dtype):
    # empty's contents are unspecified: check only shape and dtype.
    for op, args in [
        (aten.empty.memory_format, ([2, 3],)),
        (aten.empty_like.default, (rand(4, 1, dtype=dtype),)),
        (aten.empty_permuted.default, ([2, 3, 4], [0, 2, 1])),
        (aten.empty_strided.default, ([2, 3], [1, 2])),
        (aten.new_empty.default, (rand(1, dtype=dtype), [5])),
    ]:
        c, e, arrays = lower(op, *args, dtype=dtype)
        got = evaluate(c, arrays)
        assert got.shape == tuple(e.shape) and str(got.dtype) == str(e.dtype).split(".")[-1]


@pytest.mark.parametrize(
    "args,dtype",
    [
        ((10,), None),
        ((0,), None),
        ((1, 10, 3), None),
        ((5, -4, -2), None),
        ((0.5, 3.0, 0.25), None),
        ((0.0, 1.0, 0.1), torch.float32),
        ((-1.0, 1.0, 0.3), torch.float64),
        ((0, 100, 7), torch.float16),
        ((1, 7, 2), torch.int32),
        ((2.0, 9.0, 3.0), torch.int64),
        ((3,), torch.float32),
    ],
)
def test_arange(args, dtype):
    # Eager CPU rounds differently in its vectorized and scalar loops (and CUDA computes in
    # float32): float results agree to rounding, integer ones exactly.
    kwargs = {} if dtype is None else {"dtype": dtype}
    kwargs["exact"] = not any(isinstance(a, float) for a in args) and (
        dtype is None or not dtype.is_floating_point
    )
    if len(args) == 1:
        check(aten.arange.default, *args, **kwargs)
    check(aten.arange.start_step, *(args if len(args) == 3 else (0, args[0], 1)), **kwargs)
    if len(args) == 3 and args[0] <= args[1]:
        check(aten.arange.start, *args[:2], **kwargs)


def test_arange_long_float_range():
    check(aten.arange.start_step, 0.1, 1000.0, 0.7, exact=False)
    check(aten.arange.start_step, -3.0, 3.0, 1 / 3, dtype=torch.float64, exact=False)


def test_arange_symbolic():
    check(aten.arange.default, 7, sym={"s0": 7})
    check(aten.arange.start_step, 2, 7, 2, sym={"s0": 7}, out_shapes=[(3,)])


def test_arange_refuses_fractional_integer_steps():
    refuses(aten.arange.start_step, 0.5, 5, 1.5, dtype=torch.int64)


def test_iota():
    check(
        prims.iota.default,
        5,
        start=3,
        step=-2,
        dtype=torch.int64,
        device="cpu",
        requires_grad=False,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("diagonal", [0, 1, -1, 5, -5])
def test_tril_triu(dtype, diagonal):
    x = rand(2, 4, 5, dtype=dtype)
    check(aten.tril.default, x, diagonal)
    check(aten.triu.default, x, diagonal)
    check(aten.tril.default, rand(3, 0, dtype=dtype), diagonal)


def test_tril_symbolic():
    check(aten.tril.default, rand(7, 3), -1, sym={"s0": 7})
    check(aten.triu.default, rand(3, 7), 2, sym={"s0": 7})
