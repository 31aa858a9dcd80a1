"""Reductions: sum, mean, max/min, prod, var/std, argmax/argmin, any/all, logsumexp, vector
norms.

Statistics that need two passes (var, logsumexp) are small DAGs of computes: a first
reduction kept with keepdim's shape, read back at the projected index by the second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from minicomp.ir import types as T
from minicomp.ir.compute import Compute, TensorNode, compute, reduce
from minicomp.ir.expr import (
    Expr,
    binary,
    call,
    cast,
    const,
    dim_expr,
    eq,
    maximum,
    ne,
    prod,
    select,
)
from minicomp.ops.common import check_dtypes, normalize_dims, opmath
from minicomp.ops.registry import NotLowerable, register_lowering

aten = torch.ops.aten


def reduce_dims(x: TensorNode, dims) -> tuple[int, ...]:
    """The reduced dims of `x` as sorted non-negative ints (None or [] means all)."""
    return () if len(x.shape) == 0 else normalize_dims(dims, len(x.shape))


def reduced_shape(x: TensorNode, dims: Sequence[int], keepdim: bool) -> tuple:
    """The shape of a reduction of `x` over `dims`."""
    if keepdim:
        return tuple(1 if d in dims else s for d, s in enumerate(x.shape))
    return tuple(s for d, s in enumerate(x.shape) if d not in dims)


def project(idx: Sequence[Expr], dims: Sequence[int]) -> tuple[Expr, ...]:
    """The index into a keepdim-shaped reduction that full-shape element `idx` reads."""
    return tuple(const(0) if d in dims else i for d, i in enumerate(idx))


def reduce_compute(
    name: str,
    kind: str,
    x: TensorNode,
    dims: Sequence[int],
    keepdim: bool,
    out_dtype: T.DataType,
    element: Callable[..., Expr],
    shape: tuple | None = None,
) -> Compute:
    """The reduction `kind` of `element(*input_index)` over `dims` of `x`, as `out_dtype`."""
    extents = tuple(x.shape[d] for d in dims)
    kept = [d for d in range(len(x.shape)) if d not in dims]
    shape = reduced_shape(x, dims, keepdim) if shape is None else shape

    def body(*out_idx):
        src = [out_idx[d] for d in kept] if keepdim else list(out_idx)

        def inner(*r):
            rit, sit = iter(r), iter(src)
            return element(*(next(rit) if d in dims else next(sit) for d in range(len(x.shape))))

        return cast(reduce(kind, extents, inner), out_dtype)

    return compute(name, shape, body)


def reduction(ctx, kind, x, dims, keepdim, acc_dtype=None, name=None):
    """The reduction `kind` of `x` over `dims`, accumulated in `acc_dtype`, as ctx's output."""
    check_dtypes(x)
    dims = reduce_dims(x, dims)
    acc = acc_dtype or opmath(ctx.out_dtype)
    return reduce_compute(
        name or ctx.name,
        kind,
        x,
        dims,
        keepdim,
        ctx.out_dtype,
        lambda *i: cast(x[i], acc),
        shape=ctx.out_shape,
    )


def count(x: TensorNode, dims: Sequence[int]) -> Expr:
    """The number of elements reduced over `dims`, as an i64 expression."""
    return dim_expr(prod(x.shape[d] for d in dims))


@register_lowering(aten.sum.dim_IntList)
def sum_dim(ctx, x, dims=None, keepdim=False, *, dtype=None):
    return reduction(ctx, "sum", x, dims, keepdim)


@register_lowering(aten.sum.default)
def sum_all(ctx, x, *, dtype=None):
    return reduction(ctx, "sum", x, None, False)


@register_lowering(aten.prod.dim_int)
def prod_dim(ctx, x, dim, keepdim=False, *, dtype=None):
    return reduction(ctx, "prod", x, [dim], keepdim)


@register_lowering(aten.prod.default)
def prod_all(ctx, x, *, dtype=None):
    return reduction(ctx, "prod", x, None, False)


def mean_of(name: str, x: TensorNode, dims, keepdim: bool, acc: T.DataType, out: T.DataType):
    """The mean of `x` over `dims`: a sum in `acc` divided by the (maybe symbolic) count."""
    total = reduce_compute(f"{name}_sum", "sum", x, dims, keepdim, acc, lambda *i: cast(x[i], acc))
    n = cast(count(x, dims), acc)
    return compute(name, total.shape, lambda *i: cast(total[i] / n, out))


@register_lowering(aten.mean.dim)
def mean_dim(ctx, x, dims=None, keepdim=False, *, dtype=None):
    check_dtypes(x)
    if not ctx.out_dtype.is_float:
        raise NotLowerable("mean of a non-floating type")
    dims = reduce_dims(x, dims)
    return mean_of(ctx.name, x, dims, keepdim, opmath(ctx.out_dtype), ctx.out_dtype)


@register_lowering(aten.mean.default)
def mean_all(ctx, x, *, dtype=None):
    return mean_dim(ctx, x, None, False)


@register_lowering(aten.amax.default)
def amax(ctx, x, dim=(), keepdim=False):
    return reduction(ctx, "max", x, dim, keepdim, acc_dtype=x.dtype)


