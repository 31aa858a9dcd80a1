"""Scalar expressions shared by every IR: constants, variables, arithmetic, calls, loads."""

from __future__ import annotations

import math

from minicomp.ir.node import Node, node
from minicomp.ir.types import DataType, PointerType, boolean, f32, i8, i64, promote

ARITH_OPS = ("add", "sub", "mul", "div", "floordiv", "mod", "idiv", "imod", "max", "min", "pow")
BIT_OPS = ("bitand", "bitor", "bitxor", "shl", "shr")
COMPARE_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
LOGIC_OPS = ("and", "or")
UNARY_OPS = ("neg", "not", "bitnot")

# Math functions a Call may name, with their arity. Every backend renders each of them
# for f32 and f64 (f16/bf16 are computed in f32 by the ops). Semantics are PyTorch's:
# `rint` rounds half to even, `isnan`/`isinf`/`signbit` return bool, `gelu` is the exact
# x/2 (1 + erf(x/sqrt 2)).
MATH_FUNCTIONS = {
    "exp": 1,
    "exp2": 1,
    "expm1": 1,
    "log": 1,
    "log2": 1,
    "log10": 1,
    "log1p": 1,
    "sqrt": 1,
    "rsqrt": 1,
    "cbrt": 1,
    "sin": 1,
    "cos": 1,
    "tan": 1,
    "asin": 1,
    "acos": 1,
    "atan": 1,
    "sinh": 1,
    "cosh": 1,
    "tanh": 1,
    "asinh": 1,
    "acosh": 1,
    "atanh": 1,
    "erf": 1,
    "erfc": 1,
    "erfinv": 1,
    "gelu": 1,
    "lgamma": 1,
    "digamma": 1,
    "floor": 1,
    "ceil": 1,
    "rint": 1,
    "trunc": 1,
    "abs": 1,
    "sigmoid": 1,
    "isnan": 1,
    "isinf": 1,
    "signbit": 1,
    "atan2": 2,
    "fmod": 2,
    "copysign": 2,
    "hypot": 2,
    "nextafter": 2,
}
# Binary ops: max/min propagate NaN (PyTorch's maximum/minimum); div is true division for
# floats and truncating for ints; floordiv/mod floor (Python semantics, for tensor data);
# idiv/imod truncate (C semantics, for non-negative index arithmetic); shr is arithmetic
# for signed types.


class Expr(Node):
    """A scalar expression with a data type."""

    @property
    def dtype(self) -> DataType:
        raise NotImplementedError

    def __bool__(self) -> bool:
        raise TypeError(f"a symbolic expression has no truth value: {self}")

    def __repr__(self) -> str:
        from minicomp.ir.printer import expr_str

        return expr_str(self)

    # Arithmetic builds new expressions; `==` stays structural equality (use `eq()`).
    def __add__(self, o):
        return binary("add", self, o)

    def __radd__(self, o):
        return binary("add", o, self)

    def __sub__(self, o):
        return binary("sub", self, o)

    def __rsub__(self, o):
        return binary("sub", o, self)

    def __mul__(self, o):
        return binary("mul", self, o)

    def __rmul__(self, o):
        return binary("mul", o, self)

    def __truediv__(self, o):
        return binary("div", self, o)

    def __rtruediv__(self, o):
        return binary("div", o, self)

    def __floordiv__(self, o):
        return binary("idiv", self, o)

    def __rfloordiv__(self, o):
        return binary("idiv", o, self)

    def __mod__(self, o):
        return binary("imod", self, o)

    def __rmod__(self, o):
        return binary("imod", o, self)

    def __neg__(self):
        return unary("neg", self)

    def __lt__(self, o):
        return binary("lt", self, o)

    def __le__(self, o):
        return binary("le", self, o)

    def __gt__(self, o):
        return binary("gt", self, o)

    def __ge__(self, o):
        return binary("ge", self, o)

    def __and__(self, o):
        return binary("and" if _is_bool(self) else "bitand", self, o)

    def __or__(self, o):
        return binary("or" if _is_bool(self) else "bitor", self, o)

    def __invert__(self):
        return unary("not" if _is_bool(self) else "bitnot", self)

    __hash__ = Node.__hash__
    __eq__ = Node.__eq__


def _is_bool(e: Expr) -> bool:
    return e.dtype == boolean


