"""View simplification: identities removed, chains of views collapsed into one."""

import pytest
from graph_builder import GraphBuilder, assert_graph_equal, assert_same_results

from minicomp.ir.expr import const
from minicomp.ops.shape import ravel, unravel
from minicomp.passes.graph.dce import eliminate_dead_code
from minicomp.passes.graph.simplify_views import simplify_views
from minicomp.passes.pipeline import run_passes


def _reshape(b, name, x, shape):
    """The view lowering's index map: element i of the result is x[unravel(ravel(i))]."""
    return b.compute(name, shape, lambda *i: x[tuple(unravel(ravel(i, shape), x.shape))])


def _permute(b, name, x, dims):
    inv = [dims.index(k) for k in range(len(dims))]
    shape = tuple(x.shape[d] for d in dims)
    return b.compute(name, shape, lambda *i: x[tuple(i[inv[k]] for k in range(len(dims)))])


def test_identity_is_removed_unless_returned():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y = b.compute("y", (4, 8), lambda i, j: x[i, j])
    z = b.compute("z", (4, 8), lambda i, j: y[i, j] * 2)
    r = b.compute("r", (4, 8), lambda i, j: z[i, j])
    b.output(r)
    g = b.build()

    e = GraphBuilder()
    x = e.input("x", (4, 8))
    z = e.compute("z", (4, 8), lambda i, j: x[i, j] * 2)
    r = e.compute("r", (4, 8), lambda i, j: z[i, j])
    e.output(r)
    assert_graph_equal(simplify_views(g), e.build())


@pytest.mark.parametrize("mid", [(32,), (2, 16), (8, 2, 2)])
def test_reshape_and_back_collapses_to_nothing(mid):
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    v = _reshape(b, "v", x, mid)
    w = _reshape(b, "w", v, (4, 8))
    y = b.compute("y", (4, 8), lambda i, j: w[i, j] + 1)
    b.output(y)
    g = b.build()

    e = GraphBuilder()
    x = e.input("x", (4, 8))
    y = e.compute("y", (4, 8), lambda i, j: x[i, j] + 1)
    e.output(y)
    after = run_passes(g, [simplify_views, eliminate_dead_code])
    assert_graph_equal(after, e.build())
    assert_same_results(g, after)


def test_permute_of_permute_composes():
    b = GraphBuilder()
    x = b.input("x", (2, 3, 4))
    p = _permute(b, "p", x, [2, 0, 1])
    q = _permute(b, "q", p, [0, 2, 1])
    b.output(q)
    g = b.build()

    # q reads x directly; p, now unread, is left for dead-code elimination.
    e = GraphBuilder()
    x = e.input("x", (2, 3, 4))
    _permute(e, "p", x, [2, 0, 1])
    e.output(e.compute("q", (4, 3, 2), lambda i, j, k: x[k, j, i]))
    after = simplify_views(g)
    assert_graph_equal(after, e.build())
    assert_same_results(g, after)


def test_mixed_view_chain_keeps_values():
    b = GraphBuilder()
    x = b.input("x", (6, 4))
    t = _permute(b, "t", x, [1, 0])
    r = _reshape(b, "r", t, (2, 12))
    s = b.compute("s", (2, 5), lambda i, j: r[i, j * 2 + 1])
    ex = b.compute("ex", (3, 2, 5), lambda i, j, k: s[j, k])
    y = b.compute("y", (3, 2, 5), lambda i, j, k: ex[i, j, k] * const(2.0))
    b.output(y, t)
    g = b.build()

    # ex reads x through the whole chain: s[j, k] is r[j, 2k + 1], the element 12j + 2k + 1
    # of t in row-major order, which is x[(2k + 1) % 6, 2j + (2k + 1) // 6]. t stays: the
    # graph returns it.
    e = GraphBuilder()
    x = e.input("x", (6, 4))
    t = _permute(e, "t", x, [1, 0])
    ex = e.compute("ex", (3, 2, 5), lambda i, j, k: x[(k * 2 + 1) % 6, (k * 2 + 1) // 6 + j * 2])
    e.output(e.compute("y", (3, 2, 5), lambda i, j, k: ex[i, j, k] * const(2.0)), t)
    after = run_passes(g, [simplify_views, eliminate_dead_code])
    assert_graph_equal(after, e.build())
    assert_same_results(g, after)


def test_symbolic_reshape_and_back():
    b = GraphBuilder()
    s = b.symbol("s")
    x = b.input("x", (s, 8))
    v = _reshape(b, "v", x, (s * 8,))
    w = _reshape(b, "w", v, (s, 8))
    b.output(b.compute("y", (s, 8), lambda i, j: w[i, j] * 2))
    g = b.build()

    e = GraphBuilder()
    s = e.symbol("s")
    x = e.input("x", (s, 8))
    e.output(e.compute("y", (s, 8), lambda i, j: x[i, j] * 2))
    after = run_passes(g, [simplify_views, eliminate_dead_code])
    assert_graph_equal(after, e.build())
    assert_same_results(g, after, s=3)


def test_nothing_to_do_returns_same_graph():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    t = _permute(b, "t", x, [1, 0])
    y = b.compute("y", (8, 4), lambda i, j: t[i, j] + 1)
    b.output(y)
    g = b.build()
    assert simplify_views(g) is g
