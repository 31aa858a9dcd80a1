"""oneDNN convolutions on the cpu target: channels-last values, prepacked constant weights, a
relu fused, eager's layout wherever anything else reads a value; and compiled models that
match eager (values, dtypes, strides) frozen and not."""

import pytest
import torch
from helpers import assert_same, clone_inputs
from helpers_graph import PassGraphBuilder, assert_graph_equal, run_graph

from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.expr import maximum
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, FusedOp, Graph
from minicomp.passes.graph.onednn_calls import PackedConvolution
from minicomp.passes.graph.onednn_convolution import channels_last_strides, onednn_convolutions

aten = torch.ops.aten
ONEDNN = torch.ops.mkldnn._convolution_pointwise.default
ONEDNN_BINARY = torch.ops.mkldnn._convolution_pointwise.binary
ONEDNN_BINARY_IN_PLACE = torch.ops.mkldnn._convolution_pointwise_.binary
X = (2, 3, 8, 8)
Y = (2, 4, 8, 8)
CL_X, CL_Y = channels_last_strides(X), channels_last_strides(Y)
REASON = "oneDNN convolution, channels-last"
pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN"
)


def conv_args(bias: bool) -> tuple:
    return (ArgRef(0), ArgRef(1), ArgRef(2) if bias else None, (1, 1), (1, 1), (1, 1))


def aten_conv(b, name, x, w, bias=None):
    ins = [x, w] if bias is None else [x, w, bias]
    args = (*conv_args(bias is not None), False, (0, 0), 1)
    return b.extern(name, aten.convolution.default, ins, Y, args=args)


def test_kernel_values_become_channels_last_around_the_call():
    # a = 2x (a kernel) -> conv with a weight input (not frozen) -> y + 1 (a kernel).
    def build(b, rewritten: bool):
        x = b.input("x", X)
        w = b.input("w", (4, 3, 3, 3))
        bias = b.input("bias", (4,))
        a = b.compute("a", X, lambda *i: x[i] * 2.0, strides=CL_X if rewritten else None)
        if rewritten:
            # padding, stride, dilation, groups, post-op, its scalars, its algorithm
            args = (*conv_args(True), 1, "none", (), "")
            y = b.extern("y", ONEDNN, [a, w, bias], Y, args=args, strides=CL_Y, reason=REASON)
        else:
            y = aten_conv(b, "y", a, w, bias)
        b.output(b.compute("out", Y, lambda *i: y[i] + 1.0))
        return b.build()

    g = build(PassGraphBuilder(), False)
    rewritten = onednn_convolutions(g)
    assert_graph_equal(rewritten, build(PassGraphBuilder(), True))
    inputs = {"x": torch.randn(X), "w": torch.randn(4, 3, 3, 3), "bias": torch.randn(4)}
    torch.testing.assert_close(run_graph(rewritten, inputs), run_graph(g, inputs))


def test_constant_weight_is_prepacked_and_relu_fused():
    # x (a graph input) -> conv with a constant weight -> relu -> r + 1.
    torch.manual_seed(0)
    weight = torch.randn(4, 3, 3, 3)
    b = PassGraphBuilder()
    x = b.input("x", X)
    w = b.constant("w", weight)
    y = aten_conv(b, "y", x, w)
    r = b.compute("r", Y, lambda *i: maximum(y[i], 0.0))
    b.output(b.compute("out", Y, lambda *i: r[i] + 1.0))
    g = b.build()
    rewritten = onednn_convolutions(g)

    copy, conv, out = rewritten.nodes
    # The graph input is copied channels-last; the call writes the relu's value directly.
    assert isinstance(copy, ComputeOp) and copy.outputs[0].type.strides == CL_X
    assert isinstance(conv.target, PackedConvolution) and conv.target.relu
    assert not conv.target.binary
    assert conv.inputs == copy.outputs and conv.args == (ArgRef(0), None)
    assert conv.outputs[0].name == "r" and conv.outputs[0].type.strides == CL_Y
    assert out.inputs == conv.outputs
    x_value = torch.randn(X)
    torch.testing.assert_close(run_graph(rewritten, {"x": x_value}), run_graph(g, {"x": x_value}))


@pytest.mark.parametrize("frozen", [False, True])
def test_residual_addition_and_relu_fuse_after_the_addend(frozen):
    # y = conv(x); d = conv(x) (the addend, after y); relu(y + d): one call with both post-ops.
    torch.manual_seed(0)
    weights = [torch.randn(4, 3, 3, 3) for _ in range(2)]
    b = PassGraphBuilder()
    x = b.input("x", X)
    w0, w1 = (
        b.constant(f"w{k}", t) if frozen else b.input(f"w{k}", t.shape)
        for k, t in enumerate(weights)
    )
    y = aten_conv(b, "y", x, w0)
    d = aten_conv(b, "d", x, w1)
    s = b.compute("s", Y, lambda *i: d[i] + y[i])
    r = b.compute("r", Y, lambda *i: maximum(s[i], 0.0))
    b.output(b.compute("out", Y, lambda *i: r[i] * 2.0))
    g = b.build()
    rewritten = onednn_convolutions(g)

    copy, conv_d, conv_y, out = rewritten.nodes
    assert conv_d.outputs[0].name == "d" and conv_y.outputs[0].name == "r"
    assert conv_y.inputs[:2] == (copy.outputs[0], conv_d.outputs[0])
    if frozen:
        assert (conv_y.target.binary, conv_y.target.relu) == (True, True)
    else:
        assert conv_y.target is ONEDNN_BINARY
        assert conv_y.args[8:11] == ("add", None, "relu")
    inputs = {"x": torch.randn(X)} | ({} if frozen else {"w0": weights[0], "w1": weights[1]})
    torch.testing.assert_close(run_graph(rewritten, inputs), run_graph(g, inputs))