@node
class Const(Expr):
    """A literal of a given type; floats may be inf or nan."""

    value: int | float | bool
    type: DataType

    @property
    def dtype(self) -> DataType:
        return self.type

    def _key(self) -> tuple:
        # -0.0 and 0.0 differ, and every NaN is the same constant.
        v = self.value
        if isinstance(v, float):
            return (math.copysign(1.0, v), "nan" if math.isnan(v) else v, self.type)
        return (v, self.type)


@node
class Var(Expr):
    """A named variable: a loop index, a size symbol, a local or a kernel parameter."""

    name: str
    type: DataType | PointerType

    @property
    def dtype(self) -> DataType:
        if isinstance(self.type, PointerType):
            raise TypeError(f"{self.name} is a pointer")
        return self.type


@node
class Binary(Expr):
    """A binary operation; `idiv`/`imod` truncate (indices), `floordiv`/`mod` floor."""

    op: str
    a: Expr
    b: Expr

    def __post_init__(self):
        if self.op not in ARITH_OPS + BIT_OPS + COMPARE_OPS + LOGIC_OPS:
            raise ValueError(f"unknown binary op {self.op!r}")

    @property
    def dtype(self) -> DataType:
        if self.op in COMPARE_OPS or self.op in LOGIC_OPS:
            return boolean
        return self.a.dtype


@node
class Unary(Expr):
    """neg, logical not, or bitwise not."""

    op: str
    a: Expr

    @property
    def dtype(self) -> DataType:
        return self.a.dtype


@node
class Call(Expr):
    """A call of a math function or an intrinsic known to the backends, by name."""

    name: str
    args: tuple[Expr, ...]
    type: DataType

    @property
    def dtype(self) -> DataType:
        return self.type


@node
class Cast(Expr):
    """Conversion to another scalar type, with C semantics (PyTorch's for bool)."""

    a: Expr
    type: DataType

    @property
    def dtype(self) -> DataType:
        return self.type


@node
class Select(Expr):
    """`a if cond else b`."""

    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> DataType:
        return self.a.dtype


@node
class Load(Expr):
    """Element `index` of a buffer (a pointer variable)."""

    buf: Var
    index: Expr

    @property
    def dtype(self) -> DataType:
        return self.buf.type.elem


@node
class StringLiteral(Expr):
    """A constant C string, such as the format argument of the `printf` intrinsic.

    `value` is the text without its terminating NUL; backends spell it as an escaped string
    literal. Its `type` is a pointer to constant i8 characters (PointerType(i8, "constant")),
    so like a pointer Var it has no scalar `dtype`.
    """

    value: str

    @property
    def type(self) -> PointerType:
        return PointerType(i8, "constant")

    @property
    def dtype(self) -> DataType:
        raise TypeError(f"a string literal is a pointer ({self.type}), not a scalar")


ExprLike = Expr | int | float | bool


def const(value: int | float | bool, dt: DataType | None = None) -> Const:
    """A constant; the type defaults to i64 for ints, f32 for floats, bool for bools.

    An integer outside `dt`'s range wraps around (two's complement), as C's conversion and
    PyTorch's do: `int8_tensor + 300` adds 44.
    """
    if dt is None:
        dt = boolean if isinstance(value, bool) else i64 if isinstance(value, int) else f32
    if dt.is_bool:
        value = bool(value)
    elif dt.is_integer:
        value = _wrap(int(value), dt)
    else:
        value = float(value)
    return Const(value, dt)


def _wrap(v: int, dt: DataType) -> int:
    bits = 8 * dt.nbytes
    v &= (1 << bits) - 1
    return v - (1 << bits) if dt.kind == "int" and v >> (bits - 1) else v


def as_expr(x: ExprLike, like: DataType | None = None) -> Expr:
    """`x` as an expression; Python numbers take the type `like` when given."""
    if isinstance(x, Expr):
        return x
    if like is not None and not (isinstance(x, float) and not like.is_float):
        return const(x, like)
    return const(x)


def cast(x: ExprLike, dt: DataType) -> Expr:
    """`x` converted to `dt`, folding constants and no-op casts."""
    x = as_expr(x, dt)
    if x.dtype == dt:
        return x
    if isinstance(x, Const):
        return const(x.value, dt)
    return Cast(x, dt)


def _fold(op: str, a, b):
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "max":
        return max(a, b)
    if op == "min":
        return min(a, b)
    if isinstance(a, int) and isinstance(b, int) and b > 0 and a >= 0:
        if op in ("idiv", "floordiv"):
            return a // b
        if op in ("imod", "mod"):
            return a % b
    if op in COMPARE_OPS:
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[
            op
        ]
    return None


def binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    """A binary expression with operands promoted to a common type and trivial cases folded."""
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        raise TypeError("binary() needs at least one expression operand")
    a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, a.dtype)
    if op in LOGIC_OPS:
        a, b = cast(a, boolean), cast(b, boolean)
    elif a.dtype != b.dtype:
        t = promote(a.dtype, b.dtype)
        a, b = cast(a, t), cast(b, t)
    if isinstance(a, Const) and isinstance(b, Const) and a.dtype.is_integer | a.dtype.is_bool:
        v = _fold(op, a.value, b.value)
        if v is not None:
            return const(v, boolean if op in COMPARE_OPS else a.dtype)
    if a.dtype.is_integer:
        if op == "add" and _is(b, 0) or op == "sub" and _is(b, 0):
            return a
        if op == "add" and _is(a, 0):
            return b
        if op == "mul" and (_is(a, 0) or _is(b, 0)):
            return const(0, a.dtype)
        if op == "mul" and _is(b, 1) or op in ("idiv", "floordiv") and _is(b, 1):
            return a
        if op == "mul" and _is(a, 1):
            return b
        if op in ("imod", "mod") and _is(b, 1):
            return const(0, a.dtype)
    return Binary(op, a, b)


def _is(e: Expr, v: int) -> bool:
    return isinstance(e, Const) and e.value == v


def unary(op: str, a: ExprLike) -> Expr:
    """A unary expression, folding constants."""
    a = as_expr(a)
    if isinstance(a, Const) and op == "neg":
        return const(-a.value, a.dtype)
    if isinstance(a, Const) and op == "not":
        return const(not a.value, boolean)
    return Unary(op, a)


def call(name: str, *args: ExprLike, dtype: DataType | None = None) -> Call:
    """A call of a named math function; its type is the first argument's unless given."""
    eargs = tuple(as_expr(a) for a in args)
    return Call(name, eargs, dtype or eargs[0].dtype)


def select(cond: ExprLike, a: ExprLike, b: ExprLike) -> Expr:
    """`a if cond else b` with `a` and `b` promoted to one type."""
    cond = cast(as_expr(cond), boolean)
    if isinstance(cond, Const):
        return as_expr(a) if cond.value else as_expr(b)
    a = as_expr(a, b.dtype if isinstance(b, Expr) else None)
    b = as_expr(b, a.dtype)
    if a.dtype != b.dtype:
        t = promote(a.dtype, b.dtype)
        a, b = cast(a, t), cast(b, t)
    return Select(cond, a, b)


def eq(a: ExprLike, b: ExprLike) -> Expr:
    """The comparison `a == b` as an expression (Python's `==` compares structure)."""
    return binary("eq", a, b)


def ne(a: ExprLike, b: ExprLike) -> Expr:
    """The comparison `a != b` as an expression."""
    return binary("ne", a, b)


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    """max(a, b)."""
    return binary("max", a, b)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    """min(a, b)."""
    return binary("min", a, b)


def logical_and(*xs: ExprLike) -> Expr:
    """The conjunction of boolean expressions (true for none)."""
    out: Expr = const(True)
    for x in xs:
        x = as_expr(x)
        out = x if _is_true(out) else binary("and", out, x)
    return out


def _is_true(e: Expr) -> bool:
    return isinstance(e, Const) and e.value is True


def is_const(e: ExprLike, value=None) -> bool:
    """Whether `e` is a literal (equal to `value` when given)."""
    if not isinstance(e, Expr):
        return value is None or e == value
    return isinstance(e, Const) and (value is None or e.value == value)


def float_literal(v: float) -> str:
    """A float as Python text, spelling out inf and nan."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)


Dim = int | Expr
Shape = tuple[Dim, ...]


def size_var(name: str) -> Var:
    """A symbolic size (an i64 variable)."""
    return Var(name, i64)


def prod(dims) -> Dim:
    """The product of sizes, an int when all are ints."""
    out: Dim = 1
    for d in dims:
        out = out * d if isinstance(out, int) and isinstance(d, int) else binary("mul", out, d)
    return out


def dim_expr(d: Dim) -> Expr:
    """A size as an i64 expression."""
    return d if isinstance(d, Expr) else const(d, i64)
