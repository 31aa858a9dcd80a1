"""The oneDNN calls of the cpu target. For convolutions: their parameters, the elementwise ops
after a convolution that oneDNN runs as post-ops, and the ATen call (or prepacked callable)
computing one; passes/graph/onednn_convolution.py decides where they go and in which layouts.
For matrix products: oneDNN's linear over a prepacked or an unpacked weight
(passes/graph/onednn_linear.py decides which products)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from minicomp.ir.expr import Binary, Const, Expr
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Op, Value
from minicomp.passes.graph.rewrite import reads_own_element

mkldnn = torch.ops.mkldnn


@dataclass(frozen=True)
class Convolution:
    """A 2-D convolution's operands and parameters, as its ATen call had them."""

    op: ExternOp
    x: Value
    weight: Value
    bias: Value | None
    padding: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    groups: int


@dataclass(frozen=True)
class PostOp:
    """The ops after a convolution that the oneDNN call computes too: relu(y), y + other or
    relu(y + other) of its result y, as one op or an addition and then a relu, each alone
    reading the one before."""

    ops: tuple[ComputeOp, ...]
    other: Value | None  # the addend of a binary post-op
    relu: bool

    @property
    def result(self) -> Value:
        return self.ops[-1].outputs[0]


class PackedConvolution:
    """oneDNN's convolution over a weight reordered once into the blocked layout its kernel
    reads for one input size. The packed weight is an opaque MKL-DNN tensor without strides,
    so it is held here rather than among the graph's constants; the call takes the
    activation, the addend of a binary post-op (when there is one) and the bias (or None)."""

    # Activations are passed as the graph lays them out (channels-last).
    layout_constraint = "exact"
    __name__ = "mkldnn._convolution_pointwise (prepacked)"

    # The in-place form (in_place()) writes its result into the addend, its first argument.
    writes_first_input = False

    def __init__(self, weight: torch.Tensor, conv: Convolution, post: PostOp | None):
        self.weight = weight
        self.shape = tuple(weight.shape)
        self.params = (conv.padding, conv.stride, conv.dilation, conv.groups)
        self.binary = post is not None and post.other is not None
        self.relu = post is not None and post.relu

    def in_place(self) -> PackedConvolution:
        """This call, with a binary post-op, as one that adds into its addend's memory and
        returns it: called (other, x, bias) instead of (x, other, bias)."""
        assert self.binary, "only a residual addition has an addend to write into"
        call = copy.copy(self)
        call.writes_first_input = True
        return call

    def __call__(self, *operands: torch.Tensor | None) -> torch.Tensor:
        if self.writes_first_input:
            other, x, bias = operands
            unary = "relu" if self.relu else None
            return mkldnn._convolution_pointwise_.binary(
                other, x, self.weight, bias, *self.params, "add", None, unary, [], ""
            )
        if self.binary:
            x, other, bias = operands
            unary = "relu" if self.relu else None
            return mkldnn._convolution_pointwise.binary(
                x, other, self.weight, bias, *self.params, "add", None, unary, [], ""
            )
        x, bias = operands
        unary = "relu" if self.relu else "none"
        return mkldnn._convolution_pointwise.default(
            x, self.weight, bias, *self.params, unary, [], ""
        )

    def __repr__(self) -> str:
        post = ("add, " if self.binary else "") + ("relu" if self.relu else "none")
        where = ", in place" if self.writes_first_input else ""
        return f"PackedConvolution(weight {list(self.shape)}, {post}{where})"


def post_op(reader: Op, y: Value, then: Op | None = None) -> PostOp | None:
    """`reader` as a post-op of the convolution computing `y`: an elementwise relu(y),
    y + other or relu(y + other) over y's own shape and type, with `other` of that shape and
    type too; an addition followed by `then`, a relu of its result alone reading it, counts
    as relu(y + other). Else None."""
    post = _post_op(reader, y)
    if post is None or post.relu or then is None:
        return post
    relu = _post_op(then, post.result)
    if relu is None or relu.other is not None:
        return post
    return PostOp((*post.ops, *relu.ops), post.other, True)


def _post_op(reader: Op, y: Value) -> PostOp | None:
    """`reader` as a post-op on its own (see post_op)."""
    if not isinstance(reader, ComputeOp) or y not in reader.inputs or len(reader.inputs) > 2:
        return None
    out = reader.outputs[0]
    if any((v.shape, v.dtype) != (y.shape, y.dtype) for v in (*reader.inputs, out)):
        return None
    d = reader.definition
    body, relu = _without_relu(d.body)
    others = [v for v in reader.inputs if v != y]
    other = others[0] if others else None

    def own(e: Expr, v: Value) -> bool:
        return reads_own_element(e, v.name, d.axes, d.shape)

    if other is None:
        return PostOp((reader,), None, True) if relu and own(body, y) else None
    if not isinstance(body, Binary) or body.op != "add":
        return None
    if own(body.a, y) and own(body.b, other) or own(body.a, other) and own(body.b, y):
        return PostOp((reader,), other, relu)
    return None


