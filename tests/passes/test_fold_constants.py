"""Constant folding and constant operand layouts: before/expected graph pairs, and numeric
checks of folded graphs."""

import torch
from graph_builder import GraphBuilder, assert_same_results
from helpers_graph import assert_graph_equal

from minicomp.ir import types as T
from minicomp.ir.compute import reduce
from minicomp.ir.expr import cast, const
from minicomp.passes.graph.fold_constants import (
    MAX_FOLDED_ELEMENTS,
    constant_operand_layouts,
    fold_constants,
)

aten = torch.ops.aten


def _chain(b: GraphBuilder, c_value: torch.Tensor):
    x = b.input("x", (4, 8))
    c = b.constant("c", c_value)
    return x, c


def test_folds_chains_of_constant_computes():
    c_value = torch.randn(4, 8)
    b = GraphBuilder()
    x, c = _chain(b, c_value)
    r = b.compute("r", (4,), lambda i: reduce("sum", (8,), lambda k: c[i, k]))
    d = b.compute("d", (4, 8), lambda i, j: c[i, j] * 2 - r[i])
    y = b.compute("y", (4, 8), lambda i, j: x[i, j] + d[i, j])
    b.output(y)
    g = b.build()
    folded = fold_constants(g)

    # The expected constants come from the evaluator; check them against torch separately.
    expected_d = folded.constants["d"]
    torch.testing.assert_close(expected_d, c_value * 2 - c_value.sum(1, keepdim=True))
    e = GraphBuilder()
    x, c = _chain(e, c_value)
    e.constant("r", folded.constants["r"])
    d = e.constant("d", expected_d)
    y = e.compute("y", (4, 8), lambda i, j: x[i, j] + d[i, j])
    e.output(y)
    assert_graph_equal(folded, e.build())
    assert_same_results(g, folded)


