"""Constant folding: before/expected graph pairs and a numeric check of the folded graph."""

import numpy as np
import torch
from graph_builder import GraphBuilder, assert_graph_equal, assert_same_results

from minicomp.ir import types as T
from minicomp.ir.compute import reduce
from minicomp.ir.expr import cast, const
from minicomp.passes.graph.fold_constants import MAX_FOLDED_ELEMENTS, fold_constants


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
    folded = fold_constants(b.build())
    assert folded.nodes == () and folded.outputs == (b.values["y"],)
    np.testing.assert_array_equal(folded.constants["y"].numpy(), [1.0, 4.0, 9.0])
