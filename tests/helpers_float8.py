"""float8 test data: every bit pattern of a format, and float32 values at its rounding
boundaries, compared with PyTorch bit for bit."""

import pytest
import torch

from minicomp.ir.types import FLOAT8_TYPES, to_torch


def float8_params() -> list:
    """The float8 torch dtypes as pytest parameters named by their short IR names."""
    return [pytest.param(to_torch(t), id=t.short) for t in FLOAT8_TYPES]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a tensor, as the integer type of its size."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.itemsize])


def all_patterns(dt: torch.dtype) -> torch.Tensor:
    """The 256 values of float8 type `dt`, in bit-pattern order."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dt)


def boundary_floats(dt: torch.dtype) -> torch.Tensor:
    """float32 values at every rounding boundary of float8 type `dt`, both signs: each value,
    each midpoint between neighbours, the midpoints and values one float32 ulp either side, the
    subnormals (float8's and float32's), the largest finite value and what lies beyond it up to
    float32's largest, zeros, infinities, NaNs with several payloads, then random bits."""
    values = all_patterns(dt).float()
    values = values[values.isfinite() & (values >= 0)].unique().double()
    step = values[-1] - values[-2]
    beyond = torch.tensor([0.5, 1.0, 1.5, 2.0, 1e3]) * step + values[-1]
    points = torch.cat(
        [
            values,
            (values[1:] + values[:-1]) / 2,
            values[1] / 2 * torch.tensor([0.25, 0.5, 0.75]),  # below the smallest subnormal
            beyond,
            torch.tensor([3.4028234663852886e38, 1e-30, 1e-45]),
        ]
    ).float()
    up = torch.nextafter(points, torch.tensor(float("inf")))
    down = torch.nextafter(points, torch.tensor(0.0))
    magnitudes = torch.cat([points, up, down])
    special = torch.tensor(
        [
            0x00000000, 0x00000001, 0x007FFFFF, 0x00800000,  # zero, float32 subnormals
            0x7F800000, 0x7FC00000, 0x7F800001, 0x7FBFFFFF, 0x7FFFFFFF, 0x7FC12345,  # inf, NaNs
        ],
        dtype=torch.int64,
    ).to(torch.int32).view(torch.float32)  # fmt: skip
    positive = torch.cat([magnitudes, special])
    generator = torch.Generator().manual_seed(0)
    random = torch.randint(-(2**31), 2**31, (4096,), generator=generator).to(torch.int32)
    return torch.cat([positive, -positive, random.view(torch.float32)])
