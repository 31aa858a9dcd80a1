"""View simplification: drop identity copies and collapse chains of index remappings."""

from __future__ import annotations

from minicomp.ir.compute import Compute, Reduce, TensorElement, TensorInput
from minicomp.ir.expr import Var, dim_expr
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import ComputeOp, Graph, Op, Value
from minicomp.ir.simplify import simplify_expr
from minicomp.passes.graph.rewrite import rename_op, rename_values


def simplify_views(graph: Graph) -> Graph:
    """Remove identity compute ops and make views of views read the original tensor.

    A view is a compute op whose body is one element of its single input at remapped indices
    (view, permute, expand, slice, select...). A view of a view is rewritten to read the
    inner view's input through the composed index map, simplified with the axes' bounds, so a
    chain of views becomes one (the inner views then usually die in dead-code elimination).
    An identity (same shape and dtype, body `x[i0, i1, ...]`) is removed and its uses read
    its input, unless the graph returns it: the graph must return a fresh tensor there.
    """
    outputs = graph.output_values()
    mapping: dict[Value, Value] = {}
    views: dict[Value, ComputeOp] = {}
    nodes: list[Op] = []
    changed = False
    for n in graph.nodes:
        n = rename_op(n, mapping)
        if is_view(n):
            producer = views.get(n.inputs[0])
            if producer is not None:
                n = _compose(n, producer)
            if _is_identity(n) and n.outputs[0] not in outputs:
                mapping[n.outputs[0]] = n.inputs[0]
                changed = True
                continue
            views[n.outputs[0]] = n
        nodes.append(n)
    changed = changed or any(a is not b for a, b in zip(nodes, graph.nodes))
    if not changed:
        return graph
    return rename_values(graph.replace(nodes=tuple(nodes)), mapping)


def is_view(n: Op) -> bool:
    """Whether `n` reads one element of its single input per output element, at indices that
    depend on the output position only."""
    if not isinstance(n, ComputeOp) or len(n.inputs) != 1:
        return False
    body = n.definition.body
    if not isinstance(body, TensorElement) or not isinstance(body.tensor, TensorInput):
        return False
    return not collect(body.indices, (TensorElement, Reduce))


def _is_identity(n: ComputeOp) -> bool:
    d, x = n.definition, n.inputs[0]
    out = n.outputs[0]
    return (
        out.shape == x.shape
        and out.dtype == x.dtype
        and out.type.device == x.type.device
        and d.body.tensor.name == x.name
        and d.body.indices == d.axes
    )


def _compose(consumer: ComputeOp, producer: ComputeOp) -> ComputeOp:
    """`consumer` reading `producer`'s input directly through the composed index map."""
    outer: Compute = consumer.definition
    inner: Compute = producer.definition
    at = dict(zip(inner.axes, outer.body.indices))
    bounds = _axis_bounds(outer)
    indices = tuple(simplify_expr(substitute(i, at), bounds) for i in inner.body.indices)
    body = TensorElement(inner.body.tensor, indices)
    return consumer.replace(inputs=producer.inputs, definition=outer.replace(body=body))


def _axis_bounds(d: Compute) -> dict:
    """0 <= axis < extent for each axis of `d`, and 1 <= s for the size symbols its extents
    use (a zero size means no element is ever read, so no index is ever evaluated)."""
    bounds: dict = {}
    for v, n in zip(d.axes, d.shape):
        bounds[v] = (0, n - 1 if isinstance(n, int) else dim_expr(n) - 1)
        if not isinstance(n, int):
            for s in collect(n, Var):
                bounds.setdefault(s, (1, None))
    return bounds
