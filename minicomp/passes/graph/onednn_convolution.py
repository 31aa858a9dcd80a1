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
forward saving them for its backward) is left to ATen. The op that alone reads the
convolution's result, when it is a relu, an addition of another value of the same shape, or
both (a batch norm folded into the convolution, fold_batch_norm.py, leaves conv -> relu and
ResNet's conv -> add -> relu), becomes the call's post-op (onednn_calls.py); the call then
sits where that op was, after the addend. With a constant weight (options.freeze) the weight
is prepacked; a weight that is a graph input is passed as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from minicomp.ir import types as T
from minicomp.ir.compute import TensorInput, compute
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, Op, Value
from minicomp.passes.graph.onednn_calls import Convolution, PostOp, onednn_call, post_op
from minicomp.passes.graph.rewrite import fresh_name, rename_values, value_names

aten = torch.ops.aten


def onednn_convolutions(graph: Graph) -> Graph:
    """`graph` with each eligible 2-D convolution a oneDNN call on channels-last values (see
    the module's docstring), with the relu, add or add and relu that alone reads its result
    as the call's post-op."""
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

    def only_reader(v: Value) -> Op | None:
        readers = users.get(v, [])
        return readers[0] if len(readers) == 1 and v not in returned else None

    posts: dict[Op, PostOp] = {}  # conv op -> the post-ops fused into it
    taken: set[Op] = set()
    for n in convs:
        reader = only_reader(n.outputs[0])
        post = None if reader is None else post_op(reader, n.outputs[0])
        if post is not None and post.other is not None:
            post = post_op(reader, n.outputs[0], only_reader(post.result))
        if post is not None and not taken.intersection(post.ops):
            posts[n] = post
            taken.update(post.ops)
    # The call goes where its last post-op was: the addend may come after the convolution.
    at = {p.ops[-1]: n for n, p in posts.items()}
    result = {n: posts[n].result if n in posts else n.outputs[0] for n in convs}

    def kernels_read_only(v: Value) -> bool:
        """Whether only minicomp's kernels and the oneDNN calls read `v`, and the graph does
        not return it: then it may live in any layout."""
        readers = users.get(v, [])
        return v not in returned and all(isinstance(r, ComputeOp) or r in convs for r in readers)

    retyped: dict[Value, Value] = {}
    for n in convs:
        if kernels_read_only(result[n]):
            retyped[result[n]] = _channels_last(result[n])
    results = set(result.values())
    operands = [c.x for c in convs.values()] + [p.other for p in posts.values() if p.other]
    for v in operands:
        p = producers.get(v)
        kernel_made = isinstance(p, ComputeOp) and p not in taken
        if v not in results and kernel_made and kernels_read_only(v):
            retyped[v] = _channels_last(v)

    names = value_names(graph)
    copies: dict[Value, Value] = {}

    def channels_last(v: Value, nodes: list[Op]) -> Value:
        """`v` as the call reads it: itself when channels-last, else its (one) copy."""
        v = retyped.get(v, v)
        if _is_channels_last(v):
            return v
        if v not in copies:
            copies[v] = _copy(v, _channels_last(v, fresh_name(f"{v.name}_nhwc", names)), nodes)
        return copies[v]

    nodes: list[Op] = []
    for n in graph.nodes:
        conv = at.get(n, n if n in convs and n not in posts else None)
        if conv is None:
            if n not in convs and n not in taken:
                if any(v in retyped for v in n.outputs):
                    n = n.replace(outputs=tuple(retyped.get(v, v) for v in n.outputs))
                nodes.append(n)
            continue
        c, post = convs[conv], posts.get(conv)
        x = channels_last(c.x, nodes)
        other = channels_last(post.other, nodes) if post and post.other else None
        r = result[conv]
        out = retyped.get(r, r)
        if not _is_channels_last(out):
            out = _channels_last(r, fresh_name(f"{r.name}_nhwc", names))
        weight = graph.constants.get(c.weight.name)
        nodes.append(onednn_call(c, x, other, out, post, weight))
        if out.name != r.name:
            _copy(out, r, nodes)  # back to the strides the graph's other readers expect
    return rename_values(graph.replace(nodes=tuple(nodes)), retyped)


def _convolution(n: Op) -> Convolution | None:
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
    return Convolution(n, x, w, bias, *params, groups)


def _pair(p: Any) -> tuple[int, int] | None:
    if isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(d, int) for d in p):
        return (p[0], p[1])
    return None


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
