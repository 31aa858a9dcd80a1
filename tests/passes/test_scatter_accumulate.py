"""Sums of scattered zeros scatter into the other addend: a tied embedding's gradient."""

import torch
from helpers import check_compiled, compile_minicomp
from helpers_graph import PassGraphBuilder, assert_graph_equal

from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.expr import const
from minicomp.ir.graph import ArgRef, ExternOp, FusedOp
from minicomp.passes.graph.scatter_accumulate import fold_scatter_into_sum

aten = torch.ops.aten
SCATTER_ARGS = (ArgRef(0), (ArgRef(1),), ArgRef(2), True)


def scattered_sum(b, zeros_fill=0.0, accumulate=True, alpha=None):
    """grad + index_put(full(fill), [rows], vals, accumulate), as an embedding's backward."""
    grad, rows = b.input("grad", (10, 4)), b.input("rows", (3,), T.i64)
    vals = b.input("vals", (3, 4))
    zeros = b.compute("zeros", (10, 4), lambda i, j: const(zeros_fill, T.f32))
    args = (*SCATTER_ARGS[:3], accumulate)
    put = b.extern("put", aten.index_put.default, [zeros, rows, vals], (10, 4), args=args)

    def total(i, j):
        return grad[i, j] + (put[i, j] if alpha is None else put[i, j] * alpha)

    return put, b.compute("total", (10, 4), total)


def test_a_sum_of_scattered_zeros_scatters_into_the_addend():
    b = PassGraphBuilder()
    b.output(scattered_sum(b)[1])

    e = PassGraphBuilder()
    grad, rows = e.input("grad", (10, 4)), e.input("rows", (3,), T.i64)
    vals = e.input("vals", (3, 4))
    e.compute("zeros", (10, 4), lambda i, j: const(0.0, T.f32))  # left to DCE
    total = e.extern("total", aten.index_put.default, [grad, rows, vals], (10, 4),
                     args=SCATTER_ARGS, op="put")  # fmt: skip
    e.output(total)
    assert_graph_equal(fold_scatter_into_sum(b.build()), e.build())


def test_other_sums_and_scatters_are_left_alone():
    for kwargs in ({"zeros_fill": 1.0}, {"accumulate": False}, {"alpha": 2.0}):
        b = PassGraphBuilder()
        b.output(scattered_sum(b, **kwargs)[1])
        g = b.build()
        assert fold_scatter_into_sum(g) is g, kwargs
    # The scatter's result read twice: it is needed on its own.
    b = PassGraphBuilder()
    put, total = scattered_sum(b)
    b.output(total, b.compute("again", (10, 4), lambda i, j: put[i, j] * 3.0))
    g = b.build()
    assert fold_scatter_into_sum(g) is g


def test_a_tied_embeddings_gradient_matches_eager_and_scatters_into_the_matmul(target):
    # GPT-2's tied LM head: the table's gradient is the head's product plus the embedding's
    # scattered rows, repeated tokens included. No kernel fills or adds the whole table.
    torch.manual_seed(0)
    table = torch.nn.Embedding(40, 8)
    idx = torch.tensor([[3, 7, 3, 0, 39, 7]])

    def step(emb):
        logits = emb(idx) @ emb.weight.t()
        logits.square().mean().backward()
        return emb.weight.grad

    import copy

    ours = copy.deepcopy(table)
    records: list = []
    with recording(records):
        got = compile_minicomp(step, target)(ours)
    assert torch.allclose(got, step(table), rtol=1e-5, atol=1e-6)
    backward = next(r for r in records if r.kind == "backward")
    puts = [n for n in backward.graph.nodes if isinstance(n, ExternOp) and "index_put" in n.name]
    assert len(puts) == 1 and puts[0].inputs[0].name.startswith("mm"), puts
    product = backward.graph.producers()[puts[0].inputs[0]]  # ATen's on cpu, ours on cuda
    kernels = [n for n in backward.graph.nodes if isinstance(n, FusedOp) and n is not product]
    assert not [n.name for n in kernels if any(v.shape == (40, 8) for v in n.outputs)]


def test_an_index_put_into_zeros_plus_a_tensor_matches_eager(target):
    def f(grad, rows, vals):
        return grad + torch.zeros_like(grad).index_put((rows,), vals, accumulate=True)

    rows = torch.tensor([1, 4, 1, 9])
    check_compiled(f, torch.randn(10, 3), rows, torch.randn(4, 3), target=target)
