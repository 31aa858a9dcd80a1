"""Fuzzer finding 8cb31ce5: error on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 2530) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "error",
    "pattern": (
        "RuntimeError: unsupported operation: more than one element of the written-to tensor "
        "refers to a single memory location. Please clone() the tensor before performing the "
        "operat"
    ),
    "targets": ["cpu", "cuda-emu"],
    "ops": ["sub_", "unbind"],
}
# Why the test fails: what is wrong, in words.
REASON = (
    "PyTorch, not minicomp (aot_eager too): sub_ through a view of an expanded input; AOTAutograd "
    "copies the mutation back into the overlapping input and raises"
)


def fn(a):
    v0 = a.unbind(1)[-1]
    v1 = v0.sub_(1)
    return (v1,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randint(-4, 5, (1, 1), dtype=torch.int8, generator=gen.manual_seed(63528)).expand(
        1, 2
    )
    return (a,)


@pytest.mark.xfail(strict=True, reason=REASON)
@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_8cb31ce5(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
