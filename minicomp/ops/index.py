"""Indexing operators: index_select, gather, embedding, advanced indexing, slice/select scatter.

Indices read from tensors follow PyTorch. Advanced indexing (index.Tensor) wraps a negative
index once (index + size); index_select, gather and embedding do not wrap, since eager
PyTorch rejects negative indices there. An index out of range raises an error in eager
PyTorch; a kernel cannot raise, so each index read from a tensor goes through checked_index
(ir/error_flag.py): the load stays in bounds and the plan raises eager's error after the
kernel. Nothing is clamped silently. A gather from a dimension of size 0 has no element to
keep a load on: it stays an ATen call, which raises.
"""

from __future__ import annotations

import torch

from minicomp.ir.compute import TensorNode, compute
from minicomp.ir.error_flag import GATHER_OUT_OF_RANGE, checked_index
from minicomp.ir.expr import Expr, cast, eq, logical_and, select
from minicomp.ops.common import broadcast_index
from minicomp.ops.registry import NotLowerable, register_lowering
from minicomp.ops.shape import canon_dim, clamp_index, slice_start, wrap_index

aten = torch.ops.aten


def _check_index_dtype(index: TensorNode, op: str) -> None:
    if not index.dtype.is_integer:
        raise NotLowerable(f"{op} with {index.dtype.name} indices")


def _element(index: TensorNode, idx) -> Expr:
    """Element `idx` of an index tensor (a 0-d index tensor ignores `idx`)."""
    return index[()] if len(index.shape) == 0 else index[tuple(idx)]


def _check_not_empty(size, op: str) -> None:
    if size == 0:
        raise NotLowerable(f"{op} from a dimension of size 0")


@register_lowering(aten.index_select.default)
def index_select(ctx, x, dim, index):
    _check_index_dtype(index, "index_select")
    rank = len(x.shape)
    d = canon_dim(dim, rank)
    if rank == 0:
        return compute(ctx.name, ctx.out_shape, lambda *i: x[()])
    _check_not_empty(x.shape[d], "index_select")

    def body(*i):
        idx = list(i)
        idx[d] = checked_index(_element(index, (i[d],)), x.shape[d])
        return x[tuple(idx)]

    return compute(ctx.name, ctx.out_shape, body)


@register_lowering(aten.gather.default)
def gather(ctx, x, dim, index, *, sparse_grad=False):
    _check_index_dtype(index, "gather")
    rank = len(x.shape)
    d = canon_dim(dim, rank)
    if rank == 0:
        return compute(ctx.name, ctx.out_shape, lambda *i: x[()])
    _check_not_empty(x.shape[d], "gather")

    def body(*i):
        idx = list(i)
        idx[d] = checked_index(index[tuple(i)], x.shape[d], GATHER_OUT_OF_RANGE)
        return x[tuple(idx)]

    return compute(ctx.name, ctx.out_shape, body)


@register_lowering(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    # padding_idx and the gradient flags only change the backward pass.
    _check_index_dtype(indices, "embedding")
    if len(weight.shape) != 2:
        raise NotLowerable("embedding weight must be 2-d")
    k = len(indices.shape)
    _check_not_empty(weight.shape[0], "embedding")

    def body(*i):
        return weight[checked_index(_element(indices, i[:k]), weight.shape[0]), i[k]]

    return compute(ctx.name, ctx.out_shape, body)


@register_lowering(aten.index.Tensor)
def index(ctx, x, indices):
    """Advanced indexing with integer index tensors broadcast together.

    Adjacent index tensors put the broadcast dims where they stand; index tensors separated
    by a full slice put them first, as in NumPy. Boolean masks (data-dependent shapes) are
    refused.
    """
    rank = len(x.shape)
    indices = list(indices) + [None] * (rank - len(indices))
    if len(indices) > rank:
        raise NotLowerable("too many indices")
    used = [k for k, t in enumerate(indices) if t is not None]
    if not used:
        raise NotLowerable("index without index tensors")
    for k in used:
        if not isinstance(indices[k], TensorNode) or not indices[k].dtype.is_integer:
            raise NotLowerable("index with a boolean mask or a non-tensor index")
    b_rank = max(len(indices[k].shape) for k in used)
    adjacent = used == list(range(used[0], used[-1] + 1))
    out = ctx.out_shape
    first = used[0] if adjacent else 0
    b_shape = out[first : first + b_rank]
    rest = [k for k in range(rank) if indices[k] is None]
    for k in used:
        _check_not_empty(x.shape[k], "index")

    def body(*i):
        b_idx = i[first : first + b_rank]
        # Output dims outside the broadcast block map, in order, onto the unindexed dims.
        free = list(i[:first]) + list(i[first + b_rank :])
        idx: list = [None] * rank
        for k, pos in zip(rest, free):
            idx[k] = pos
        for k in used:
            t = indices[k]
            v = _element(t, broadcast_index(t, b_shape, b_idx))
            idx[k] = checked_index(wrap_index(v, x.shape[k]), x.shape[k])
        return x[tuple(idx)]

    return compute(ctx.name, out, body)


@register_lowering(aten.slice_scatter.default)
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    rank = len(x.shape)
    d = canon_dim(dim, rank)
    if not isinstance(step, int) or step <= 0:
        raise NotLowerable("slice_scatter needs a positive static step")
    begin = slice_start(start, x.shape[d])
    count = src.shape[d]
    if isinstance(count, int) and count == 0:
        return compute(ctx.name, ctx.out_shape, lambda *i: x[i])

    def body(*i):
        rel = i[d] - begin
        j = rel // step
        hit = [i[d] >= begin, j < count]
        if step != 1:
            hit.append(eq(rel % step, 0))
        idx = list(i)
        # rel may be negative off the slice, and C division truncates: clamp both ends.
        idx[d] = clamp_index(j, count)
        return select(logical_and(*hit), cast(src[tuple(idx)], ctx.out_dtype), x[i])

    return compute(ctx.name, ctx.out_shape, body)


@register_lowering(aten.select_scatter.default)
def select_scatter(ctx, x, src, dim, index):
    rank = len(x.shape)
    d = canon_dim(dim, rank)
    pos = wrap_index(index, x.shape[d])

    def body(*i):
        value = cast(src[tuple(i[:d]) + tuple(i[d + 1 :])], ctx.out_dtype)  # eager copies src in
        return select(eq(i[d], pos), value, x[i])

    return compute(ctx.name, ctx.out_shape, body)
