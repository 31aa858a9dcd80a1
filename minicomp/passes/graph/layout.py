"""Memory layout: the strides every value of a graph lives with."""

from __future__ import annotations

from collections.abc import Sequence

from minicomp.ir.expr import Dim, binary, dim_expr
from minicomp.ir.graph import ExternOp, Graph, Value


def contiguous_strides(shape: Sequence[Dim]) -> tuple[Dim, ...]:
    """Row-major strides of a shape."""
    out: list[Dim] = []
    acc: Dim = 1
    for d in reversed(shape):
        out.append(acc)
        if isinstance(acc, int) and isinstance(d, int):
            acc = acc * d
        else:
            acc = binary("mul", dim_expr(acc), dim_expr(d))
    return tuple(reversed(out))


def layouts_for(graph: Graph) -> dict[str, tuple]:
    """Strides of every value: PyTorch's for graph inputs, outputs, constants and ATen-call
    results; row-major for the intermediates minicomp writes."""
    outputs = graph.output_values()
    out: dict[str, tuple] = {}
    for v in graph.inputs:
        if isinstance(v, Value):
            out[v.name] = v.type.strides or contiguous_strides(v.shape)
    for name, t in graph.constants.items():
        out[name] = tuple(t.stride())
    for n in graph.nodes:
        for v in n.outputs:
            keep = isinstance(n, ExternOp) or v in outputs
            strides = v.type.strides if keep and v.type.strides is not None else None
            out[v.name] = strides if strides is not None else contiguous_strides(v.shape)
    return out
