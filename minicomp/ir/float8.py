"""The float8 formats: their parameters, and numpy conversions bit-exact with PyTorch's.

These are the reference the evaluator, constant folding and literal rendering use; the C
helpers in backends/common.h compute the same bits in the same steps (one algorithm, c10's
`fp8*_from_fp32_value` / `fp8*_to_fp32_value`, whatever the target):

- float32 to float8 rounds to nearest even; values below the smallest normal round in the
  float32 adder (adding a power of two whose ulp is the format's subnormal unit).
- overflow: e5m2 gives infinity (the rounding decides: 61440 ties to even, up to inf);
  e4m3fn, which has no infinity, saturates at +-448 (infinities too) in PyTorch 2.12 and newer
  and gives NaN in older ones (`e4m3fn_saturates` asks the installed PyTorch); the fnuz
  formats give their one NaN, 0x80, for anything beyond their range, infinities and NaN.
- NaN: e4m3fn and e5m2 give 0x7f with the input's sign; a fnuz format never has a negative
  zero (a negative value rounding to zero gives 0x00).
- float8 to float32 is exact; NaNs widen as c10 widens them (e4m3fn: 0x7f -> 0x7ff00000 with
  the sign, e5m2: the payload kept and quietened, fnuz: 0x80 -> 0x7f800001).
Other source types convert through float32 (float64 rounds to float32 first, as c10 does).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from minicomp.ir import types as T


@dataclass(frozen=True)
class Float8Format:
    """One float8 format: mantissa bits, exponent bias, whether it is a fnuz format (0x80 the
    only NaN, no infinity, no negative zero)."""

    mantissa: int
    bias: int
    fnuz: bool

    @property
    def min_normal_bits(self) -> int:
        """The float32 bits of the smallest normal value."""
        return (127 + 1 - self.bias) << 23

    @property
    def subnormal_magic_bits(self) -> int:
        """The float32 bits of the power of two whose ulp is the smallest subnormal."""
        return (127 + 1 - self.bias - self.mantissa + 23) << 23


FORMATS = {
    T.f8e4m3fn: Float8Format(3, 7, False),
    T.f8e5m2: Float8Format(2, 15, False),
    T.f8e4m3fnuz: Float8Format(3, 8, True),
    T.f8e5m2fnuz: Float8Format(2, 16, True),
}
# float32 bits at and above which a value overflows before rounding: 480 (e4m3fn), 65536
# (e5m2), 256 (e4m3fnuz) and 65536 (e5m2fnuz).
OVERFLOW_BITS = {
    T.f8e4m3fn: 0x43F00000,
    T.f8e5m2: 0x47800000,
    T.f8e4m3fnuz: 0x43800000,
    T.f8e5m2fnuz: 0x47800000,
}
_F32_INF = 0x7F800000


@functools.cache
def e4m3fn_saturates() -> bool:
    """Whether the installed PyTorch saturates float32 -> float8_e4m3fn at +-448 (2.12 and
    newer) rather than giving NaN beyond it."""
    import torch

    big = torch.tensor([1e6], dtype=torch.float32).to(torch.float8_e4m3fn)
    return int(big.view(torch.uint8)[0]) == 0x7E


def _rounded(ax: np.ndarray, fmt: Float8Format) -> np.ndarray:
    """The format's magnitude bits for |x| (float32 bits, uint32) below the overflow."""
    with np.errstate(all="ignore"):
        magic = np.uint32(fmt.subnormal_magic_bits)
        total = ax.view(np.float32) + np.array(magic, np.uint32).view(np.float32)
        subnormal = total.view(np.uint32) - magic
        shift = 23 - fmt.mantissa
        wide = ax.astype(np.uint64)
        normal = (
            wide
            - ((127 - fmt.bias) << 23)
            + ((1 << (shift - 1)) - 1)
            + ((wide >> np.uint64(shift)) & np.uint64(1))
        ) >> np.uint64(shift)
    return np.where(ax < fmt.min_normal_bits, subnormal, normal.astype(np.uint32))


def to_float8_bits(x, dt: T.DataType, *, saturate: bool | None = None) -> np.ndarray:
    """The uint8 bit patterns of float32 values (an array or scalar) in float8 type `dt`.

    `saturate` is e4m3fn's overflow behaviour, by default the installed PyTorch's."""
    fmt = FORMATS[dt]
    bits = np.asarray(x, np.float32).view(np.uint32)
    sign = (bits >> np.uint32(24)) & np.uint32(0x80)
    ax = bits & np.uint32(0x7FFFFFFF)
    mag = _rounded(ax, fmt)
    over = ax >= OVERFLOW_BITS[dt]
    if fmt.fnuz:
        out = np.where(over, 0x80, np.where(mag == 0, 0, mag | sign))
    else:
        if dt == T.f8e4m3fn:
            if e4m3fn_saturates() if saturate is None else saturate:
                mag = np.where(over | (mag == 0x7F), 0x7E, mag)
            else:
                mag = np.where(over, 0x7F, mag)
        else:
            mag = np.where(over, 0x7C, mag)
        out = np.where(ax > _F32_INF, 0x7F, mag) | sign
    return np.asarray(out, np.uint32).astype(np.uint8)


def from_float8_bits(b, dt: T.DataType) -> np.ndarray:
    """The float32 values of float8 bit patterns (uint8, an array or scalar) of type `dt`."""
    fmt = FORMATS[dt]
    b = np.asarray(b, np.uint8).astype(np.uint32)
    sign = (b & 0x80) << 24
    em = b & 0x7F
    magic = np.uint32(fmt.subnormal_magic_bits)
    with np.errstate(all="ignore"):
        sub = (magic | em).view(np.float32) - np.array(magic, np.uint32).view(np.float32)
    normal = (em << (23 - fmt.mantissa)) + np.uint32(((127 - fmt.bias) & 0xFF) << 23)
    mag = np.where(em < (1 << fmt.mantissa), sub.view(np.uint32), normal)
    out = sign | mag
    shifted = (em & ((1 << fmt.mantissa) - 1)) << (23 - fmt.mantissa)
    if fmt.fnuz:
        out = np.where(b == 0x80, 0x7F800001, out)
    elif dt == T.f8e4m3fn:
        out = np.where(em == 0x7F, sign | _F32_INF | shifted, out)
    else:
        quiet = np.where(shifted != 0, 0x400000, 0)
        out = np.where(em >= 0x7C, sign | _F32_INF | shifted | quiet, out)
    return np.asarray(out, np.uint32).view(np.float32)


def round_float8(x, dt: T.DataType) -> np.ndarray:
    """float32 values rounded to float8 type `dt`, kept as float32."""
    return from_float8_bits(to_float8_bits(x, dt), dt)


def float8_bits(value: float, dt: T.DataType) -> int:
    """The bit pattern of a Python float in float8 type `dt` (rounded to float32 first)."""
    with np.errstate(all="ignore"):
        return int(to_float8_bits(np.float32(value), dt))
