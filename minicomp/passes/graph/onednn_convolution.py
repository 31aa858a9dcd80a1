"""CPU convolutions as oneDNN runs them fastest: channels-last activations, prepacked weights.

ATen's `convolution` on a row-major (NCHW) activation reorders the activation and the weight
into oneDNN's blocked layouts on every call, and on one thread sends 1x1 convolutions at
small batch to its own slower path (`use_mkldnn` in ATen's Convolution.cpp wants a batch of
16, a stride, a dilation, a kernel over 1x1 or several threads). `mkldnn._convolution_pointwise`
on a channels-last (NHWC) activation runs oneDNN's NHWC kernels directly and returns NHWC;
a weight reordered once (`mkldnn._reorder_convolution_weight`, for the input's size) spares
the per-call weight reorder, and a relu after the convolution runs as the kernel's post-op.
Measured on ResNet-50's convolutions, one thread: batch 8, 522 ms NCHW ATen -> about 300 ms;
batch 1, 78 -> 36 ms prepacked (67 ms with the weight reordered per call).

On the cpu target each 2-D convolution with static sizes (float32, or bfloat16 where oneDNN
has it) becomes that call. Its input is made channels-last: a value minicomp's kernels write
and only kernels and these convolutions read is written channels-last in the first place
(its type's strides change; the convolution reads it with exact strides, so layouts_for
keeps them); anything else (a graph input, an ATen result) gets a channels-last copy. Its
result is channels-last too, and stays so where only kernels and convolutions read it; a
result another ATen call reads (or a fused relu's value the graph returns) is copied back to
eager's strides. A convolution whose input or own result the graph returns (a training
forward saving them for its backward) is left to ATen. A relu that alone reads the
convolution's result (a batch norm folded into the convolution, fold_batch_norm.py, leaves
conv -> relu) becomes the call's post-op. With a constant weight (options.freeze) the weight
is prepacked; a weight that is a graph input is passed as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from minicomp.ir import types as T
from minicomp.ir.compute import TensorElement, TensorInput, compute
from minicomp.ir.expr import Binary, Const
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, Op, Value
from minicomp.passes.graph.rewrite import fresh_name, rename_values, value_names

aten = torch.ops.aten


class PackedConvolution:
    """oneDNN's convolution over a weight reordered once into the blocked layout its kernel
    reads for one input size. The packed weight is an opaque MKL-DNN tensor without strides,
    so it is held here rather than among the graph's constants; the call takes the
    activation and the bias (or None)."""

    # The activation is passed as the graph lays it out (channels-last): see layout_constraint.
    layout_constraint = "exact"
    __name__ = "mkldnn._convolution_pointwise (prepacked)"

    def __init__(self, weight: torch.Tensor, conv: _Conv, attr: str):
        self.weight = weight
        self.shape = tuple(weight.shape)
        self.conv = conv
        self.attr = attr

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        c = self.conv
        return torch.ops.mkldnn._convolution_pointwise.default(
            x, self.weight, bias, c.padding, c.stride, c.dilation, c.groups, self.attr, [], ""
        )

    def __repr__(self) -> str:
        return f"PackedConvolution(weight {list(self.shape)}, {self.attr})"


@dataclass(frozen=True)
class _Conv:
    """A convolution the pass rewrites: its ATen call's operands and parameters."""

    op: ExternOp
    x: Value
    weight: Value
    bias: Value | None
    padding: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    groups: int


def onednn_convolutions(graph: Graph) -> Graph:
    """`graph` with each eligible 2-D convolution a oneDNN call on channels-last values (see
    the module's docstring), a relu that alone reads its result fused into it."""
    if not torch.backends.mkldnn.is_available():
        return graph
    returned = graph.output_values()
    # A training forward returns the activations its backward reads: in eager's layout, each
    # would cost a copy on top of the oneDNN call's (not measured to pay), so such
    # convolutions stay ATen's.
    convs = {
        n: c
        for n in graph.nodes
        if (c := _convolution(n)) is not None and not {c.x, n.outputs[0]} & returned
    }
    if not convs:
        return graph
    users = graph.users()
    producers = graph.producers()
    relu_of = {}  # conv op -> the relu op fused into it
    for n in convs:
        readers = users.get(n.outputs[0], [])
        y = n.outputs[0]
        if y not in returned and len(readers) == 1 and _is_relu_of(readers[0], y):
            relu_of[n] = readers[0]
    fused = set(relu_of.values())
    result = {n: (relu_of[n] if n in relu_of else n).outputs[0] for n in convs}

    def kernels_read_only(v: Value) -> bool:
        """Whether only minicomp's kernels and the rewritten convolutions read `v`, and the
        graph does not return it: then it may live in any layout."""
        readers = users.get(v, [])
        return v not in returned and all(
            isinstance(r, ComputeOp) and r not in fused or r in convs for r in readers
        )

    retyped: dict[Value, Value] = {}
    for n in convs:
        if kernels_read_only(result[n]):
            retyped[result[n]] = _channels_last(result[n])
    results = set(result.values())
    for c in convs.values():
        p = producers.get(c.x)
        kernel_made = isinstance(p, ComputeOp) and p not in fused
        if c.x not in results and kernel_made and kernels_read_only(c.x):
            retyped[c.x] = _channels_last(c.x)

    names = value_names(graph)
    constants = graph.constants
    copies: dict[Value, Value] = {}
    nodes: list[Op] = []
    for n in graph.nodes:
        if n in fused:
            continue
        if n not in convs:
            if any(v in retyped for v in n.outputs):
                n = n.replace(outputs=tuple(retyped.get(v, v) for v in n.outputs))
            nodes.append(n)
            continue
        c = convs[n]
        x = retyped.get(c.x, c.x)
        if not _is_channels_last(x):
            if x not in copies:
                copies[x] = _copy(x, _channels_last(x, fresh_name(f"{x.name}_nhwc", names)), nodes)
            x = copies[x]
        r = result[n]
        out = retyped.get(r) or _channels_last(r, fresh_name(f"{r.name}_nhwc", names))
        attr = "relu" if n in relu_of else "none"
        nodes.append(_onednn_call(c, x, out, attr, constants.get(c.weight.name)))
        if r not in retyped:
            _copy(out, r, nodes)  # back to the strides the graph's other readers expect
    return rename_values(graph.replace(nodes=tuple(nodes)), retyped)


