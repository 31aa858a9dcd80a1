"""oneDNN's linear for the cpu target's products: prepacked over constant weights, unpacked over
weights the graph takes (laid out as a linear or a Conv1D holds them, products large enough);
products oneDNN's linear does not compute, or would compute slower, are left alone. With
`cpu_gemm="mkl"` (auto's choice on Intel CPUs), MKL's linear over constant weights it packed,
the rest ATen's."""

import pytest
import torch
from helpers import assert_same
from helpers_graph import PassGraphBuilder, run_graph

from minicomp import compiler, config
from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.graph import ExternOp, Graph
from minicomp.passes.graph import onednn_linear as onednn_linear_module
from minicomp.passes.graph.onednn_calls import MklPackedLinear, PackedLinear, linear
from minicomp.passes.graph.onednn_linear import (
    MIN_UNPACKED_WORK,
    host_gemm_library,
    onednn_linears,
)
from minicomp.targets import get_target

aten = torch.ops.aten
# The compiled tests of oneDNN's calls choose the library: auto's depends on the CPU.
ONEDNN = {"target": "cpu", "cpu_gemm": "onednn"}
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
    small = unfrozen(6, 16, 24, "linear")  # not frozen, too small for oneDNN to pay
    assert onednn_linears(small) is small
    scaled = products(weight, torch.randn(24), kwargs=(("alpha", 2.0),))
    assert onednn_linears(scaled) is scaled
    wide_bias = products(weight, torch.randn(6, 24))
    assert onednn_linears(wide_bias) is wide_bias
    double = products(weight.double(), None, T.f64)
    assert onednn_linears(double) is double


# Rows x K x N at MIN_UNPACKED_WORK: the smallest products oneDNN's unpacked linear computes.
ROWS, K, N = 64, 128, 256
assert ROWS * K * N == MIN_UNPACKED_WORK

# A weight [K, N] as the products read it: nn.Linear's [N, K] transposed, GPT-2's Conv1D's as
# it is, and a slice of a wider matrix, neither (oneDNN would reorder it on every call).
LAYOUTS = {
    "linear": lambda k, n: (1, k),
    "conv1d": lambda k, n: (n, 1),
    "sliced": lambda k, n: (n + 8, 1),
}


def weight_of(k: int, n: int, layout: str) -> torch.Tensor:
    """A random [k, n] weight with the layout's strides."""
    stride = LAYOUTS[layout](k, n)
    return torch.randn(k * n + 8 * k).as_strided((k, n), stride)


def unfrozen(rows, k: int, n: int, layout: str, with_bias: bool = True, symbol=None) -> Graph:
    """x [rows, k] @ w [k, n] (+ bias), the weight and bias graph inputs, w laid out as
    `layout` says; `symbol` names a symbolic row count."""
    b = PassGraphBuilder()
    rows = b.symbol(symbol) if symbol else rows
    x = b.input("x", (rows, k))
    w = b.input("w", (k, n), strides=LAYOUTS[layout](k, n))
    if with_bias:
        c = b.input("bias", (n,))
        y = b.extern("y", aten.addmm.default, [c, x, w], (rows, n))
    else:
        y = b.extern("y", aten.mm.default, [x, w], (rows, n))
    b.output(y)
    return b.build()


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("layout", ["linear", "conv1d"])
def test_products_over_weight_inputs_become_unpacked_calls(with_bias, layout):
    torch.manual_seed(0)
    g = unfrozen(ROWS, K, N, layout, with_bias)
    rewritten = onednn_linears(g)
    (call,) = rewritten.nodes
    assert call.target is linear and call.reason == "oneDNN linear"
    assert call.outputs == g.nodes[0].outputs
    assert [v.name for v in call.inputs] == ["x", "w", "bias"][: 3 if with_bias else 2]
    inputs = {"x": torch.randn(ROWS, K), "w": weight_of(K, N, layout), "bias": torch.randn(N)}
    (got,) = run_graph(rewritten, inputs)
    (expected,) = run_graph(g, inputs)
    assert_same(got, expected, rtol=1e-5, atol=1e-4)


