"""name_library_calls: products and convolutions the cpu target leaves to ATen say "by design";
ops with no lowering for another reason keep "no lowering"."""

import torch
from helpers_graph import PassGraphBuilder, assert_graph_equal

import minicomp
from minicomp.ops.registry import NO_LOWERING
from minicomp.passes.graph.library_calls import by_design, name_library_calls

aten = torch.ops.aten


def _graph(mm_reason: str, cumsum_reason: str = NO_LOWERING):
    b = PassGraphBuilder()
    x = b.input("x", (4, 8))
    w = b.input("w", (8, 3))
    y = b.extern("y", aten.mm.default, [x, w], (4, 3), reason=mm_reason)
    z = b.extern("z", aten.cumsum.default, [y], (4, 3), args=(y, 0), reason=cumsum_reason)
    b.output(z)
    return b.build()


def test_a_product_without_lowering_is_by_design_and_cumsum_stays_unsupported():
    expected = _graph(by_design("cpu", "BLAS GEMM"))
    assert_graph_equal(name_library_calls(_graph(NO_LOWERING)), expected)
    assert by_design("cpu", "BLAS GEMM") == "ATen by design on cpu: BLAS GEMM"


def test_a_graph_with_nothing_to_name_comes_back_unchanged():
    graph = _graph("oneDNN linear, weight prepacked")
    assert name_library_calls(graph) is graph


def test_explain_on_cpu_says_a_matmul_and_a_convolution_are_by_design():
    def f(a, b, img, weight):
        return torch.relu(a @ b), torch.nn.functional.conv1d(img, weight), torch.cumsum(a, 0)

    args = torch.randn(4, 8), torch.randn(8, 3), torch.randn(1, 2, 9), torch.randn(3, 2, 3)
    e = minicomp.explain(f, *args, options={"target": "cpu"})
    assert e.fallbacks["mm.default"] == "ATen by design on cpu: BLAS GEMM"
    assert e.fallbacks["convolution.default"] == "ATen by design on cpu: convolution (oneDNN)"
    assert e.fallbacks["cumsum.default"] == NO_LOWERING