def _without_relu(e: Expr) -> tuple[Expr, bool]:
    """(e's operand, True) when `e` is max(operand, 0) (either way round), else (e, False)."""
    if isinstance(e, Binary) and e.op == "max":
        for a, b in ((e.a, e.b), (e.b, e.a)):
            if isinstance(b, Const) and b.value == 0:
                return a, True
    return e, False


def onednn_call(
    c: Convolution,
    x: Value,
    other: Value | None,
    out: Value,
    post: PostOp | None,
    weight: torch.Tensor | None,
) -> ExternOp:
    """The oneDNN call computing convolution `c` of `x` (and its post-op, adding `other`)
    into `out`: over a prepacked weight when the weight is the constant `weight`, else over
    the weight value as it is."""
    relu = post is not None and post.relu
    parts = ["oneDNN convolution, channels-last"]
    parts += ["add fused"] if other is not None else []
    parts += ["relu fused"] if relu else []
    operands = (x,) if other is None else (x, other)
    if weight is not None:
        packed = mkldnn._reorder_convolution_weight(
            weight.contiguous(memory_format=torch.channels_last),
            list(c.padding),
            list(c.stride),
            list(c.dilation),
            c.groups,
            list(x.shape),
        )
        target: Any = PackedConvolution(packed, c, post)
        inputs = operands + (() if c.bias is None else (c.bias,))
        refs = tuple(ArgRef(k) for k in range(len(operands)))
        args: tuple = (*refs, None if c.bias is None else ArgRef(len(operands)))
        parts.append("weight prepacked")
    else:
        inputs = (*operands, c.weight) + (() if c.bias is None else (c.bias,))
        bias = None if c.bias is None else ArgRef(len(inputs) - 1)
        refs = tuple(ArgRef(k) for k in range(len(operands) + 1))
        params = (c.padding, c.stride, c.dilation, c.groups)
        if other is None:
            target = mkldnn._convolution_pointwise.default
            args = (*refs, bias, *params, "relu" if relu else "none", (), "")
        else:
            target = mkldnn._convolution_pointwise.binary
            args = (*refs, bias, *params, "add", None, "relu" if relu else None, (), "")
    return ExternOp(c.op.name, inputs, (out,), target, args, (), ((),), ", ".join(parts))


class PackedLinear:
    """oneDNN's matrix product x @ w.t() + bias over a weight w [N, K] reordered once for
    it (an opaque MKL-DNN tensor, held here as PackedConvolution holds its weight)."""

    __name__ = "mkldnn._linear_pointwise (prepacked)"

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.shape = tuple(weight.shape)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # oneDNN reads the activation row-major; a strided one is copied (as ATen's mm would
        # pack it).
        x = x if x.is_contiguous() else x.contiguous()
        return mkldnn._linear_pointwise.default(x, self.weight, _dense(bias), "none", [], "")

    def __repr__(self) -> str:
        return f"PackedLinear(weight {list(self.shape)})"


class MklPackedLinear:
    """MKL's matrix product x @ w.t() + bias over a weight w [N, K] packed once for `rows` rows
    (`mkl._mkl_reorder_linear_weight`; what Inductor's freezing calls on Intel CPUs). Another
    row count runs over w as it is."""

    __name__ = "mkl._mkl_linear (prepacked)"

    def __init__(self, weight: torch.Tensor, rows: int):
        self.weight = weight
        self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        self.rows = rows
        self.shape = tuple(weight.shape)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x = x if x.is_contiguous() else x.contiguous()
        return torch.ops.mkl._mkl_linear(x, self.packed, self.weight, _dense(bias), self.rows)

    def __repr__(self) -> str:
        return f"MklPackedLinear(weight {list(self.shape)}, {self.rows} rows)"


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ w (+ bias) by oneDNN's linear over the weight as it is: w [K, N] is the transpose
    of the [N, K] weight oneDNN reads, a free view when w is either row-major or column-major
    (an nn.Linear's weight read transposed, GPT-2's Conv1D weight as it is). oneDNN reorders
    a weight of any other layout on every call, measured a thousand times slower than MKL
    (768 -> 3072 at 128 rows: 6.5 s against 6.8 ms), so such a weight goes to ATen's product;
    onednn_linears passes only the two layouts, so that path is a guard."""
    wt = w.t()
    if not (wt.is_contiguous() or w.is_contiguous()):
        return torch.mm(x, w) if bias is None else torch.addmm(bias, x, w)
    return mkldnn._linear_pointwise.default(x, wt, _dense(bias), "none", [], "")


def _dense(bias: torch.Tensor | None) -> torch.Tensor | None:
    """The bias as oneDNN's linear needs it: it reads a strided bias as if it were dense (a
    wrong result, not an error)."""
    return bias if bias is None or bias.is_contiguous() else bias.contiguous()
