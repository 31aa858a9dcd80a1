"""Softmax, log-softmax, layer, group and batch norm as small DAGs of row reductions and an
epilogue.

Every reduction of one op runs over the same input domain and dims, so the fusion pass can
put the reductions and the full-shape epilogue (which reads them at the projected index)
into one kernel. Batch norm in inference is elementwise (per-channel statistics), so it
fuses into its producer, such as a convolution's epilogue.
"""

from __future__ import annotations

import torch

from minicomp.ir.compute import compute
from minicomp.ir.expr import call, cast, const
from minicomp.ops.common import check_dtypes, opmath
from minicomp.ops.reduce import project, reduce_compute, reduce_dims, variance
from minicomp.ops.registry import NotLowerable, register_lowering

aten = torch.ops.aten


def _softmax_parts(ctx, x, dim):
    """(acc type, dims, row max, row sum of exp(x - max)), each reduction keepdim-shaped."""
    check_dtypes(x)
    if not ctx.out_dtype.is_float:
        raise NotLowerable("softmax of a non-floating type")
    acc = opmath(ctx.out_dtype)
    dims = reduce_dims(x, [dim])
    # x - max is nan for rows of -inf (and rows holding +inf), as in PyTorch.
    mx = reduce_compute(f"{ctx.name}_max", "max", x, dims, True, acc, lambda *i: cast(x[i], acc))

    def shifted(i):
        return cast(x[i], acc) - mx[project(i, dims)]

    total = reduce_compute(
        f"{ctx.name}_sum", "sum", x, dims, True, acc, lambda *i: call("exp", shifted(i))
    )
    return acc, dims, shifted, total


@register_lowering(aten._softmax.default)
def softmax(ctx, x, dim, half_to_float=False):
    _, dims, shifted, total = _softmax_parts(ctx, x, dim)
    return compute(
        ctx.name,
        ctx.out_shape,
        lambda *i: cast(call("exp", shifted(i)) / total[project(i, dims)], ctx.out_dtype),
    )


@register_lowering(aten._log_softmax.default)
def log_softmax(ctx, x, dim, half_to_float=False):
    _, dims, shifted, total = _softmax_parts(ctx, x, dim)
    return compute(
        ctx.name,
        ctx.out_shape,
        lambda *i: cast(shifted(i) - call("log", total[project(i, dims)]), ctx.out_dtype),
    )


@register_lowering(aten.native_layer_norm.default)
def native_layer_norm(ctx, x, normalized_shape, weight, bias, eps):
    """(out, mean, rstd): rstd = rsqrt(biased variance + eps) over the trailing dims."""
    check_dtypes(x, weight, bias)
    if not x.dtype.is_float:
        raise NotLowerable("layer norm of a non-floating type")
    rank, k = len(x.shape), len(normalized_shape)
    dims = tuple(range(rank - k, rank))
    acc = opmath(x.dtype)
    moments = variance(f"{ctx.name}_var", x, dims, 0, acc)
    var, mean = moments.var, moments.mean
    rstd = compute(f"{ctx.name}_rstd", var.shape, lambda *i: call("rsqrt", var[i] + eps))

    def normalized(*i):
        p = project(i, dims)
        y = (cast(x[i], acc) - mean[p]) * rstd[p]
        tail = i[rank - k :]
        if weight is not None:
            y = y * cast(weight[tail], acc)
        if bias is not None:
            y = y + cast(bias[tail], acc)
        return cast(y, ctx.out_dtypes[0])

    out = compute(ctx.name, ctx.out_shapes[0], normalized)
    mean_out = compute(
        f"{ctx.name}_mean", ctx.out_shapes[1], lambda *i: cast(mean[i], ctx.out_dtypes[1])
    )
    rstd_out = compute(
        f"{ctx.name}_rstd_out", ctx.out_shapes[2], lambda *i: cast(rstd[i], ctx.out_dtypes[2])
    )
    return out, mean_out, rstd_out


def _batch_norm_out(ctx, x, weight, bias, mean, rstd):
    """(x - mean) * rstd * weight[c] + bias[c] in op-math, for channel c = dim 1; `mean` and
    `rstd` give the statistics of output element i."""
    acc = opmath(x.dtype)

    def normalized(*i):
        c = (i[1],)
        y = (cast(x[i], acc) - mean(i)) * rstd(i)
        if weight is not None:
            y = y * cast(weight[c], acc)
        if bias is not None:
            y = y + cast(bias[c], acc)
        return cast(y, ctx.out_dtypes[0])

    return compute(ctx.name, ctx.out_shapes[0], normalized)


