"""Helpers shared by the operator families: broadcasting, promotion, elementwise computes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from minicomp.ir import types as T
from minicomp.ir.compute import Compute, TensorNode, compute
from minicomp.ir.expr import Dim, Expr, as_expr, cast, const
from minicomp.ir.types import DataType
from minicomp.ops.registry import LoweringContext, NotLowerable

Arg = TensorNode | Expr | int | float | bool

SUPPORTED = {T.f16, T.bf16, T.f32, T.f64, T.i8, T.i16, T.i32, T.i64, T.u8, T.boolean} | set(
    T.FLOAT8_TYPES
)


def is_tensor(a) -> bool:
    """Whether a lowering argument is a tensor."""
    return isinstance(a, TensorNode)


def check_dtypes(*args: Arg) -> None:
    """Refuse tensors of dtypes minicomp does not compute with."""
    for a in args:
        if is_tensor(a) and a.dtype not in SUPPORTED:
            raise NotLowerable(f"dtype {a.dtype.name} is not supported")


def opmath(dt: DataType) -> DataType:
    """The type arithmetic on `dt` runs in: f32 for the half and float8 types, as in PyTorch."""
    return T.f32 if T.is_narrow_float(dt) else dt


def broadcast_index(t: TensorNode, out_shape: Sequence[Dim], idx: Sequence[Expr]) -> list[Expr]:
    """The indices of `t` that element `idx` of a broadcast result of `out_shape` reads."""
    offset = len(out_shape) - len(t.shape)
    if offset < 0:
        raise NotLowerable(f"cannot broadcast {t.name} of rank {len(t.shape)} to {out_shape}")
    out = []
    for k, d in enumerate(t.shape):
        out.append(const(0) if isinstance(d, int) and d == 1 else idx[offset + k])
    return out


def load(a: Arg, out_shape: Sequence[Dim], idx: Sequence[Expr], dt: DataType | None) -> Expr:
    """Element `idx` of argument `a` broadcast to `out_shape`, converted to `dt`."""
    if is_tensor(a):
        e = a[tuple(broadcast_index(a, out_shape, idx))]
    else:
        e = as_expr(a, dt)
    return e if dt is None else cast(e, dt)


def elementwise(
    ctx: LoweringContext,
    fn: Callable[..., Expr],
    *args: Arg,
    compute_dtype: DataType | None = None,
    name: str | None = None,
) -> Compute:
    """The output of `fn` applied elementwise to broadcast arguments.

    Inputs are converted to `compute_dtype` (default: the op-math type of the output
    dtype), and the result to the output dtype PyTorch computed for this node.
    """
    check_dtypes(*args)
    out_dtype = ctx.out_dtype
    cdt = compute_dtype or opmath(out_dtype)
    shape = ctx.out_shape

    def body(*idx):
        return cast(fn(*(load(a, shape, idx, cdt) for a in args)), out_dtype)

    return compute(name or ctx.name, shape, body)


def result_type(*args: Arg) -> DataType:
    """PyTorch's result type of tensors and scalars (0-dim tensors rank below others)."""
    import torch

    fakes = []
    for a in args:
        if is_tensor(a):
            shape = [1] * len(a.shape)
            fakes.append(torch.empty(shape, dtype=T.to_torch(a.dtype), device="meta"))
        elif isinstance(a, Expr):
            fakes.append(1.0 if a.dtype.is_float else 1)
        else:
            fakes.append(a)
    out = fakes[0]
    if len(fakes) == 1:
        return T.from_torch(out.dtype) if isinstance(out, torch.Tensor) else _scalar_type(out)
    dt = torch.result_type(fakes[0], fakes[1])
    for f in fakes[2:]:
        dt = torch.promote_types(
            dt,
            torch.result_type(torch.empty((), dtype=dt), f)
            if not isinstance(f, torch.Tensor)
            else f.dtype,
        )
    return T.from_torch(dt)


def _scalar_type(v) -> DataType:
    if isinstance(v, bool):
        return T.boolean
    return T.i64 if isinstance(v, int) else T.f32


def normalize_dims(dims, rank: int) -> tuple[int, ...]:
    """Dimension arguments as sorted non-negative ints (None or [] means every dim)."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({d % rank if rank else 0 for d in dims}))
