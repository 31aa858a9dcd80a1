"""Elementwise operators: unary and binary math, comparisons, where, casts, activations.

Most ops are rows of tables: (ATen overloads, expression builder). A builder receives the
schema's arguments in order, the first `arity` of them loaded at the output element and
converted to the op's compute type (None and Python scalars as they are otherwise), the rest
as the Python values ATen got. Semantics follow PyTorch's CPU kernels, special values included.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from minicomp.ir import types as T
from minicomp.ir.compute import compute
from minicomp.ir.expr import (
    Expr,
    as_expr,
    binary,
    call,
    cast,
    const,
    eq,
    logical_and,
    maximum,
    minimum,
    ne,
    select,
    unary,
)
from minicomp.ops.common import check_dtypes, load, opmath, result_type
from minicomp.ops.registry import LoweringContext, NotLowerable, register_lowering

aten = torch.ops.aten


def bind(overload, args: tuple, kwargs: dict) -> list:
    """The arguments of a call of `overload` in schema order, defaults filled in."""
    schema = overload._schema.arguments
    out = list(args)
    for a in schema[len(args) :]:
        if a.name in kwargs:
            out.append(kwargs[a.name])
        elif a.has_default_value():
            out.append(a.default_value)
        else:
            raise NotLowerable(f"{overload} called without argument {a.name}")
    return out


def _compute_type(how: str, ctx: LoweringContext, operands: list) -> T.DataType:
    """The type an op's operands are converted to: see `pointwise`."""
    if how == "opmath":
        return opmath(ctx.out_dtype)
    if how == "out":
        return ctx.out_dtype
    present = [a for a in operands if a is not None]
    promoted = result_type(*present)
    return opmath(promoted) if how == "opmath_in" else promoted


def pointwise(overload, fn: Callable[..., Expr], arity: int, how: str = "opmath"):
    """The lowering of `overload` as `fn` of its first `arity` arguments, elementwise.

    `how` picks the compute type: "opmath" of the output (arithmetic), "promote" (the
    operands' result type: comparisons, bitwise and logical ops), "opmath_in" (the op-math
    type of the operands' result type: predicates such as isnan), or "out" (data movement).
    """

    def lower(ctx: LoweringContext, *args, **kwargs):
        values = bind(overload, args, kwargs)
        operands, params = values[:arity], values[arity:]
        check_dtypes(*operands)
        for v in values:
            if isinstance(v, complex):
                raise NotLowerable("complex scalars are not supported")
        cdt = _compute_type(how, ctx, operands)
        shape = ctx.out_shape

        def body(*idx):
            loaded = [None if a is None else load(a, shape, idx, cdt) for a in operands]
            return cast(fn(*loaded, *params), ctx.out_dtype)

        return compute(ctx.name, shape, body)

    return lower


def register_table(table, arity: int, how: str = "opmath") -> None:
    """Register each row (overloads, builder) of a table through `pointwise`."""
    for overloads, fn in table:
        for overload in overloads:
            register_lowering(overload)(pointwise(overload, fn, arity, how))


def _ovl(packet, *names):
    return tuple(getattr(packet, n) for n in names)


# Expression helpers ------------------------------------------------------------------------


def _scaled(y, alpha):
    return y if not isinstance(alpha, Expr) and alpha == 1 else y * alpha


def _fdt(x: Expr) -> bool:
    return x.dtype.is_float


def _math(name):
    return lambda x: call(name, x)


def _int_identity(name):
    # Rounding an integer is the identity in PyTorch (and the math call is float-only).
    return lambda x: call(name, x) if _fdt(x) else x


def _abs(x):
    if _fdt(x):
        return call("abs", x)
    return x if x.dtype.is_bool or x.dtype.kind == "uint" else select(x < 0, -x, x)


def _sign(x):
    if x.dtype.is_bool:
        return x
    # NaN compares false both ways, so sign(nan) is 0 as in PyTorch's CPU kernel.
    return cast(x > 0, x.dtype) - cast(x < 0, x.dtype)