def test_unpacked_calls_need_a_free_transpose_and_enough_work():
    sliced = unfrozen(ROWS, K, N, "sliced")
    assert onednn_linears(sliced) is sliced
    fewer_rows = unfrozen(ROWS - 1, K, N, "linear")
    assert onednn_linears(fewer_rows) is fewer_rows
    # A symbolic row count may be one: K x N alone must pay.
    assert onednn_linears(unfrozen(None, 256, 8192, "linear", symbol="s")).nodes[0].target is linear
    dynamic = unfrozen(None, K, N, "linear", symbol="s")
    assert onednn_linears(dynamic) is dynamic


def test_a_constant_weight_with_a_symbolic_row_count_is_not_packed():
    torch.manual_seed(0)
    b = PassGraphBuilder()
    s = b.symbol("s")
    x = b.input("x", (s, 256))
    w = b.constant("w", torch.randn(8192, 256).t(), strides=(1, 256))
    b.output(b.extern("y", aten.mm.default, [x, w], (s, 8192)))
    (call,) = onednn_linears(b.build()).nodes
    assert call.target is linear and [v.name for v in call.inputs] == ["x", "w"]


def test_the_call_keeps_to_aten_for_other_weight_layouts_and_reads_strided_biases():
    # The pass passes neither; the calls must still compute the product.
    torch.manual_seed(0)
    x, bias = torch.randn(ROWS, K), torch.randn(2 * N)[::2]
    w = weight_of(K, N, "sliced")
    expected = torch.addmm(bias, x, w)
    assert_same(linear(x, w, bias), expected, rtol=1e-5, atol=1e-4)
    assert_same(linear(x, w.contiguous(), bias), expected, rtol=1e-5, atol=1e-4)
    rows = x.shape[0]
    packed = PackedLinear(torch.ops.mkldnn._reorder_linear_weight(w.t().contiguous(), rows))
    assert_same(packed(x, bias), expected, rtol=1e-5, atol=1e-4)


class Conv1D(torch.nn.Module):
    """GPT-2's Conv1D: a linear whose weight is stored [K, N] and read as it is."""

    def __init__(self, k: int, n: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(k, n) / k**0.5)
        self.bias = torch.nn.Parameter(torch.randn(n))

    def forward(self, x):
        rows = x.reshape(-1, x.shape[-1])
        return torch.addmm(self.bias, rows, self.weight).view(*x.shape[:-1], -1)


