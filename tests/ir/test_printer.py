"""The IR printer: expressions with minimal parentheses, statements and functions as script DSL
(tests/ir/test_round_trip.py parses it back), and graphs."""

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
        for a in parallel(range(c)):
            acc: f32 = 0.0
            for b in vectorize(range(i64(8))):
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
        def scale(buf: ptr(f32), c: i64):  # kernel
            attrs.block_dim = (128, 1, 1)
            for a in range(c):
                buf[a] = buf[a] * 2.0""")
    assert repr(f) == function_str(f)


def test_statements_print_as_script_dsl():
    t, k = E.Var("t", i32), E.Var("k", i64)
    smem = E.Var("smem", PointerType(f32, "shared"))
    regs = E.Var("regs", PointerType(f32, "local"))
    flag = E.Var("flag", boolean)
    tid = E.Call("thread_idx_x", (), i32)
    body = S.seq(
        S.Declare(t, tid),
        S.Declare(flag),
        S.DeclareArray(smem, f32, 64, "dynamic"),
        S.DeclareArray(regs, f32, 4, "local"),
        S.Comment("a note"),
        S.For(k, E.const(4), S.Store(regs, k, E.const(0.0)), "unroll"),
        S.Evaluate(
            E.Call("load_vec", (regs, E.Load(buf, E.cast(t, i64) * 4), E.const(4, i32)), i32)
        ),
        S.Store(smem, E.cast(t, i64), E.Load(regs, E.const(0)) * E.const(0.5) + float("-inf")),
        S.If(t < 3, S.Seq(()), S.Assign(flag, E.const(True))),
        S.Evaluate(E.Call("syncthreads", (), i32)),
    )
    assert stmt_str(body) == dedent("""\
        t: i32 = threadIdx.x
        flag: boolean
        smem = dynamic_shared_tensor(f32, 64, at=0)
        regs = register_tensor(f32, 4)
        comment('a note')
        for k in unroll(range(i64(4))):
            regs[k] = 0.0
        load_vec(regs, buf[i64(t) * 4], 4)
        smem[i64(t)] = regs[0] * 0.5 + -math.inf
        if t < 3:
            pass
        else:
            flag = True
        syncthreads()""")


@pytest.mark.parametrize(
    "e, text",
    [
        # A literal beside an operand takes its type; alone it is i32, f32 or bool.
        (lambda: a + 3, "a + 3"),
        (lambda: E.const(3), "i64(3)"),
        (lambda: E.const(3, i32), "3"),
        (lambda: E.const(2**40), "1099511627776"),
        (lambda: E.const(1.5, f64), "f64(1.5)"),
        (lambda: E.select(p, E.const(1.0, f64), u), "1.0 if p else f64(u)"),
        (lambda: E.select(p, E.const(1.0, f64), E.const(2.0, f64)), "f64(1.0) if p else f64(2.0)"),
        # Two constants: the first is typed, so that the operation is not folded.
        (lambda: E.Binary("sub", E.const(64.0), E.const(0.0)), "f32(64.0) - 0.0"),
        (lambda: E.cast(p, i32), "i32(p)"),
        (lambda: E.cast(a, boolean), "boolean(a)"),
        (lambda: E.eq(E.unary("not", p), p), "(not p) == p"),
        (lambda: E.select(p, E.select(p, u, v), v), "(u if p else v) if p else v"),
        (lambda: E.Call("block_dim_z", (), i32), "blockDim.z"),
        (lambda: E.Call("shfl_xor_sync", (u, E.const(16, i32)), f32), "shfl_xor_sync(u, 16)"),
        (lambda: E.const(float("nan")), "math.nan"),
        (lambda: E.Binary("div", a, b), "div(a, b)"),
        (lambda: E.Binary("bitand", p, p), "bitand(p, p)"),
    ],
)
def test_script_expressions(e, text):
    # Inside functions and statements, expressions print as the script DSL spells them.
    assert stmt_str(S.Evaluate(e())) == text


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
