"""Softmax, log-softmax and layer norm as small DAGs of row reductions and an epilogue.

Every reduction of one op runs over the same input domain and dims, so the fusion pass can
put the reductions and the full-shape epilogue (which reads them at the projected index)
into one kernel.
"""

from __future__ import annotations

import torch

from minicomp.ir.compute import compute
from minicomp.ir.expr import call, cast
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
