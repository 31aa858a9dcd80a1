"""Zero-copy views: a pure index remapping read by ATen calls, or returned as a view as eager
returns it, becomes a strided alias.

A view, permute, slice or expand feeding a matmul would otherwise be copied by a kernel
first. When the remapping of its input's storage is itself strided (checked on the actual
index map, not by op name), the value is an `as_strided` alias of the input instead.

A returned value is an alias only where eager's is one (the ATen graph's tensors share a
storage) and its source is memory that outlives the call and that nothing in the graph writes:
an unmutated graph input, an ATen call's new result, or a kernel's output (which the plan
builder then allocates fresh instead of in the workspace: runtime/plan_builder.py's
escaping_values). That is the transposed weight a training graph saves for its backward, the
LM head's matmul result seen at the batch's shape, or a loss gradient's rows reshaped: eager
copies none of them.
"""

from __future__ import annotations

import numpy as np

from minicomp.ir import types as T
from minicomp.ir.compute import Compute, TensorElement, TensorInput
from minicomp.ir.evaluate import evaluate
from minicomp.ir.expr import Binary, Const, Expr, Var
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, TensorType, Value
from minicomp.passes.graph.layout import layouts_for
from minicomp.passes.graph.rewrite import rename_values

# Index maps of views larger than this are not probed (the probe is exhaustive); affine ones
# are derived from their index expressions at any size.
MAX_CHECKED_ELEMENTS = 1 << 22


def strided_view(t, size, stride, offset):
    """`t` seen through sizes and strides, `offset` elements past its own start."""
    return t.as_strided(size, stride, t.storage_offset() + offset)


strided_view.is_view = True


def alias_views(graph: Graph) -> Graph:
    """Replace view-like compute ops that ATen calls read by zero-copy strided aliases."""
    layouts = layouts_for(graph)
    users = graph.users()
    outputs = graph.output_values()
    returnable = _returnable_memory(graph)
    nodes, renamed = [], {}
    for n in graph.nodes:
        view = None
        if isinstance(n, ComputeOp):
            out = n.outputs[0]
            if out in outputs:
                src = n.inputs[0] if len(n.inputs) == 1 else None
                if src in returnable and graph.shares_eager_memory(out, src):
                    view = as_alias(n, layouts)
                # Returned, it must show eager's strides (a source laid out otherwise would
                # give others): else the kernel's copy, which writes them, stays.
                if view is not None and out.type.strides not in (
                    None,
                    view.outputs[0].type.strides,
                ):
                    view = None
            elif any(isinstance(u, ExternOp) for u in users.get(out, [])):
                view = as_alias(n, layouts)
        nodes.append(view or n)
        if view is not None:
            renamed[n.outputs[0]] = view.outputs[0]
    if not renamed:
        return graph
    # The alias's value has its own strides, so it is a new Value: its readers must read it,
    # or passes that match producers to readers by value lose the edge.
    return rename_values(graph.replace(nodes=tuple(nodes)), renamed)


def _returnable_memory(graph: Graph) -> set:
    """The values a returned view may show: memory that outlives the call unchanged. Graph
    inputs no operator mutates, the results of ATen calls that allocate them (not views, which
    may be of the workspace), and compute results (kernel outputs: a view returned of one
    keeps it out of the workspace)."""
    externs = [n for n in graph.nodes if isinstance(n, ExternOp)]
    mutated = {v for n in externs if n.mutates for v in n.inputs}
    inputs = {v for v in graph.inputs if isinstance(v, Value)}
    results = {v for n in externs if not n.returns_views for v in n.outputs}
    computed = {v for n in graph.nodes if isinstance(n, ComputeOp) for v in n.outputs}
    return (inputs | results | computed) - mutated


def as_alias(op: ComputeOp, layouts: dict) -> ExternOp | None:
    """View `op` as a zero-copy `as_strided` alias of its input laid out as `layouts` says, or
    None when its remapping is not strided."""
    d = op.definition
    if len(op.inputs) != 1 or not isinstance(d.body, TensorElement):
        return None
    src = op.inputs[0]
    if src.dtype != op.outputs[0].dtype or not _static(d.shape, src.shape, layouts[src.name]):
        return None
    found = view_strides(d, layouts[src.name])
    if found is None:
        return None
    strides, offset = found
    out = op.outputs[0]
    if out.type.strides is not None:
        # A size-1 dim's stride is free: keep eager's, which a returned tensor shows.
        strides = tuple(e if x == 1 else s for s, e, x in zip(strides, out.type.strides, d.shape))
    value = out.replace(type=TensorType(out.shape, out.dtype, out.type.device, strides))
    args = (ArgRef(0), tuple(d.shape), strides, offset)
    return ExternOp(
        f"{op.name} (zero-copy view)",
        (src,),
        (value,),
        strided_view,
        args,
        (),
        ((),),
        "a view of its input's memory",
    )


