"""Matrix products as compute ops on the CUDA targets, so that templates can take them whole.

The importer leaves `mm`, `bmm`, `addmm` and `baddbmm` as ATen calls, which is what the cpu
target keeps (ATen's GEMM beats a generated loop nest there). On CUDA this pass rewrites each
into a compute op, a sum over K of a product, in the accumulator type (f32 for f16 and bf16):

    mm[i, j] = cast(sum_k cast(a[i, k], acc) * cast(b[k, j], acc), out)

`addmm`/`baddbmm` add a second, elementwise op, `alpha * mm + beta * bias` (bias broadcast),
computed in the accumulator type before the final cast. Fusion then groups injective producers
(transposes, casts) into the product's operands and injective consumers (the bias, an
activation, a residual) after it, and the CUDA scheduler recognises the fused group as a
contraction (minicomp.schedule.contraction) that a matmul template computes.
"""

from __future__ import annotations

import torch

from minicomp.ir import types as T
from minicomp.ir.compute import TensorInput, compute, reduce
from minicomp.ir.expr import Expr, cast, const
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, Op, TensorType, Value

aten = torch.ops.aten

_PRODUCTS = {
    aten.mm.default: ("mm", False),
    aten.bmm.default: ("bmm", False),
    aten.addmm.default: ("mm", True),
    aten.baddbmm.default: ("bmm", True),
}
_ACCUMULATORS = {T.f16: T.f32, T.bf16: T.f32, T.f32: T.f32, T.f64: T.f64}


def lower_anchors(graph: Graph) -> Graph:
    """`graph` with its matrix-product ATen calls replaced by compute ops."""
    names = {v.name for v in graph.inputs if isinstance(v, Value)} | set(graph.constants)
    names |= {v.name for n in graph.nodes for v in n.outputs}
    nodes: list[Op] = []
    changed = False
    for n in graph.nodes:
        lowered = _lower(n, names) if isinstance(n, ExternOp) else None
        nodes.extend(lowered or (n,))
        changed |= lowered is not None
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def _lower(op: ExternOp, names: set[str]) -> list[ComputeOp] | None:
    kind = _PRODUCTS.get(op.target)
    if kind is None or len(op.outputs) != 1:
        return None
    family, with_bias = kind
    args = dict(op.kwargs)
    positional = list(op.args)
    if with_bias:
        bias_ref, a_ref, b_ref, *rest = positional
        beta = rest[0] if rest else args.get("beta", 1)
        alpha = rest[1] if len(rest) > 1 else args.get("alpha", 1)
    else:
        a_ref, b_ref = positional[:2]
        bias_ref, beta, alpha = None, 0, 1
    refs = [r for r in (bias_ref, a_ref, b_ref) if r is not None]
    if not all(isinstance(r, ArgRef) for r in refs):
        return None
    if not all(isinstance(s, (int, float)) for s in (alpha, beta)):
        return None  # symbolic scalars stay with ATen
    a, b = op.inputs[a_ref.index], op.inputs[b_ref.index]
    out = op.outputs[0]
    dt = out.dtype
    acc = _ACCUMULATORS.get(dt)
    if acc is None or a.dtype != dt or b.dtype != dt:
        return None
    ta, tb = (TensorInput(v.name, v.shape, v.dtype) for v in (a, b))
    k_extent = a.shape[-1]

    def product(*idx):
        *batch, i, j = idx

        def body(k):
            return cast(ta[(*batch, i, k)], acc) * cast(tb[(*batch, k, j)], acc)

        return reduce("sum", (k_extent,), body)

    shape = out.shape
    if not with_bias or beta == 0:
        scaled = _scaled(product, alpha)
        definition = compute(out.name, shape, lambda *idx: cast(scaled(*idx), dt))
        return [ComputeOp(op.name, (a, b), (out,), definition)]
    # The product in the accumulator type, then alpha * product + beta * bias.
    pname = _fresh(f"{out.name}_{family}", names)
    pdef = compute(pname, shape, product)
    pvalue = Value(pname, TensorType(shape, acc, out.type.device))
    bias = op.inputs[bias_ref.index]
    tbias = TensorInput(bias.name, bias.shape, bias.dtype)
    tprod = TensorInput(pname, shape, acc)

    def epilogue(*idx):
        term: Expr = _scaled(lambda *i: tprod[i], alpha)(*idx)
        b_elem = cast(tbias[_broadcast(idx, bias.shape, shape)], acc)
        if beta != 1:
            b_elem = b_elem * const(beta, acc)
        return cast(term + b_elem, dt)

    return [
        ComputeOp(op.name, (a, b), (pvalue,), pdef),
        ComputeOp(op.name, (pvalue, bias), (out,), compute(out.name, shape, epilogue)),
    ]


def _scaled(fn, alpha):
    if alpha == 1:
        return fn

    def scaled(*idx):
        value = fn(*idx)
        return value * const(alpha, value.dtype)

    return scaled


def _broadcast(idx: tuple, shape: tuple, out_shape: tuple) -> tuple:
    """The index of a tensor of `shape` broadcast to `out_shape` at output index `idx`."""
    lead = len(out_shape) - len(shape)
    return tuple(
        const(0) if isinstance(d, int) and d == 1 and out_shape[lead + q] != 1 else idx[lead + q]
        for q, d in enumerate(shape)
    )


def _fresh(base: str, used: set[str]) -> str:
    name, n = base, 1
    while name in used:
        name, n = f"{base}{n}", n + 1
    used.add(name)
    return name

