"""Typing rules of scripts: literals, implicit and explicit conversions, operators.

Values are either compile-time Python values (ints, floats, bools from literals or the
enclosing scope) or kernel-IR expressions. The rules (the language reference repeats them):

- Operators on two compile-time values are evaluated by Python at compile time, except that
  `//` and `%` truncate toward zero like C (the same as at run time).
- A Python literal meeting a typed value takes that value's type (`x + 1` keeps x's type; a
  float literal with an integer value gives f32). Alone, an int literal is i32 (i64 when it
  does not fit), a float literal f32, True/False bool.
- Arithmetic promotes operands to a common type: floats beat integers, wider beats narrower,
  f16 with bf16 gives f32 (minicomp.ir.types.promote). Integer arithmetic wraps like C's.
- `/` needs a float operand (integer `/` is an error: write `//`); `//` and `%` need integer
  operands and truncate toward zero (C's `/` and `%`, the IR's idiv/imod), so -7 // 2 == -3;
  use floor()/fmod() for floats. Shifts and bitwise operators need integers; `&`, `|` and `~`
  on bools are logical.
- Implicit conversions (assignment to a variable, store to a tensor element, arguments and
  return values of device functions, atomic operands) only widen: a same-kind integer to a
  wider one (unsigned to a wider signed too), f16/bf16 to f32 or f64, f32 to f64; and a literal
  converts to any numeric type it fits (an int literal also to floats; a float literal only to
  floats). Everything else (float to int, narrowing, int to float, bool to number and back)
  needs an explicit cast such as `f16(x)` or `i32(x)`, which follows C (float to int
  truncates) except that a number converts to bool as `x != 0`.
"""

from __future__ import annotations

import math

from minicomp.ir import expr as E
from minicomp.ir.expr import Expr
from minicomp.ir.types import DataType, boolean, f32, fits, i32, i64, promote
from minicomp.script.errors import Issue
from minicomp.script.values import TensorRef

Number = int | float | bool


def is_number(value) -> bool:
    """Whether `value` is a compile-time number (bools included)."""
    return isinstance(value, int | float)


def literal_type(value: Number) -> DataType:
    """The type a literal gets when nothing else types it."""
    if isinstance(value, bool):
        return boolean
    if isinstance(value, int):
        if fits(value, i32):
            return i32
        if fits(value, i64):
            return i64
        raise Issue(f"the constant {value} does not fit a 64-bit integer")
    return f32


def literal(value: Number, dt: DataType) -> Expr:
    """The literal `value` as a constant of type `dt`, when it converts implicitly."""
    if isinstance(value, bool):
        if not dt.is_bool:
            raise Issue(f"cannot use the bool {value} as a {dt}; write {dt.short}({value})")
        return E.const(value, dt)
    if dt.is_bool:
        raise Issue(f"cannot use the number {value!r} as a bool; compare it instead")
    if isinstance(value, int):
        if dt.is_integer and not fits(value, dt):
            raise Issue(f"the constant {value} does not fit {dt}")
        return E.const(value, dt)
    if not dt.is_float:
        raise Issue(f"cannot use the float {value!r} as a {dt}; write {dt.short}({value!r})")
    return E.const(value, dt)


def to_expr(value, like: DataType | None = None) -> Expr:
    """A value as an expression: expressions as they are, literals typed `like` when they
    convert to it implicitly (else by literal_type)."""
    if isinstance(value, Expr):
        return value
    if not is_number(value):
        raise Issue(f"{describe(value)} is not a scalar value")
    if like is not None:
        try:
            return literal(value, like)
        except Issue:
            pass
    return literal(value, literal_type(value))


def widens(src: DataType, dst: DataType) -> bool:
    """Whether converting `src` to `dst` implicitly is allowed (it loses nothing)."""
    if src == dst:
        return True
    if src.is_float and dst.is_float:
        return dst.nbytes > src.nbytes
    if src.is_integer and dst.is_integer:
        if src.kind == dst.kind:
            return dst.nbytes > src.nbytes
        return src.kind == "uint" and dst.kind == "int" and dst.nbytes > src.nbytes
    return False


