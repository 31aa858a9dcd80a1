"""Horizontal fusion: matrix products sharing their input and reading constant weights become one.

Attention's query, key and value projections (and a gated MLP's gate and up projections) are
separate products of the same activation:

    q = x @ Wq + bq      k = x @ Wk + bk      v = x @ Wv + bv

With constant weights (options.freeze) they are computed as one product over the weights
concatenated along N, built once here, followed by slices of its result:

    qkv = x @ [Wq Wk Wv] + [bq bk bv]      q = qkv[:, :Nq]  k = qkv[:, Nq:Nq+Nk]  v = ...

One wider GEMM reads x once instead of three times and fills the machine better at small
batch; the slices are views that fuse into (or alias for) their readers. Only constant
weights qualify: concatenating weights that are graph inputs would copy all of them on every
call, as much memory traffic as the products themselves at batch 1. The concatenated weight
is a new constant (the parameters it copies stay with their module).

The pass looks at ATen calls of `mm` and `addmm` (alpha = beta = 1, a 1-D bias), so it runs
before the CUDA targets turn them into compute ops (passes/graph/anchors.py); the cpu target
keeps the fused product an ATen call. A weight read through a view of a constant (the
transpose `linear` produces) or any other computation of constants alone is taken by value
(passes/graph/fold_constants.py). Activations are the same value, or equal views of one value
(each `linear` of a 3-D input flattens it with its own `view`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from minicomp.ir import types as T
from minicomp.ir.compute import TensorInput, compute
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, Op, TensorType, Value
from minicomp.passes.graph.fold_constants import constant_value
from minicomp.passes.graph.layout import contiguous_strides
from minicomp.passes.graph.rewrite import fresh_name, value_names

aten = torch.ops.aten

_PRODUCTS = {aten.mm.default: False, aten.addmm.default: True}


@dataclass(frozen=True)
class _Call:
    """An mm/addmm call the pass may fuse: its activation, weight [K, N] and bias [N]."""

    op: ExternOp
    a: Value
    b: Value
    bias: Value | None


@dataclass(frozen=True)
class _Product:
    """A call whose weight (and bias) hold constant tensors."""

    op: ExternOp
    a: Value
    weight: torch.Tensor
    bias: torch.Tensor | None


def fuse_matmuls_sharing_input(graph: Graph) -> Graph:
    """`graph` with every group of two or more mm (or addmm) calls reading the same activation
    and constant weights of one K, dtype and device replaced by one call over the
    concatenated weights and a slice of its result per original product."""
    producers = graph.producers()
    calls: dict[Any, list[_Call]] = {}
    for n in graph.nodes:
        call = _call(n)
        if call is not None:
            calls.setdefault(_group_key(call, producers), []).append(call)
    fused = []
    for group in calls.values():
        # Weights are taken by value only where there is something to fuse.
        products = [p for p in (_product(c, graph.constants, producers) for c in group) if p]
        if len(products) > 1:
            fused.append(products)
    if not fused:
        return graph
    names = value_names(graph)
    constants = dict(graph.constants)
    replaced: dict[ExternOp, list[Op]] = {}
    for products in fused:
        replaced[products[0].op] = _fuse(products, constants, names)
        for p in products[1:]:
            replaced[p.op] = []
    nodes: list[Op] = []
    for n in graph.nodes:
        nodes.extend(replaced.get(n, (n,)))
    return graph.replace(nodes=tuple(nodes), constants=constants)


def _call(n: Op) -> _Call | None:
    """`n` as a product the pass may fuse (alpha = beta = 1), or None."""
    with_bias = _PRODUCTS.get(n.target) if isinstance(n, ExternOp) else None
    if with_bias is None or len(n.outputs) != 1:
        return None
    refs = n.args[:3] if with_bias else n.args[:2]
    extra = dict(n.kwargs)
    if with_bias and (len(n.args) > 3 or extra.get("beta", 1) != 1 or extra.get("alpha", 1) != 1):
        return None
    if not with_bias and (len(n.args) > 2 or extra):
        return None
    if not all(isinstance(r, ArgRef) for r in refs):
        return None
    values = [n.inputs[r.index] for r in refs]
    bias, a, b = values if with_bias else [None, *values]
    if a.dtype != b.dtype or len(b.shape) != 2 or bias is not None and len(bias.shape) != 1:
        return None
    return _Call(n, a, b, bias)


def _group_key(c: _Call, producers: dict) -> tuple:
    """What products fused together share: the activation (up to equal views of one value),
    whether they add a bias, K, dtype and device."""
    a_key: Any = c.a
    producer = producers.get(c.a)
    if isinstance(producer, ComputeOp):
        a_key = (producer.inputs, c.a.type, producer.definition.replace(name=""))
    return (a_key, c.bias is not None, c.b.shape[0], c.b.dtype, c.a.type.device)


def _product(c: _Call, constants: Mapping[str, Any], producers: dict) -> _Product | None:
    """`c` with its weight and bias by value, or None when they are not constants."""
    weight = constant_value(c.b, constants, producers)
    if weight is None or weight.device.type != c.a.type.device:
        return None
    if c.bias is None:
        return _Product(c.op, c.a, weight, None)
    bias = constant_value(c.bias, constants, producers)
    if bias is None or tuple(bias.shape) != (weight.shape[1],) or bias.dtype != weight.dtype:
        return None
    if bias.device != weight.device:
        return None
    return _Product(c.op, c.a, weight, bias)


def _fuse(group: list[_Product], constants: dict, names: set[str]) -> list[Op]:
    """The fused product and the slices of its result that define the originals' outputs."""
    first = group[0]
    weights = [p.weight for p in group]
    if all(w.stride(0) == 1 for w in weights):
        # K-major weights (a linear's transposed [N, K] weight): keep K contiguous, which
        # the matmul templates and BLAS read without a transpose.
        weight = torch.cat([w.t() for w in weights], 0).t()
    else:
        weight = torch.cat(weights, 1)
    k, total = weight.shape
    out0 = first.op.outputs[0]
    device = out0.type.device
    w_value = _constant_value(fresh_name(f"{out0.name}_hweight", names), weight, device)
    constants[w_value.name] = weight
    a = first.a
    if first.bias is not None:
        bias = torch.cat([p.bias for p in group])
        b_value = _constant_value(fresh_name(f"{out0.name}_hbias", names), bias, device)
        constants[b_value.name] = bias
        inputs: tuple[Value, ...] = (b_value, a, w_value)
    else:
        inputs = (a, w_value)
    shape = (a.shape[0], total)
    wide = Value(
        fresh_name(f"{out0.name}_hcat", names),
        TensorType(shape, out0.dtype, device, contiguous_strides(shape)),
    )
    args = tuple(ArgRef(i) for i in range(len(inputs)))
    reason = f"{first.op.reason}; one product for {len(group)} products sharing their input"
    ops: list[Op] = [
        ExternOp(first.op.name, inputs, (wide,), first.op.target, args, (), ((),), reason)
    ]
    src = TensorInput(wide.name, shape, wide.dtype)
    start = 0
    for p in group:
        out = p.op.outputs[0]
        width = p.weight.shape[1]
        definition = compute(out.name, out.shape, lambda i, j, s=start: src[i, j + s])
        ops.append(ComputeOp("slice", (wide,), (out,), definition))
        start += width
    return ops


def _constant_value(name: str, t: torch.Tensor, device: str) -> Value:
    strides = tuple(t.stride())
    return Value(name, TensorType(tuple(t.shape), T.from_torch(t.dtype), device, strides))
