"""The IR printer: expressions with minimal parentheses, statements, functions and graphs."""

from textwrap import dedent

import pytest
import torch
from graph_builder import GraphBuilder

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.compute import reduce
from minicomp.ir.func import Function, LaunchAttrs
from minicomp.ir.graph import ExternOp
from minicomp.ir.printer import expr_str, function_str, graph_str, stmt_str
from minicomp.ir.types import PointerType, boolean, f32, f64, i32, i64
from minicomp.passes.graph.fusion import fuse

a, b, c, d = (E.Var(n, i64) for n in "abcd")
u, v = E.Var("u", f32), E.Var("v", f32)
p = E.Var("p", boolean)
buf = E.Var("buf", PointerType(f32))
aten = torch.ops.aten


@pytest.mark.parametrize(
    "e, text",
    [
        (lambda: (a + b) * c, "(a + b) * c"),
        (lambda: a + b * c, "a + b * c"),
        (lambda: a * b + c, "a * b + c"),
        (lambda: a - b - c, "a - b - c"),
        (lambda: a - (b - c), "a - (b - c)"),
        (lambda: a + (b + c), "a + (b + c)"),
        (lambda: a // (b * c), "a // (b * c)"),
        (lambda: a * b // c % d, "a * b // c % d"),
        (lambda: (a + b) % c, "(a + b) % c"),
        (lambda: a + b < c * d, "a + b < c * d"),
        (lambda: (a < b) & (c < d), "a < b and c < d"),
        (lambda: ((a < b) | (c < d)) & p, "(a < b or c < d) and p"),
        (lambda: (a & b) | (c & d), "a & b | c & d"),
        (lambda: a & (b | c), "a & (b | c)"),
        (lambda: -(a + b), "-(a + b)"),
        (lambda: -a * b, "-a * b"),
        (lambda: ~p, "not p"),
        (lambda: ~((a < b) & p), "not (a < b and p)"),
        (lambda: E.select(p, a, b) + 1, "(a if p else b) + 1"),
        (lambda: E.maximum(u, v * 2.0), "max(u, v * 2.0)"),
        (lambda: E.call("exp", u - v), "exp(u - v)"),
        (lambda: E.cast(a + b, f32), "f32(a + b)"),
        (lambda: E.Load(buf, a * 4 + b), "buf[a * 4 + b]"),
    ],
)
def test_expression_precedence(e, text):
    assert expr_str(e()) == text


@pytest.mark.parametrize(
    "e, text",
    [
        (E.const(3), "3"),
        (E.const(3, i32), "i32(3)"),
        (E.const(1.5), "1.5"),
        (E.const(1.5, f64), "f64(1.5)"),
        (E.const(True), "True"),
        (E.const(float("inf")), "inf"),
        (E.const(float("-inf")), "-inf"),
        (E.const(float("nan")), "nan"),
    ],
)
def test_constants(e, text):
    assert expr_str(e) == text


def test_comparison_of_comparisons_is_parenthesised():
    assert expr_str(E.eq(a < b, c < d)) == "(a < b) == (c < d)"


def test_reduce_and_tensor_elements():
    t = GraphBuilder().input("t", (4, 8))
    r = reduce("sum", (8,), lambda k: t[a, k] * 2.0)
    assert expr_str(r) == "sum[r0<8](t[a, r0] * 2.0)"


def test_statements():
    acc = E.Var("acc", f32)
    loop = S.For(
        a,
        c,
        S.seq(
            S.Declare(acc, E.const(0.0)),
            S.For(b, E.const(8), S.Assign(acc, acc + E.Load(buf, a * 8 + b)), "vectorize"),
            S.If(acc > 0.0, S.Store(buf, a, acc), S.Store(buf, a, -acc)),
        ),
        "parallel",
    )
    assert stmt_str(loop) == dedent("""\
        for a in range(c):  # parallel
            acc: f32 = 0.0
            for b in range(8):  # vectorize
                acc = acc + buf[a * 8 + b]
            if acc > 0.0:
                buf[a] = acc
            else:
                buf[a] = -acc""")


def test_function_signature_attrs_and_body():
    f = Function(
        "scale",
        (buf, c),
        S.For(a, c, S.Store(buf, a, E.Load(buf, a) * 2.0)),
        attrs=LaunchAttrs(block_dim=(128, 1, 1)),
    )
    assert function_str(f) == dedent("""\
        def scale(buf: f32*, c: i64):  # kernel
            attrs.block_dim = (128, 1, 1)
            for a in range(c):
                buf[a] = buf[a] * 2.0""")
    assert repr(f) == function_str(f)


def _graph():
    g = GraphBuilder()
    n = g.symbol("n")
    x = g.input("x", (n, 8))
    w = g.input("w", (8, 8))
    y = g.compute("y", (n, 8), lambda i, j: x[i, j] * 2.0)
    m = g.extern("m", aten.mm.default, [y, w], (n, 8))
    s = g.compute("s", (n, 1), lambda i, j: reduce("sum", (8,), lambda k: m[i, k]))
    z = g.compute("z", (n, 8), lambda i, j: m[i, j] - s[i, 0])
    g.output(z, None)
    graph = g.build()
    m_op = graph.nodes[1]
    return graph.replace(
        nodes=(graph.nodes[0], m_op.replace(reason="no lowering"), *graph.nodes[2:])
    )


def test_graph_with_compute_and_extern_ops():
    text = graph_str(_graph())
    assert text.splitlines()[0] == "graph(n: i64, %x: f32[n, 8], %w: f32[8, 8]):"
    assert "    %y: f32[n, 8] = y(%x)  { y[n, 8]: [i0, i1] -> x[i0, i1] * 2.0 }" in text
    assert "    %m: f32[n, 8] = m(%y, %w)  # extern: no lowering" in text
    assert "s[n, 1]: [i0, i1] -> sum[r0<8](m[i0, r0])" in text
    assert text.splitlines()[-1] == "    return (%z, None)"
    assert str(_graph()) == text


def test_graph_with_fused_ops():
    fused = fuse(_graph())
    text = graph_str(fused)
    assert isinstance(fused.nodes[1], ExternOp)
    assert "= k0_y(%x)  # fused: y" in text
    assert "%z: f32[n, 8] = k2_s_z(%m)  # fused: s, z" in text
    assert "        for o0<n:" in text
    assert "            acc0 = sum over r0<8: m[o0, r0]" in text
    assert "            for r0<8: %z[o0, r0] = m[o0, r0] - acc0" in text


def test_printing_is_deterministic():
    first = graph_str(fuse(_graph()))
    for _ in range(3):
        assert graph_str(fuse(_graph())) == first
    assert stmt_str(S.Store(buf, a, u)) == stmt_str(S.Store(buf, a, u))