def _static(*dims_lists) -> bool:
    return all(not isinstance(x, Expr) for dims in dims_lists for x in dims)


def _fit_strides(d: Compute, src_strides: tuple) -> tuple[tuple, int] | None:
    """Strides and offset reproducing the storage offsets `d` reads, if there are such."""
    numel = int(np.prod(d.shape)) if d.shape else 1
    if numel == 0:
        return None
    found = _affine_strides(d, src_strides)
    if found is not None or numel > MAX_CHECKED_ELEMENTS:
        return found  # the derivation has no size limit: GPT-2's 38M-element tied lm_head
    return _probe_strides(d, src_strides)


def view_strides(d: Compute, src_strides: tuple) -> tuple[tuple, int] | None:
    """The sizes' strides and the offset with which `as_strided` of the source gives `d`, or
    None. A flip has strides too, but negative ones, which as_strided refuses."""
    found = _fit_strides(d, src_strides)
    return None if found is None or any(s < 0 for s in found[0]) else found


def _affine_strides(d: Compute, src_strides: tuple) -> tuple[tuple, int] | None:
    """The strides and offset of `d`'s reads derived from its index expressions, when each is
    affine in the axes and stays inside the source: the result `_probe_strides` would find,
    without evaluating every element. None when the derivation does not apply."""
    el = d.body
    axes = {a: k for k, a in enumerate(d.axes)}
    origin, strides = 0, [0] * len(d.shape)
    for index, extent, stride in zip(el.indices, el.tensor.shape, src_strides):
        form = _affine(index, axes)
        if form is None:
            return None
        c, coeffs = form
        lo = c + sum(a * (x - 1) for a, x in zip(coeffs, d.shape) if a < 0)
        hi = c + sum(a * (x - 1) for a, x in zip(coeffs, d.shape) if a > 0)
        if lo < 0 or hi >= extent:
            return None
        origin += c * stride
        for k, a in enumerate(coeffs):
            strides[k] += a * stride
    if origin < 0:
        return None
    # The probe reports 1 for size-1 dims, whatever the index map.
    return tuple(1 if x == 1 else s for s, x in zip(strides, d.shape)), origin


def _affine(e: Expr, axes: dict) -> tuple[int, list[int]] | None:
    """(c, [a0, a1, ...]) with e == c + sum(ak * axis_k), or None when `e` is not of that form
    (only integer constants, the axes, +, - and products by a constant are understood)."""
    if isinstance(e, Const):
        if e.dtype.kind != "int" or isinstance(e.value, bool):
            return None
        return e.value, [0] * len(axes)
    if isinstance(e, Var):
        k = axes.get(e)
        if k is None or e.dtype.kind != "int":
            return None
        coeffs = [0] * len(axes)
        coeffs[k] = 1
        return 0, coeffs
    if not isinstance(e, Binary) or e.op not in ("add", "sub", "mul") or e.dtype.kind != "int":
        return None
    a, b = _affine(e.a, axes), _affine(e.b, axes)
    if a is None or b is None:
        return None
    if e.op == "add":
        return a[0] + b[0], [x + y for x, y in zip(a[1], b[1])]
    if e.op == "sub":
        return a[0] - b[0], [x - y for x, y in zip(a[1], b[1])]
    if not any(a[1]):
        return a[0] * b[0], [a[0] * y for y in b[1]]
    if not any(b[1]):
        return a[0] * b[0], [x * b[0] for x in a[1]]
    return None


def _probe_strides(d: Compute, src_strides: tuple) -> tuple[tuple, int] | None:
    """`_fit_strides` by evaluating the offset of every element read and checking them."""
    el = d.body
    src = el.tensor
    base = _strided_offsets(src.shape, src_strides, 0)
    probe = TensorInput(src.name, src.shape, T.i64)
    body = TensorElement(probe, el.indices)
    offsets = evaluate(Compute(d.name, d.shape, d.axes, body), {src.name: base})
    offsets = np.asarray(offsets, np.int64).reshape(d.shape)
    origin = int(offsets.reshape(-1)[0])
    strides = []
    for k, x in enumerate(d.shape):
        if x == 1:
            strides.append(1)
            continue
        step = [0] * len(d.shape)
        step[k] = 1
        strides.append(int(offsets[tuple(step)]) - origin)
    predicted = _strided_offsets(d.shape, strides, origin)
    if not np.array_equal(predicted, offsets) or origin < 0:
        return None
    return tuple(strides), origin


def _strided_offsets(shape: tuple, strides, origin: int) -> np.ndarray:
    """origin + sum(index_k * stride_k) at every index of `shape`, built by broadcasting."""
    out = np.full(shape, origin, np.int64)
    for k, (x, s) in enumerate(zip(shape, strides)):
        along = [1] * len(shape)
        along[k] = x
        out += (np.arange(x, dtype=np.int64) * s).reshape(along)
    return out