def test_result_read_by_an_aten_call_is_copied_back():
    b = PassGraphBuilder()
    x = b.input("x", X)
    w = b.input("w", (4, 3, 3, 3))
    y = aten_conv(b, "y", x, w)
    b.output(b.extern("s", aten.sum.default, [y], ()))
    g = b.build()
    rewritten = onednn_convolutions(g)
    _, conv, back, call = rewritten.nodes
    # The call writes a channels-last value; a copy gives `y` the layout the sum was given.
    assert conv.target is ONEDNN and conv.outputs[0].type.strides == CL_Y
    assert back.outputs[0] == g.nodes[0].outputs[0] and back.inputs == conv.outputs
    assert call == g.nodes[1]


def test_training_forward_convolutions_are_left_alone():
    # The input (saved for the backward) is returned: the convolution stays ATen's.
    b = PassGraphBuilder()
    x = b.input("x", X)
    w = b.input("w", (4, 3, 3, 3))
    a = b.compute("a", X, lambda *i: x[i] * 2.0)
    y = aten_conv(b, "y", a, w)
    b.output(y, a)
    g = b.build()
    assert onednn_convolutions(g) is g


def test_other_convolutions_are_left_alone():
    b = PassGraphBuilder()
    x = b.input("x", (2, 3, 8), T.f64)
    w = b.input("w", (4, 3, 3), T.f64)
    args = (ArgRef(0), ArgRef(1), None, (1,), (1,), (1,), False, (0,), 1)
    b.output(b.extern("y", aten.convolution.default, [x, w], (2, 4, 8), T.f64, args=args))
    g = b.build()
    assert onednn_convolutions(g) is g  # 1-D (and float64)


class Block(torch.nn.Module):
    """conv -> BN -> relu -> grouped strided conv -> BN, a residual add, relu."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, stride=2, padding=2, dilation=2, groups=4)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.down = torch.nn.Conv2d(8, 16, 1, stride=2)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


def block(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = Block().eval()
    for bn in (model.bn1, model.bn2):
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.normal_()
        bn.bias.data.normal_()
    return model.to(dtype)


def onednn_calls(graph: Graph) -> list:
    return [
        n.target
        for n in graph.nodes
        if isinstance(n, ExternOp)
        and (
            n.target in (ONEDNN, ONEDNN_BINARY, ONEDNN_BINARY_IN_PLACE)
            or isinstance(n.target, PackedConvolution)
        )
    ]


@pytest.mark.parametrize("freeze", [False, True], ids=["inputs", "frozen"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_compiled_block_matches_eager(freeze, channels_last):
    model = block()
    x = torch.randn(2, 8, 10, 10)
    if channels_last:
        model, x = (
            model.to(memory_format=torch.channels_last),
            x.to(memory_format=torch.channels_last),
        )
    records: list = []
    torch._dynamo.reset()
    options = {"target": "cpu", "fallback": "error", "freeze": freeze}
    with torch.no_grad(), recording(records):
        compiled = torch.compile(model, backend="minicomp", options=options)
        first = compiled(clone_inputs([x])[0])
        assert_same(first, model(x), rtol=1e-4, atol=1e-4)
        fresh = torch.randn_like(x)
        assert_same(compiled(fresh), model(fresh), rtol=1e-4, atol=1e-4)
        # The result (written into its addend, returned as it is channels-last) is memory of
        # its own, not the workspace the second call reused.
        assert_same(first, model(x), rtol=1e-4, atol=1e-4)
    (record,) = records
    calls = onednn_calls(record.graph)
    assert len(calls) == 3
    # Unfrozen, the batch norms stay kernels: the shortcut's call adds conv2's normalised
    # result and applies the relu. Frozen: every weight prepacked, the batch norms folded,
    # conv1's relu and conv2's residual addition and relu in their calls. Either way the
    # addition writes into its addend, which nothing reads after (reinplace.py).
    assert (ONEDNN_BINARY_IN_PLACE in calls) == (not freeze)
    packed = [c for c in calls if isinstance(c, PackedConvolution)]
    assert len(packed) == (3 if freeze else 0)
    posts = sorted((c.binary, c.relu, c.writes_first_input) for c in packed)
    expected = [(False, False, False), (False, True, False), (True, True, True)]
    assert posts == (expected if freeze else [])
    # What kernels are left copy the image in and the result out of channels-last (a
    # channels-last model needs neither), and compute the batch norms when not frozen.
    kernels = [m for n in record.graph.nodes if isinstance(n, FusedOp) for m in n.members]
    if freeze:
        assert kernels == ([] if channels_last else ["to_layout", "to_layout"])


def test_compiled_bf16_block_matches_eager():
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN has no bf16 convolution on this CPU")
    model = block(torch.bfloat16)
    x = torch.randn(2, 8, 10, 10, dtype=torch.bfloat16)
    torch._dynamo.reset()
    options = {"target": "cpu", "fallback": "error", "freeze": True}
    with torch.no_grad():
        compiled = torch.compile(model, backend="minicomp", options=options)
        # Folding rounds the weights to bf16 once more than eager does.
        assert_same(compiled(x), model(x), rtol=5e-2, atol=1e-1)


def test_training_step_keeps_aten_convolutions():
    model = block().train()
    x = torch.randn(2, 8, 10, 10)
    records: list = []
    torch._dynamo.reset()
    with recording(records):
        compiled = torch.compile(model, backend="minicomp", options={"target": "cpu"})
        out = compiled(x)
        out.sum().backward()
    assert all(onednn_calls(r.graph) == [] for r in records)
    expected = block().train()(x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
