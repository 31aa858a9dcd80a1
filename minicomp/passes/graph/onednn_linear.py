"""CPU matrix products with a constant weight as oneDNN's prepacked linear.

With frozen weights (options.freeze) a linear layer is an ATen `addmm(bias, x, W)` or
`mm(x, W)` whose W [K, N] is a constant (a view of the parameter, transposed, or the
concatenated weights of fused projections, horizontal.py). Here each becomes
`mkldnn._linear_pointwise` over W reordered once by `mkldnn._reorder_linear_weight` for the
product's row count (PackedLinear, onednn_calls.py).

Why oneDNN and not MKL: measured on this machine's AMD EPYC (one thread, process time,
GPT-2's shapes, M = 128 and 1024 rows), ATen's `addmm` (MKL's sgemm) and Inductor's
`mkl._mkl_linear` over an MKL-packed weight take the same time, while oneDNN's f32 linear
takes 0.45 of it (768 -> 3072 at M = 128: 6.27 ms, MKL-packed 6.21, oneDNN 2.76), at float32
accuracy (largest error 9e-7 of the largest output, MKL's 3e-7). MKL's packing gives
nothing; oneDNN's kernel is the win.
"""

from __future__ import annotations

import torch

from minicomp.ir import types as T
from minicomp.ir.graph import ArgRef, ExternOp, Graph, Op, Value
from minicomp.passes.graph.onednn_calls import PackedLinear

aten = torch.ops.aten
mkldnn = torch.ops.mkldnn


def onednn_linears(graph: Graph) -> Graph:
    """`graph` with each `mm` or `addmm` (1-D bias, alpha = beta = 1) of a static row count
    over a constant float32 weight a call of oneDNN's prepacked linear."""
    if not torch.backends.mkldnn.is_available():
        return graph
    nodes = []
    packed: dict[tuple, PackedLinear] = {}  # a weight products share is packed once
    for n in graph.nodes:
        w = _constant_weight(n, graph.constants)
        if w is None:
            nodes.append(n)
            continue
        a = n.inputs[n.args[1 if n.target is aten.addmm.default else 0].index]
        key = (w.untyped_storage().data_ptr(), w.storage_offset(), w.stride(), a.shape[0])
        if key not in packed:
            rows = a.shape[0]
            packed[key] = PackedLinear(mkldnn._reorder_linear_weight(w.t().contiguous(), rows))
        nodes.append(_linear_call(n, a, packed[key]))
    return graph.replace(nodes=tuple(nodes)) if packed else graph


def _constant_weight(n: Op, constants) -> torch.Tensor | None:
    """The constant W [K, N] that product `n` multiplies by, when `n` qualifies; else None."""
    if not isinstance(n, ExternOp) or len(n.outputs) != 1:
        return None
    if n.target is aten.mm.default:
        refs, bias_ok = n.args, not n.kwargs
    elif n.target is aten.addmm.default:
        extra = dict(n.kwargs)
        refs = n.args
        bias_ok = len(refs) == 3 and extra.get("beta", 1) == 1 and extra.get("alpha", 1) == 1
        bias_ok = (
            bias_ok and isinstance(refs[0], ArgRef) and len(n.inputs[refs[0].index].shape) == 1
        )
        refs = refs[1:]
    else:
        return None
    if not bias_ok or len(refs) != 2 or not all(isinstance(r, ArgRef) for r in refs):
        return None
    a, b = (n.inputs[r.index] for r in refs)
    w = constants.get(b.name)
    if w is None or a.type.device != "cpu" or len(a.shape) != 2 or w.dim() != 2:
        return None
    if not all(isinstance(d, int) for d in a.shape):
        return None
    if {v.dtype for v in (*n.inputs, *n.outputs)} != {T.f32} or w.dtype != torch.float32:
        return None
    return w


def _linear_call(n: ExternOp, a: Value, target: PackedLinear) -> ExternOp:
    """The prepacked oneDNN call computing product `n` of activation `a`."""
    with_bias = n.target is aten.addmm.default
    inputs = (a, n.inputs[n.args[0].index]) if with_bias else (a,)
    args = (ArgRef(0), ArgRef(1) if with_bias else None)
    reason = "oneDNN linear, weight prepacked"
    return ExternOp(n.name, inputs, n.outputs, target, args, (), ((),), reason)