def large_mlp() -> torch.nn.Module:
    """Linear, GELU, Linear and a Conv1D, each product (at 64 rows) large enough for oneDNN."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(K, N),
        torch.nn.GELU(),
        torch.nn.Linear(N, K, bias=False),
        Conv1D(K, N),
    )


def compile_and_check(model, x, options, records) -> None:
    """Compile `model` with minicomp, and compare it with eager on `x` and on fresh inputs."""
    with recording(records):
        compiled = torch.compile(model, backend="minicomp", options=options)
        for inputs in (x, torch.randn_like(x), torch.randn_like(x)):
            assert_same(compiled(inputs), model(inputs), rtol=1e-5, atol=1e-4)


def linear_calls(record) -> list:
    return [n for n in record.graph.nodes if isinstance(n, ExternOp) and n.target is linear]


def test_compiled_large_mlp_runs_unpacked_onednn_calls():
    model = large_mlp().eval()
    records: list = []
    torch._dynamo.reset()
    with torch.no_grad():
        compile_and_check(model, torch.randn(4, 16, K), ONEDNN, records)
    (record,) = records
    assert len(linear_calls(record)) == 3


def test_dynamic_rows():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 8192), torch.nn.ReLU()).eval()
    records: list = []
    torch._dynamo.reset()
    options = {**ONEDNN, "fallback": "error"}
    with torch.no_grad(), recording(records):
        compiled = torch.compile(model, backend="minicomp", options=options, dynamic=True)
        for rows in (3, 5):
            x = torch.randn(rows, 256)
            assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-4)
    (record,) = records
    assert len(linear_calls(record)) == 1


def test_a_training_step_matches_eager():
    # The forward's products and the backward's (the input's gradient over the weight as it
    # is, the weight's with the activation read transposed) all pay oneDNN's call.
    model = large_mlp()
    x = torch.randn(4, 16, K)
    records: list = []
    torch._dynamo.reset()
    with recording(records):
        compiled = torch.compile(model, backend="minicomp", options=ONEDNN)
        loss = compiled(x).square().mean()
        loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    expected = model(x).square().mean()
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for got, p in zip(grads, model.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-5)
    forward, backward = records
    assert len(linear_calls(forward)) == 3 and len(linear_calls(backward)) >= 3


def test_a_graph_with_unpacked_calls_is_linked_from_the_graph_cache(tmp_path, monkeypatch):
    model = large_mlp().eval()
    x = torch.randn(4, 16, K)
    options = {**ONEDNN, "cache_dir": str(tmp_path), "graph_cache": True}
    for expected in ("stored", "hit"):
        torch._dynamo.reset()
        records: list = []
        with torch.no_grad():
            compile_and_check(model, x, options, records)
        (record,) = records
        assert record.cache.split()[0] == expected
        assert len(linear_calls(record)) == 3

        def fail(*args, **kwargs):
            raise AssertionError("the graph was lowered again")

        monkeypatch.setattr(compiler, "lower", fail)


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
    options = {**ONEDNN, "fallback": "error", "freeze": freeze}
    with torch.no_grad(), recording(records):
        compiled = torch.compile(model, backend="minicomp", options=options)
        assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        fresh = torch.randn_like(x)
        assert_same(compiled(fresh), model(fresh), rtol=1e-5, atol=1e-5)
    (record,) = records
    calls = [n for n in record.graph.nodes if isinstance(n, ExternOp)]
    packed = [n for n in calls if isinstance(n.target, PackedLinear)]
    assert len(packed) == (2 if freeze else 0)


# MKL (cpu_gemm="mkl") ---------------------------------------------------------------------------

needs_mkl = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="no MKL build")


@needs_mkl
@pytest.mark.parametrize("with_bias", [False, True])
def test_mkl_packs_constant_weights_and_leaves_weight_values_to_aten(with_bias):
    torch.manual_seed(0)
    weight = torch.randn(24, 16).t()  # a linear's, read transposed
    g = products(weight, torch.randn(24) if with_bias else None)
    (call,) = onednn_linears(g, library="mkl").nodes
    assert isinstance(call.target, MklPackedLinear) and call.target.shape == (24, 16)
    x = torch.randn(6, 16)
    (got,) = run_graph(onednn_linears(g, library="mkl"), {"x": x})
    expected = x.double() @ weight.double() + (g.constants["bias"].double() if with_bias else 0)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    # Over a weight the graph takes: ATen's product, unchanged.
    b = PassGraphBuilder()
    xv, wv = b.input("x", (64, K)), b.input("w", (K, N))
    b.output(b.extern("y", aten.mm.default, [xv, wv], (64, N)))
    unpacked = b.build()
    assert onednn_linears(unpacked, library="mkl") is unpacked


def test_auto_is_mkl_on_intel_cpus_only(monkeypatch):
    for intel, expected in ((True, "mkl"), (False, "onednn")):
        monkeypatch.setattr(onednn_linear_module, "_intel_cpu", lambda intel=intel: intel)
        assert host_gemm_library() == (expected if torch.backends.mkl.is_available() else "onednn")


def test_the_cpu_target_binds_the_option_to_the_pass():
    passes = get_target("cpu").passes_for(None, config.Options(cpu_gemm="mkl"))
    (bound,) = [p for p in passes if getattr(p, "func", None) is onednn_linears]
    assert bound.keywords == {"library": "mkl"}


@needs_mkl
@pytest.mark.parametrize("cpu_gemm", ["mkl", "onednn"])
def test_a_frozen_model_matches_eager_with_either_library(cpu_gemm):
    model = mlp()
    records: list = []
    torch._dynamo.reset()
    options = {"target": "cpu", "fallback": "error", "freeze": True, "cpu_gemm": cpu_gemm}
    with torch.no_grad(), recording(records):
        compiled = torch.compile(model, backend="minicomp", options=options)
        for x in (torch.randn(2, 5, 16), torch.randn(2, 5, 16)):
            assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    (record,) = records
    kind = MklPackedLinear if cpu_gemm == "mkl" else PackedLinear
    assert (
        sum(isinstance(n.target, kind) for n in record.graph.nodes if isinstance(n, ExternOp)) == 2
    )
