"""Functional scatters, and oneDNN convolutions with a residual addition, into memory nothing
reads afterwards run in place."""

import pytest
import torch
from helpers import assert_same, compile_minicomp
from helpers_graph import PassGraphBuilder, assert_graph_equal, run_graph

from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.expr import maximum
from minicomp.ir.graph import ArgRef, ExternOp
from minicomp.passes.graph.onednn_calls import PackedConvolution
from minicomp.passes.graph.onednn_convolution import channels_last_strides, onednn_convolutions
from minicomp.passes.graph.reinplace import reinplace_convolutions, reinplace_scatters
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


X, Y = (2, 3, 8, 8), (2, 4, 8, 8)
CL_X, CL_Y = channels_last_strides(X), channels_last_strides(Y)
CONV = torch.ops.mkldnn._convolution_pointwise.default
BINARY = torch.ops.mkldnn._convolution_pointwise.binary
BINARY_IN_PLACE = torch.ops.mkldnn._convolution_pointwise_.binary
PARAMS = ((1, 1), (1, 1), (1, 1), 1)  # padding, stride, dilation, groups
onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN"
)


def residual(b, in_place: bool, addend_strides=CL_Y, read_after: bool = False):
    """relu(conv(x, w1) + d), d = conv(x, w0) (a oneDNN call's new result), as one oneDNN
    call with a binary post-op: out of place, or adding into d."""
    x = b.input("x", X, strides=CL_X)
    w0, w1 = b.input("w0", (4, 3, 3, 3)), b.input("w1", (4, 3, 3, 3))
    d_args = (ArgRef(0), ArgRef(1), None, *PARAMS, "none", (), "")
    d = b.extern("d", CONV, [x, w0], Y, args=d_args, strides=addend_strides)
    post = ("add", None, "relu", (), "")
    if in_place:
        args = (ArgRef(1), ArgRef(0), ArgRef(2), None, *PARAMS, *post)
        y = b.extern(
            "y", BINARY_IN_PLACE, [x, d, w1], Y, args=args, strides=CL_Y, op="y (in place)"
        )
    else:
        args = (ArgRef(0), ArgRef(1), ArgRef(2), None, *PARAMS, *post)
        y = b.extern("y", BINARY, [x, d, w1], Y, args=args, strides=CL_Y)
    b.output(y)
    if read_after:
        b.output(d)
    return b.build()


def conv_inputs() -> dict:
    torch.manual_seed(0)
    x = torch.randn(X).contiguous(memory_format=torch.channels_last)
    return {"x": x, "w0": torch.randn(4, 3, 3, 3), "w1": torch.randn(4, 3, 3, 3)}


@onednn
def test_a_residual_convolution_adds_into_its_dead_addend():
    g = residual(PassGraphBuilder(), in_place=False)
    got = reinplace_convolutions(g)
    assert_graph_equal(got, residual(PassGraphBuilder(), in_place=True))
    assert got.nodes[-1].mutates and got.nodes[-1].returns_views
    assert {v.name for v in escaping_values(got)} >= {"d", "y"}
    assert_same(run_graph(got, conv_inputs()), run_graph(g, conv_inputs()))


@onednn
def test_residual_convolutions_keep_an_addend_still_read_or_laid_out_otherwise():
    read = residual(PassGraphBuilder(), in_place=False, read_after=True)
    assert reinplace_convolutions(read) is read
    row_major = residual(PassGraphBuilder(), in_place=False, addend_strides=(256, 64, 8, 1))
    assert reinplace_convolutions(row_major) is row_major


@onednn
def test_a_prepacked_residual_convolution_adds_into_its_addend():
    # The frozen form: onednn_convolutions fuses relu(conv(x, w1) + conv(x, w0)) into the
    # second call, whose addend (the first call's result) nothing reads after.
    torch.manual_seed(0)
    b = PassGraphBuilder()
    x = b.input("x", X, strides=CL_X)
    w0, w1 = (b.constant(f"w{k}", torch.randn(4, 3, 3, 3)) for k in range(2))
    args = (ArgRef(0), ArgRef(1), None, (1, 1), (1, 1), (1, 1), False, (0, 0), 1)
    y = b.extern("y", torch.ops.aten.convolution.default, [x, w1], Y, args=args)
    d = b.extern("d", torch.ops.aten.convolution.default, [x, w0], Y, args=args)
    s = b.compute("s", Y, lambda *i: d[i] + y[i])
    b.output(b.compute("r", Y, lambda *i: maximum(s[i], 0.0)))
    g = onednn_convolutions(b.build())
    got = reinplace_convolutions(g)
    (call,) = [n for n in got.nodes if isinstance(n, ExternOp) and n.target.binary]
    assert isinstance(call.target, PackedConvolution) and call.target.writes_first_input
    assert call.name.endswith("(in place)") and call.mutates and call.returns_views
    assert [call.inputs[a.index].name for a in call.args[:2]] == ["d", "x"]
    x_value = {"x": conv_inputs()["x"]}
    assert_same(run_graph(got, x_value), run_graph(g, x_value))
