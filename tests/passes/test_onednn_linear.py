"""oneDNN's prepacked linear for products over constant weights on the cpu target; products
over graph inputs, or that oneDNN's linear does not compute, are left alone."""

import pytest
import torch
from helpers import assert_same
from helpers_graph import PassGraphBuilder, run_graph

from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.graph import ExternOp, Graph
from minicomp.passes.graph.onednn_calls import PackedLinear
from minicomp.passes.graph.onednn_linear import onednn_linears

aten = torch.ops.aten
pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="PyTorch built without oneDNN"
)


def products(weight: torch.Tensor, bias: torch.Tensor | None, dtype=T.f32, kwargs=()) -> Graph:
    """x [6, K] @ weight [K, N] (+ bias), the weight a constant."""
    b = PassGraphBuilder()
    k, n = weight.shape
    x = b.input("x", (6, k), dtype)
    w = b.constant("w", weight)
    if bias is None:
        y = b.extern("y", aten.mm.default, [x, w], (6, n), dtype)
    else:
        c = b.constant("bias", bias)
        y = b.extern("y", aten.addmm.default, [c, x, w], (6, n), dtype, kwargs=kwargs)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("transposed", [False, True], ids=["row-major", "linear"])
def test_products_over_constant_weights_become_prepacked_calls(with_bias, transposed):
    # A linear's weight is read transposed (strides (1, K)); GPT-2's Conv1D reads it as is.
    torch.manual_seed(0)
    weight = torch.randn(24, 16).t() if transposed else torch.randn(16, 24)
    bias = torch.randn(24) if with_bias else None
    g = products(weight, bias)
    rewritten = onednn_linears(g)
    (call,) = rewritten.nodes
    assert isinstance(call.target, PackedLinear) and call.target.shape == (24, 16)
    assert call.outputs == g.nodes[0].outputs
    assert [v.name for v in call.inputs] == (["x", "bias"] if with_bias else ["x"])
    x = torch.randn(6, 16)
    torch.testing.assert_close(run_graph(rewritten, {"x": x}), run_graph(g, {"x": x}))


def test_a_weight_two_products_share_is_packed_once():
    torch.manual_seed(0)
    b = PassGraphBuilder()
    x = b.input("x", (6, 16))
    w = b.constant("w", torch.randn(16, 8))
    y = b.extern("y", aten.mm.default, [x, w], (6, 8))
    b.output(y, b.extern("u", aten.mm.default, [x, w], (6, 8)))
    first, second = onednn_linears(b.build()).nodes
    assert first.target is second.target


def test_other_products_are_left_alone():
    torch.manual_seed(0)
    weight = torch.randn(16, 24)
    b = PassGraphBuilder()
    x = b.input("x", (6, 16))
    w = b.input("w", (16, 24))  # not frozen
    b.output(b.extern("y", aten.mm.default, [x, w], (6, 24)))
    g = b.build()
    assert onednn_linears(g) is g
    scaled = products(weight, torch.randn(24), kwargs=(("alpha", 2.0),))
    assert onednn_linears(scaled) is scaled
    wide_bias = products(weight, torch.randn(6, 24))
    assert onednn_linears(wide_bias) is wide_bias
    double = products(weight.double(), None, T.f64)
    assert onednn_linears(double) is double


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8, bias=False)
    ).eval()


@pytest.mark.parametrize("freeze", [False, True])
def test_compiled_mlp_matches_eager(freeze):
    model = mlp()
    x = torch.randn(2, 5, 16)
    records: list = []
    torch._dynamo.reset()
    options = {"target": "cpu", "fallback": "error", "freeze": freeze}
    with torch.no_grad(), recording(records):
        compiled = torch.compile(model, backend="minicomp", options=options)
        assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        fresh = torch.randn_like(x)
        assert_same(compiled(fresh), model(fresh), rtol=1e-5, atol=1e-5)
    (record,) = records
    calls = [n for n in record.graph.nodes if isinstance(n, ExternOp)]
    packed = [n for n in calls if isinstance(n.target, PackedLinear)]
    assert len(packed) == (2 if freeze else 0)
