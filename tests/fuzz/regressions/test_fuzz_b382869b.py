"""Fuzzer finding b382869b: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 2159) and shrunk to this program.
"""

import pytest
import torch
import torch.nn.functional as F

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output values",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["gelu", "matmul", "reciprocal"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "gelu(+inf) is inf under minicomp and nan in eager's vectorized float32 CPU loop (inf in "
    "float64, CUDA and eager's scalar path); the float64 run that excuses it failed on "
    "float32 @ float64, the int input's reciprocal being float32"
)


def fn(a, b):
    v0 = a.reciprocal()
    v1 = v0 @ b
    v2 = F.gelu(v1)
    return (v2,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randint(-4, 5, (1, 2, 5), dtype=torch.int32, generator=gen.manual_seed(38007))
    b = torch.randn(1, 5, 1, generator=gen.manual_seed(49343))
    return a, b


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_b382869b(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
