"""Batch norm folding: a convolution followed by a per-channel affine op with constant
coefficients becomes one convolution over folded weights; anything else is left alone."""

import pytest
import torch
from helpers_graph import PassGraphBuilder, assert_graph_equal, run_graph

from minicomp.ir import types as T
from minicomp.ir.expr import call, cast, maximum
from minicomp.ir.graph import ArgRef, ExternOp, Graph
from minicomp.passes.graph.fold_batch_norm import FOLDED, fold_batch_norms

aten = torch.ops.aten
EPS = 1e-5
SHAPE = (2, 4, 6, 6)  # the convolution's output: 4 channels
CONV = "convolution"


def statistics(channels: int = 4) -> dict[str, torch.Tensor]:
    """A trained batch norm's constants: mean, var, weight, bias."""
    g = torch.Generator().manual_seed(1)
    return {
        "mean": torch.randn(channels, generator=g),
        "var": torch.rand(channels, generator=g) + 0.5,
        "gamma": torch.randn(channels, generator=g),
        "beta": torch.randn(channels, generator=g),
    }


def conv_args(with_bias: bool) -> tuple:
    bias = ArgRef(2) if with_bias else None
    return (ArgRef(0), ArgRef(1), bias, (1, 1), (1, 1), (1, 1), False, (0, 0), 1)


def conv_bn(
    with_bias: bool = False,
    frozen: bool = True,
    relu_reads_conv: bool = False,
    dtype: T.DataType = T.f32,
) -> Graph:
    """x -> convolution -> batch norm (as ops/norm.py lowers it) -> relu."""
    torch.manual_seed(0)
    b = PassGraphBuilder()
    x = b.input("x", (2, 3, 6, 6), dtype)
    w = b.constant("w", torch.randn(4, 3, 3, 3).to(T.to_torch(dtype)))
    ins = [x, w]
    if with_bias:
        ins.append(b.constant("bias", torch.randn(4).to(T.to_torch(dtype))))
    y = b.extern(CONV, aten.convolution.default, ins, SHAPE, dtype, args=conv_args(with_bias))
    stats = {
        k: (b.constant(k, t.to(T.to_torch(dtype))) if frozen else b.input(k, (4,), dtype))
        for k, t in statistics().items()
    }
    m, v, g, beta = (stats[k] for k in ("mean", "var", "gamma", "beta"))

    def normalized(*i):
        c = i[1]
        acc = T.f32
        z = (cast(y[i], acc) - cast(m[c], acc)) * call("rsqrt", cast(v[c], acc) + EPS)
        return cast(z * cast(g[c], acc) + cast(beta[c], acc), dtype)

    bn = b.compute("bn", SHAPE, normalized)
    relu = b.compute("relu", SHAPE, lambda *i: maximum(bn[i], 0.0))
    outs = [relu]
    if relu_reads_conv:
        outs.append(b.compute("other", SHAPE, lambda *i: maximum(y[i], 0.0)))
    b.output(*outs)
    return b.build()


def eager(graph: Graph, x: torch.Tensor) -> torch.Tensor:
    """What PyTorch computes for `conv_bn`'s graph."""
    c = graph.constants
    y = torch.nn.functional.conv2d(x, c["w"], c.get("bias"), padding=1)
    y = torch.nn.functional.batch_norm(
        y, c["mean"], c["var"], c["gamma"], c["beta"], training=False, eps=EPS
    )
    return torch.relu(y)


