"""View and layout operators as index remappings: view, permute, expand, slice, cat, pad...

Every op here is an injective compute whose element reads one element of an input at a
remapped index. A view of a TensorInput remaps in logical (row-major) element order, which
is right whatever the input's strides: strides are applied when a backend loads the element.

Invariant kept by every lowering here: each TensorElement it emits is in bounds for every
output index, even inside the branch of a Select that is not taken (cat, pad and
slice_scatter clamp such indices). Backends and the reference evaluator may therefore
evaluate both branches of a Select, or hoist and speculate loads, without faulting.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from minicomp.ir.compute import Compute, TensorNode, compute
from minicomp.ir.expr import (
    Binary,
    Const,
    Dim,
    Expr,
    ExprLike,
    as_expr,
    cast,
    const,
    logical_and,
    maximum,
    minimum,
    prod,
    select,
)
from minicomp.ops.registry import NotLowerable, register_lowering

aten = torch.ops.aten


# Index arithmetic helpers -----------------------------------------------------------------


def canon_dim(d: int, rank: int) -> int:
    """A dim argument as a non-negative int (a 0-d tensor accepts dims 0 and -1, as in PyTorch)."""
    r = max(rank, 1)
    if not -r <= d < r:
        raise NotLowerable(f"dim {d} out of range for rank {rank}")
    return d % r


def is_one(d: Dim) -> bool:
    """Whether a size is the literal 1."""
    return isinstance(d, int) and d == 1 or isinstance(d, Const) and d.value == 1


def is_zero(d: Dim) -> bool:
    """Whether a size is the literal 0."""
    return isinstance(d, int) and d == 0 or isinstance(d, Const) and d.value == 0


def dmax(a: ExprLike, b: ExprLike) -> ExprLike:
    """max of two sizes or indices, folded when both are ints."""
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return maximum(as_expr(a), b)


def dmin(a: ExprLike, b: ExprLike) -> ExprLike:
    """min of two sizes or indices, folded when both are ints."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return minimum(as_expr(a), b)


def clamp_index(e: Expr, size: Dim, lower: bool = True, upper: bool = True) -> Expr:
    """`e` clamped into [0, size) so that a load in an untaken branch stays in bounds."""
    if lower:
        e = maximum(e, 0)
    if upper:
        e = minimum(e, size - 1 if isinstance(size, int) else as_expr(size) - 1)
    return e


def unravel(flat: Expr, shape) -> list[Expr]:
    """The multi-index of row-major offset `flat` in `shape`."""
    idx = []
    for k, d in enumerate(reversed(shape)):
        if is_one(d):
            idx.append(const(0))
            continue
        last = k == len(shape) - 1
        # The outermost index needs no modulo: flat is already below its extent.
        idx.append(flat if last else flat % d)
        flat = flat // d
    return idx[::-1]


def ravel(idx, shape) -> Expr:
    """The row-major offset of a multi-index in `shape`."""
    flat: Expr = const(0)
    for i, d in zip(idx, shape):
        flat = flat * d + i
    return flat


def _monomial(d: Dim) -> tuple[int, Counter] | None:
    """A size as coefficient × multiset of symbolic factors, or None if not a pure product."""
    if isinstance(d, int):
        return d, Counter()
    if isinstance(d, Const):
        return int(d.value), Counter()
    if isinstance(d, Binary) and d.op == "mul":
        a, b = _monomial(d.a), _monomial(d.b)
        if a is None or b is None:
            return None
        return a[0] * b[0], a[1] + b[1]
    return 1, Counter({d: 1})


def _mono_mul(p, q):
    return p[0] * q[0], p[1] + q[1]


def _divides(p, q) -> bool:
    return p[0] != 0 and q[0] % p[0] == 0 and not (p[1] - q[1])


