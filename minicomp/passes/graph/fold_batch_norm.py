"""Batch norm folded into the convolution before it, when its statistics and affine are constants.

An inference batch norm is a per-channel affine function of its input,

    y = (x - mean[c]) * rsqrt(var[c] + eps) * weight[c] + bias[c]  =  a[c] * x + b[c],

and the batch norm lowering (ops/norm.py) computes it as one elementwise expression of x. With
frozen weights (options.freeze) a[c] and b[c] are constants, and a convolution followed by the
affine is one convolution with weight w[c] * a[c] and bias bias[c] * a[c] + b[c], computed
once here: the batch norm's pass over the activation is gone, on the cpu target (where it was
a kernel of its own after the ATen convolution) and on the CUDA targets (where it was the
implicit GEMM's epilogue) alike.

The pass matches any compute op that is affine in its one non-constant input, the output of a
convolution it alone reads, with coefficients that depend on the channel only: a batch norm,
or a per-channel scale or shift written out. It runs first, before the CUDA targets turn
convolutions into compute ops (passes/graph/anchors.py) and before `fold_constants`, which
would otherwise leave nothing of the batch norm to recognise but the expression itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from minicomp.ir import types as T
from minicomp.ir.compute import Compute, Reduce, TensorElement
from minicomp.ir.expr import Binary, Cast, Expr, Unary, Var, binary, cast, const, unary
from minicomp.ir.functor import collect
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, Op, TensorType, Value
from minicomp.passes.graph.fold_constants import constant_value, folded_value
from minicomp.passes.graph.rewrite import fresh_name, reads_own_element, value_names

aten = torch.ops.aten

FOLDED = "a per-channel affine op (batch norm) folded into its weights"

# (scale, shift) of an expression `scale * x + shift`; None stands for zero.
_Affine = tuple[Expr | None, Expr | None]


@dataclass(frozen=True)
class _Fold:
    """A convolution and the per-channel affine op that alone reads its result."""

    conv: ExternOp
    affine: ComputeOp
    weight: torch.Tensor
    bias: torch.Tensor | None
    scale: torch.Tensor  # a[c], one per output channel
    shift: torch.Tensor  # b[c]


def fold_batch_norms(graph: Graph) -> Graph:
    """`graph` with each convolution whose result only a per-channel affine op with constant
    coefficients reads (an inference batch norm) replaced by one convolution over the folded
    weight and bias, writing the affine op's output."""
    producers = graph.producers()
    users = graph.users()
    returned = graph.output_values()
    folds = []
    for n in graph.nodes:
        if isinstance(n, ComputeOp):
            fold = _match(n, producers, users, returned, graph.constants)
            if fold is not None:
                folds.append(fold)
    if not folds:
        return graph
    names = value_names(graph)
    constants = dict(graph.constants)
    replaced: dict[Op, Op | None] = {}
    for f in folds:
        replaced[f.conv] = _folded_convolution(f, constants, names)
        replaced[f.affine] = None
    nodes = []
    for n in graph.nodes:
        if n not in replaced:
            nodes.append(n)
        elif replaced[n] is not None:
            nodes.append(replaced[n])
    return graph.replace(nodes=tuple(nodes), constants=constants)


def _match(
    n: ComputeOp,
    producers: dict,
    users: dict,
    returned: set,
    constants: Mapping[str, torch.Tensor],
) -> _Fold | None:
    """`n` and the convolution before it when `n` folds into it, else None."""
    conv, x = _convolution_read(n, producers, users, returned)
    if conv is None:
        return None
    weight = constant_value(conv.inputs[conv.args[1].index], constants, producers)
    bias_ref = conv.args[2]
    bias = None
    if bias_ref is not None:
        bias = constant_value(conv.inputs[bias_ref.index], constants, producers)
        if bias is None:
            return None
    if weight is None or not weight.is_floating_point():
        return None
    known = dict(constants)
    for v in n.inputs:
        if v != x:
            t = constant_value(v, constants, producers)
            if t is None:
                return None
            known[v.name] = t
    coefficients = _channel_coefficients(n, x, known)
    if coefficients is None:
        return None
    return _Fold(conv, n, weight, bias, *coefficients)


def _convolution_read(n: ComputeOp, producers: dict, users: dict, returned: set):
    """(the convolution, its result) when `n` reads the result of a plain (not transposed)
    convolution with static sizes that nothing else reads, at `n`'s own shape; else (None,
    None)."""
    candidates = [
        v
        for v in n.inputs
        if isinstance(p := producers.get(v), ExternOp) and p.target is aten.convolution.default
    ]
    if len(candidates) != 1:
        return None, None
    x = candidates[0]
    conv = producers[x]
    out = n.outputs[0]
    if x in returned or len(users.get(x, ())) != 1 or len(conv.outputs) != 1:
        return None, None
    if out.shape != x.shape or out.dtype != x.dtype or len(x.shape) < 3:
        return None, None
    if not all(isinstance(d, int) for d in x.shape) or conv.kwargs or len(conv.args) != 9:
        return None, None
    transposed = conv.args[6]
    if transposed or not isinstance(conv.args[1], ArgRef):
        return None, None
    if conv.args[2] is not None and not isinstance(conv.args[2], ArgRef):
        return None, None
    return conv, x