@pytest.mark.parametrize("with_bias", [False, True])
def test_convolution_and_batch_norm_become_one_convolution(with_bias):
    g = conv_bn(with_bias)
    folded = fold_batch_norms(g)

    # The convolution reads folded constants and defines the batch norm's value; the relu
    # reads it as it read the batch norm.
    stats = statistics()
    scale = stats["gamma"].double() / (stats["var"].double() + EPS).sqrt()
    shift = stats["beta"].double() - stats["mean"].double() * scale
    weight = (g.constants["w"].double() * scale[:, None, None, None]).float()
    bias = g.constants["bias"].double() * scale + shift if with_bias else shift
    e = PassGraphBuilder()
    x = e.input("x", (2, 3, 6, 6))
    e.constant("w", g.constants["w"])
    if with_bias:
        e.constant("bias", g.constants["bias"])
    for k, t in stats.items():
        e.constant(k, t)
    fw = e.constant("bn_folded_weight", weight, strides=(27, 9, 3, 1))
    fb = e.constant("bn_folded_bias", bias.float(), strides=(1,))
    bn = e.extern(
        "bn", aten.convolution.default, [x, fw, fb], SHAPE, args=conv_args(True), reason=FOLDED
    )
    e.nodes[-1] = e.nodes[-1].replace(name=CONV)
    e.output(e.compute("relu", SHAPE, lambda *i: maximum(bn[i], 0.0)))
    expected = e.build()
    # Within a float32 rounding of the weights: the coefficients are computed as the batch
    # norm kernel computes them, the products in float64.
    assert_graph_equal(
        folded.replace(constants={k: folded.constants[k] for k in g.constants}),
        expected.replace(constants=g.constants),
    )
    for name in ("bn_folded_weight", "bn_folded_bias"):
        got, want = folded.constants[name], expected.constants[name]
        assert (got.dtype, got.stride()) == (want.dtype, want.stride())
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)

    x = torch.randn(2, 3, 6, 6)
    (before,), (after,) = run_graph(g, {"x": x}), run_graph(folded, {"x": x})
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after, eager(g, x), rtol=1e-5, atol=1e-5)


def test_bf16_folds_into_bf16_weights():
    g = conv_bn(with_bias=True, dtype=T.bf16)
    folded = fold_batch_norms(g)
    (conv,) = [n for n in folded.nodes if isinstance(n, ExternOp)]
    assert [v.dtype for v in conv.inputs] == [T.bf16] * 3
    x = torch.randn(2, 3, 6, 6).bfloat16()
    (before,), (after,) = run_graph(g, {"x": x}), run_graph(folded, {"x": x})
    # One bf16 rounding of the folded weights against one of the batch norm's output.
    torch.testing.assert_close(after.float(), before.float(), rtol=5e-2, atol=5e-2)


def test_graph_input_statistics_are_left_alone():
    # Without freezing the batch norm's statistics are graph inputs: nothing to fold.
    g = conv_bn(frozen=False)
    assert fold_batch_norms(g) is g


def test_convolution_read_by_others_is_left_alone():
    # The convolution's own result is needed too: folding would compute it twice.
    g = conv_bn(relu_reads_conv=True)
    assert fold_batch_norms(g) is g


def test_non_affine_reader_is_left_alone():
    torch.manual_seed(0)
    b = PassGraphBuilder()
    x = b.input("x", (2, 3, 6, 6))
    w = b.constant("w", torch.randn(4, 3, 3, 3))
    s = b.constant("s", torch.randn(4))
    y = b.extern(CONV, aten.convolution.default, [x, w], SHAPE, args=conv_args(False))
    # y * y * s[c] and relu(y) + s[c] are no per-channel affine functions of y.
    b.output(b.compute("sq", SHAPE, lambda *i: y[i] * y[i] * s[i[1]]))
    g = b.build()
    assert fold_batch_norms(g) is g
    b.nodes.pop()
    b.outputs.clear()
    b.output(b.compute("r", SHAPE, lambda *i: maximum(y[i], 0.0) + s[i[1]]))
    g = b.build()
    assert fold_batch_norms(g) is g


def test_coefficient_varying_along_another_axis_is_left_alone():
    torch.manual_seed(0)
    b = PassGraphBuilder()
    x = b.input("x", (2, 3, 6, 6))
    w = b.constant("w", torch.randn(4, 3, 3, 3))
    s = b.constant("s", torch.randn(6))
    y = b.extern(CONV, aten.convolution.default, [x, w], SHAPE, args=conv_args(False))
    b.output(b.compute("scaled", SHAPE, lambda *i: y[i] * s[i[3]]))
    g = b.build()
    assert fold_batch_norms(g) is g
