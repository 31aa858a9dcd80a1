"""Dead-code elimination, as before/expected graph pairs."""

import torch
from graph_builder import GraphBuilder, assert_graph_equal

from minicomp.ir.types import f32
from minicomp.passes.graph.dce import eliminate_dead_code

aten = torch.ops.aten


def test_drops_unused_chain_keeps_used():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y = b.compute("y", (4, 8), lambda i, j: x[i, j] * 2)
    d1 = b.compute("d1", (4, 8), lambda i, j: x[i, j] + 1)
    b.compute("d2", (4, 8), lambda i, j: d1[i, j] + y[i, j])
    b.output(y)
    g = b.build()

    e = GraphBuilder()
    x = e.input("x", (4, 8))
    y = e.compute("y", (4, 8), lambda i, j: x[i, j] * 2)
    e.output(y)
    assert_graph_equal(eliminate_dead_code(g), e.build())


def test_drops_unread_constants_and_dead_externs():
    b = GraphBuilder()
    x = b.input("x", (4,))
    c = b.constant("c", torch.arange(4, dtype=torch.float32))
    unused = b.constant("unused", torch.ones(4))
    b.extern("e", aten.mm.default, [unused, unused], (4,))
    y = b.compute("y", (4,), lambda i: x[i] + c[i])
    b.output(y, None)
    g = b.build()

    e = GraphBuilder()
    x = e.input("x", (4,))
    c = e.constant("c", torch.arange(4, dtype=torch.float32))
    y = e.compute("y", (4,), lambda i: x[i] + c[i])
    e.output(y, None)
    assert_graph_equal(eliminate_dead_code(g), e.build())


def test_keeps_everything_returned_and_returns_same_graph():
    b = GraphBuilder()
    s = b.symbol("s")
    x = b.input("x", (s,), f32)
    y = b.compute("y", (s,), lambda i: x[i] * 3)
    z = b.compute("z", (s,), lambda i: y[i] - x[i])
    c = b.constant("c", torch.zeros(2))
    b.output(z, x, y, s * 2, c)
    g = b.build()
    assert eliminate_dead_code(g) is g


def test_empty_when_nothing_is_returned():
    b = GraphBuilder()
    x = b.input("x", (3,))
    b.compute("y", (3,), lambda i: x[i] * 3)
    g = eliminate_dead_code(b.build())
    assert g.nodes == () and g.outputs == ()
