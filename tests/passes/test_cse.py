"""Common-subexpression elimination, as before/expected graph pairs."""

import torch
from graph_builder import GraphBuilder, assert_graph_equal

from minicomp.ir.expr import const
from minicomp.ir.graph import ArgRef
from minicomp.passes.graph.cse import eliminate_common_subexpressions

aten = torch.ops.aten


def test_merges_equal_computes_and_renames_uses_in_definitions():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y1 = b.compute("y1", (4, 8), lambda i, j: x[i, j] * 2)
    y2 = b.compute("y2", (4, 8), lambda i, j: x[i, j] * 2)
    z1 = b.compute("z1", (4, 8), lambda i, j: y1[i, j] + 1)
    z2 = b.compute("z2", (4, 8), lambda i, j: y2[i, j] + 1)
    w = b.compute("w", (4, 8), lambda i, j: z1[i, j] * z2[i, j] - y2[i, j])
    b.output(w, z2)
    g = b.build()

    e = GraphBuilder()
    x = e.input("x", (4, 8))
    y1 = e.compute("y1", (4, 8), lambda i, j: x[i, j] * 2)
    z1 = e.compute("z1", (4, 8), lambda i, j: y1[i, j] + 1)
    w = e.compute("w", (4, 8), lambda i, j: z1[i, j] * z1[i, j] - y1[i, j])
    e.output(w, z1)
    assert_graph_equal(eliminate_common_subexpressions(g), e.build())


def test_keeps_different_computes():
    b = GraphBuilder()
    x = b.input("x", (4,))
    y1 = b.compute("y1", (4,), lambda i: x[i] * 2)
    y2 = b.compute("y2", (4,), lambda i: x[i] * 3)
    y3 = b.compute("y3", (4,), lambda i: x[i] * const(0.0))
    y4 = b.compute("y4", (4,), lambda i: x[i] * const(-0.0))
    y5 = b.compute("y5", (2,), lambda i: x[i] * 2)
    b.output(y1, y2, y3, y4, y5)
    g = b.build()
    assert eliminate_common_subexpressions(g) is g


def test_merges_externs_but_not_random_ones():
    b = GraphBuilder()
    x = b.input("x", (4, 4))
    m1 = b.extern("m1", aten.mm.default, [x, x], (4, 4))
    m2 = b.extern("m2", aten.mm.default, [x, x], (4, 4))
    r1 = b.extern("r1", aten.rand_like.default, [x], (4, 4))
    r2 = b.extern("r2", aten.rand_like.default, [x], (4, 4))
    e1 = b.extern("e1", aten.exponential.default, [x], (4, 4))
    e2 = b.extern("e2", aten.exponential.default, [x], (4, 4))
    s = b.compute("s", (4, 4), lambda i, j: m1[i, j] + m2[i, j] + r1[i, j] + r2[i, j])
    b.output(s, e1, e2)
    g = b.build()

    e = GraphBuilder()
    x = e.input("x", (4, 4))
    m1 = e.extern("m1", aten.mm.default, [x, x], (4, 4))
    r1 = e.extern("r1", aten.rand_like.default, [x], (4, 4))
    r2 = e.extern("r2", aten.rand_like.default, [x], (4, 4))
    e1 = e.extern("e1", aten.exponential.default, [x], (4, 4))
    e2 = e.extern("e2", aten.exponential.default, [x], (4, 4))
    s = e.compute("s", (4, 4), lambda i, j: m1[i, j] + m1[i, j] + r1[i, j] + r2[i, j])
    e.output(s, e1, e2)
    assert_graph_equal(eliminate_common_subexpressions(g), e.build())


def test_extern_arguments_compare_with_their_types():
    b = GraphBuilder()
    x = b.input("x", (4,))
    a1 = b.extern("a1", aten.add.Tensor, [x], (4,), args=(ArgRef(0), 1))
    a2 = b.extern("a2", aten.add.Tensor, [x], (4,), args=(ArgRef(0), 1.0))
    a3 = b.extern("a3", aten.add.Tensor, [x], (4,), args=(ArgRef(0), True))
    a4 = b.extern("a4", aten.add.Tensor, [x], (4,), args=(ArgRef(0), 1))
    b.output(a1, a2, a3, a4)
    g = b.build()

    e = GraphBuilder()
    x = e.input("x", (4,))
    a1 = e.extern("a1", aten.add.Tensor, [x], (4,), args=(ArgRef(0), 1))
    a2 = e.extern("a2", aten.add.Tensor, [x], (4,), args=(ArgRef(0), 1.0))
    a3 = e.extern("a3", aten.add.Tensor, [x], (4,), args=(ArgRef(0), True))
    e.output(a1, a2, a3, a1)
    assert_graph_equal(eliminate_common_subexpressions(g), e.build())
