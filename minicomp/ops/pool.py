"""Pooling as reductions over each output's window: max (with ATen's indices), average,
adaptive average; two spatial dims, any leading dims.

Along one spatial dim an output `o` reads the input at `o * stride - pad + t * dilation` for
the kernel taps `t < k`; taps outside the input are padding. Max pooling clamps the taps of
each window into its valid range instead of reading a fill value: a clamped tap repeats a
valid element of the same window, which changes neither the maximum nor, since the repeat
comes right before or after the element it copies in the window's order, which element is the
first maximum. So no padding tap is ever chosen, as in ATen, whatever the values (a window of
-inf included). Average pooling sums the input guarded by a select (clamped index, 0 outside)
and divides by ATen's count. Backward ops stay ATen calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minicomp.ir import types as T
from minicomp.ir.compute import TensorNode, compute, reduce
from minicomp.ir.expr import Dim, Expr, as_expr, cast, const, logical_and, maximum, minimum, select
from minicomp.ops.common import check_dtypes, opmath
from minicomp.ops.registry import NotLowerable, register_lowering

aten = torch.ops.aten


def _pair(v, name: str, default=None) -> tuple[int, int]:
    """A pooling parameter given as one int or two (empty: `default`), as two ints."""
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    if not v and default is not None:
        return default
    if len(v) == 1:
        v = v * 2
    if len(v) != 2 or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise NotLowerable(f"{name} must be one or two ints, got {v}")
    return v


def _size_minus_one(size: Dim) -> Dim:
    return size - 1 if isinstance(size, int) else as_expr(size) - 1


@dataclass(frozen=True)
class _Dim:
    """One spatial dim of a pooling: kernel, stride, padding, dilation, input and output size."""

    k: int
    stride: int
    pad: int
    dil: int
    size: Dim
    out: Dim

    def start(self, o: Expr) -> Expr:
        """The input index of output `o`'s first tap (negative in the padding)."""
        return o * self.stride - self.pad

    def may_pass_end(self) -> bool:
        """Whether some window reaches past the input's end (always for symbolic sizes)."""
        if not isinstance(self.size, int) or not isinstance(self.out, int):
            return True
        last = (self.out - 1) * self.stride - self.pad + (self.k - 1) * self.dil
        return last > self.size - 1

    def valid_tap(self, o: Expr, t: Expr) -> Expr:
        """Tap `t` of output `o`'s window clamped to the taps that land inside the input.

        ATen's output size makes every window start before the input's end and end after
        its start, so the range is never empty and both divisions have non-negative
        operands."""
        if self.pad > 0:
            before = maximum(const(self.pad) - o * self.stride, 0)
            first = before if self.dil == 1 else (before + (self.dil - 1)) // self.dil
            t = maximum(t, first)
        if self.may_pass_end():
            room = _size_minus_one(self.size) - self.start(o)
            last = room if self.dil == 1 else room // self.dil
            t = minimum(t, minimum(last, self.k - 1))
        return t

    def guarded(self, o: Expr, t: Expr) -> tuple[Expr, list[Expr]]:
        """The input index of tap `t` of output `o` clamped into the input, and the
        conditions saying it was inside (none where it always is)."""
        e = self.start(o) + t * self.dil
        inside = []
        if self.pad > 0:
            inside.append(e >= 0)
            e = maximum(e, 0)
        if self.may_pass_end():
            inside.append(e < self.size)
            e = minimum(e, _size_minus_one(self.size))
        return e, inside


def _dims(ctx, x: TensorNode, kernel_size, stride, padding, dilation=1) -> tuple[_Dim, _Dim]:
    check_dtypes(x)
    if len(x.shape) not in (3, 4):
        raise NotLowerable("pooling of a tensor that is not 3-D or 4-D")
    kernel = _pair(kernel_size, "kernel_size")
    strides = _pair(stride, "stride", default=kernel)
    pads = _pair(padding, "padding")
    dils = _pair(dilation, "dilation")
    sizes, outs = x.shape[-2:], ctx.out_shape[-2:]
    return tuple(_Dim(*p) for p in zip(kernel, strides, pads, dils, sizes, outs))


def _window_max(ctx, x: TensorNode, dims: Sequence[_Dim], kind: str, name: str, dtype):
    """The max (`kind` "max") or argmax over each output's window of clamped taps: the value,
    or the flat tap index (row-major over the window)."""

    def body(*idx):
        *lead, oh, ow = idx

        def element(rh, rw):
            h = dims[0].start(oh) + dims[0].valid_tap(oh, rh) * dims[0].dil
            w = dims[1].start(ow) + dims[1].valid_tap(ow, rw) * dims[1].dil
            return x[(*lead, h, w)]

        return cast(reduce(kind, (dims[0].k, dims[1].k), element), dtype)

    return compute(name, ctx.out_shape, body)


