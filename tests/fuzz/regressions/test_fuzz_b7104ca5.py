"""Fuzzer finding b7104ca5: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 6271) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output stride",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["index_tensor"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "a[:, idx] of a permuted uint8 input returns strides (1, 1, 2); eager's result is contiguous"
)


def fn(a, b):
    v0 = a[:, b]
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randint(0, 9, (1, 2, 1), dtype=torch.uint8, generator=gen.manual_seed(5435)).permute(
        2, 0, 1
    )
    b = torch.randint(0, 1, (2,), generator=gen.manual_seed(30654))
    return a, b


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_b7104ca5(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
