"""Creation operators: full, zeros/ones, empty, scalar_tensor, arange, iota, tril/triu.

Shapes and dtypes come from ctx (what PyTorch computed): a lowering only says what each
element is. `empty` and its relatives have unspecified contents in PyTorch, so any value is
right; they are lowered to zeros, which keeps results deterministic and is free to fuse.
"""

from __future__ import annotations

import torch

from minicomp.ir import types as T
from minicomp.ir.compute import compute
from minicomp.ir.expr import Expr, cast, const, select
from minicomp.ops.registry import NotLowerable, register_lowering

aten = torch.ops.aten
prims = torch.ops.prims


def filled(ctx, value) -> object:
    """ctx's output with every element `value`, converted to the output dtype."""
    dt = ctx.out_dtype
    if isinstance(value, Expr):
        v = cast(value, dt)
    elif isinstance(value, (bool, int, float)):
        v = const(value, dt)
    else:
        raise NotLowerable(f"fill value of type {type(value).__name__}")
    return compute(ctx.name, ctx.out_shape, lambda *i: v)


@register_lowering(aten.full.default)
def full(ctx, size, fill_value, **kwargs):
    return filled(ctx, fill_value)


@register_lowering(aten.new_full.default)
def new_full(ctx, x, size, fill_value, **kwargs):
    return filled(ctx, fill_value)


@register_lowering(aten.full_like.default)
def full_like(ctx, x, fill_value, **kwargs):
    return filled(ctx, fill_value)


@register_lowering(aten.scalar_tensor.default)
def scalar_tensor(ctx, s, **kwargs):
    return filled(ctx, s)


@register_lowering(
    aten.zeros.default,
    aten.zeros_like.default,
    aten.new_zeros.default,
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_permuted.default,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
)
def zeros(ctx, *args, **kwargs):
    # The empty variants land here too: their contents are unspecified, so zeros are right.
    return filled(ctx, 0)


@register_lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def ones(ctx, *args, **kwargs):
    return filled(ctx, 1)


def _is_integral(v) -> bool:
    if isinstance(v, Expr):
        return not v.dtype.is_float
    return isinstance(v, int) or float(v).is_integer()


def _ramp(ctx, start, step):
    """ctx's 1-d output with element i equal to start + i * step."""
    dt = ctx.out_dtype
    if dt.is_float:
        # PyTorch's CPU kernel accumulates in double and rounds once; do the same.
        acc = T.f64
    elif all(_is_integral(v) for v in (start, step)):
        acc = T.i64
    else:
        raise NotLowerable("integer arange with fractional start or step")
    s0 = cast(start, acc) if isinstance(start, Expr) else const(start, acc)
    st = cast(step, acc) if isinstance(step, Expr) else const(step, acc)
    return compute(ctx.name, ctx.out_shape, lambda i: cast(s0 + cast(i, acc) * st, dt))


@register_lowering(aten.arange.default)
def arange(ctx, end, **kwargs):
    return _ramp(ctx, 0, 1)


@register_lowering(aten.arange.start)
def arange_start(ctx, start, end, **kwargs):
    return _ramp(ctx, start, 1)


@register_lowering(aten.arange.start_step)
def arange_start_step(ctx, start, end, step=1, **kwargs):
    return _ramp(ctx, start, step)


@register_lowering(prims.iota.default)
def iota(ctx, length, *, start, step, **kwargs):
    return _ramp(ctx, start, step)


def _triangle(ctx, x, diagonal: int, lower: bool):
    if len(x.shape) < 2:
        raise NotLowerable("tril/triu need at least 2 dims")
    zero = const(0, ctx.out_dtype)

    def body(*i):
        offset = i[-1] - i[-2]
        keep = offset <= diagonal if lower else offset >= diagonal
        return select(keep, cast(x[i], ctx.out_dtype), zero)

    return compute(ctx.name, ctx.out_shape, body)


@register_lowering(aten.tril.default)
def tril(ctx, x, diagonal=0):
    return _triangle(ctx, x, diagonal, lower=True)


@register_lowering(aten.triu.default)
def triu(ctx, x, diagonal=0):
    return _triangle(ctx, x, diagonal, lower=False)