def _convolution(n: Op) -> _Conv | None:
    """`n` as a convolution the pass rewrites: a plain 2-D convolution on CPU tensors of
    static sizes, float32 (or bfloat16 where oneDNN computes it); else None."""
    if not isinstance(n, ExternOp) or n.target is not aten.convolution.default:
        return None
    if n.kwargs or len(n.args) != 9 or len(n.outputs) != 1:
        return None
    x_ref, w_ref, b_ref, stride, padding, dilation, transposed, _, groups = n.args
    if transposed or not isinstance(x_ref, ArgRef) or not isinstance(w_ref, ArgRef):
        return None
    if b_ref is not None and not isinstance(b_ref, ArgRef):
        return None
    x, w, out = n.inputs[x_ref.index], n.inputs[w_ref.index], n.outputs[0]
    bias = n.inputs[b_ref.index] if b_ref is not None else None
    if len(x.shape) != 4 or len(w.shape) != 4 or x.type.device != "cpu":
        return None
    if not all(isinstance(d, int) for v in (x, w, out) for d in v.shape):
        return None
    dtypes = {v.dtype for v in (x, w, out, bias) if v is not None}
    bf16 = T.bf16 in dtypes and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtypes != {T.f32} and not (dtypes == {T.bf16} and bf16):
        return None
    params = [_pair(p) for p in (padding, stride, dilation)]
    if None in params or not isinstance(groups, int):
        return None
    return _Conv(n, x, w, bias, *params, groups)


def _pair(p: Any) -> tuple[int, int] | None:
    if isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(d, int) for d in p):
        return (p[0], p[1])
    return None


def _is_relu_of(n: Op, y: Value) -> bool:
    """Whether `n` computes max(y, 0) elementwise over y's own shape (a relu of y)."""
    out = n.outputs[0] if isinstance(n, ComputeOp) else None
    if out is None or n.inputs != (y,) or (out.shape, out.dtype) != (y.shape, y.dtype):
        return False
    d = n.definition
    body = d.body
    if not isinstance(body, Binary) or body.op != "max":
        return False
    element = TensorElement(TensorInput(y.name, y.shape, y.dtype), tuple(d.axes))
    operands = {body.a, body.b}
    zero = [e for e in operands if isinstance(e, Const) and e.value == 0]
    return element in operands and len(zero) == 1


def _onednn_call(c: _Conv, x: Value, out: Value, attr: str, weight: torch.Tensor | None):
    """The oneDNN call computing convolution `c` of `x` into `out`: over a prepacked weight
    when the weight is the constant `weight`, else over the weight value as it is."""
    n = c.op
    reason = f"oneDNN convolution, channels-last{', relu fused' if attr == 'relu' else ''}"
    if weight is not None:
        packed = torch.ops.mkldnn._reorder_convolution_weight(
            weight.contiguous(memory_format=torch.channels_last),
            list(c.padding),
            list(c.stride),
            list(c.dilation),
            c.groups,
            list(x.shape),
        )
        target: Any = PackedConvolution(packed, c, attr)
        inputs: tuple[Value, ...] = (x,) if c.bias is None else (x, c.bias)
        args: tuple = (ArgRef(0), None if c.bias is None else ArgRef(1))
        reason += ", weight prepacked"
    else:
        target = torch.ops.mkldnn._convolution_pointwise.default
        inputs = (x, c.weight) if c.bias is None else (x, c.weight, c.bias)
        bias = None if c.bias is None else ArgRef(2)
        params = (c.padding, c.stride, c.dilation, c.groups, attr, (), "")
        args = (ArgRef(0), ArgRef(1), bias, *params)
    return ExternOp(n.name, inputs, (out,), target, args, (), ((),), reason)


def channels_last_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of an NCHW shape laid out NHWC (torch.channels_last)."""
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _channels_last(v: Value, name: str | None = None) -> Value:
    """`v` (or a value named `name` of its type) laid out channels-last."""
    t = v.type.replace(strides=channels_last_strides(v.shape))
    return Value(name or v.name, t)


def _is_channels_last(v: Value) -> bool:
    """Whether `v` is laid out channels-last (size-1 dims may have any stride)."""
    want = channels_last_strides(v.shape)
    strides = v.type.strides
    if strides is None:
        return False
    return all(d == 1 or s == w for d, s, w in zip(v.shape, strides, want))


def _copy(src: Value, dst: Value, nodes: list[Op]) -> Value:
    """`dst` defined as a copy of `src` (the layouts differ), its compute op appended."""
    t = TensorInput(src.name, src.shape, src.dtype)
    definition = compute(dst.name, dst.shape, lambda *i: t[i])
    nodes.append(ComputeOp("to_layout", (src,), (dst,), definition))
    return dst
