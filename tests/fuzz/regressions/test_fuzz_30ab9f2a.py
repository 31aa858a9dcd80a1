"""Fuzzer finding 30ab9f2a: error on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 6391) and shrunk to this program.
"""

import pytest
import torch
import torch.nn.functional as F

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "error",
    "pattern": "ZeroDivisionError: float division by zero",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["group_norm"],
}
# Why the test fails: what is wrong, in words.
REASON = (
    "PyTorch, not minicomp (aot_eager too): group_norm of an empty input that requires grad raises "
    "ZeroDivisionError while tracing"
)


def fn(a):
    v0 = F.group_norm(a, 1)
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randn(1, 1, 0, 1, generator=gen.manual_seed(56744)).requires_grad_()
    return (a,)


@pytest.mark.xfail(strict=True, reason=REASON)
@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_30ab9f2a(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