def _view_groups(src: Sequence[Dim], dst: Sequence[Dim]):
    """Split two shapes of equal numel into runs of equal products, or None if not provable.

    Each run is (src dims range, dst dims range); leftover size-1 dims form runs with an
    empty side. Remapping run by run keeps div/mod off the dims a view leaves alone.
    """
    monos = [_monomial(d) for d in src], [_monomial(d) for d in dst]
    if any(m is None or m[0] == 0 for side in monos for m in side):
        return None
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        if i == len(src) or j == len(dst):
            rest = monos[0][i:] if j == len(dst) else monos[1][j:]
            if any(m != (1, Counter()) for m in rest):
                return None
            groups.append(((i, len(src)), (j, len(dst))))
            break
        i0, j0 = i, j
        p, q = monos[0][i], monos[1][j]
        i, j = i + 1, j + 1
        while p != q:
            ints = not p[1] and not q[1]
            if (ints and p[0] < q[0] or not ints and _divides(p, q)) and i < len(src):
                p, i = _mono_mul(p, monos[0][i]), i + 1
            elif (ints and q[0] < p[0] or not ints and _divides(q, p)) and j < len(dst):
                q, j = _mono_mul(q, monos[1][j]), j + 1
            else:
                return None
        groups.append(((i0, i), (j0, j)))
    return groups


def view_index(idx: Sequence[Expr], out_shape: Sequence[Dim], in_shape: Sequence[Dim]):
    """The index of a tensor of `in_shape` that element `idx` of its view as `out_shape` reads."""
    if tuple(in_shape) == tuple(out_shape):
        return list(idx)
    groups = _view_groups(in_shape, out_shape)
    if groups is None:
        return unravel(ravel(idx, out_shape), in_shape)
    src_idx: list[Expr] = []
    for (a0, a1), (b0, b1) in groups:
        sub_in, sub_out = in_shape[a0:a1], out_shape[b0:b1]
        if len(sub_in) == 1 and len(sub_out) == 1:
            src_idx.append(idx[b0])
        else:
            src_idx.extend(unravel(ravel(idx[b0:b1], sub_out), sub_in))
    return src_idx


def out_name(ctx, k: int) -> str:
    """The name of output `k` of a multi-output op."""
    return f"{ctx.name}_{k}"


# Views --------------------------------------------------------------------------------------


def identity(ctx, x: TensorNode) -> Compute:
    """A copy of `x` (an alias in ATen) as ctx's output."""
    return compute(ctx.name, ctx.out_shape, lambda *i: x[i])


@register_lowering(
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.view_copy.default,
)
def view(ctx, x, size):
    shape = ctx.out_shape
    return compute(ctx.name, shape, lambda *i: x[tuple(view_index(i, shape, x.shape))])


@register_lowering(aten.alias.default, aten.alias_copy.default)
def alias(ctx, x):
    return identity(ctx, x)


@register_lowering(aten._neg_view.default, aten._neg_view_copy.default)
def neg_view(ctx, x):
    """The values of a view with PyTorch's negative bit: what reading it gives (a graph
    takes `x.conj().imag` so); an ATen call would hand our kernels the raw, unnegated data."""
    return compute(ctx.name, ctx.out_shape, lambda *i: -x[i])


@register_lowering(aten.permute.default, aten.permute_copy.default)
def permute(ctx, x, dims):
    rank = len(x.shape)
    dims = [canon_dim(d, rank) for d in dims]
    if sorted(dims) != list(range(rank)):
        raise NotLowerable(f"permute dims {dims} are not a permutation")
    # Output dim j is input dim dims[j], so input dim k reads output index dims.index(k).
    inv = [dims.index(k) for k in range(rank)]
    return compute(ctx.name, ctx.out_shape, lambda *i: x[tuple(i[inv[k]] for k in range(rank))])


@register_lowering(aten.transpose.int, aten.transpose_copy.int)
def transpose(ctx, x, dim0, dim1):
    rank = len(x.shape)
    perm = list(range(rank))
    if rank:
        a, b = canon_dim(dim0, rank), canon_dim(dim1, rank)
        perm[a], perm[b] = perm[b], perm[a]
    return permute(ctx, x, perm)


@register_lowering(aten.t.default, aten.t_copy.default)
def t(ctx, x):
    return transpose(ctx, x, 0, 1) if len(x.shape) == 2 else identity(ctx, x)


@register_lowering(aten.expand.default, aten.expand_copy.default)
def expand(ctx, x, size, *, implicit=False):
    shape = ctx.out_shape
    off = len(shape) - len(x.shape)
    if off < 0:
        raise NotLowerable("expand to a lower rank")

    def body(*i):
        return x[tuple(const(0) if is_one(d) else i[off + k] for k, d in enumerate(x.shape))]

    return compute(ctx.name, shape, body)