def _isnan(x):
    return call("isnan", x, dtype=T.boolean) if _fdt(x) else const(False)


def _isinf(x):
    return call("isinf", x, dtype=T.boolean) if _fdt(x) else const(False)


def _isfinite(x):
    return logical_and(unary("not", _isnan(x)), unary("not", _isinf(x))) if _fdt(x) else const(True)


def _signed_inf(x, sign: int):
    return eq(x, const(sign * math.inf, x.dtype)) if _fdt(x) else const(False)


def _softplus(x, beta=1, threshold=20):
    bx = _scaled(x, beta)
    soft = call("log1p", call("exp", bx))
    return select(bx > threshold, x, soft if beta == 1 else soft / beta)


def _gelu(x, approximate="none"):
    if approximate == "none":
        # One math function: the cpu target's needs erf only to gelu's own accuracy.
        return call("gelu", x)
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1.0 + call("tanh", inner))
    raise NotLowerable(f"gelu approximate={approximate!r}")


def _hardsigmoid(x):
    return minimum(maximum(x + 3.0, 0.0), 6.0) / 6.0


def _elu(x, alpha=1, scale=1, input_scale=1):
    neg = call("expm1", _scaled(x, input_scale)) * (alpha * scale)
    return select(x <= 0, neg, _scaled(x, scale))


def _clamp(x, lo=None, hi=None):
    # maximum/minimum propagate NaN from either side, like PyTorch's clamp.
    if lo is not None:
        x = maximum(x, lo)
    if hi is not None:
        x = minimum(x, hi)
    return x


def _nan_to_num(x, nan=None, posinf=None, neginf=None, *, out: T.DataType):
    if not _fdt(x):
        return x
    finfo = torch.finfo(T.to_torch(out))
    pos = finfo.max if posinf is None else posinf
    neg = finfo.min if neginf is None else neginf
    x = select(_signed_inf(x, -1), as_expr(neg, x.dtype), x)
    x = select(_signed_inf(x, 1), as_expr(pos, x.dtype), x)
    return select(_isnan(x), as_expr(0.0 if nan is None else nan, x.dtype), x)


def _lerp(a, b, w):
    # PyTorch's formula, exact at both ends.
    w = as_expr(w, a.dtype)
    d = b - a
    return select(_abs(w) < 0.5, a + w * d, b - d * (1.0 - w))


def _div_mode(x, y, rounding_mode=None):
    # Half types divide in float32 with no intermediate rounding, as on CUDA; eager's CPU
    # kernels sometimes round the quotient to the half type first (one unit apart).
    if rounding_mode is None:
        return x / y
    if rounding_mode == "trunc":
        return call("trunc", x / y) if _fdt(x) else binary("div", x, y)
    if rounding_mode == "floor":
        return binary("floordiv", x, y)
    raise NotLowerable(f"rounding_mode={rounding_mode!r}")


def _fmod(x, y):
    # On integers too a call of fmod (C's %): `imod` is index arithmetic, free of zero checks.
    return call("fmod", x, as_expr(y, x.dtype))


def _bin(op: str):
    return lambda x, y: binary(op, x, y)


def _no_float(fn):
    def build(*args):
        for v in args:
            if as_expr(v).dtype.is_float:
                raise NotLowerable("bitwise op on floating-point values")
        return fn(*args)

    return build


def _not_bool(fn):
    def build(*args):
        if args[0].dtype.is_bool:
            raise NotLowerable("op not defined for bool")
        return fn(*args)

    return build


# Tables -------------------------------------------------------------------------------------

_MATH_OPS = (
    "exp",
    "exp2",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "erf",
    "erfc",
    "erfinv",
    "sigmoid",
    "lgamma",
    "digamma",
)