def implicit(value, dt: DataType, what: str) -> Expr:
    """`value` converted implicitly to `dt`; `what` names the destination in errors."""
    if is_number(value):
        try:
            return literal(value, dt)
        except Issue as e:
            raise Issue(f"{what}: {e}") from None
    if not isinstance(value, Expr):
        raise Issue(f"{what}: {describe(value)} is not a scalar value")
    src = value.dtype
    if src == dt:
        return value
    if widens(src, dt):
        return E.cast(value, dt)
    raise Issue(
        f"{what}: a {src} value does not convert implicitly to {dt}; write {_cast_name(dt)}(...)"
    )


def explicit(value, dt: DataType) -> Expr:
    """`value` converted to `dt` by a cast: C's conversions, and `x != 0` to bool."""
    if is_number(value) and not isinstance(value, Expr):
        if dt.is_bool:
            return E.const(bool(value), dt)
        if dt.is_integer:
            if isinstance(value, float) and not math.isfinite(value):
                raise Issue(f"cannot convert {value} to {dt}")
            v = int(value)  # truncates toward zero, like C
            if not fits(v, dt):
                raise Issue(f"the constant {v} does not fit {dt}")
            return E.const(v, dt)
        return E.const(float(value), dt)
    if not isinstance(value, Expr):
        raise Issue(f"cannot convert {describe(value)} to {dt}")
    return E.cast(value, dt)


def _cast_name(dt: DataType) -> str:
    return "boolean" if dt.is_bool else dt.short


def describe(value) -> str:
    """A short description of a value for error messages."""
    if isinstance(value, Expr):
        return f"a {value.dtype} value"
    if isinstance(value, TensorRef):
        return f"the tensor {value.name}"
    if isinstance(value, bool | int | float | str):
        return f"the constant {value!r}"
    if isinstance(value, tuple):
        return "a tuple"
    return repr(value)


# ---- operators ----

_ARITH = {"Add": "add", "Sub": "sub", "Mult": "mul", "Div": "div", "FloorDiv": "idiv"}
_ARITH |= {"Mod": "imod", "Pow": "pow", "LShift": "shl", "RShift": "shr"}
_ARITH |= {"BitAnd": "bitand", "BitOr": "bitor", "BitXor": "bitxor"}
SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "idiv": "//", "imod": "%", "pow": "**"}
SYMBOLS |= {"shl": "<<", "shr": ">>", "bitand": "&", "bitor": "|", "bitxor": "^"}
COMPARE = {"Lt": "lt", "LtE": "le", "Gt": "gt", "GtE": "ge", "Eq": "eq", "NotEq": "ne"}


def op_name(ast_op: str) -> str:
    """The IR op of a Python operator class name (ast.Add -> "add")."""
    if ast_op in _ARITH:
        return _ARITH[ast_op]
    if ast_op in COMPARE:
        return COMPARE[ast_op]
    raise Issue(f"the operator {ast_op} is not supported")


def c_div(a: int, b: int) -> int:
    """Integer division truncating toward zero (C's)."""
    if b == 0:
        raise Issue("integer division by zero")
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _fold(op: str, a: Number, b: Number):
    if op in ("idiv", "imod", "shl", "shr", "bitand", "bitor", "bitxor"):
        if isinstance(a, float) or isinstance(b, float):
            raise Issue(f"{SYMBOLS[op]} needs integer operands")
    if op == "idiv":
        return c_div(a, b)
    if op == "imod":
        return a - b * c_div(a, b)
    if op == "div":
        if b == 0:
            raise Issue("division by zero")
        return a / b
    py = {
        "add": lambda: a + b,
        "sub": lambda: a - b,
        "mul": lambda: a * b,
        "pow": lambda: a**b,
        "shl": lambda: a << b,
        "shr": lambda: a >> b,
        "bitand": lambda: a & b,
        "bitor": lambda: a | b,
        "bitxor": lambda: a ^ b,
        "lt": lambda: a < b,
        "le": lambda: a <= b,
        "gt": lambda: a > b,
        "ge": lambda: a >= b,
        "eq": lambda: a == b,
        "ne": lambda: a != b,
        "max": lambda: max(a, b),
        "min": lambda: min(a, b),
    }
    return py[op]()


