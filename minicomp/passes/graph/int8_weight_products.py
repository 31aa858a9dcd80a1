"""CPU products over int8 weights (weight-only quantization) as ATen's `_weight_int8pack_mm`.

torchao's int8 weight-only linear traces to `mm(x, w_i8.t().to(x.dtype)) * scale (+ bias)`:
the cast makes a dequantized copy of the whole weight on every call, which ATen's GEMM then
reads again, 5 bytes per weight element where the int8 weight is 1. For few rows the
product is bound by reading the weight, and ATen's CPU kernel `_weight_int8pack_mm(x, w_i8,
scales)`, which converts the int8 weight as it multiplies, reads it once. Measured here (one
thread, 2048 x 2048 weight, bf16): 1 row 0.92 -> 0.11 ms, 16 rows 2.90 -> 0.77 ms, but 128
rows 6.88 -> 14.5 ms, so only products of at most MAX_ROWS rows are rewritten. The scale
stays the multiply after the product (scales of one here), which fuses with the bias add, so
the values are rounded as eager rounds them.

ATen's bf16 kernel gives wrong sums (K = 24, 40) or crashes (K = 8, 33, 100) unless K is a
multiple of 16 on this machine's AVX-512 CPU; the rewrite asks for K a multiple of K_MULTIPLE.
"""

from __future__ import annotations

import torch

from minicomp.ir import types as T
from minicomp.ir.compute import TensorElement, TensorInput
from minicomp.ir.expr import Cast, Var
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, TensorType, Value
from minicomp.passes.graph.dce import eliminate_dead_code
from minicomp.passes.graph.layout import contiguous_strides, layouts_for
from minicomp.passes.graph.library_calls import by_design
from minicomp.passes.graph.rewrite import fresh_name, value_names

aten = torch.ops.aten

MAX_ROWS = 32
"""Rows up to which the int8 kernel beats dequantizing and ATen's GEMM (crossover measured
between 16 and 128 rows)."""

K_MULTIPLE = 32
"""What K must be a multiple of: ATen's bf16 kernel needs 16 (see the module docstring)."""

_FLOATS = (T.f32, T.f16, T.bf16)


def int8_weight_products(graph: Graph) -> Graph:
    """`graph` with each `mm(x, cast(w_i8).t())` of at most MAX_ROWS rows on the CPU a call of
    `_weight_int8pack_mm` over the int8 weight; the same graph when there is none."""
    producers = graph.producers()
    layouts = None
    names = value_names(graph)
    constants = dict(graph.constants)
    calls: dict = {}
    for n in graph.nodes:
        if not (isinstance(n, ExternOp) and n.target is aten.mm.default and not n.kwargs):
            continue
        x, w = _operands(n)
        if x is None or not _few_rows(x):
            continue
        source = _int8_source(w, x.dtype, producers)
        if source is None:
            continue
        layouts = layouts or layouts_for(graph)
        # ATen's kernel reads both as row-major (it has crashed on other shapes: see above).
        if any(layouts[v.name] != contiguous_strides(v.shape) for v in (x, source)):
            continue
        scales = Value(
            fresh_name(f"{n.outputs[0].name}_ones", names),
            TensorType((w.shape[1],), x.dtype, "cpu", (1,)),
        )
        constants[scales.name] = torch.ones(w.shape[1], dtype=T.to_torch(x.dtype))
        calls[n] = ExternOp(
            n.name, (x, source, scales), n.outputs, aten._weight_int8pack_mm.default,
            (ArgRef(0), ArgRef(1), ArgRef(2)), (), ((),),
            by_design("cpu", "int8 weight-only GEMM"),
        )  # fmt: skip
    if not calls:
        return graph
    nodes = tuple(calls.get(n, n) for n in graph.nodes)
    return eliminate_dead_code(graph.replace(nodes=nodes, constants=constants))


def _operands(n: ExternOp) -> tuple[Value | None, Value | None]:
    if len(n.args) != 2 or not all(isinstance(a, ArgRef) for a in n.args):
        return None, None
    x, w = (n.inputs[a.index] for a in n.args)
    if x.type.device != "cpu" or x.dtype not in _FLOATS or len(w.shape) != 2:
        return None, None
    return x, w


def _few_rows(x: Value) -> bool:
    rows, k = x.shape
    return isinstance(rows, int) and rows <= MAX_ROWS and isinstance(k, int) and k % K_MULTIPLE == 0


def _int8_source(w: Value, dtype, producers) -> Value | None:
    """The int8 [N, K] graph input or constant that `w` [K, N] is the cast transpose of (through
    injective compute ops such as a permute and a `_to_copy`); else None."""
    axes = (Var("k", T.i64), Var("n", T.i64))
    expr, source = _inlined(w, axes, producers)
    if not isinstance(expr, Cast) or expr.type != dtype or source.dtype != T.i8:
        return None
    read = expr.a
    if not isinstance(read, TensorElement) or read.indices != (axes[1], axes[0]):
        return None
    return source if source.shape == (w.shape[1], w.shape[0]) else None


def _inlined(value: Value, indices: tuple, producers, depth: int = 0):
    """Element `indices` of `value` as an expression reading one graph input or constant, and
    that value, through the injective one-input compute ops that make `value`; (None, None)
    when something else is in the way."""
    op = producers.get(value)
    if op is None:
        return TensorElement(TensorInput(value.name, value.shape, value.dtype), indices), value
    if not isinstance(op, ComputeOp) or not op.definition.is_injective or depth > 8:
        return None, None
    d = op.definition
    body = substitute(d.body, dict(zip(d.axes, indices)))
    reads = collect(body, TensorElement)
    if len(reads) != 1 or len(op.inputs) != 1:
        return None, None
    inner, source = _inlined(op.inputs[0], reads[0].indices, producers, depth + 1)
    if inner is None:
        return None, None
    return substitute(body, {reads[0]: inner}), source