UNARY = [
    *[((getattr(aten, n).default,), _math(n)) for n in _MATH_OPS],
    *[((getattr(aten, n).default,), _int_identity(n)) for n in ("floor", "ceil", "trunc")],
    ((aten.round.default,), _int_identity("rint")),
    ((aten.neg.default, aten.negative.default), _not_bool(lambda x: -x)),
    ((aten.abs.default,), _abs),
    ((aten.reciprocal.default,), lambda x: 1.0 / x),
    ((aten.frac.default,), lambda x: x - call("trunc", x)),
    ((aten.sign.default, aten.sgn.default), _sign),
    ((aten.square.default,), lambda x: x * x),
    ((aten.relu.default,), _not_bool(lambda x: maximum(x, 0))),
    ((aten.silu.default,), lambda x: x / (1.0 + call("exp", -x))),
    ((aten.mish.default,), lambda x: x * call("tanh", call("log1p", call("exp", x)))),
    ((aten.gelu.default,), _gelu),
    ((aten.hardtanh.default,), lambda x, lo=-1, hi=1: _clamp(x, lo, hi)),
    ((aten.hardsigmoid.default,), _hardsigmoid),
    ((aten.hardswish.default,), lambda x: x * minimum(maximum(x + 3.0, 0.0), 6.0) / 6.0),
    ((aten.leaky_relu.default,), lambda x, slope=0.01: select(x > 0, x, x * slope)),
    ((aten.elu.default,), _elu),
    ((aten.softplus.default,), _softplus),
    ((aten.clamp.default,), _clamp),
    ((aten.clamp_min.default,), lambda x, lo: _clamp(x, lo)),
    ((aten.clamp_max.default,), lambda x, hi: _clamp(x, None, hi)),
]

# Predicates and bitwise/logical unary ops compute in the input's own type.
UNARY_INPUT_TYPED = [
    ((aten.isnan.default,), _isnan),
    ((aten.isinf.default,), _isinf),
    ((aten.isfinite.default,), _isfinite),
    ((aten.isposinf.default,), lambda x: _signed_inf(x, 1)),
    ((aten.isneginf.default,), lambda x: _signed_inf(x, -1)),
    ((aten.signbit.default,), lambda x: call("signbit", x, dtype=T.boolean) if _fdt(x) else x < 0),
    ((aten.logical_not.default,), lambda x: unary("not", cast(x, T.boolean))),
]

BINARY = [
    (_ovl(aten.add, "Tensor", "Scalar"), lambda x, y, alpha=1: x + _scaled(y, alpha)),
    (_ovl(aten.sub, "Tensor", "Scalar"), lambda x, y, alpha=1: x - _scaled(y, alpha)),
    (_ovl(aten.rsub, "Tensor", "Scalar"), lambda x, y, alpha=1: y - _scaled(x, alpha)),
    (_ovl(aten.mul, "Tensor", "Scalar"), lambda x, y: x * y),
    (
        _ovl(aten.div, "Tensor", "Scalar") + _ovl(aten.true_divide, "Tensor", "Scalar"),
        lambda x, y: x / y,
    ),
    (_ovl(aten.div, "Tensor_mode", "Scalar_mode"), _div_mode),
    (_ovl(aten.floor_divide, "default", "Scalar"), lambda x, y: binary("floordiv", x, y)),
    (_ovl(aten.remainder, "Tensor", "Scalar", "Scalar_Tensor"), lambda x, y: binary("mod", x, y)),
    (_ovl(aten.fmod, "Tensor", "Scalar"), _fmod),
    (_ovl(aten.maximum, "default"), maximum),
    (_ovl(aten.minimum, "default"), minimum),
    (_ovl(aten.atan2, "default"), lambda x, y: call("atan2", x, y)),
    (_ovl(aten.hypot, "default"), lambda x, y: call("hypot", x, y)),
    (_ovl(aten.copysign, "Tensor", "Scalar"), lambda x, y: call("copysign", x, y)),
]