def operands(a, b) -> tuple[Expr, Expr]:
    """Two operands as expressions, a literal typed like the other operand."""
    if isinstance(a, Expr) and not isinstance(b, Expr):
        return a, _literal_like(b, a.dtype)
    if isinstance(b, Expr) and not isinstance(a, Expr):
        return _literal_like(a, b.dtype), b
    return to_expr(a), to_expr(b)


def _literal_like(value, dt: DataType) -> Expr:
    if not is_number(value):
        raise Issue(f"{describe(value)} is not a scalar value")
    if isinstance(value, bool) or dt.is_bool:
        return to_expr(value, dt)
    if isinstance(value, float) and not dt.is_float:
        return E.const(value, f32)
    if isinstance(value, int) and dt.is_integer and not fits(value, dt):
        raise Issue(f"the constant {value} does not fit {dt}, the type of the other operand")
    return E.const(value, dt)


def binop(op: str, a, b):
    """`a op b` for an IR op name: folded for compile-time numbers, else an expression."""
    if is_number(a) and is_number(b):
        return _fold(op, a, b)
    x, y = operands(a, b)
    if op in E.COMPARE_OPS:
        if x.dtype.is_bool != y.dtype.is_bool and op not in ("eq", "ne"):
            raise Issue(f"cannot compare a {x.dtype} value with a {y.dtype} value")
        return E.binary(op, x, y)
    t = promote(x.dtype, y.dtype)
    symbol = SYMBOLS.get(op, op)
    if op in ("bitand", "bitor", "bitxor") and x.dtype.is_bool and y.dtype.is_bool:
        return E.binary({"bitand": "and", "bitor": "or", "bitxor": "ne"}[op], x, y)
    if x.dtype.is_bool or y.dtype.is_bool:
        raise Issue(f"arithmetic ({symbol}) on a bool value; convert it with i32(...) first")
    if op == "div" and not t.is_float:
        raise Issue(
            "/ on integers: write // for (truncating) integer division, or convert an operand "
            "to a float type"
        )
    if op in ("idiv", "imod") and t.is_float:
        hint = "floor(a / b)" if op == "idiv" else "fmod(a, b)"
        raise Issue(f"{symbol} needs integer operands; for floats write {hint}")
    if op in ("shl", "shr", "bitand", "bitor", "bitxor") and t.is_float:
        raise Issue(f"{symbol} needs integer operands")
    return E.binary(op, x, y)


def unop(op: str, a):
    """A unary operator ("neg", "not", "invert", "pos") on a value."""
    if is_number(a):
        if op == "not":
            return not a
        if op == "neg":
            return -a
        if op == "pos":
            return a
        if isinstance(a, float):
            raise Issue("~ needs an integer operand")
        return ~a
    if not isinstance(a, Expr):
        raise Issue(f"{describe(a)} is not a scalar value")
    if op == "pos":
        return a
    if op == "not":
        return E.unary("not", E.cast(a, boolean))
    if op == "neg":
        if a.dtype.is_bool:
            raise Issue("arithmetic (-) on a bool value; convert it with i32(...) first")
        return E.unary("neg", a)
    if a.dtype.is_float:
        raise Issue("~ needs an integer operand")
    return E.unary("not" if a.dtype.is_bool else "bitnot", a)


def truth(value, what: str = "a condition"):
    """A condition: a compile-time bool, or a bool expression (numbers compare with 0)."""
    if is_number(value):
        return bool(value)
    if isinstance(value, E.Const):
        return bool(value.value)
    if not isinstance(value, Expr):
        raise Issue(f"{describe(value)} cannot be {what}")
    return E.cast(value, boolean)