@register_lowering(aten.amin.default)
def amin(ctx, x, dim=(), keepdim=False):
    return reduction(ctx, "min", x, dim, keepdim, acc_dtype=x.dtype)


def _value_and_index(ctx, kind, x, dim, keepdim):
    check_dtypes(x)
    dims = reduce_dims(x, [dim])
    value = reduce_compute(
        f"{ctx.name}_values",
        kind,
        x,
        dims,
        keepdim,
        ctx.out_dtypes[0],
        lambda *i: x[i],
        shape=ctx.out_shapes[0],
    )
    index = reduce_compute(
        f"{ctx.name}_indices",
        "arg" + kind,
        x,
        dims,
        keepdim,
        ctx.out_dtypes[1],
        lambda *i: x[i],
        shape=ctx.out_shapes[1],
    )
    return value, index


@register_lowering(aten.max.dim)
def max_dim(ctx, x, dim, keepdim=False):
    return _value_and_index(ctx, "max", x, dim, keepdim)


@register_lowering(aten.min.dim)
def min_dim(ctx, x, dim, keepdim=False):
    return _value_and_index(ctx, "min", x, dim, keepdim)


@register_lowering(aten.max.default)
def max_all(ctx, x):
    return reduction(ctx, "max", x, None, False, acc_dtype=x.dtype)


@register_lowering(aten.min.default)
def min_all(ctx, x):
    return reduction(ctx, "min", x, None, False, acc_dtype=x.dtype)


@register_lowering(aten.argmax.default)
def argmax(ctx, x, dim=None, keepdim=False):
    # dim=None reduces every axis; the flat row-major index is what argmax over all gives.
    return reduction(ctx, "argmax", x, None if dim is None else [dim], keepdim, x.dtype)


@register_lowering(aten.argmin.default)
def argmin(ctx, x, dim=None, keepdim=False):
    return reduction(ctx, "argmin", x, None if dim is None else [dim], keepdim, x.dtype)


def _logical(kind):
    def lower(ctx, x, dim=None, keepdim=False):
        return reduction(
            ctx, kind, x, [dim] if isinstance(dim, int) else dim, keepdim, acc_dtype=T.boolean
        )

    return lower


for _kind in ("any", "all"):
    _packet = getattr(aten, _kind)
    register_lowering(_packet.dim, _packet.dims, _packet.default)(_logical(_kind))


class Moments(NamedTuple):
    """Keepdim-shaped row statistics: the variance, the mean, the sum of squared deviations.

    For a row holding an infinity the mean is +-inf (a plain sum); PyTorch's CPU Welford pass
    gives inf or NaN there depending on where the infinity sits, so no choice matches it.
    """

    var: Compute
    mean: Compute
    ssq: Compute


def variance(name, x, dims, correction, acc: T.DataType) -> Moments:
    """The moments of `x` over `dims` in two passes, in `acc`: a first mean, then the squared
    deviations from it and their sum, which corrects both (the corrected two-pass algorithm).

    A plain sum's mean is off by a few ulps per element, and a normalization multiplies that
    by 1/std: a group of nearly equal values came out 10x further from float64 than eager.
    The divisor is max(0, N - correction), so N <= correction gives inf or nan as in PyTorch.
    """
    rough = mean_of(f"{name}_mean0", x, dims, True, acc, acc)
    n = cast(count(x, dims), acc)

    def dev(i):
        return cast(x[i], acc) - rough[project(i, dims)]

    drift = reduce_compute(f"{name}_dev", "sum", x, dims, True, acc, lambda *i: dev(i))
    ssq_raw = reduce_compute(f"{name}_ssq0", "sum", x, dims, True, acc, lambda *i: dev(i) * dev(i))

    def shift(i):
        # NaN when the first mean is infinite: then that mean stands, as a plain sum gives.
        d = drift[i] / n
        return select(ne(d, d), const(0.0, acc), d)

    mean = compute(f"{name}_mean", rough.shape, lambda *i: rough[i] + shift(i))

    def ssq_of(*i):
        s = ssq_raw[i] - drift[i] * shift(i)
        return select(s < const(0.0, acc), const(0.0, acc), s)  # NaN stays NaN

    ssq = compute(f"{name}_ssq", rough.shape, ssq_of)
    denom = maximum(n - cast(correction, acc), const(0.0, acc))
    var = compute(name, ssq.shape, lambda *i: ssq[i] / denom)
    return Moments(var, mean, ssq)


def _moments(ctx, x, dim, correction, keepdim, with_mean: bool, fn=None):
    check_dtypes(x)
    if not x.dtype.is_float:
        raise NotLowerable("var/std of a non-floating type")
    dims = reduce_dims(x, dim)
    correction = 1 if correction is None else correction
    m = variance(f"{ctx.name}_var", x, dims, correction, opmath(ctx.out_dtype))

    def index(*i):
        return tuple(i) if keepdim else expand_index(i, dims, len(x.shape))

    def stat(*i):
        v = m.var[index(*i)]
        return cast(v if fn is None else fn(v), ctx.out_dtypes[0])

    out = compute(f"{ctx.name}_0" if with_mean else ctx.name, ctx.out_shapes[0], stat)
    if not with_mean:
        return out
    mean = compute(
        f"{ctx.name}_1", ctx.out_shapes[1], lambda *i: cast(m.mean[index(*i)], ctx.out_dtypes[1])
    )
    return out, mean