# Comparison, bitwise and logical ops compute in the operands' promoted type.
BINARY_PROMOTED = [
    *[
        (_ovl(getattr(aten, n), "Tensor", "Scalar"), _bin(n))
        for n in ("eq", "ne", "lt", "le", "gt", "ge")
    ],
    *[
        (
            _ovl(getattr(aten, f"bitwise_{n}"), "Tensor", "Scalar", "Scalar_Tensor"),
            _no_float(_bin(op)),
        )
        for n, op in (("and", "bitand"), ("or", "bitor"), ("xor", "bitxor"))
    ],
    *[
        (
            _ovl(getattr(aten, f"bitwise_{n}_shift"), "Tensor", "Tensor_Scalar", "Scalar_Tensor")
            + _ovl(getattr(aten, f"__{n[0]}shift__"), "Tensor", "Scalar"),
            _no_float(_bin(op)),
        )
        for n, op in (("left", "shl"), ("right", "shr"))
    ],
    ((aten.logical_and.default,), lambda x, y: binary("and", x, y)),
    ((aten.logical_or.default,), lambda x, y: binary("or", x, y)),
    ((aten.logical_xor.default,), lambda x, y: ne(cast(x, T.boolean), cast(y, T.boolean))),
]

TERNARY = [
    ((aten.clamp.Tensor,), _clamp),
    ((aten.lerp.Scalar, aten.lerp.Tensor), _lerp),
    # PyTorch's association: self + (value * t1) * t2 and self + (value * t1) / t2.
    ((aten.addcmul.default,), lambda s, a, b, value=1: s + _scaled(a, value) * b),
    ((aten.addcdiv.default,), lambda s, a, b, value=1: s + _scaled(a, value) / b),
]

register_table(UNARY, 1)
register_table(UNARY_INPUT_TYPED, 1, "opmath_in")
register_table(BINARY, 2)
register_table(BINARY_PROMOTED, 2, "promote")
register_table(TERNARY, 3)
register_table(
    [
        ((aten.clamp_min.Tensor,), lambda x, lo: _clamp(x, lo)),
        ((aten.clamp_max.Tensor,), lambda x, hi: _clamp(x, None, hi)),
    ],
    2,
)
register_table([((aten.bitwise_not.default,), _no_float(lambda x: ~x))], 1, "promote")


# Ops with their own argument handling ----------------------------------------------------


@register_lowering(aten.nan_to_num.default)
def nan_to_num(ctx, x, nan=None, posinf=None, neginf=None):
    def fn(v, *_):
        return _nan_to_num(v, nan, posinf, neginf, out=ctx.out_dtype)

    return pointwise(aten.nan_to_num.default, fn, 1)(ctx, x)


@register_lowering(aten.round.decimals)
def round_decimals(ctx, x, *, decimals=0):
    if decimals != 0:
        raise NotLowerable("round with decimals != 0")
    return pointwise(aten.round.default, _int_identity("rint"), 1)(ctx, x)


_POW_SPECIAL = {
    0.5: lambda x: call("sqrt", x),
    2.0: lambda x: x * x,
    3.0: lambda x: x * x * x,
    -0.5: lambda x: call("rsqrt", x),
    -1.0: lambda x: 1.0 / x,
    -2.0: lambda x: 1.0 / (x * x),
}


def _pow_expr(x: Expr, e, special: bool = True) -> Expr:
    if x.dtype.is_bool:
        raise NotLowerable("pow of bool")
    if not isinstance(e, Expr):
        if x.dtype.is_integer and e < 0:
            raise NotLowerable("integer pow with a negative exponent")
        if e == 0:
            return const(1, x.dtype)
        if e == 1:
            return x
        if x.dtype.is_float and float(e) in _POW_SPECIAL and (special or abs(e) != 0.5):
            # PyTorch special-cases these exponents; pow(-inf, 0.5) is nan, as sqrt gives.
            return _POW_SPECIAL[float(e)](x)
        return binary("pow", x, e)
    if x.dtype.is_integer:
        # PyTorch: x ** negative is 1 for 1, +-1 for -1 (by parity), 0 otherwise.
        neg_one = select(eq(binary("imod", e, 2), 0), const(1, x.dtype), const(-1, x.dtype))
        small = select(eq(x, 1), const(1, x.dtype), select(eq(x, -1), neg_one, const(0, x.dtype)))
        return select(e < 0, small, binary("pow", x, maximum(e, 0)))
    return binary("pow", x, e)


