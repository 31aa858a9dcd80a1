"""Python scalars meet narrower tensors as in eager PyTorch: integers that do not fit an
integer tensor's dtype wrap around (`int8_tensor + 300` adds 44; `pow(300, int8_tensor)`
raises 44) instead of failing the kernel's compilation, and a float base is rounded to the
result's dtype before the power."""

import pytest
import torch
from helpers import check_compiled

INT8 = torch.tensor([0, 1, 2, 3, -3, 44, 127], dtype=torch.int8)
UINT8 = torch.tensor([0, 1, 2, 3, 200, 255], dtype=torch.uint8)


def random_like(t: torch.Tensor) -> torch.Tensor:
    info = torch.iinfo(t.dtype)
    return torch.randint(info.min, info.max + 1, (16,), dtype=t.dtype)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x + 300,
        lambda x: x * 300,
        lambda x: 300 - x,
        lambda x: x == 300,
        lambda x: x < 300,
        lambda x: x & 300,
        lambda x: torch.pow(300, x.clamp(0, 3)),
        lambda x: torch.pow(-129, x.clamp(0, 3)),
    ],
    ids=["add", "mul", "rsub", "eq", "lt", "bitand", "pow_base", "pow_negative_base"],
)
@pytest.mark.parametrize("values", [INT8, UINT8], ids=["int8", "uint8"])
def test_out_of_range_integer_scalars_wrap(fn, values, target):
    check_compiled(fn, values, target=target)
    check_compiled(fn, random_like(values), target=target)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("base", [1e6, 0.1, 3, 1e39, 2.5])
def test_a_python_base_is_rounded_to_the_result_dtype_first(target, dtype, base):
    # Eager converts the base before the power: pow(1e6, x) is inf for float16 x.
    x = torch.randn(40).to(dtype)
    exact = {"rtol": 0, "atol": 0} if dtype != torch.float32 else {}  # f32: libm's last ulp
    check_compiled(lambda x: torch.pow(base, x), x, target=target, **exact)
