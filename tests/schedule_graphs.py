"""Small graphs and helpers the scheduler tests of every target share."""

import torch
from graph_builder import GraphBuilder

from minicomp.ir.compute import reduce
from minicomp.ir.graph import FusedOp, Graph
from minicomp.passes.graph.fusion import fuse


def one_group(g: Graph) -> FusedOp:
    (op,) = fuse(g).nodes
    assert isinstance(op, FusedOp)
    return op


def poisoned(shape, dtype=torch.float32) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype)
    return torch.full(shape, -12345, dtype=dtype)


def scale_graph(shape) -> Graph:
    b = GraphBuilder()
    x = b.input("x", shape)
    y = b.compute("y", shape, lambda *i: x[i] * 2.0 + 1.0)
    b.output(y)
    return b.build()


def broadcast_add(rows=4, cols=8) -> Graph:
    b = GraphBuilder()
    x = b.input("x", (rows, cols))
    y = b.input("y", (1, cols))
    z = b.compute("z", (rows, cols), lambda i, j: x[i, j] + y[0, j])
    b.output(z)
    return b.build()


def row_reduce(kind: str, rows=4, cols=16, dtype=None) -> Graph:
    b = GraphBuilder()
    x = b.input("x", (rows, cols), *(() if dtype is None else (dtype,)))
    s = b.compute("s", (rows, 1), lambda i, j: reduce(kind, (cols,), lambda k: x[i, k]))
    b.output(s)
    return b.build()


def full_2d_sum(rows, cols) -> Graph:
    b = GraphBuilder()
    x = b.input("x", (rows, cols))
    s = b.compute("s", (1, 1), lambda i, j: reduce("sum", (rows, cols), lambda r, c: x[r, c]))
    b.output(s)
    return b.build()


def matmul_problem_of(fn, *args, target: str = "cuda-emu"):
    """The one matmul problem (templates.problem.MatmulProblem) of `fn`'s graph on `target`."""
    import minicomp
    from minicomp.passes.graph.layout import layouts_for
    from minicomp.schedule.templates import matmul_problem

    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(fn, *args, options={"target": target})
    (record,) = report.records
    layouts = layouts_for(record.graph)
    groups = [n for n in record.graph.nodes if isinstance(n, FusedOp)]
    (problem,) = [p for p in (matmul_problem(g, layouts) for g in groups) if p is not None]
    return problem
