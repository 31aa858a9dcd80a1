"""Calls in scripts: casts, the language's primitives, math functions and device functions."""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir import types as T
from minicomp.ir.expr import MATH_FUNCTIONS, Expr, StringLiteral
from minicomp.script import cluster as _cluster
from minicomp.script import conversions as C
from minicomp.script import hopper as _hopper
from minicomp.script import lang, mapping
from minicomp.script import mma as _mma
from minicomp.script import tma as _tma
from minicomp.script import wgmma as _wgmma
from minicomp.script.errors import Issue
from minicomp.script.types import ScalarType, ptr
from minicomp.script.values import Effect, TensorRef

# Element types the backends implement each atomic for.
ATOMIC_TYPES = {
    "atomic_add": (T.f32, T.f64, T.i32, T.u32, T.i64, T.u64, T.f16, T.bf16),
    "atomic_max": (T.i32, T.u32, T.f32),
}
# Math functions defined on integers too (the rounding ones are the identity there).
_INTEGER_MATH = ("abs", "floor", "ceil", "rint", "trunc", "isnan", "isinf", "signbit")
_PREDICATES = ("isnan", "isinf", "signbit")
# The byte sizes of a vector access (minicomp.backends.cuda.codegen.VECTOR_BYTES).
VECTOR_BYTES = (2, 4, 8, 16, 32)
# printf conversions: %[flags][width][.precision][length]conversion.
_PRINTF_SPEC = re.compile(
    r"%(%|[-+ #0]*(\d+|\*)?(\.(\d+|\*))?(hh|h|ll|l|z|j|t|L)?[diouxXeEfFgGaAcsp])"
)


def call(p, node: ast.Call):
    """The value of a call expression: dispatches on what the called name stands for."""
    func = p.value(node.func)
    kwargs = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise Issue("unsupported syntax: **keyword arguments")
        kwargs[kw.arg] = kw.value
    args = list(node.args)
    if any(isinstance(a, ast.Starred) for a in args):
        raise Issue("unsupported syntax: *arguments")
    if isinstance(func, ScalarType):
        _no_keywords(kwargs, repr(func))
        if len(args) != 1:
            raise Issue(f"{func!r}() converts one value, {len(args)} given")
        return C.explicit(p.value(args[0]), func.dtype)
    if isinstance(func, lang.Primitive):
        handler = HANDLERS.get(func.name) or (
            _math if func.name in MATH_FUNCTIONS else _unknown(func.name)
        )
        return handler(p, func.name, args, kwargs)
    if isinstance(func, lang.ScriptFunctionBase):
        return call_device(p, func, args, kwargs)
    if isinstance(func, lang.Macro):
        return _expand(p, func, args, kwargs)
    if func is range:
        raise Issue("range() can only be iterated by a for loop")
    if func is len:
        _no_keywords(kwargs, "len")
        value = p.value(args[0]) if len(args) == 1 else None
        if isinstance(value, TensorRef):
            return len(value.shape)
        if not isinstance(value, tuple):
            raise Issue("len() takes one tuple or tensor")
        return len(value)
    if func in (mapping.spatial, mapping.repeat, ptr):
        values = [p.constant(a, f"an argument of {func.__name__}()") for a in args]
        _no_keywords(kwargs, func.__name__)
        return func(*values)
    raise Issue(f"cannot call {C.describe(func)} in a script")


def _expand(p, m: lang.Macro, args: list, kwargs: dict):
    """The value (or statement) macro `m` gives for these arguments, expanded now."""
    values = [p.value(a) for a in args]
    named = {k: p.value(v) for k, v in kwargs.items()}
    out = m.fn(*values, **named)
    if out is None:
        return Effect(S.Seq(()), f"{m.name}()")
    if isinstance(out, S.Stmt):
        return Effect(out, f"{m.name}()")
    if isinstance(out, list | tuple) and all(isinstance(s, S.Stmt) for s in out):
        return Effect(S.seq(*out) if out else S.Seq(()), f"{m.name}()")
    if isinstance(out, Expr | bool | int | float | TensorRef):
        return out
    raise Issue(f"macro {m.name}() returned {out!r}, not an IR expression or statements")


