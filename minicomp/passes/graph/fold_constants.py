"""Constant folding: compute ops whose inputs are all constants are evaluated at compile time.

With options.freeze the modules' parameters and buffers are constants too, so what a model
computes from its weights alone (transposes, reshapes, casts, concatenations, a batch norm's
scale) is computed once here and the plan reads the result. `constant_operand_layouts` then
gives constant matmul and convolution operands the layout the CUDA templates read best.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minicomp.ir.compute import Reduce, TensorElement, TensorInput
from minicomp.ir.contraction import product_sides
from minicomp.ir.expr import Cast, Const, Expr, Var
from minicomp.ir.functor import collect
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, Value

# Bigger results stay computed at run time when they are bigger than what they read: a
# folded broadcast would only fill memory. A result no bigger than its inputs (a weight's
# transpose, cast or concatenation) folds whatever its size.
MAX_FOLDED_ELEMENTS = 2**20


def fold_constants(graph: Graph) -> Graph:
    """Replace each compute op reading only constants (or nothing, like full or arange) and
    producing a static shape by a constant, when the result has at most MAX_FOLDED_ELEMENTS
    elements or no more than its inputs together.

    An ATen call (without effects, drawing no random numbers) reading only constants at static
    sizes is called once here, under the same size rule.

    A view of a constant (a permute, a reshape, a slice, an expand: one element of the input
    at indices that are a strided map of the output position) folds to a strided view of the
    constant's memory, so a weight's transpose costs neither a copy nor memory. Anything else
    is computed by the reference evaluator in the op's own dtype, so folding never changes a
    value; those results are contiguous tensors on the op's device. A graph output may become
    a constant: the runtime returns a fresh copy of it, never the constant itself. The
    constants the folded ops read stay until dead-code elimination drops them.
    """
    constants = dict(graph.constants)
    nodes = []
    for n in graph.nodes:
        if isinstance(n, ComputeOp):
            value = folded_value(n, constants)
            values = None if value is None else [value]
        else:
            values = _extern_values(n, constants) if isinstance(n, ExternOp) else None
        if values is None:
            nodes.append(n)
        else:
            constants.update((v.name, t) for v, t in zip(n.outputs, values))
    if len(nodes) == len(graph.nodes):
        return graph
    return graph.replace(nodes=tuple(nodes), constants=constants)


def folded_value(n: ComputeOp, constants: Mapping[str, Any]) -> Any:
    """The value of compute op `n` as a torch tensor when every input is in `constants` (a
    strided view of it for a view), or None when it is not to be folded."""
    out = n.outputs[0]
    if any(v.name not in constants for v in n.inputs) or _has_free_symbols(n):
        return None
    shape = out.shape
    if not all(isinstance(d, int) for d in shape):
        return None
    view = _constant_view(n, constants)
    if view is not None:
        return view
    read = sum(constants[v.name].numel() for v in n.inputs)
    if _numel(shape) > max(MAX_FOLDED_ELEMENTS, read):
        return None
    return _evaluated(n, constants)


def constant_value(v: Value, constants: Mapping[str, Any], producers: Mapping) -> Any:
    """The tensor `v` holds when it is a constant or computed by a compute op (`producers`
    maps values to the ops defining them) from constants alone; else None."""
    if v.name in constants:
        return constants[v.name]
    producer = producers.get(v)
    if isinstance(producer, ComputeOp):
        return folded_value(producer, constants)
    return None


def _evaluated(n: ComputeOp, constants: Mapping[str, Any]) -> Any:
    import torch

    from minicomp.ir.evaluate import evaluate
    from minicomp.ir.types import to_torch

    out = n.outputs[0]
    arrays = {v.name: _to_numpy(constants[v.name]) for v in n.inputs}
    try:
        result = evaluate(n.definition, arrays, {})
    except (ZeroDivisionError, IndexError, ValueError):
        # Undefined at run time too (division by zero, an index out of range): leave it there.
        return None
    value = torch.from_numpy(result.copy()).to(to_torch(out.dtype)).reshape(out.shape)
    return value if out.type.device == "cpu" else value.to(out.type.device)


def _constant_view(n: ComputeOp, constants: Mapping[str, Any]) -> Any:
    """`n` as a strided view of its one constant input, or None when it is no such view."""
    from minicomp.passes.graph.alias_views import view_strides

    d = n.definition
    if len(n.inputs) != 1 or not isinstance(d.body, TensorElement):
        return None
    src, out = n.inputs[0], n.outputs[0]
    if not isinstance(d.body.tensor, TensorInput) or collect(d.body.indices, TensorElement):
        return None
    t = constants[src.name]
    if src.dtype != out.dtype or t.device.type != out.type.device:
        return None
    found = view_strides(d, tuple(t.stride()))
    if found is None:
        return None
    strides, offset = found
    return t.as_strided(tuple(d.shape), strides, t.storage_offset() + offset)


def _extern_values(n: ExternOp, constants: Mapping[str, Any]) -> list | None:
    """The results of ATen call `n` when it reads only constants, or None."""
    import torch

    if n.has_effects or any(v.name not in constants for v in n.inputs):
        return None
    if torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
        return None
    shapes = [v.shape for v in n.outputs]
    if not all(isinstance(d, int) for shape in shapes for d in shape):
        return None
    read = sum(constants[v.name].numel() for v in n.inputs)
    if sum(_numel(shape) for shape in shapes) > max(MAX_FOLDED_ELEMENTS, read):
        return None
    tensors = [constants[v.name] for v in n.inputs]

    def arg(a: Any) -> Any:
        if isinstance(a, ArgRef):
            return tensors[a.index]
        if isinstance(a, Expr):
            raise _Symbolic
        if isinstance(a, tuple):
            return [arg(x) for x in a]
        return a

    try:
        args = [arg(a) for a in n.args]
        kwargs = {k: arg(a) for k, a in n.kwargs}
        result = n.target(*args, **kwargs)
    except _Symbolic:
        return None
    values = []
    for v, path in zip(n.outputs, n.result_paths):
        t = result
        for p in path:
            t = t[p]
        if t.device.type != v.type.device:
            t = t.to(v.type.device)
        values.append(t)
    return values


class _Symbolic(Exception):
    """An argument of an ATen call is a size known only at run time."""


def _has_free_symbols(n: ComputeOp) -> bool:
    """Whether the definition uses size symbols (variables other than its own axes)."""
    d = n.definition
    bound = set(d.axes)
    for r in collect(d.body, Reduce):
        bound.update(r.axes)
    return any(v not in bound for v in collect(d, Var))


def _numel(shape: tuple) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _to_numpy(t: Any):
    """A constant as the numpy array the evaluator expects (bf16 and float8 as float32,
    exact)."""
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16 or t.dtype.itemsize == 1 and t.dtype.is_floating_point:
        t = t.float()
    return t.numpy()


def constant_operand_layouts(graph: Graph) -> Graph:
    """Give each constant that a matrix product or a convolution reads as a plain operand (one
    element at indices that are its axes) the layout the CUDA templates read without a
    prologue: a strided copy whose reduced (K) axes are innermost and contiguous, in the
    product's order, when the constant's own layout is no plain K-major or MN-major matrix.

    The matmul templates read an operand with 16-byte asynchronous copies when its elements
    form a matrix with unit stride along K or along its own side (M or N); anything else
    goes through registers. PyTorch's weights are usually plain already: a linear's weight
    is K-major through its transpose, and a convolution's OIHW weight is K-major for the
    implicit GEMM's K = (c, r, s). A channels-last convolution weight (OHWI) is neither, and
    is copied here once, at compile time. A plain MN-major weight (GPT-2's Conv1D) is left as
    it is: the tensor-core template stages both orientations through cp.async (ldmatrix or
    ldmatrix.trans), and a copy would double the weight's memory for no measured gain. An
    8-bit one (an int8 weight of _int_mm) is copied K-major, though: ldmatrix cannot
    transpose bytes, and the template reads an MN-major 8-bit tile element by element.
    """
    import torch

    constants = dict(graph.constants)
    changed = False
    for n in graph.nodes:
        if not isinstance(n, ComputeOp):
            continue
        for operand, side, k_axes in _product_operands(n):
            t = constants.get(operand.tensor.name)
            if t is None:
                continue
            k_major = t.dtype in (torch.int8, torch.uint8)  # see the docstring
            if _is_plain(operand, t.stride(), side, k_axes, k_major=k_major):
                continue
            strides = _k_major_strides(operand, t.shape, side, k_axes)
            if strides is None:
                continue
            copy = torch.empty_strided(tuple(t.shape), strides, dtype=t.dtype, device=t.device)
            constants[operand.tensor.name] = copy.copy_(t)
            changed = True
    return graph.replace(constants=constants) if changed else graph


def _product_operands(n: ComputeOp):
    """(operand element, its side's axes, the K axes) for each operand of `n` when `n` is a
    sum of a product (see ir/contraction.py) whose operand reads one tensor element
    at plain indices (possibly widened by a cast)."""
    d = n.definition
    reduces = collect(d.body, Reduce)
    if len(reduces) != 1 or reduces[0].kind != "sum":
        return []
    red = reduces[0]
    outer = [(v, x) for v, x in zip(d.axes, d.shape) if not (isinstance(x, int) and x == 1)]
    sides = product_sides(red.body, tuple(outer), tuple(red.axes))
    if sides is None:
        return []
    out = []
    for e, side in ((sides.a, sides.m), (sides.b, sides.n)):
        el = _strip_casts(e)
        if isinstance(el, TensorElement) and isinstance(el.tensor, TensorInput):
            if all(isinstance(i, (Var, Const)) for i in el.indices):
                out.append((el, [v for v, _ in side], list(red.axes)))
    return out


def _strip_casts(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.a
    return e


def _is_plain(
    el: TensorElement, strides, side: list[Var], k_axes: list[Var], *, k_major: bool = False
) -> bool:
    """Whether the element offsets along the side's axes and along K each form one strided
    run (each axis' stride its inner neighbour's times that one's extent), one of them with
    unit stride (K's, when `k_major`)."""
    along = {v: (s, x) for v, s, x in zip(el.indices, strides, el.tensor.shape)}
    runs = []
    for axes in (side, k_axes):
        kept = [along[v] for v in axes if v in along and along[v][1] != 1]
        for (s_outer, _), (s_inner, x_inner) in zip(kept, kept[1:]):
            if s_outer != s_inner * x_inner:
                return False
        runs.append(kept[-1][0] if kept else 1)
    return runs[1] == 1 if k_major else 1 in runs


def _k_major_strides(el: TensorElement, shape, side: list[Var], k_axes: list[Var]):
    """Strides for the tensor `el` reads that make its K axes innermost (in `k_axes` order),
    then its side's axes, then the rest; None when an axis is not a plain index."""
    dims = list(range(len(shape)))
    rank = {}
    for order, v in enumerate([*side, *k_axes]):
        for d in dims:
            if el.indices[d] == v:
                rank[d] = order
    outer = [d for d in dims if d not in rank]
    ordered = outer + sorted(rank, key=rank.get)
    strides = [0] * len(shape)
    acc = 1
    for d in reversed(ordered):
        strides[d] = acc
        acc *= shape[d]
    return tuple(strides)