def _check_batch_norm(x, *params) -> None:
    check_dtypes(x, *params)
    if not x.dtype.is_float or not all(p.dtype.is_float for p in params if p is not None):
        raise NotLowerable("batch norm of a non-floating type")
    if len(x.shape) < 2:
        raise NotLowerable("batch norm of a tensor without a channel dim")


@register_lowering(aten._native_batch_norm_legit_no_training.default)
def batch_norm_inference(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    """(out, empty, empty): x normalised by the running statistics of its channel (dim 1)."""
    _check_batch_norm(x, weight, bias, running_mean, running_var)
    acc = opmath(x.dtype)

    # The statistics are read in the expression itself rather than through a (C,)-shaped
    # compute: the loop nest of a reduction (a convolution) takes only producers of its own
    # row shape, and this keeps the whole op fusable as the convolution's epilogue.
    def mean(i):
        return cast(running_mean[i[1]], acc)

    def rstd(i):
        return call("rsqrt", cast(running_var[i[1]], acc) + eps)

    out = _batch_norm_out(ctx, x, weight, bias, mean, rstd)
    # In inference ATen saves no statistics: both are empty.
    empties = (
        compute(f"{ctx.name}_{k}", ctx.out_shapes[k], lambda *i, k=k: const(0, ctx.out_dtypes[k]))
        for k in (1, 2)
    )
    return (out, *empties)


@register_lowering(aten._native_batch_norm_legit.no_stats)
def batch_norm_batch_stats(ctx, x, weight, bias, training, momentum, eps):
    """(out, mean, rstd): x normalised by its own per-channel statistics (biased variance)."""
    _check_batch_norm(x, weight, bias)
    if not training:
        raise NotLowerable("batch norm without running statistics in eval mode")
    rank = len(x.shape)
    dims = tuple(d for d in range(rank) if d != 1)
    moments = variance(f"{ctx.name}_var", x, dims, 0, opmath(x.dtype))
    var, mean = moments.var, moments.mean
    rstd = compute(f"{ctx.name}_rstd", var.shape, lambda *i: call("rsqrt", var[i] + eps))
    out = _batch_norm_out(
        ctx, x, weight, bias, lambda i: mean[project(i, dims)], lambda i: rstd[project(i, dims)]
    )

    def saved(k, stat):
        def element(c):
            return cast(
                stat[tuple(c if d == 1 else const(0) for d in range(rank))], ctx.out_dtypes[k]
            )

        return compute(f"{ctx.name}_{k}", ctx.out_shapes[k], element)

    return out, saved(1, mean), saved(2, rstd)


@register_lowering(aten.native_group_norm.default)
def native_group_norm(ctx, x, weight, bias, n, c, hxw, group, eps):
    """(out, mean, rstd): x normalised over each group of C / group channels and all spatial
    positions (biased variance), then scaled per channel; the statistics are (N, group)."""
    check_dtypes(x, weight, bias)
    if not x.dtype.is_float:
        raise NotLowerable("group norm of a non-floating type")
    channels = x.shape[1] if len(x.shape) >= 2 else None
    if not isinstance(channels, int) or not isinstance(group, int) or channels % group:
        raise NotLowerable("group norm needs a constant channel count divisible by group")
    per_group = channels // group
    rank = len(x.shape)
    # x seen as (N, group, C / group, *spatial): the statistics reduce its dims 2 and up.
    grouped_shape = (x.shape[0], group, per_group, *x.shape[2:])
    grouped = compute(
        f"{ctx.name}_grouped",
        grouped_shape,
        lambda b, g, k, *s: x[(b, g * per_group + k, *s)],
    )
    dims = tuple(range(2, rank + 1))
    acc = opmath(x.dtype)
    moments = variance(f"{ctx.name}_var", grouped, dims, 0, acc)
    var, mean = moments.var, moments.mean
    rstd = compute(f"{ctx.name}_rstd", var.shape, lambda *i: call("rsqrt", var[i] + eps))

    def stat(i):
        return (i[0], i[1] // per_group) + (const(0),) * (rank - 1)

    def normalized(*i):
        y = (cast(x[i], acc) - mean[stat(i)]) * rstd[stat(i)]
        if weight is not None:
            y = y * cast(weight[(i[1],)], acc)
        if bias is not None:
            y = y + cast(bias[(i[1],)], acc)
        return cast(y, ctx.out_dtypes[0])

    def saved(k, value):
        rest = (const(0),) * (rank - 1)
        return compute(
            f"{ctx.name}_{k}",
            ctx.out_shapes[k],
            lambda b, g: cast(value[(b, g, *rest)], ctx.out_dtypes[k]),
        )

    out = compute(ctx.name, ctx.out_shapes[0], normalized)
    return out, saved(1, mean), saved(2, rstd)
