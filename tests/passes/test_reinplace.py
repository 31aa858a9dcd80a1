"""Functional scatters into memory nothing reads afterwards run in place."""

import torch
from helpers import assert_same, compile_minicomp
from helpers_graph import PassGraphBuilder

from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.graph import ArgRef, ExternOp
from minicomp.passes.graph.reinplace import reinplace_scatters
from minicomp.runtime.plan_builder import escaping_values

aten = torch.ops.aten
PUT = (ArgRef(0), (ArgRef(1),), ArgRef(2), True)


def scatter_after_matmul(b, read_after: bool = False):
    """index_put into an ATen matmul's result, which a later op may read again."""
    x, w = b.input("x", (10, 4)), b.input("w", (4, 6))
    rows, vals = b.input("rows", (3,), T.i64), b.input("vals", (3, 6))
    mm = b.extern("mm", aten.mm.default, [x, w], (10, 6))
    put = b.extern("put", aten.index_put.default, [mm, rows, vals], (10, 6), args=PUT)
    b.output(put)
    if read_after:
        b.output(b.extern("neg", aten.neg.default, [mm], (10, 6)))


def targets(graph):
    return {n.name: n.target for n in graph.nodes if isinstance(n, ExternOp)}


def test_a_scatter_into_a_dead_aten_result_runs_in_place():
    b = PassGraphBuilder()
    scatter_after_matmul(b)
    got = targets(reinplace_scatters(b.build()))
    assert got["put (in place)"] is aten.index_put_.default


def test_scatters_into_memory_still_read_or_not_the_plans_own_copy():
    b = PassGraphBuilder()
    scatter_after_matmul(b, read_after=True)  # mm is read after the scatter
    g = b.build()
    assert reinplace_scatters(g) is g
    # Into a graph input, or into a view of one: the caller's memory.
    b = PassGraphBuilder()
    x, rows, vals = b.input("x", (10, 6)), b.input("rows", (3,), T.i64), b.input("vals", (3, 6))
    t = b.extern("t", aten.t.default, [x], (6, 10))
    b.output(b.extern("put", aten.index_put.default, [x, rows, vals], (10, 6), args=PUT))
    b.output(b.extern("put_t", aten.index_put.default, [t, rows, vals], (6, 10), args=PUT))
    g = b.build()
    assert reinplace_scatters(g) is g


def test_memory_a_returned_in_place_result_lives_in_escapes():
    b = PassGraphBuilder()
    scatter_after_matmul(b)
    g = reinplace_scatters(b.build())
    assert {v.name for v in escaping_values(g)} >= {"mm", "put"}


def test_a_scatter_into_a_kernels_result_is_returned_intact_across_calls(target):
    # y lives in the plan's memory; written in place and returned, it must be memory of its
    # own, not part of the workspace (which a CUDA graph reuses on every replay).
    def f(x, rows, vals):
        y = x * 2.0 + 1.0
        return y.index_put((rows,), vals, accumulate=True)

    rows = torch.tensor([0, 3, 0])
    compiled = compile_minicomp(f, target)
    records: list = []
    with recording(records):
        first_args = (torch.randn(5, 4), rows, torch.randn(3, 4))
        first = compiled(*first_args)
    second_args = (torch.randn(5, 4), rows, torch.randn(3, 4))
    second = compiled(*second_args)
    assert_same(first, f(*first_args))
    assert_same(second, f(*second_args))
    assert first.untyped_storage().nbytes() == first.numel() * first.element_size()
    puts = [n for r in records for n in r.graph.nodes if isinstance(n, ExternOp)]
    assert [n.target for n in puts] == [aten.index_put_.default]


def test_cross_entropy_backward_scatters_in_place(target):
    # The loss's backward scatters -1 into zeros of the logits' shape: a fill too large to
    # fold into a constant (fold_constants.MAX_FOLDED_ELEMENTS), then the plan's own memory.
    logits = torch.randn(21, 50257, requires_grad=True)
    labels = torch.randint(0, 50257, (21,))

    def f(logits):
        return torch.nn.functional.cross_entropy(logits, labels)

    mine = logits.detach().clone().requires_grad_()
    records: list = []
    with recording(records):
        compile_minicomp(f, target)(mine).backward()
    f(logits).backward()
    assert_same(mine.grad, logits.grad, rtol=1e-5, atol=1e-6)
    calls = {n.target for r in records for n in r.graph.nodes if isinstance(n, ExternOp)}
    assert aten.scatter_.value in calls and aten.scatter.value not in calls
