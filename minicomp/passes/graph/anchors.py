"""Matrix products as compute ops on the CUDA targets, so that templates can take them whole.

The importer leaves `mm`, `bmm`, `addmm`, `baddbmm` and `_int_mm` as ATen calls, which is
what the cpu target keeps (ATen's GEMM beats a generated loop nest there). On CUDA this pass
rewrites each into a compute op, a sum over K of a product, in the accumulator type (f32 for
f16 and bf16; i32 for `_int_mm`'s 8-bit integers, i8 or u8, whose i32 sums wrap modulo 2^32
as eager's do):

    mm[i, j] = cast(sum_k cast(a[i, k], acc) * cast(b[k, j], acc), out)

`addmm`/`baddbmm` add a second, elementwise op, `alpha * mm + beta * bias` (bias broadcast),
computed in the accumulator type before the final cast. Fusion then groups injective
producers (transposes, casts) into the product's operands and injective consumers (the bias,
an activation, a residual) after it, and the CUDA scheduler recognises the fused group as a
contraction (minicomp.ir.contraction) that a matmul template computes.

`_scaled_mm` (float8 e4m3fn/e5m2 operands, f32 scales) becomes the same f32 sum of the
operands widened, and a second op applying the scales and the bias in f32 before the cast to
the output type: `mm * (scale_a * scale_b) + bias` per tensor, `mm * scale_a[i] * scale_b[j] +
bias` row-wise. Only calls that every ATen kernel computes that way are lowered, the ones
eager accepts on CUDA as well as on the CPU (`_scaled_mm_form`: A row-major and B column-major,
K and N multiples of 16, an f16/bf16/f32 output, no scale_result, a bias of the output's type,
row-wise scales only with an e4m3fn B and a 16-bit output, and on a CUDA device sm_89 or
newer, `arch`); any other stays ATen's call, which computes it or raises what eager raises.

`convolution` (1 to 3 spatial dims, not transposed, any stride, padding, dilation and groups)
becomes a sum over the input channels of its group and the kernel taps, the padding a guard:

    conv[n, o, p, q] = sum_{c, r, s} x[n, g * Cg + c, p*sh + r*dh - ph, q*sw + s*dw - pw]
                                     * w[o, c, r, s]         (g = o // (O / groups))

where an index outside the input reads 0 (`select(inside, x[clamped index], 0)`: the clamp
keeps every load in bounds, the guard exists only along dims and taps that can leave the
input). With groups == 1 this is a contraction (M = n, p, q; N = o; K = c, r, s; unit taps
left out), computed by a matmul template as an implicit GEMM whose operand loads evaluate the
window. The bias, when given, is a second, elementwise op as for addmm.

When each output channel reads a single input channel (Cg == 1: depthwise convolution, or a
one-channel input) the sum is only over the taps, a handful of products per output. A
reduction would give each output a warp (the CUDA row reduction for short rows) with most
lanes idle and a shuffle tree per output; instead the op is injective, the taps' sum unrolled
in the expression (at most MAX_TAPS), so the injective scheduler computes one output per
thread, stores vectorised and coalesced along the width, and guards only the taps that can
reach the padding.

A grouped convolution (1 < Cg < C, more than one output channel per group) is a batched
GEMM, one per group: in the form above the output channel o both selects the input channels
and indexes the weight (o is read by both operands: no M/N split), so the sum is computed
over outer axes that split it, o = g * Og + oo (Og = O / groups):

    conv5[n, g, oo, p, q] = sum_{c, r, s} x[n, g * Cg + c, ...] * w[g * Og + oo, c, r, s]

g is read by both operands (a batch axis), n, p, q by x only (M), oo by w only (N); the bias
is added in that shape too, and a view then reshapes (N, G, Og, P, Q) to (N, O, P, Q). The
view ends the template's group (fusion cannot store along o // Og and o % Og): it fuses with
the consumers after it, or is a copy of its own when the graph returns it. When PyTorch gives
the output channels-last strides, the 5-d axes run (n, p, q, g, oo) instead, so that the
template writes, and the view reads, memory in the output's order. A grouped convolution with
one output channel per group (Og == 1: no N axis) stays one row reduction over the 4-d output.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from minicomp.backends.cuda.arch import has_float8_mma
from minicomp.ir import types as T
from minicomp.ir.compute import TensorInput, compute, reduce
from minicomp.ir.expr import (
    Expr,
    Var,
    as_expr,
    cast,
    const,
    logical_and,
    maximum,
    minimum,
    select,
)
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, Op, TensorType, Value
from minicomp.passes.graph.rewrite import fresh_name, value_names

aten = torch.ops.aten

_PRODUCTS = {
    aten.mm.default: ("mm", False),
    aten.bmm.default: ("bmm", False),
    aten.addmm.default: ("mm", True),
    aten.baddbmm.default: ("bmm", True),
    aten._int_mm.default: ("mm", False),
}
_ACCUMULATORS = {T.f16: T.f32, T.bf16: T.f32, T.f32: T.f32, T.f64: T.f64}
# _int_mm's operand types (either operand either one); it sums in i32.
_INT_MM_OPERANDS = (T.i8, T.u8)
# _scaled_mm's operand types lowered (either operand either one, not both e5m2) and outputs;
# the fnuz formats are ROCm's, an fp8 output needs scale_result: those stay ATen calls.
_SCALED_MM_OPERANDS = (T.f8e4m3fn, T.f8e5m2)
_SCALED_MM_OUTPUTS = (T.f16, T.bf16, T.f32)
# The most kernel taps a single-channel (depthwise) convolution sums unrolled: 7x7.
MAX_TAPS = 49


def lower_anchors(graph: Graph, *, arch: str | None = None) -> Graph:
    """`graph` with its matrix-product ATen calls replaced by compute ops. `arch` is the CUDA
    architecture the graph compiles for (None: unknown), which decides whether `_scaled_mm` on
    a CUDA device is one eager computes (sm_89 and newer)."""
    names = value_names(graph)
    nodes: list[Op] = []
    changed = False
    for n in graph.nodes:
        lowered = _lower(n, names, arch) if isinstance(n, ExternOp) else None
        nodes.extend(lowered or (n,))
        changed |= lowered is not None
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def _lower(op: ExternOp, names: set[str], arch: str | None = None) -> list[ComputeOp] | None:
    if op.target is aten.convolution.default:
        return _lower_convolution(op, names)
    if op.target is aten._scaled_mm.default:
        return _lower_scaled_mm(op, names, arch)
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
    if op.target is aten._int_mm.default:
        acc = T.i32
        if dt != acc or a.dtype not in _INT_MM_OPERANDS or b.dtype not in _INT_MM_OPERANDS:
            return None
    else:
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
    pname = fresh_name(f"{out.name}_{family}", names)
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


@dataclass(frozen=True)
class _ScaledMm:
    """A `_scaled_mm` call lowered (`_scaled_mm_form`): its operands, scales (`rowwise`: A's
    M x 1 and B's 1 x N; else one element each), bias or None."""

    a: Value
    b: Value
    scale_a: Value
    scale_b: Value
    bias: Value | None
    rowwise: bool


def _scaled_mm_form(op: ExternOp, arch: str | None) -> _ScaledMm | None:
    """The `_scaled_mm` call `op` if eager computes it as the lowering does on every device
    (see the module doc): ATen's checks of torch 2.13 (its meta function, _scaled_mm_out_cuda
    and the row-wise CUTLASS kernel's) all pass, and the CPU's emulation agrees; else None."""
    args = arguments(op)
    refs = [args.get(k) for k in ("self", "mat2", "scale_a", "scale_b")]
    bias_ref = args.get("bias")
    if not all(isinstance(r, ArgRef) for r in refs) or len(op.outputs) != 1:
        return None
    if args.get("scale_result") is not None or not isinstance(bias_ref, ArgRef | None):
        return None
    a, b, sa, sb = (op.inputs[r.index] for r in refs)
    out = op.outputs[0]
    if out.type.device == "cuda" and (arch is None or not has_float8_mma(arch)):
        return None  # eager's CUDA kernel needs compute capability 8.9
    if out.dtype not in _SCALED_MM_OUTPUTS or T.f32 != sa.dtype or T.f32 != sb.dtype:
        return None
    if a.dtype not in _SCALED_MM_OPERANDS or b.dtype not in _SCALED_MM_OPERANDS:
        return None
    if a.dtype == b.dtype == T.f8e5m2:
        return None  # cuBLASLt has no e5m2 x e5m2
    if len(a.shape) != 2 or len(b.shape) != 2:
        return None
    (m, k), (k2, n) = a.shape, b.shape
    if not all(isinstance(d, int) and d > 0 and d % 16 == 0 for d in (k, k2, n)) or k != k2:
        return None
    if isinstance(m, int) and m <= 0:
        return None
    sa_strides, sb_strides = a.type.strides, b.type.strides
    if sa_strides is None or sb_strides is None:
        return None
    if not (sa_strides[1] == 1 and sa_strides[0] > 1 and sb_strides[0] == 1 and sb_strides[1] > 1):
        return None  # A row-major, B column-major
    bias = op.inputs[bias_ref.index] if bias_ref is not None else None
    if bias is not None and (
        out.dtype == T.f32 or bias.dtype != out.dtype or tuple(bias.shape) != (n,)
    ):
        return None  # eager wants a bias of the output's 16-bit type (none with an f32 output)
    if _numel(sa.shape) == 1 and _numel(sb.shape) == 1:
        return _ScaledMm(a, b, sa, sb, bias, rowwise=False)
    rowwise = tuple(sa.shape) == (m, 1) and tuple(sb.shape) == (1, n)
    if not rowwise or b.dtype != T.f8e4m3fn or out.dtype == T.f32:
        return None  # the row-wise kernels take an e4m3fn B and give f16 or bf16
    if sa.type.strides is None or sb.type.strides is None:
        return None
    if sa.type.strides[0] != 1 or sb.type.strides[1] != 1:
        return None  # contiguous scales
    return _ScaledMm(a, b, sa, sb, bias, rowwise=True)


def _numel(shape: tuple) -> int | None:
    return math.prod(shape) if all(isinstance(d, int) for d in shape) else None


def _lower_scaled_mm(op: ExternOp, names: set[str], arch: str | None) -> list[ComputeOp] | None:
    """`_scaled_mm` as a sum of the widened float8 operands' products in f32, then the scales
    and the bias applied in f32 and the cast (see the module doc)."""
    form = _scaled_mm_form(op, arch)
    if form is None:
        return None
    out = op.outputs[0]
    shape, dt, acc = out.shape, out.dtype, T.f32
    ta, tb = (TensorInput(v.name, v.shape, v.dtype) for v in (form.a, form.b))
    k_extent = form.a.shape[1]

    def product(i, j):
        return reduce("sum", (k_extent,), lambda k: cast(ta[i, k], acc) * cast(tb[k, j], acc))

    pname = fresh_name(f"{out.name}_mm", names)
    pvalue = Value(pname, TensorType(shape, acc, out.type.device))
    tprod = TensorInput(pname, shape, acc)
    sa, sb = (TensorInput(v.name, v.shape, v.dtype) for v in (form.scale_a, form.scale_b))
    inputs = [pvalue, form.scale_a, form.scale_b]
    if form.bias is not None:
        tbias = TensorInput(form.bias.name, form.bias.shape, form.bias.dtype)
        inputs.append(form.bias)

    def epilogue(i, j):
        if form.rowwise:
            term = tprod[i, j] * sa[i, 0] * sb[0, j]
        else:
            first = tuple(const(0) for _ in form.scale_a.shape)
            term = tprod[i, j] * (sa[first] * sb[tuple(const(0) for _ in form.scale_b.shape)])
        if form.bias is not None:
            term = term + cast(tbias[j], acc)
        return cast(term, dt)

    return [
        ComputeOp(op.name, (form.a, form.b), (pvalue,), compute(pname, shape, product)),
        ComputeOp(op.name, tuple(inputs), (out,), compute(out.name, shape, epilogue)),
    ]


def arguments(op: ExternOp) -> dict:
    """The call's arguments by their schema names."""
    names = [a.name for a in op.target._schema.arguments]
    return {**dict(zip(names, op.args)), **dict(op.kwargs)}


def conv_params(args: dict, spatial: int) -> tuple[tuple[int, ...], ...] | None:
    """A convolution call's (stride, padding, dilation), one int per spatial dim each, from
    its arguments by name (`arguments`); None where one is not a static int per dim."""
    params = []
    for key in ("stride", "padding", "dilation"):
        p = tuple(args.get(key, ()))
        p = p * spatial if len(p) == 1 else p
        if len(p) != spatial or not all(isinstance(i, int) for i in p):
            return None
        params.append(p)
    return tuple(params)


@dataclass(frozen=True)
class _Conv:
    """A convolution's static parameters, one entry per spatial dim, and its input (`x`),
    weight (`w`) and output shapes."""

    x: TensorInput
    w: TensorInput
    out_shape: tuple
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    @property
    def kernel(self) -> tuple[int, ...]:
        return self.w.shape[2:]

    @property
    def group_in(self) -> int:
        return self.w.shape[1]

    def channel(self, o: Expr, c: Expr | int) -> Expr:
        """The input channel that output channel `o` reads as its group's channel `c`."""
        if self.groups == 1:
            return as_expr(c)
        group = o // (self.w.shape[0] // self.groups)
        return group * self.group_in + c

    def needs_guards(self, d: int, tap: Var | int) -> tuple[bool, bool]:
        """Whether the input index along spatial dim `d` can fall below 0 / past the end, at
        kernel tap `tap` (an int, or a Var running over every tap)."""
        k, pad, dil = self.kernel[d], self.padding[d], self.dilation[d]
        last = tap if isinstance(tap, int) else k - 1
        first = tap if isinstance(tap, int) else 0
        size, out = self.x.shape[2 + d], self.out_shape[2 + d]
        if isinstance(size, int) and isinstance(out, int):
            upper = (out - 1) * self.stride[d] + last * dil - pad > size - 1
        else:
            # ATen's output size gives (out - 1) * stride <= size + 2 pad - (k - 1) dil - 1
            # whatever the input size, so the last index is at most size - 1 plus this.
            upper = pad - (k - 1 - last) * dil > 0
        return first * dil - pad < 0, upper

    def window(self, n: Expr, channel: Expr, pos: tuple, taps: tuple, acc) -> Expr:
        """The input element output position `pos` reads at kernel `taps`, in type `acc`;
        0 in the padding."""
        idx: list[Expr] = [n, channel]
        inside = []
        for d, (p, t) in enumerate(zip(pos, taps)):
            e = p * self.stride[d]
            if isinstance(t, int):
                e = e + (t * self.dilation[d] - self.padding[d])
            else:
                e = e + t * self.dilation[d] - self.padding[d]
            lower, upper = self.needs_guards(d, t)
            if lower:
                inside.append(e >= 0)
                e = maximum(e, 0)
            if upper:
                size = self.x.shape[2 + d]
                inside.append(e < size)
                e = minimum(e, size - 1)
            idx.append(e)
        el = self.x[tuple(idx)]
        if inside:
            return cast(select(logical_and(*inside), el, const(0, el.dtype)), acc)
        return cast(el, acc)

    def taps_sum(self, n: Expr, o: Expr, pos: tuple, acc) -> Expr:
        """The unrolled sum over every kernel tap of a single-channel convolution."""
        total: Expr | None = None
        for taps in itertools.product(*(range(k) for k in self.kernel)):
            term = self.window(n, self.channel(o, 0), pos, taps, acc)
            term = term * cast(self.w[(o, 0, *taps)], acc)
            total = term if total is None else total + term
        assert total is not None
        return total

    @property
    def group_out(self) -> int:
        return self.w.shape[0] // self.groups

    def reduction(self, n: Expr, o: Expr, pos: tuple, acc) -> Expr:
        """The sum over the group's channels and the kernel taps (unit extents left out)."""
        return self._sum(n, o, lambda c: self.channel(o, c), pos, acc)

    def grouped_reduction(self, n: Expr, g: Expr, oo: Expr, pos: tuple, acc) -> Expr:
        """The sum of output channel `oo` of group `g`, each index a loop variable of its own
        (the batched-GEMM form of the module docstring)."""
        o = g * self.group_out + oo
        return self._sum(n, o, lambda c: g * self.group_in + c, pos, acc)

    def _sum(self, n: Expr, o: Expr, channel, pos: tuple, acc) -> Expr:
        extents = [x for x in (self.group_in, *self.kernel) if x != 1]

        def body(*r):
            it = iter(r)
            c = next(it) if self.group_in != 1 else 0
            taps = tuple(next(it) if k != 1 else 0 for k in self.kernel)
            a = self.window(n, channel(c), pos, taps, acc)
            return a * cast(self.w[(o, c, *taps)], acc)

        return reduce("sum", extents, body)


def _lower_convolution(op: ExternOp, names: set[str]) -> list[ComputeOp] | None:
    """A convolution as compute ops (see the module docstring), or None to keep ATen's."""
    args = arguments(op)
    refs = [args.get("input"), args.get("weight")]
    bias_ref = args.get("bias")
    if len(op.outputs) != 1 or args.get("transposed") is not False:
        return None
    if not all(isinstance(r, ArgRef) for r in refs + ([bias_ref] if bias_ref else [])):
        return None
    x, w = (op.inputs[r.index] for r in refs)
    bias = op.inputs[bias_ref.index] if bias_ref is not None else None
    out = op.outputs[0]
    dt = out.dtype
    acc = _ACCUMULATORS.get(dt)
    if acc is None or any(v.dtype != dt for v in (x, w, bias) if v is not None):
        return None
    spatial = len(x.shape) - 2
    if not 1 <= spatial <= 3 or len(w.shape) != len(x.shape) or len(out.shape) != len(x.shape):
        return None
    params = conv_params(args, spatial)
    if params is None:
        return None
    groups = args.get("groups")
    if not isinstance(groups, int) or not all(isinstance(d, int) and d > 0 for d in w.shape):
        return None
    if w.shape[0] % groups:
        return None
    tx, tw = (TensorInput(v.name, v.shape, v.dtype) for v in (x, w))
    conv = _Conv(tx, tw, out.shape, *params, groups)
    inputs = tuple(dict.fromkeys(v for v in (x, w, bias) if v is not None))
    tbias = TensorInput(bias.name, bias.shape, bias.dtype) if bias is not None else None
    if conv.group_in == 1 and math.prod(conv.kernel) <= MAX_TAPS:

        def depthwise(n, o, *pos):
            total = conv.taps_sum(n, o, pos, acc)
            if tbias is not None:
                total = total + cast(tbias[o], acc)
            return cast(total, dt)

        return [ComputeOp(op.name, inputs, (out,), compute(out.name, out.shape, depthwise))]
    if groups > 1 and conv.group_in > 1 and conv.group_out > 1:
        return _grouped_convolution(op, conv, inputs, bias, names)
    if tbias is None:
        definition = compute(
            out.name, out.shape, lambda n, o, *pos: cast(conv.reduction(n, o, pos, acc), dt)
        )
        return [ComputeOp(op.name, inputs, (out,), definition)]
    # The sum in the accumulator type, then the bias as an elementwise op (as for addmm).
    pname = fresh_name(f"{out.name}_conv", names)
    pdef = compute(pname, out.shape, lambda n, o, *pos: conv.reduction(n, o, pos, acc))
    pvalue = Value(pname, TensorType(out.shape, acc, out.type.device))
    tprod = TensorInput(pname, out.shape, acc)

    def add_bias(*idx):
        return cast(tprod[idx] + cast(tbias[idx[1]], acc), dt)

    return [
        ComputeOp(op.name, tuple(dict.fromkeys((x, w))), (pvalue,), pdef),
        ComputeOp(op.name, (pvalue, bias), (out,), compute(out.name, out.shape, add_bias)),
    ]


def _grouped_convolution(
    op: ExternOp, conv: _Conv, inputs: tuple, bias: Value | None, names: set[str]
) -> list[ComputeOp]:
    """A grouped convolution as a batched GEMM over 5-d outer axes, its bias, and the view
    back to the output's shape (see the module docstring)."""
    out = op.outputs[0]
    dt, device = out.dtype, out.type.device
    acc = _ACCUMULATORS[dt]
    og = conv.group_out
    n_size, pos_sizes = out.shape[0], tuple(out.shape[2:])
    last = _channels_last(out)
    if last:
        shape5 = (n_size, *pos_sizes, conv.groups, og)
    else:
        shape5 = (n_size, conv.groups, og, *pos_sizes)

    def split(idx: tuple) -> tuple:
        """(n, g, oo, positions) of a 5-d index."""
        if last:
            return idx[0], idx[-2], idx[-1], tuple(idx[1:-2])
        return idx[0], idx[1], idx[2], tuple(idx[3:])

    def join(n, g, oo, pos: tuple) -> tuple:
        return (n, *pos, g, oo) if last else (n, g, oo, *pos)

    def total(*idx):
        n, g, oo, pos = split(idx)
        return conv.grouped_reduction(n, g, oo, pos, acc)

    name5 = fresh_name(f"{out.name}_groups", names)
    value5 = Value(name5, TensorType(shape5, dt, device))
    if bias is None:
        ops = [ComputeOp(op.name, inputs, (value5,), compute(name5, shape5, _cast_to(total, dt)))]
    else:
        pname = fresh_name(f"{out.name}_conv", names)
        pvalue = Value(pname, TensorType(shape5, acc, device))
        tprod = TensorInput(pname, shape5, acc)
        tbias = TensorInput(bias.name, bias.shape, bias.dtype)

        def add_bias(*idx):
            _, g, oo, _ = split(idx)
            return cast(tprod[idx] + cast(tbias[g * og + oo], acc), dt)

        ops = [
            ComputeOp(
                op.name,
                tuple(v for v in inputs if v != bias),
                (pvalue,),
                compute(pname, shape5, total),
            ),
            ComputeOp(op.name, (pvalue, bias), (value5,), compute(name5, shape5, add_bias)),
        ]
    t5 = TensorInput(name5, shape5, dt)

    def view(n, o, *pos):
        return t5[join(n, o // og, o % og, pos)]

    return [*ops, ComputeOp(op.name, (value5,), (out,), compute(out.name, out.shape, view))]


def _channels_last(v: Value) -> bool:
    """Whether PyTorch gave `v` (an N, C, spatial... tensor) unit stride along C."""
    strides = v.type.strides
    c = v.shape[1]
    return strides is not None and isinstance(c, int) and c > 1 and strides[1] == 1


def _cast_to(fn, dt):
    return lambda *idx: cast(fn(*idx), dt)


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