def _sqrt(v):
    return call("sqrt", v)


@register_lowering(aten.var.correction)
def var(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _moments(ctx, x, dim, correction, keepdim, False)


@register_lowering(aten.std.correction)
def std(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _moments(ctx, x, dim, correction, keepdim, False, _sqrt)


@register_lowering(aten.var_mean.correction)
def var_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _moments(ctx, x, dim, correction, keepdim, True)


@register_lowering(aten.std_mean.correction)
def std_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    return _moments(ctx, x, dim, correction, keepdim, True, _sqrt)


@register_lowering(aten.logsumexp.default)
def logsumexp(ctx, x, dim, keepdim=False):
    check_dtypes(x)
    dims = reduce_dims(x, dim)
    acc = opmath(ctx.out_dtype)
    if any(isinstance(x.shape[d], int) and x.shape[d] == 0 for d in dims):
        raise NotLowerable("logsumexp over an empty dim")
    mx = reduce_compute(f"{ctx.name}_max", "max", x, dims, True, acc, lambda *i: cast(x[i], acc))

    def shift(v):
        # As in PyTorch, an infinite maximum shifts by 0: rows of -inf give -inf, not nan.
        return select(call("isinf", v, dtype=T.boolean), const(0.0, acc), v)

    def exp_term(*i):
        return call("exp", cast(x[i], acc) - shift(mx[project(i, dims)]))

    total = reduce_compute(f"{ctx.name}_sum", "sum", x, dims, True, acc, exp_term)

    def body(*i):
        full = tuple(i) if keepdim else expand_index(i, dims, len(x.shape))
        return cast(call("log", total[full]) + shift(mx[full]), ctx.out_dtype)

    return compute(ctx.name, ctx.out_shape, body)


def expand_index(idx, dims, rank):
    """The keepdim-shaped index of a reduction's element `idx` (reduced axes dropped)."""
    it = iter(idx)
    return tuple(const(0) if d in dims else next(it) for d in range(rank))


@register_lowering(aten.linalg_vector_norm.default)
def linalg_vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The `ord`-norm of `x` over `dim` (all dims when None), accumulated in op-math: max or
    min of |x| for +-inf, the count of nonzeros for 0, (sum |x|^ord)^(1/ord) otherwise.

    For orders other than 1 and 2, |x|^ord overflows or underflows long before the norm does
    (0.5^-1000, 9^1000), so each |x| is first divided by the largest |x| of its reduction (the
    smallest for a negative order): every term is then at most 1 and the largest is exactly 1.
    A scale of 0 (all zeros, or a zero under a negative order) gives 0 and one of inf gives inf,
    as the unscaled formula does."""
    check_dtypes(x)
    out = ctx.out_dtype
    if not out.is_float or not x.dtype.is_float:
        raise NotLowerable("vector norm of a non-floating type")
    if not isinstance(ord, (int, float)) or isinstance(ord, bool):
        raise NotLowerable(f"vector norm of order {ord!r}")
    dims = reduce_dims(x, dim)
    acc = opmath(out)
    rank = len(x.shape)

    def magnitude(*i):
        return call("abs", cast(x[i], acc))

    # max or min of |x| (power None), the nonzero count (0), else sum |x|^p then its p-th root.
    if ord in (math.inf, -math.inf):
        kind, power = ("max" if ord > 0 else "min"), None
    else:
        kind, power = "sum", float(ord)
    scaled = power not in (None, 0, 1, 2)
    if scaled:
        extreme = "max" if power > 0 else "min"
        scale = reduce_compute(f"{ctx.name}_{extreme}", extreme, x, dims, True, acc, magnitude)

    def element(*i):
        if power == 0:
            return cast(ne(x[i], const(0, x.dtype)), acc)
        m = magnitude(*i)
        if power in (None, 1):
            return m
        if power == 2:
            return m * m
        s = scale[project(i, dims)]
        return binary("pow", select(eq(s, const(0.0, acc)), m, m / s), const(power, acc))

    total = reduce_compute(f"{ctx.name}_{kind}", kind, x, dims, keepdim, acc, element)

    def norm(*i):
        t = total[i]
        if power == 2:
            t = call("sqrt", t)
        elif scaled:
            s = scale[tuple(i) if keepdim else expand_index(i, dims, rank)]
            root = s * binary("pow", t, const(1.0 / power, acc))
            special = eq(s, const(0.0, acc)) | call("isinf", s, dtype=T.boolean)
            t = select(special, s, root)
            if power > 0:
                # |x| >= 0, so a largest |x| of -inf (max's identity) means an empty
                # reduction, whose norm is 0 (eager rejects empty ones of negative order).
                t = select(eq(s, const(-math.inf, acc)), const(0.0, acc), t)
        return cast(t, out)

    return compute(ctx.name, ctx.out_shape, norm)
