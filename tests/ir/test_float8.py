"""ir/float8.py, the numpy reference of the float8 conversions, and the float8 types of the IR:
bit for bit against PyTorch, through the evaluator too; promotion."""

import numpy as np
import pytest
import torch
from helpers_float8 import all_patterns, bits, boundary_floats, float8_params

from minicomp.ir import types as T
from minicomp.ir.compute import compute, tensor_input
from minicomp.ir.evaluate import evaluate
from minicomp.ir.expr import cast
from minicomp.ir.float8 import (
    e4m3fn_saturates,
    float8_bits,
    from_float8_bits,
    round_float8,
    to_float8_bits,
)


@pytest.mark.parametrize("dt", float8_params())
def test_reference_widens_every_pattern_like_pytorch(dt):
    q = all_patterns(dt)
    got = from_float8_bits(bits(q).numpy(), T.from_torch(dt))
    assert np.array_equal(got.view(np.int32), bits(q.float()).numpy())


@pytest.mark.parametrize("dt", float8_params())
def test_reference_narrows_like_pytorch_at_every_boundary(dt):
    x = boundary_floats(dt)
    got = to_float8_bits(x.numpy(), T.from_torch(dt))
    assert np.array_equal(got, bits(x.to(dt)).numpy())
    rounded = round_float8(x.numpy(), T.from_torch(dt))
    expected = x.to(dt).float().numpy()
    assert np.array_equal(np.isnan(rounded), np.isnan(expected))
    assert np.array_equal(rounded[~np.isnan(rounded)], expected[~np.isnan(expected)])


def test_e4m3fn_overflow_follows_the_installed_pytorch():
    big = torch.tensor([464.0, 470.0, 1e6, float("inf"), -1e6])
    eager = bits(big.to(torch.float8_e4m3fn)).tolist()
    assert eager == to_float8_bits(big.numpy(), T.f8e4m3fn).tolist()
    # The two behaviours: saturation at 448 (0x7e) or NaN (0x7f), the sign kept either way.
    assert to_float8_bits(big.numpy(), T.f8e4m3fn, saturate=True).tolist() == [
        0x7E,
        0x7E,
        0x7E,
        0x7E,
        0xFE,
    ]
    assert to_float8_bits(big.numpy(), T.f8e4m3fn, saturate=False).tolist() == [
        0x7E,
        0x7F,
        0x7F,
        0x7F,
        0xFF,
    ]
    assert e4m3fn_saturates() == (eager[2] == 0x7E)


@pytest.mark.parametrize("dt", float8_params())
def test_scalar_bits_of_python_floats(dt):
    for v in (0.0, -0.0, 1.0, -2.5, 0.1, 1e-3, 1e9, float("inf"), float("nan"), 2.0**-9):
        expected = bits(torch.tensor([v], dtype=torch.float32).to(dt))[0].item()
        assert float8_bits(v, T.from_torch(dt)) == expected, v


@pytest.mark.parametrize("dt", float8_params())
def test_evaluator_rounds_casts_and_arithmetic_to_float8(dt):
    """A cast to float8, a product of float8 values (computed in float32, rounded, as eager's
    float8 mul) and a cast back, evaluated against eager."""
    f8 = T.from_torch(dt)
    x = torch.randn(64) * 100
    a = tensor_input("a", (64,), T.f32)
    q = compute("q", (64,), lambda i: cast(a[i], f8))
    sq = compute("sq", (64,), lambda i: q[i] * q[i])
    back = compute("back", (64,), lambda i: cast(sq[i], T.f32) / 3)
    inputs = {"a": x.numpy()}
    eager_q = x.to(dt)
    eager_sq = eager_q * eager_q
    # fnuz formats have no infinity: past their largest value a cast gives NaN, as eager's.
    assert np.array_equal(evaluate(q, inputs), eager_q.float().numpy(), equal_nan=True)
    got_sq = evaluate(sq, inputs)
    assert np.array_equal(np.isnan(got_sq), eager_sq.float().isnan().numpy())
    finite = ~np.isnan(got_sq)
    assert np.array_equal(got_sq[finite], eager_sq.float().numpy()[finite])
    expected = eager_sq.float() / 3
    assert np.allclose(evaluate(back, inputs), expected.numpy(), equal_nan=True, rtol=0)


def test_float8_types_are_narrow_floats_computed_in_float32():
    for t in T.FLOAT8_TYPES:
        assert t.is_float and t.nbytes == 1 and T.is_narrow_float(t) and T.is_float8(t)
        assert T.from_torch(T.to_torch(t)) == t
        assert T.dtype(t.short) == t and T.dtype(t.name) == t
    assert not T.is_float8(T.f16) and T.is_narrow_float(T.bf16)
    # float8_e8m0fnu (a scale format) stays opaque: only ATen calls handle it.
    assert T.from_torch(torch.float8_e8m0fnu).kind == "opaque"


def test_promotion_of_float8_inside_the_ir():
    # PyTorch promotes float8 with nothing; inside the IR the wider type holds it exactly.
    assert T.promote(T.f8e4m3fn, T.f32) == T.f32
    assert T.promote(T.f8e5m2, T.f16) == T.f16
    assert T.promote(T.f8e4m3fn, T.f8e5m2) == T.f32
    assert T.promote(T.f8e4m3fn, T.i64) == T.f8e4m3fn
    assert T.promote(T.boolean, T.f8e5m2) == T.f8e5m2
