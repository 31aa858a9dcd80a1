"""Which fused groups are contractions, and how their variables split into B, M, N and K."""

import pytest
import torch

import minicomp
from minicomp.ir.contraction import match_contraction
from minicomp.ir.graph import FusedOp


def _groups(fn, *args):
    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(fn, *args, options={"target": "cuda-emu"})
    (record,) = report.records
    return [n for n in record.graph.nodes if isinstance(n, FusedOp)]


def test_linear_with_bias_and_activation():
    x, w, b = torch.randn(6, 8, dtype=torch.float16), torch.randn(5, 8), torch.randn(5)
    (group,) = _groups(lambda x, w, b: torch.relu(x.float() @ w.t() + b), x, w, b)
    c = match_contraction(group)
    assert c is not None
    assert [e for _, e in c.m] == [6] and [e for _, e in c.n] == [5] and [e for _, e in c.k] == [8]
    assert not c.batch
    # The prologue (a cast of x) is part of operand a, which held f16 before widening.
    assert c.operand_dtypes == (minicomp.ir.types.f16, minicomp.ir.types.f32)
    assert len(c.epilogue) == 1


def test_batched_product_with_a_transposed_operand():
    a, b = torch.randn(3, 4, 7), torch.randn(3, 5, 7)
    (group,) = _groups(lambda a, b: torch.bmm(a, b.transpose(1, 2)) * 2, a, b)
    c = match_contraction(group)
    assert c is not None
    assert [e for _, e in c.batch] == [3]
    assert [e for _, e in c.m] == [4] and [e for _, e in c.n] == [5] and [e for _, e in c.k] == [7]


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (lambda x: x.sum(dim=1), [(6, 9)]),
        (lambda x, v: x @ v, [(6, 9), (9,)]),  # matrix-vector: a reduction per row
        (lambda x, y: (x * y).amax(dim=1), [(6, 9), (6, 9)]),
    ],
)
def test_other_reductions_are_not_contractions(fn, shapes):
    groups = _groups(fn, *(torch.randn(s) for s in shapes))
    assert groups and all(match_contraction(g) is None for g in groups)