def _channel_coefficients(n: ComputeOp, x: Value, known: Mapping[str, torch.Tensor]):
    """(a, b) as float64 tensors of one value per channel when `n` computes a[c] * x + b[c]
    (then cast to its own type) for channel c = axis 1; else None."""
    d = n.definition
    if collect(d.body, Reduce):
        return None
    reads = [e for e in collect(d.body, TensorElement) if e.tensor.name == x.name]
    if len(reads) != 1 or not reads_own_element(reads[0], x.name, d.axes, d.shape):
        return None  # x read at other indices than the op's own: no elementwise function
    affine = _affine(d.body, reads[0])
    if affine is None or affine[0] is None:
        return None
    channel = d.axes[1]
    channels = x.shape[1]
    values = []
    for part, coefficient in zip(affine, ("scale", "shift")):
        if part is None:
            values.append(torch.zeros(channels, dtype=torch.float64))
            continue
        if any(v != channel for v in collect(part, Var)):
            return None  # a coefficient varying along another axis than the channel
        value = _evaluated(f"{n.outputs[0].name}_{coefficient}", part, channel, channels, known)
        if value is None:
            return None
        values.append(value.double())
    return tuple(values)


def _affine(e: Expr, x: TensorElement) -> _Affine | None:
    """(a, b) with `e` == a * x + b and a, b free of x; None when `e` is not of that form."""
    if e == x:
        return const(1.0, x.dtype), None
    if x not in collect(e, TensorElement):
        return None, e
    if isinstance(e, Cast) and e.type.is_float:
        inner = _affine(e.a, x)
        return inner and tuple(None if p is None else cast(p, e.type) for p in inner)
    if isinstance(e, Unary) and e.op == "neg":
        inner = _affine(e.a, x)
        return inner and tuple(None if p is None else unary("neg", p) for p in inner)
    if not isinstance(e, Binary) or not e.dtype.is_float:
        return None
    if e.op in ("add", "sub"):
        left, right = _affine(e.a, x), _affine(e.b, x)
        if left is None or right is None:
            return None
        return tuple(_combine(e.op, p, q) for p, q in zip(left, right))
    if e.op == "mul" or e.op == "div":
        factor_free = x not in collect(e.b, TensorElement)
        if e.op == "mul" and not factor_free:
            e = Binary("mul", e.b, e.a)  # x on the right: the product commutes
            factor_free = x not in collect(e.b, TensorElement)
        inner = _affine(e.a, x) if factor_free else None
        return inner and tuple(None if p is None else binary(e.op, p, e.b) for p in inner)
    return None


def _combine(op: str, p: Expr | None, q: Expr | None) -> Expr | None:
    if q is None:
        return p
    if p is None:
        return q if op == "add" else unary("neg", q)
    return binary(op, p, q)


def _evaluated(
    name: str, body: Expr, channel: Var, channels: int, known: Mapping[str, torch.Tensor]
) -> torch.Tensor | None:
    """The coefficient `body` (an expression of the channel and constants) for every channel,
    computed as the batch norm kernel would (in its op-math type)."""
    definition = Compute(name, (channels,), (channel,), body)
    read = {e.tensor.name: e.tensor for e in collect(body, TensorElement)}
    inputs = tuple(Value(t.name, TensorType(tuple(t.shape), t.dtype, "cpu")) for t in read.values())
    out = Value(name, TensorType((channels,), definition.dtype, "cpu"))
    op = ComputeOp(name, inputs, (out,), definition)
    value = folded_value(op, {k: known[k].cpu() for k in read})
    return None if value is None else value.reshape(channels)


def _folded_convolution(f: _Fold, constants: dict, names: set[str]) -> ExternOp:
    """The convolution with the affine op folded into its weight and bias, defining the affine
    op's output."""
    w = f.weight
    # In float64, then rounded once to the weight's type.
    per_channel = (-1,) + (1,) * (w.dim() - 1)
    scale, shift = f.scale.to(w.device), f.shift.to(w.device)
    weight = (w.double() * scale.reshape(per_channel)).to(w.dtype)
    bias = shift if f.bias is None else f.bias.double() * scale + shift
    bias = bias.to(w.dtype)
    conv = f.conv
    device = conv.inputs[conv.args[0].index].type.device
    out = f.affine.outputs[0]
    w_value = _new_constant(fresh_name(f"{out.name}_folded_weight", names), weight, device)
    b_value = _new_constant(fresh_name(f"{out.name}_folded_bias", names), bias, device)
    constants[w_value.name] = weight
    constants[b_value.name] = bias
    inputs = (conv.inputs[conv.args[0].index], w_value, b_value)
    args = (ArgRef(0), ArgRef(1), ArgRef(2), *conv.args[3:])
    reason = "; ".join(r for r in (conv.reason, FOLDED) if r)
    return conv.replace(inputs=inputs, outputs=(out,), args=args, reason=reason)


def _new_constant(name: str, t: torch.Tensor, device: str) -> Value:
    strides = tuple(t.stride())
    return Value(name, TensorType(tuple(t.shape), T.from_torch(t.dtype), device, strides))
