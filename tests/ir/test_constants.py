"""Integer constants take their type's value as C and PyTorch convert: modulo 2^bits."""

import pytest

from minicomp.ir import types as T
from minicomp.ir.expr import cast, const


@pytest.mark.parametrize(
    ("value", "dtype", "expected"),
    [
        (300, T.i8, 44),
        (-129, T.i8, 127),
        (128, T.i8, -128),
        (-1, T.u8, 255),
        (256, T.u8, 0),
        (2**31, T.i32, -(2**31)),
        (2**63, T.i64, -(2**63)),
        (127, T.i8, 127),
        (-128, T.i8, -128),
    ],
)
def test_integer_constants_wrap(value, dtype, expected):
    assert const(value, dtype).value == expected


def test_a_folded_cast_wraps():
    assert cast(const(300), T.i8) == const(44, T.i8)