@register_lowering(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(ctx, x, e):
    if isinstance(e, complex):
        raise NotLowerable("complex exponent")
    # PyTorch's CPU kernel for float16 calls pow for exponents +-0.5 (not sqrt/rsqrt).
    special = ctx.out_dtype != T.f16
    return pointwise(aten.pow.Tensor_Scalar, lambda v, _: _pow_expr(v, e, special), 1)(ctx, x, e)


def _pow_tensor(x, e):
    return _pow_expr(as_expr(x), as_expr(e))


register_lowering(aten.pow.Tensor_Tensor)(pointwise(aten.pow.Tensor_Tensor, _pow_tensor, 2))


@register_lowering(aten.pow.Scalar)
def pow_scalar(ctx, base, e):
    # Eager converts a Python base to the result's dtype first: pow(1e6, x) is inf for f16 x.
    if isinstance(base, (int, float)) and not isinstance(base, bool) and ctx.out_dtype.is_float:
        base = torch.tensor(base, dtype=torch.float64).to(T.to_torch(ctx.out_dtype)).item()
    return pointwise(aten.pow.Scalar, _pow_tensor, 2)(ctx, base, e)


@register_lowering(aten.where.self)
def where(ctx, cond, a, b):
    check_dtypes(cond, a, b)
    shape, out = ctx.out_shape, ctx.out_dtype
    return compute(
        ctx.name,
        shape,
        lambda *i: select(
            load(cond, shape, i, T.boolean), load(a, shape, i, out), load(b, shape, i, out)
        ),
    )


@register_lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(ctx, x, mask, value):
    check_dtypes(x, mask, value)
    if isinstance(value, complex):
        raise NotLowerable("complex fill value")
    shape, out = ctx.out_shape, ctx.out_dtype
    return compute(
        ctx.name,
        shape,
        lambda *i: select(
            load(mask, shape, i, T.boolean), load(value, shape, i, out), load(x, shape, i, out)
        ),
    )


_KEEP_FORMATS = (None, torch.preserve_format, torch.contiguous_format)


def _same_device(ctx, device) -> bool:
    """Whether `device` is None or the device of the op's input (`x.to(x.device, dtype)`)."""
    if device is None:
        return True
    meta = ctx.meta(0)
    if not isinstance(meta, torch.Tensor):
        return False
    want = torch.device(device)
    return want.type == meta.device.type and want.index in (None, meta.device.index)


@register_lowering(aten._to_copy.default)
def to_copy(
    ctx,
    x,
    *,
    dtype=None,
    layout=None,
    device=None,
    pin_memory=None,
    non_blocking=False,
    memory_format=None,
):
    if not _same_device(ctx, device) or layout not in (None, torch.strided) or pin_memory:
        raise NotLowerable("_to_copy changing device, layout or pinning")
    if memory_format not in _KEEP_FORMATS:
        raise NotLowerable(f"_to_copy to {memory_format}")
    check_dtypes(x)
    out = ctx.out_dtype
    return compute(ctx.name, ctx.out_shape, lambda *i: cast(x[i], out))


@register_lowering(aten.clone.default)
def clone(ctx, x, *, memory_format=None):
    if memory_format not in _KEEP_FORMATS:
        raise NotLowerable(f"clone to {memory_format}")
    check_dtypes(x)
    return compute(ctx.name, ctx.out_shape, lambda *i: x[i])


@register_lowering(aten.copy.default)
def copy(ctx, x, src, non_blocking=False):
    check_dtypes(x, src)
    shape, out = ctx.out_shape, ctx.out_dtype
    return compute(ctx.name, shape, lambda *i: load(src, shape, i, out))


@register_lowering(aten.fill.Scalar, aten.fill.Tensor)
def fill(ctx, x, value):
    check_dtypes(x, value)
    if isinstance(value, complex):
        raise NotLowerable("complex fill value")
    shape, out = ctx.out_shape, ctx.out_dtype
    return compute(ctx.name, shape, lambda *i: load(value, shape, i, out))
