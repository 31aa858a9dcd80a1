"""Fuzzer finding 58f2adc3: error on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 2113) and shrunk to this program.
"""

import pytest
import torch
import torch.nn.functional as F

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "error",
    "pattern": (
        "RuntimeError: Expected X.is_contiguous(memory_format) to be true, but got false.  (Could "
        "this error message be improved?  If so, please report an enhancement request to PyTor"
    ),
    "targets": ["cpu", "cuda-emu"],
    "ops": ["group_norm"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "group_norm of an expanded (stride 0) input: minicomp passes it to ATen's native_group_norm as "
    "it is, which raises 'Expected X.is_contiguous'"
)


def fn(a):
    v0 = F.group_norm(a, 2)
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randn(1, 1, generator=gen.manual_seed(11155)).expand(1, 4)
    return (a,)


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_58f2adc3(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=True, backward=False)