@register_lowering(
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze_copy.default,
    aten.squeeze_copy.dim,
    aten.squeeze_copy.dims,
)
def squeeze(ctx, x, dims=None):
    rank = len(x.shape)
    if dims is None:
        dims = range(rank)
    elif isinstance(dims, int):
        dims = [dims]
    dims = {canon_dim(d, rank) for d in dims}
    dropped = {d for d in dims if d < rank and is_one(x.shape[d])}
    if rank - len(dropped) != len(ctx.out_shape):
        # A symbolic size that turned out to be 1 at trace time: we cannot tell which.
        raise NotLowerable("squeeze of a dim whose size is not known to be 1")

    def body(*i):
        it = iter(i)
        return x[tuple(const(0) if d in dropped else next(it) for d in range(rank))]

    return compute(ctx.name, ctx.out_shape, body)


@register_lowering(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(ctx, x, dim):
    rank = len(x.shape) + 1
    d = canon_dim(dim, rank)
    return compute(ctx.name, ctx.out_shape, lambda *i: x[tuple(i[:d] + i[d + 1 :])])


def slice_start(start, size: Dim) -> ExprLike:
    """PyTorch's normalized start of a slice: negatives wrap, then clamp into [0, size]."""
    if start is None:
        return 0
    if isinstance(start, int) and isinstance(size, int):
        if start < 0:
            start += size
        return min(max(start, 0), size)
    if isinstance(start, int):
        # Above the size the slice is empty and its start is never used.
        return start if start >= 0 else dmax(as_expr(size) + start, 0)
    start = cast(start, const(0).dtype)
    wrapped = select(start < 0, start + size, start)
    return minimum(maximum(wrapped, 0), size)


@register_lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    rank = len(x.shape)
    d = canon_dim(dim, rank)
    if isinstance(step, int) and step <= 0:
        raise NotLowerable("slice step must be positive")
    begin = slice_start(start, x.shape[d])

    def body(*i):
        idx = list(i)
        idx[d] = i[d] * step + begin
        return x[tuple(idx)]

    return compute(ctx.name, ctx.out_shape, body)


@register_lowering(aten.narrow.default, aten.narrow_copy.default)
def narrow(ctx, x, dim, start, length):
    d = canon_dim(dim, len(x.shape))
    begin = start + x.shape[d] if isinstance(start, int) and start < 0 else start
    return slice_(ctx, x, d, begin, None, 1)


def wrap_index(i: ExprLike, size: Dim) -> ExprLike:
    """An index that may be negative, wrapped as PyTorch does (i + size when i < 0)."""
    if isinstance(i, int):
        return i + size if i < 0 else i
    i = cast(i, const(0).dtype)
    return select(i < 0, i + size, i)


@register_lowering(aten.select.int, aten.select_copy.int)
def select_int(ctx, x, dim, index):
    rank = len(x.shape)
    d = canon_dim(dim, rank)
    pos = wrap_index(index, x.shape[d])
    return compute(ctx.name, ctx.out_shape, lambda *i: x[tuple(i[:d]) + (pos,) + tuple(i[d:])])


@register_lowering(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(ctx, x, offset=0, dim1=0, dim2=1):
    rank = len(x.shape)
    d1, d2 = canon_dim(dim1, rank), canon_dim(dim2, rank)
    if d1 == d2:
        raise NotLowerable("diagonal of one dim with itself")
    if not isinstance(offset, int):
        raise NotLowerable("symbolic diagonal offset")
    rest = [d for d in range(rank) if d not in (d1, d2)]

    def body(*i):
        idx: list = [None] * rank
        for k, d in enumerate(rest):
            idx[d] = i[k]
        j = i[-1]
        idx[d1] = j + max(-offset, 0)
        idx[d2] = j + max(offset, 0)
        return x[tuple(idx)]

    return compute(ctx.name, ctx.out_shape, body)


@register_lowering(aten.unfold.default, aten.unfold_copy.default)
def unfold(ctx, x, dimension, size, step):
    rank = len(x.shape)
    d = canon_dim(dimension, rank)

    def body(*i):
        idx = list(i[:rank])
        if rank:
            idx[d] = i[d] * step + i[-1]
        return x[tuple(idx)]

    return compute(ctx.name, ctx.out_shape, body)


def _static_meta(meta):
    """(contiguous, storage_offset) of an argument's metadata, or None when unknown."""
    if isinstance(meta, torch.Tensor):
        # A fake tensor with symbolic sizes answers with SymBool/SymInt: treat as unknown.
        contiguous, offset = meta.is_contiguous(), meta.storage_offset()
        if isinstance(contiguous, bool) and isinstance(offset, int):
            return contiguous, offset
        return None
    strides = getattr(meta, "strides", None)
    shape = getattr(meta, "shape", None)
    offset = getattr(meta, "storage_offset", None)
    if strides is None or shape is None or not isinstance(offset, int):
        return None
    expected, acc = [], 1
    for n in reversed(shape):
        expected.append(acc)
        acc = acc * n
    contiguous = all(is_one(n) or st == e for n, st, e in zip(shape, strides, expected[::-1]))
    return contiguous, offset


@register_lowering(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(ctx, x, size, stride, storage_offset=None):
    """Element offsets over the input's storage, only when that storage is `x` itself.

    ctx.arg_meta[0] must describe the input (its fake tensor, or an object with shape,
    strides and storage_offset) as contiguous; every size must be static and every offset
    read must fall inside `x`, else this refuses.
    """
    meta = ctx.meta(0)
    info = _static_meta(meta) if meta is not None else None
    if info is None or not info[0] or not isinstance(info[1], int):
        raise NotLowerable("as_strided of an input not known to be contiguous")
    values = list(size) + list(stride) + list(x.shape) + [storage_offset or 0]
    if not all(isinstance(v, int) for v in values):
        raise NotLowerable("as_strided with symbolic sizes")
    base = (storage_offset if storage_offset is not None else info[1]) - info[1]
    numel = prod(x.shape)
    if any(s < 0 for s in stride):
        raise NotLowerable("negative strides")
    if prod(size) and (base < 0 or base + sum((n - 1) * s for n, s in zip(size, stride)) >= numel):
        raise NotLowerable("as_strided reads outside the input")

    def body(*i):
        flat = const(base)
        for k, s in zip(i, stride):
            flat = flat + k * s
        return x[tuple(unravel(flat, x.shape))]

    return compute(ctx.name, ctx.out_shape, body)


# Copies that move data: cat, split, flip, roll, repeat, pad ---------------------------------


@register_lowering(aten.cat.default)
def cat(ctx, tensors, dim=0):
    shape = ctx.out_shape
    rank = len(shape)
    d = canon_dim(dim, rank)
    # PyTorch skips legacy 1-d empty tensors and contributes nothing for zero-size pieces.
    parts = [t for t in tensors if len(t.shape) == rank and not is_zero(t.shape[d])]
    if not parts:
        return compute(ctx.name, shape, lambda *i: const(0, ctx.out_dtype))
    offsets: list[Dim] = [0]
    for t in parts:
        offsets.append(offsets[-1] + t.shape[d])

    def body(*i):
        def piece(k):
            t = parts[k]
            idx = list(i)
            local = i[d] - offsets[k] if k else i[d]
            # Clamped for the untaken branches of the selects below.
            idx[d] = clamp_index(local, t.shape[d], lower=k > 0, upper=k < len(parts) - 1)
            return cast(t[tuple(idx)], ctx.out_dtype)

        out = piece(len(parts) - 1)
        for k in range(len(parts) - 2, -1, -1):
            out = select(i[d] < offsets[k + 1], piece(k), out)
        return out

    return compute(ctx.name, shape, body)


def _split_outputs(ctx, x, dim) -> tuple[Compute, ...]:
    """One slice of `x` along `dim` per output, sized as PyTorch computed."""
    d = canon_dim(dim, len(x.shape))
    outs, begin = [], 0
    for k, shape in enumerate(ctx.out_shapes):
        b = begin

        def body(*i, b=b):
            idx = list(i)
            idx[d] = i[d] + b
            return x[tuple(idx)]

        outs.append(compute(out_name(ctx, k), shape, body))
        begin = begin + shape[d]
    return tuple(outs)


@register_lowering(
    aten.split_with_sizes.default,
    aten.split.Tensor,
    aten.split.sizes,
    aten.split_with_sizes_copy.default,
    aten.split_copy.Tensor,
)
def split(ctx, x, split_size, dim=0):
    return _split_outputs(ctx, x, dim)


@register_lowering(aten.unbind.int, aten.unbind_copy.int)
def unbind(ctx, x, dim=0):
    rank = len(x.shape)
    d = canon_dim(dim, rank)
    outs = []
    for k, shape in enumerate(ctx.out_shapes):
        outs.append(
            compute(
                out_name(ctx, k),
                shape,
                lambda *i, k=k: x[tuple(i[:d]) + (const(k),) + tuple(i[d:])],
            )
        )
    return tuple(outs)


@register_lowering(aten.flip.default)
def flip(ctx, x, dims):
    rank = len(x.shape)
    flipped = {canon_dim(d, rank) for d in dims} if rank else set()

    def body(*i):
        return x[tuple(x.shape[k] - 1 - i[k] if k in flipped else i[k] for k in range(rank))]

    return compute(ctx.name, ctx.out_shape, body)


def _rolled(i: Expr, shift, n: Dim) -> Expr:
    """The source index of output index `i` of a roll by `shift` over an extent `n`."""
    if not isinstance(shift, int):
        raise NotLowerable("symbolic roll shift")
    if isinstance(n, int):
        if n == 0:
            return i
        s = shift % n
        return i if s == 0 else (i + (n - s)) % n
    # n is symbolic and positive: shift by a non-negative amount below n, then wrap.
    back = (as_expr(n) - shift % n) if shift >= 0 else (const(-shift) % n)
    return (i + back) % n


@register_lowering(aten.roll.default)
def roll(ctx, x, shifts, dims=()):
    rank = len(x.shape)
    shape = ctx.out_shape
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        if len(shifts) != 1:
            raise NotLowerable("roll without dims takes one shift")
        numel = prod(shape)

        def flat_body(*i):
            src = _rolled(ravel(i, shape), shifts[0], numel)
            return x[tuple(unravel(src, shape))]

        return compute(ctx.name, shape, flat_body)
    if len(shifts) != len(dims):
        raise NotLowerable("roll needs one shift per dim")
    by_dim: dict[int, int] = {}
    for s, d in zip(shifts, dims):
        d = canon_dim(d, rank)
        by_dim[d] = by_dim.get(d, 0) + s

    def body(*i):
        return x[
            tuple(_rolled(i[k], by_dim[k], shape[k]) if k in by_dim else i[k] for k in range(rank))
        ]

    return compute(ctx.name, shape, body)


@register_lowering(aten.repeat.default)
def repeat(ctx, x, repeats):
    off = len(repeats) - len(x.shape)
    if off < 0:
        raise NotLowerable("repeat with fewer repeats than dims")

    def body(*i):
        return x[tuple(const(0) if is_one(d) else i[off + k] % d for k, d in enumerate(x.shape))]

    return compute(ctx.name, ctx.out_shape, body)


@register_lowering(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, x, pad, value=0):
    rank = len(x.shape)
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise NotLowerable("padding pairs exceed the rank")
    # pad lists (left, right) pairs starting from the last dim; negative amounts crop.
    pads = {rank - 1 - k: (pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)}
    if not all(isinstance(p, int) for pair in pads.values() for p in pair):
        raise NotLowerable("symbolic padding")
    out_dtype = ctx.out_dtype
    fill = const(value, out_dtype) if not isinstance(value, Expr) else cast(value, out_dtype)
    if any(is_zero(x.shape[d]) and (lo > 0 or hi > 0) for d, (lo, hi) in pads.items()):
        return compute(ctx.name, ctx.out_shape, lambda *i: fill)

    def body(*i):
        idx, valid = list(i), []
        for d, (lo, hi) in pads.items():
            j = i[d] - lo
            n = x.shape[d]
            if lo > 0:
                valid.append(j >= 0)
            if hi > 0:
                valid.append(j < n)
            idx[d] = clamp_index(j, n, lower=lo > 0, upper=hi > 0)
        return select(logical_and(*valid), cast(x[tuple(idx)], out_dtype), fill)

    return compute(ctx.name, ctx.out_shape, body)