def _no_keywords(kwargs: dict, name: str) -> None:
    if kwargs:
        raise Issue(f"{name}() takes no keyword argument {next(iter(kwargs))!r}")


def _arity(name: str, args: list, low: int, high: int | None = None) -> None:
    high = low if high is None else high
    if not low <= len(args) <= high:
        want = str(low) if low == high else f"{low} to {high}"
        raise Issue(f"{name}() takes {want} arguments, {len(args)} given")


def _unknown(name: str) -> Callable:
    def handler(p, name, args, kwargs):
        if name == "unroll":
            raise Issue("unroll(range(...)) can only be iterated by a for loop")
        raise Issue(f"{name}() is not available in scripts")

    return handler


# ---- threads ----


def _syncthreads(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    _arity(name, args, 0)
    return Effect(S.Evaluate(E.Call("syncthreads", (), T.i32)), "syncthreads()")


def _threadfence(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    _arity(name, args, 0)
    return Effect(S.Evaluate(E.Call("threadfence", (), T.i32)), "threadfence()")


def _shuffle(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    _arity(name, args, 2)
    value = p.scalar(args[0])
    lane = p.scalar(args[1], T.i32)
    if not lane.dtype.is_integer:
        raise Issue(f"the lane argument of {name}() is a {lane.dtype} value, not an integer")
    return E.Call(name, (value, E.cast(lane, T.i32)), value.dtype)


def element_ref(p, node: ast.AST, what: str) -> tuple[E.Var, Expr]:
    """(buffer, index) of a tensor element written `t[i, j]`."""
    v = p.value(node)
    if not isinstance(v, E.Load):
        raise p.src.error(node, f"{what} takes a tensor element such as t[i, j], not {_d(v)}")
    return v.buf, v.index


def _d(v) -> str:
    return C.describe(v)


def _atomic(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    _arity(name, args, 2)
    buf, index = element_ref(p, args[0], f"{name}()")
    dt = buf.type.elem
    if dt not in ATOMIC_TYPES[name]:
        allowed = ", ".join(t.short for t in ATOMIC_TYPES[name])
        raise Issue(f"{name}() is not available on {dt} tensors (only {allowed})")
    value = C.implicit(p.value(args[1]), dt, f"the value of {name}()")
    return E.Call(name, (buf, index, value), dt)


# ---- memory ----


def _tensor(scope: str) -> Callable:
    def handler(p, name, args, kwargs):
        at = kwargs.pop("at", None) if scope == "dynamic" else None
        _no_keywords(kwargs, name)
        _arity(name, args, 2)
        dtype = p.constant(args[0], f"the type of {name}()")
        if not isinstance(dtype, ScalarType):
            raise Issue(f"the first argument of {name}() is a type such as f32, not {_d(dtype)}")
        shape = p.constant(args[1], f"the shape of {name}()")
        shape = shape if isinstance(shape, tuple) else (shape,)
        for d in shape:
            if not isinstance(d, int) or isinstance(d, bool) or d < 1:
                raise Issue(f"the shape of {name}() must be positive compile-time ints: {shape}")
        if at is not None:
            at = p.compile_time_int(at, f"the byte offset of {name}()")
            if at < 0 or at % 16:
                raise Issue(f"{name}(at=...) is a multiple of 16 bytes, not {at}")
        return p.declare_array(scope, dtype.dtype, shape, at)

    return handler


def _printf(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    if not args:
        raise Issue("printf() needs a format string")
    fmt = p.value(args[0])
    if not isinstance(fmt, str):
        raise Issue("the first argument of printf() must be a string literal")
    specs = [m for m in _PRINTF_SPEC.findall(fmt) if m[0] != "%"]
    if any("*" in m[0] for m in specs):
        raise Issue("printf() formats with * widths are not supported")
    values = []
    for a in args[1:]:
        v = p.scalar(a)
        # Varargs carry no f16/bf16 or bool: print them as float and int.
        if v.dtype in (T.f16, T.bf16):
            v = E.cast(v, T.f32)
        elif v.dtype.is_bool or v.dtype.is_integer and v.dtype.nbytes < 4:
            v = E.cast(v, T.i32)
        values.append(v)
    if len(specs) != len(values):
        raise Issue(f"the printf format has {len(specs)} conversions for {len(values)} values")
    call_expr = E.Call("printf", (StringLiteral(fmt), *values), T.i32)
    return Effect(S.Evaluate(call_expr), "printf()")


def _comment(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    _arity(name, args, 1)
    text = p.constant(args[0], "the text of comment()")
    if not isinstance(text, str):
        raise Issue(f"comment() takes a string, not {_d(text)}")
    return Effect(S.Comment(text), "comment()")


def _vector_lanes(p, name, reg: TensorRef, elem: T.DataType, lanes_node) -> Expr:
    if not isinstance(reg, TensorRef) or reg.scope != "local" or reg.offset != 0:
        raise Issue(f"{name}() moves a whole register_tensor, not {_d(reg)}")
    if reg.dtype != elem:
        raise Issue(f"{name}() between a {reg.dtype} register tensor and a {elem} tensor")
    size = math.prod(reg.shape)
    lanes = size if lanes_node is None else p.compile_time_int(lanes_node, "the lane count")
    if lanes > size or lanes * elem.nbytes not in VECTOR_BYTES:
        raise Issue(
            f"{name}() of {lanes} {elem} lanes ({lanes * elem.nbytes} bytes): a vector is "
            f"{', '.join(map(str, VECTOR_BYTES))} bytes, within the register tensor"
        )
    return E.const(lanes, T.i32)


def _load_vec(p, name, args, kwargs):
    _arity(name, args, 2, 3)
    lanes_node = kwargs.pop("lanes", args[2] if len(args) > 2 else None)
    _no_keywords(kwargs, name)
    reg = p.value(args[0])
    buf, index = element_ref(p, args[1], "the source of load_vec()")
    lanes = _vector_lanes(p, name, reg, buf.type.elem, lanes_node)
    call_expr = E.Call("load_vec", (reg.var, E.Load(buf, index), lanes), T.i32)
    return Effect(S.Evaluate(call_expr), "load_vec()")


def _store_vec(p, name, args, kwargs):
    _arity(name, args, 2, 3)
    lanes_node = kwargs.pop("lanes", args[2] if len(args) > 2 else None)
    _no_keywords(kwargs, name)
    buf, index = element_ref(p, args[0], "the destination of store_vec()")
    reg = p.value(args[1])
    lanes = _vector_lanes(p, name, reg, buf.type.elem, lanes_node)
    return Effect(S.Evaluate(E.Call("store_vec", (buf, index, reg.var, lanes), T.i32)), name)


def _is_aligned(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    _arity(name, args, 2)
    buf, index = element_ref(p, args[0], "is_aligned()")
    nbytes = p.compile_time_int(args[1], "the alignment of is_aligned()")
    if nbytes not in (1, 2, 4, 8, 16):
        raise Issue(f"is_aligned() checks 1, 2, 4, 8 or 16 bytes, not {nbytes}")
    return E.Call("is_aligned", (E.Load(buf, index), E.const(nbytes, T.i32)), T.boolean)


# ---- math ----


def _minmax(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    if len(args) < 2:
        raise Issue(f"{name}() takes two or more values")
    values = [p.value(a) for a in args]
    out = values[0]
    for v in values[1:]:
        out = C.binop(name, out, v)
    return out


def _abs(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    _arity(name, args, 1)
    v = p.value(args[0])
    if C.is_number(v):
        return abs(v)
    return _math(p, name, args, kwargs)


def _pow(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    _arity(name, args, 2)
    return C.binop("pow", p.value(args[0]), p.value(args[1]))


def _math(p, name, args, kwargs):
    _no_keywords(kwargs, name)
    _arity(name, args, MATH_FUNCTIONS[name])
    values = [p.value(a) for a in args]
    if len(values) == 2:
        x, y = C.operands(*values)
        t = T.promote(x.dtype, y.dtype)
        values = [E.cast(x, t), E.cast(y, t)]
    else:
        values = [C.to_expr(values[0])]
    dt = values[0].dtype
    if dt.is_bool or not dt.is_float and name not in _INTEGER_MATH:
        raise Issue(
            f"{name}() needs a floating-point argument, not a {dt} value; write {name}(f32(...))"
        )
    return E.Call(name, tuple(values), T.boolean if name in _PREDICATES else dt)


# ---- device functions ----


def call_device(p, sf, args: list, kwargs: dict):
    """A call of script function `sf` (a device function) from the script being parsed."""
    sig = sf.signature()
    if sig.kind != "device":
        raise Issue(f"{sig.py_name} is a kernel; kernels are launched from Python, not called")
    params = sig.params
    if len(args) > len(params):
        raise Issue(f"{sig.py_name}() takes {len(params)} arguments, {len(args)} given")
    bound = dict(zip((q.name for q in params), args))
    for key, node in kwargs.items():
        if key in bound:
            raise Issue(f"{sig.py_name}() got two values for argument {key!r}")
        if key not in {q.name for q in params}:
            raise Issue(f"{sig.py_name}() has no parameter {key!r}")
        bound[key] = node
    missing = [q.name for q in params if q.name not in bound]
    if missing:
        raise Issue(
            f"{sig.py_name}() takes {len(params)} arguments, {len(bound)} given "
            f"(missing {', '.join(missing)})"
        )
    values = []
    for q in params:
        what = f"argument {q.name} of {sig.py_name}()"
        v = p.value(bound[q.name])
        if q.kind == "scalar":
            values.append(C.implicit(v, q.dtype, what))
            continue
        if not isinstance(v, TensorRef):
            raise Issue(f"{what} is a {q.dtype} tensor, not {_d(v)}")
        if v.dtype != q.dtype:
            raise Issue(f"{what} is a {q.dtype} tensor, not a {v.dtype} one")
        if v.offset != 0:
            raise Issue(f"{what}: passing a view of a tensor to a device function is not supported")
        if q.kind == "tensor" and len(q.shape) != len(v.shape):
            raise Issue(f"{what} has {len(q.shape)} dimensions, {v.name} has {len(v.shape)}")
        values.append(v.var)
    p.use_callee(sf)
    if sig.ret is None:
        return Effect(S.Evaluate(E.Call(sig.name, tuple(values), T.i32)), f"{sig.py_name}()")
    return E.Call(sig.name, tuple(values), sig.ret)


HANDLERS = {
    "syncthreads": _syncthreads,
    "threadfence": _threadfence,
    "shfl_down_sync": _shuffle,
    "shfl_xor_sync": _shuffle,
    "shfl_sync": _shuffle,
    "atomic_add": _atomic,
    "atomic_max": _atomic,
    "shared_tensor": _tensor("shared"),
    "register_tensor": _tensor("local"),
    "dynamic_shared_tensor": _tensor("dynamic"),
    "printf": _printf,
    "comment": _comment,
    "load_vec": _load_vec,
    "store_vec": _store_vec,
    "is_aligned": _is_aligned,
    "max": _minmax,
    "min": _minmax,
    "abs": _abs,
    "pow": _pow,
    **_mma.HANDLERS,
    **_hopper.HANDLERS,
    **_cluster.HANDLERS,
    **_tma.HANDLERS,
    **_wgmma.HANDLERS,
}