def _max_pool(ctx, x, kernel_size, stride, padding, dilation, with_indices: bool):
    dims = _dims(ctx, x, kernel_size, stride, padding, dilation)
    values = _window_max(ctx, x, dims, "max", ctx.name, ctx.out_dtypes[0])
    if not with_indices:
        return values
    taps = _window_max(ctx, x, dims, "argmax", f"{ctx.name}_argmax", T.i64)
    width = x.shape[-1]

    def index(*idx):
        *_, oh, ow = idx
        t = taps[idx]
        kw = dims[1].k
        h = dims[0].start(oh) + dims[0].valid_tap(oh, t // kw) * dims[0].dil
        w = dims[1].start(ow) + dims[1].valid_tap(ow, t % kw) * dims[1].dil
        return cast(h * width + w, ctx.out_dtypes[1])

    return values, compute(f"{ctx.name}_indices", ctx.out_shapes[1], index)


@register_lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """(values, indices): the window maxima and the flat index (h * W + w) of each one's
    first occurrence in its input plane, ATen's output size giving ceil_mode's windows.

    A window holding several NaNs gives the first NaN's index (ATen: the last one)."""
    return _max_pool(ctx, x, kernel_size, stride, padding, dilation, with_indices=True)


@register_lowering(aten.max_pool2d.default)
def max_pool2d(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(ctx, x, kernel_size, stride, padding, dilation, with_indices=False)


@register_lowering(aten.avg_pool2d.default)
def avg_pool2d(
    ctx,
    x,
    kernel_size,
    stride=(),
    padding=0,
    ceil_mode=False,
    count_include_pad=True,
    divisor_override=None,
):
    """The window sums (in the op-math type) divided as ATen does: by `divisor_override`,
    else by the window's size clipped to the padded input (`count_include_pad`) or by the
    number of input elements it covers."""
    if not x.dtype.is_float:
        raise NotLowerable("average pooling of a non-floating type")
    if divisor_override is not None and not isinstance(divisor_override, int):
        raise NotLowerable("symbolic divisor_override")
    dims = _dims(ctx, x, kernel_size, stride, padding)
    acc = opmath(ctx.out_dtype)

    def body(*idx):
        *lead, oh, ow = idx

        def element(rh, rw):
            h, h_in = dims[0].guarded(oh, rh)
            w, w_in = dims[1].guarded(ow, rw)
            value = cast(x[(*lead, h, w)], acc)
            inside = h_in + w_in
            return select(logical_and(*inside), value, const(0, acc)) if inside else value

        total = reduce("sum", (dims[0].k, dims[1].k), element)
        if divisor_override is not None:
            divisor: Expr = const(divisor_override)
        else:
            divisor = _count(dims[0], oh, count_include_pad) * _count(
                dims[1], ow, count_include_pad
            )
        return cast(total / cast(divisor, acc), ctx.out_dtype)

    return compute(ctx.name, ctx.out_shape, body)


def _count(d: _Dim, o: Expr, include_pad: bool) -> Expr:
    """How many of output `o`'s taps ATen counts: those inside the padded input
    (`include_pad`), or those inside the input."""
    start = d.start(o)
    end = start + d.k
    if d.may_pass_end():
        limit = d.size + d.pad if isinstance(d.size, int) else as_expr(d.size) + d.pad
        end = minimum(end, limit)
    if include_pad:
        return end - start
    if d.pad > 0:
        start = maximum(start, 0)
    if d.may_pass_end():
        end = minimum(end, d.size)
    return end - start


@register_lowering(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(ctx, x, output_size):
    """Output (i, j) averages input rows [floor(i H / OH), ceil((i + 1) H / OH)) and the
    columns alike: a sum over the largest such window, the taps past each window's own
    extent guarded off."""
    check_dtypes(x)
    if not x.dtype.is_float:
        raise NotLowerable("average pooling of a non-floating type")
    if len(x.shape) not in (3, 4):
        raise NotLowerable("pooling of a tensor that is not 3-D or 4-D")
    sizes, outs = x.shape[-2:], ctx.out_shape[-2:]
    if not all(isinstance(d, int) and d > 0 for d in (*sizes, *outs)):
        raise NotLowerable("adaptive pooling with symbolic or empty sizes")
    acc = opmath(ctx.out_dtype)
    windows = [{_adaptive_end(o, n, s) - o * n // s for o in range(s)} for n, s in zip(sizes, outs)]
    spans = [max(w) for w in windows]
    # Taps past a window's own extent need a guard unless every window has the same extent.
    ragged = [len(w) > 1 for w in windows]

    def body(*idx):
        *lead, oh, ow = idx
        starts, extents = [], []
        for o, n, s in zip((oh, ow), sizes, outs):
            starts.append(o * n // s)
            extents.append((o * n + (n + s - 1)) // s - starts[-1])

        def element(rh, rw):
            inside, index = [], []
            for r, start, extent, guard in zip((rh, rw), starts, extents, ragged):
                if guard:
                    inside.append(r < extent)
                index.append(start + minimum(r, extent - 1) if guard else start + r)
            value = cast(x[(*lead, *index)], acc)
            return select(logical_and(*inside), value, const(0, acc)) if inside else value

        total = reduce("sum", tuple(spans), element)
        return cast(total / cast(extents[0] * extents[1], acc), ctx.out_dtype)

    return compute(ctx.name, ctx.out_shape, body)


def _adaptive_end(o: int, n: int, s: int) -> int:
    return -(-((o + 1) * n) // s)
