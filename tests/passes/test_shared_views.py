"""Shared views: a view read by two reductions (a transposed weight read by a product and by
the sum of its columns) is never written out; a view read by elementwise ops alone stays one op
they fuse around."""

import torch
from graph_builder import GraphBuilder, assert_same_results
from helpers import check_compiled

from minicomp.dynamo.backend import recording
from minicomp.ir.compute import reduce
from minicomp.ir.graph import FusedOp
from minicomp.passes.graph.fusion import fuse
from minicomp.passes.graph.shared_views import duplicate_shared_views


def _records(fn, *args, target):
    records: list = []
    with recording(records):
        check_compiled(fn, *args, target=target, rtol=1e-4, atol=1e-4)
    return records


def _written(records) -> list[tuple[str, tuple]]:
    """Each kernel output's name and shape, over every graph."""
    return [
        (v.name, v.shape)
        for r in records
        for n in r.graph.nodes
        if isinstance(n, FusedOp)
        for v in n.outputs
    ]


def test_a_transposed_weight_read_by_a_product_and_a_sum_is_not_written(target):
    def fn(x, w):
        wt = w.t()
        return x @ wt, wt.sum(0) * 2

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(24, 40, generator=gen), torch.randn(72, 40, generator=gen)
    records = _records(fn, x, w, target=target)
    if target == "cpu":
        return  # the product is a BLAS call reading the weight through strides
    written = _written(records)
    assert (72, 40) not in [s for _, s in written] and (40, 72) not in [s for _, s in written]
    assert sorted(s for _, s in written) == [(24, 72), (72,)], written


def test_a_view_read_by_two_elementwise_ops_stays_one_op():
    def fn(x):
        v = x.t()
        return torch.relu(v), v * 3

    x = torch.randn(6, 10)
    records = _records(fn, x, target="cpu")
    (record,) = records
    fused = [n for n in record.graph.nodes if isinstance(n, FusedOp)]
    assert len(fused) == 1


def _transposed_weight_graph():
    """wt = w.t(), read by a product, the sum of its columns and an elementwise op."""
    b = GraphBuilder()
    x, w = b.input("x", (8, 16)), b.input("w", (12, 16))
    wt = b.compute("wt", (16, 12), lambda i, j: w[j, i])
    mm = b.compute("mm", (8, 12), lambda i, j: reduce("sum", (16,), lambda k: x[i, k] * wt[k, j]))
    cols = b.compute("cols", (12,), lambda j: reduce("sum", (16,), lambda k: wt[k, j]))
    plus = b.compute("plus", (16, 12), lambda i, j: wt[i, j] + 1.0)
    b.output(mm, cols, plus)
    return b.build()


def test_each_reduction_reads_a_copy_and_the_elementwise_reader_the_original():
    g = _transposed_weight_graph()
    after = duplicate_shared_views(g)
    assert_same_results(g, after)
    readers = {n.name: {v.name for v in n.inputs} for n in after.nodes}
    copies = [n for n in after.nodes if n.name.startswith("wt_")]
    assert len(copies) == 2  # one for the product, one for the column sums
    assert readers["plus"] == {"wt"}
    assert {next(iter(readers["mm"] - {"x"})), *readers["cols"]} == {c.name for c in copies}
    # Each copy sits just before its reader: between the same collectives, if any.
    order = [n.name for n in after.nodes]
    for c in copies:
        (reader,) = [n for n in after.nodes if c.outputs[0] in n.inputs]
        assert order.index(c.name) == order.index(reader.name) - 1
    # Fused, no group writes the transposed weight out: each takes its view.
    fused = fuse(after)
    written = {v.name for n in fused.nodes if isinstance(n, FusedOp) for v in n.outputs}
    assert written == {"mm", "cols", "plus"}


def test_a_view_with_one_reader_is_left_alone():
    b = GraphBuilder()
    w = b.input("w", (12, 16))
    wt = b.compute("wt", (16, 12), lambda i, j: w[j, i])
    cols = b.compute("cols", (12,), lambda j: reduce("sum", (16,), lambda k: wt[k, j]))
    b.output(cols)
    g = b.build()
    assert duplicate_shared_views(g) is g
