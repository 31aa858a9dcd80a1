"""Memory layout: the strides every value of a graph lives with."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from minicomp.ir.collectives import is_collective, is_wait
from minicomp.ir.compute import TensorInput, compute
from minicomp.ir.expr import Dim, Expr, binary, dim_expr
from minicomp.ir.graph import ComputeOp, ExternOp, Graph, KernelOp, Op, TensorType, Value
from minicomp.ir.simplify import simplify_expr


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


# ATen ops whose kernels check that their tensor arguments are contiguous without carrying
# the needs_contiguous_strides tag: the composite that calls them (group_norm) makes them so
# with a clone, which minicomp drops as an identity copy (simplify_views).
_CHECKS_CONTIGUOUS = ("native_group_norm.default", "native_group_norm_backward.default")


def layout_constraint(n: ExternOp) -> str:
    """What an ATen call needs of its tensor arguments' strides: "exact" (eager's: as_strided
    reads storage, and ops tagged needs_exact_strides or needs_fixed_stride_order, custom ops
    by default), "contiguous" (tagged needs_contiguous_strides, kernels that check
    contiguity: _CHECKS_CONTIGUOUS, and collectives) or "flexible". A callable that is no ATen
    op says so with a `layout_constraint` attribute (a prepacked oneDNN convolution:
    "exact")."""
    import torch
    from torch._library.utils import get_layout_constraint_tag

    fn = n.target
    if fn in (torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default):
        return "exact"
    if not isinstance(fn, torch._ops.OpOverload):
        return getattr(fn, "layout_constraint", "flexible")
    if is_wait(fn):
        # Its input is a collective's result, not ready before it: never copied.
        return "flexible"
    if is_collective(fn) and not fn._schema.is_mutable:
        # c10d sends the input's storage as it is (all_gather and reduce_scatter check). An
        # in-place collective is left alone: a copy would take its result.
        return "contiguous"
    if fn.namespace == "aten" and str(fn).removeprefix("aten.") in _CHECKS_CONTIGUOUS:
        return "contiguous"
    tag = get_layout_constraint_tag(fn)
    if tag == getattr(torch.Tag, "needs_contiguous_strides", None):
        return "contiguous"
    if tag in (torch.Tag.needs_exact_strides, torch.Tag.needs_fixed_stride_order):
        return "exact"
    return "flexible"


def needs_unit_last_stride(n: ExternOp) -> bool:
    """Whether an ATen call views its first argument as another element type, which needs
    the last dimension's stride 1 and the others divisible (view_as_complex; view.dtype to a
    dtype of another size). Eager's layout has them where tracing succeeded, but minicomp may
    have dropped the copy that made it so (simplify_views drops identity copies); a row-major
    layout has them."""
    import torch

    aten = torch.ops.aten
    if n.target is aten.view_as_complex.default:
        return True
    if n.target is not aten.view.dtype or not n.inputs:
        return False
    return n.inputs[0].dtype.nbytes != n.args[1].itemsize


def eager_stride_reads(graph: Graph) -> set[Value]:
    """The values ATen calls read with eager's strides (layout_constraint "exact"), looking
    through the selects an as_strided call reads its storage by."""
    import torch

    select = torch.ops.aten.select.int
    producers = graph.producers()
    found = set()
    for n in graph.nodes:
        if isinstance(n, ExternOp) and layout_constraint(n) == "exact":
            for v in n.inputs:
                while isinstance(p := producers.get(v), ExternOp) and p.target is select:
                    v = p.inputs[0]
                found.add(v)
    return found


def layouts_for(graph: Graph) -> dict[str, tuple]:
    """Strides of every value: PyTorch's for graph inputs, outputs, constants, ATen-call
    results, the values ATen calls read with eager's strides (eager_stride_reads) and what
    strided kernel launches write; an input's for a value computed in its memory
    (Graph.input_writes); row-major for the other intermediates minicomp writes."""
    outputs = graph.output_values() | eager_stride_reads(graph)
    out: dict[str, tuple] = {}
    for v in graph.inputs:
        if isinstance(v, Value):
            out[v.name] = v.type.strides or contiguous_strides(v.shape)
    for name, t in graph.constants.items():
        out[name] = tuple(t.stride())
    for n in graph.nodes:
        for v in n.outputs:
            keep = isinstance(n, ExternOp) or v in outputs
            keep = keep or isinstance(n, KernelOp) and n.strided
            strides = v.type.strides if keep and v.type.strides is not None else None
            out[v.name] = strides if strides is not None else contiguous_strides(v.shape)
    for value, name in graph.input_writes.items():
        out[value] = out[name]  # computed in the input's memory
    return out


def is_row_major(shape: Sequence[Dim], strides: Sequence[Dim]) -> bool:
    """Whether `strides` are row-major for `shape` (size-1 dims may have any stride; symbolic
    strides must match after simplification, so the answer may be a conservative no)."""

    def norm(d: Dim) -> Dim:
        return simplify_expr(d) if isinstance(d, Expr) else d

    for d, s, want in zip(shape, strides, contiguous_strides(shape)):
        if not (isinstance(d, int) and d == 1) and norm(s) != norm(want):
            return False
    return True


def contiguous_kernel_inputs(graph: Graph) -> Graph:
    """Make every input of a kernel launch (KernelOp) row-major: a value whose layout is not
    (a transposed graph input, a strided ATen result or alias) is copied first by a compute op,
    which fusion then turns into (part of) a kernel. Strided launches read their inputs in
    place. Run it after the passes that drop identity copies."""
    return _row_major_inputs(graph, lambda n: isinstance(n, KernelOp) and not n.strided)


def contiguous_extern_inputs(graph: Graph) -> Graph:
    """Make every tensor argument of an ATen call tagged needs_contiguous_strides row-major,
    as contiguous_kernel_inputs does for kernel launches, and the argument an ATen call views
    as another element type (needs_unit_last_stride)."""
    return _row_major_inputs(
        graph,
        lambda n: (
            isinstance(n, ExternOp)
            and (layout_constraint(n) == "contiguous" or needs_unit_last_stride(n))
        ),
    )


def _row_major_inputs(graph: Graph, needs: Callable[[Op], bool]) -> Graph:
    """`graph` with a row-major copy of every input that is not row-major of the ops `needs`
    selects."""
    layouts = layouts_for(graph)
    taken = {v.name for v in graph.inputs if isinstance(v, Value)} | set(graph.constants)
    taken |= {v.name for n in graph.nodes for v in n.outputs}
    copies: dict[Value, Value] = {}
    nodes: list[Op] = []
    for n in graph.nodes:
        if needs(n):
            inputs = []
            for v in n.inputs:
                if not is_row_major(v.shape, layouts[v.name]) and v not in copies:
                    copies[v] = _copy_of(v, taken, nodes)
                inputs.append(copies.get(v, v))
            n = n.replace(inputs=tuple(inputs)) if tuple(inputs) != n.inputs else n
        nodes.append(n)
    return graph.replace(nodes=tuple(nodes)) if copies else graph


def _copy_of(v: Value, taken: set[str], nodes: list[Op]) -> Value:
    """A row-major copy of `v`, its compute op appended to `nodes`."""
    name, k = f"{v.name}_contiguous", 1
    while name in taken:
        name, k = f"{v.name}_contiguous_{k}", k + 1
    taken.add(name)
    out = Value(name, TensorType(v.shape, v.dtype, v.type.device, contiguous_strides(v.shape)))
    src = TensorInput(v.name, v.shape, v.dtype)
    definition = compute(name, v.shape, lambda *i: src[i])
    nodes.append(ComputeOp("contiguous", (v,), (out,), definition))
    return out
