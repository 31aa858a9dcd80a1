"""Fuzzer finding f937e20c: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 6169) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
# ops: masked_fill_ alone, the one op that loses the layout, whatever comes before it.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output stride",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["masked_fill_"],
}
# Why the test fails: what is wrong, in words.
REASON = (
    "PyTorch, not minicomp (aot_eager too): masked_fill_ on a non-contiguous value (here the clone "
    "of sigmoid of a transposed input) comes back contiguous; eager keeps its layout"
)


def fn(a, b):
    v0 = torch.sigmoid(a)
    v1 = v0.clone()
    v2 = v1.masked_fill_(b, 2.0)
    return (v2,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randn(2, 2, generator=gen.manual_seed(53873)).t()
    b = torch.randint(0, 2, (1, 1), generator=gen.manual_seed(27906)).bool()
    return a, b


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=REASON)
@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_f937e20c(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
