"""Zero-copy views: remappings read by ATen calls become strided aliases when they are."""

import torch
from graph_builder import GraphBuilder
from helpers import check_compiled

import minicomp
from minicomp.ir.graph import ComputeOp, ExternOp
from minicomp.passes.graph.alias_views import alias_views, strided_view

aten = torch.ops.aten


def _transpose_into_mm():
    b = GraphBuilder()
    x = b.input("x", (6, 4))
    y = b.input("y", (6, 5))
    xt = b.compute("xt", (4, 6), lambda i, j: x[j, i])
    out = b.extern("mm", aten.mm.default, [xt, y], (4, 5))
    b.output(out)
    return b.build()


def test_transpose_read_by_an_aten_call_becomes_an_alias():
    g = alias_views(_transpose_into_mm())
    view = g.nodes[0]
    assert isinstance(view, ExternOp) and view.target is strided_view
    assert view.args[1:] == ((4, 6), (1, 4), 0)
    assert view.outputs[0].type.strides == (1, 4)


def test_slice_with_offset_becomes_an_alias_with_that_offset():
    b = GraphBuilder()
    x = b.input("x", (8, 4))
    tail = b.compute("tail", (3, 4), lambda i, j: x[i + 5, j])
    b.output(b.extern("neg", aten.neg.default, [tail], (3, 4)))
    view = alias_views(b.build()).nodes[0]
    assert isinstance(view, ExternOp)
    assert view.args[1:] == ((3, 4), (4, 1), 20)


def test_remap_that_is_not_strided_stays_a_kernel():
    b = GraphBuilder()
    x = b.input("x", (4, 6))
    # Flattening a transpose reads storage in an order no single stride per dim gives.
    flat = b.compute("flat", (24,), lambda k: x[k % 4, k // 4])
    b.output(b.extern("neg", aten.neg.default, [flat], (24,)))
    g = alias_views(b.build())
    assert isinstance(g.nodes[0], ComputeOp)


def test_remap_only_kernels_read_is_left_to_fusion():
    b = GraphBuilder()
    x = b.input("x", (6, 4))
    xt = b.compute("xt", (4, 6), lambda i, j: x[j, i])
    b.output(b.compute("y", (4, 6), lambda i, j: xt[i, j] * 2.0))
    g = b.build()
    assert alias_views(g) is g


def test_views_feeding_matmuls_match_eager_and_copy_nothing(target):
    def f(x, w):
        h = x.view(-1, x.shape[-1]) @ w
        return h.t() @ x.view(-1, x.shape[-1])[:, 2:5]

    x, w = torch.randn(2, 6, 8), torch.randn(8, 6)
    with torch.no_grad():
        check_compiled(f, x, w, target=target)
        report = minicomp.explain(f, x, w, options={"target": target})
    if target == "cpu":
        # ATen's GEMM reads the views in place.
        assert report.kernel_count == 0
        assert any("zero-copy" in name for name in report.fallbacks)
    else:
        # CUDA computes the products itself, reading the views through their index maps:
        # one kernel a product, no copy.
        assert report.kernel_count == 2 and not report.fallbacks


def test_readers_read_the_alias_value():
    # The alias's strides differ from the compute's on a size-1 dim, so it is a new Value;
    # a reader left on the old one loses its producer (fusion once ordered it first).
    b = GraphBuilder()
    x = b.input("x", (2, 64))
    q = b.compute("q", (2, 8, 1), lambda i, j, k: x[i, j])
    out = b.extern("bmm", aten.bmm.default, [q, q], (2, 8, 8))
    b.output(out)
    g = alias_views(b.build())
    view, bmm = g.nodes
    assert isinstance(view, ExternOp) and view.target is strided_view
    assert bmm.inputs == (view.outputs[0], view.outputs[0])


def test_attention_on_a_slice_feeding_back_into_its_source(target):
    # LeViT's last stage: a sequence of length 1 whose scores join a late reader of the
    # value the queries were sliced from.
    def f(x, w):
        h = x * 2.0 + 1.0
        q = h.view(2, 1, 2, 32)[..., :8].permute(0, 2, 1, 3)
        s = torch.matmul(q, q.transpose(-1, -2))
        return h + (s.reshape(2, 2) @ w).repeat(1, 32)

    check_compiled(f, torch.randn(2, 64), torch.randn(2, 2), target=target, rtol=1e-5, atol=1e-5)


def test_a_flip_read_by_an_aten_call_stays_a_kernel(target):
    # Strided, but with a negative stride, which as_strided refuses.
    b = GraphBuilder()
    x = b.input("x", (3, 4))
    flipped = b.compute("flipped", (3, 4), lambda i, j: x[i, 3 - j])
    b.output(b.extern("neg", aten.neg.default, [flipped], (3, 4)))
    assert isinstance(alias_views(b.build()).nodes[0], ComputeOp)
    check_compiled(lambda x: torch.flip(x, dims=(1,)) @ x.mT, torch.randn(2, 3, 4), target=target)