def test_folds_input_free_computes_in_their_dtype():
    b = GraphBuilder()
    x = b.input("x", (5,), T.bf16)
    a = b.compute("a", (5,), lambda i: cast(cast(i, T.f32) * 0.1, T.bf16))
    n = b.compute("n", (3,), lambda i: cast(i * 7 // 2, T.i32))
    y = b.compute("y", (5,), lambda i: x[i] * a[i])
    b.output(y, n)
    g = b.build()
    folded = fold_constants(g)

    a_ref = (torch.arange(5, dtype=torch.float32) * 0.1).to(torch.bfloat16)
    assert folded.constants["a"].dtype == torch.bfloat16
    assert torch.equal(folded.constants["a"], a_ref)
    assert torch.equal(folded.constants["n"], torch.tensor([0, 3, 7], dtype=torch.int32))
    e = GraphBuilder()
    x = e.input("x", (5,), T.bf16)
    a = e.constant("a", a_ref)
    n = e.constant("n", torch.tensor([0, 3, 7], dtype=torch.int32))
    y = e.compute("y", (5,), lambda i: x[i] * a[i])
    e.output(y, n)
    assert_graph_equal(folded, e.build())
    assert_same_results(g, folded)


def test_leaves_big_symbolic_and_undefined_results():
    b = GraphBuilder()
    s = b.symbol("s")
    x = b.input("x", (s,))
    big = b.compute("big", (MAX_FOLDED_ELEMENTS + 1,), lambda i: const(1.0))
    sym = b.compute("sym", (s,), lambda i: cast(i, T.f32))
    sized = b.compute("sized", (2,), lambda i: cast(i * s, T.f32))
    zero = b.constant("zero", torch.zeros(3, dtype=torch.int64))
    bad = b.compute("bad", (3,), lambda i: 5 // zero[i])
    y = b.compute("y", (s,), lambda i: x[i] + sym[i])
    b.output(y, big, sized, bad)
    g = b.build()
    assert fold_constants(g) is g


def test_output_value_folds_to_constant():
    b = GraphBuilder()
    c = b.constant("c", torch.tensor([1.0, -2.0, 3.0]))
    y = b.compute("y", (3,), lambda i: c[i] * c[i])
    b.output(y)

    # The graph returns the constant; c stays until dead-code elimination.
    e = GraphBuilder()
    e.constant("c", torch.tensor([1.0, -2.0, 3.0]))
    e.output(e.constant("y", torch.tensor([1.0, 4.0, 9.0])))
    assert_graph_equal(fold_constants(b.build()), e.build())


def test_a_view_of_a_constant_folds_to_a_view_of_its_memory():
    w = torch.randn(4, 8)
    b = GraphBuilder()
    x = b.input("x", (2, 8))
    c = b.constant("w", w)
    wt = b.compute("wt", (8, 4), lambda i, j: c[j, i])
    b.output(b.extern("y", aten.mm.default, [x, wt], (2, 4)))
    folded = fold_constants(b.build())

    e = GraphBuilder()
    x = e.input("x", (2, 8))
    e.constant("w", w)
    wt = e.constant("wt", w.t())  # strides (1, 8)
    e.output(e.extern("y", aten.mm.default, [x, wt], (2, 4)))
    assert_graph_equal(folded, e.build())
    assert folded.constants["wt"].data_ptr() == w.data_ptr()  # no copy


def test_aten_calls_reading_only_constants_are_called_once():
    c = torch.randn(3, 3)
    b = GraphBuilder()
    x = b.input("x", (3, 3))
    cv = b.constant("c", c)
    m = b.extern("m", aten.mm.default, [cv, cv], (3, 3))
    r = b.extern("r", aten.rand_like.default, [cv], (3, 3))  # random: drawn on every call
    mx = b.extern("mx", aten.mm.default, [x, cv], (3, 3))  # reads an input
    b.output(b.compute("y", (3, 3), lambda i, j: m[i, j] + r[i, j] + mx[i, j]))

    e = GraphBuilder()
    x = e.input("x", (3, 3))
    cv = e.constant("c", c)
    m = e.constant("m", c @ c)
    r = e.extern("r", aten.rand_like.default, [cv], (3, 3))
    mx = e.extern("mx", aten.mm.default, [x, cv], (3, 3))
    e.output(e.compute("y", (3, 3), lambda i, j: m[i, j] + r[i, j] + mx[i, j]))
    assert_graph_equal(fold_constants(b.build()), e.build())


# --- constant_operand_layouts ----------------------------------------------------------------


def _product_of_constant(w: torch.Tensor) -> GraphBuilder:
    """y[i, o] = sum over (c, r) of x[i, c, r] * w[o, c, r]: w's K axes are (c, r)."""
    b = GraphBuilder()
    x = b.input("x", (2, 3, 5))
    cw = b.constant("w", w)
    b.output(
        b.compute(
            "y", (2, 4), lambda i, o: reduce("sum", (3, 5), lambda c, r: x[i, c, r] * cw[o, c, r])
        )
    )
    return b


def test_a_constant_operand_neither_k_nor_mn_major_is_copied_k_major():
    # w laid out (o, r, c), as a channels-last weight: K = (c, r) is no single strided run.
    w = torch.randn(4, 5, 3).permute(0, 2, 1)
    g = _product_of_constant(w).build()

    after = constant_operand_layouts(g)
    assert_graph_equal(after, _product_of_constant(w.contiguous()).build())


def _int8_product_of_constant(w: torch.Tensor) -> GraphBuilder:
    """y[i, n] = sum over k of i32(x[i, k]) * i32(w[k, n]) (an _int_mm by an int8 weight)."""
    b = GraphBuilder()
    x = b.input("x", (2, 6), T.i8)
    cw = b.constant("w", w)
    b.output(
        b.compute(
            "y",
            (2, 4),
            lambda i, n: reduce(
                "sum", (6,), lambda k: cast(x[i, k], T.i32) * cast(cw[k, n], T.i32)
            ),
        )
    )
    return b


def test_an_int8_mn_major_constant_operand_is_copied_k_major():
    """ldmatrix cannot transpose bytes: an 8-bit weight stored [K, N] row-major is copied
    K-major (an [N, K] transposed), a K-major one kept."""
    w = torch.randint(-128, 128, (6, 4), dtype=torch.int8)
    g = _int8_product_of_constant(w).build()
    after = constant_operand_layouts(g)
    copied = after.constants["w"]
    assert copied.stride() == (1, 6) and torch.equal(copied, w)
    k_major = _int8_product_of_constant(w.t().contiguous().t()).build()
    assert constant_operand_layouts(k_major) is k_major


def test_constant_operands_read_plainly_keep_their_layout():
    k_major = _product_of_constant(torch.randn(4, 3, 5)).build()
    assert constant_operand_layouts(k_major) is k_major
    # MN-major (o innermost) is plain too: the templates read both orientations.
    mn_major = _product_of_constant(torch.randn(3, 5, 4).permute(2, 0, 1)).build()
    assert constant_operand_layouts(mn_major) is mn_major
