"""A reference evaluator of compute definitions with numpy: the oracle of the operator tests.

Every expression is evaluated over whole index grids at once. A scope holds one index array
per live variable, each shaped to broadcast over the scope's grid; a Reduce opens an inner
scope with its reduce variables as extra trailing axes and reduces those axes away.
bf16 and float8 values are float32 arrays rounded to their type after every operation
producing them (float8 as PyTorch rounds, ir/float8.py).
"""

from __future__ import annotations

import numpy as np

from minicomp.ir import types as T
from minicomp.ir.compute import Compute, Reduce, TensorElement, TensorInput, TensorNode
from minicomp.ir.expr import Binary, Call, Cast, Const, Expr, Load, Select, Unary, Var
from minicomp.ir.float8 import round_float8

_NP = {
    T.f16: np.float16,
    T.bf16: np.float32,
    T.f32: np.float32,
    T.f64: np.float64,
    T.i8: np.int8,
    T.i16: np.int16,
    T.i32: np.int32,
    T.i64: np.int64,
    T.u8: np.uint8,
    T.u16: np.uint16,
    T.u32: np.uint32,
    T.u64: np.uint64,
    T.boolean: np.bool_,
} | {t: np.float32 for t in T.FLOAT8_TYPES}


def np_dtype(dt: T.DataType) -> np.dtype:
    """The numpy dtype holding values of `dt` (float32 for bf16 and float8)."""
    return np.dtype(_NP[dt])


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), kept as float32."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out)


def rounded(x: np.ndarray, dt: T.DataType) -> np.ndarray:
    """Values of `dt`'s numpy type rounded to `dt` where numpy has no such type (bf16, float8)."""
    if dt == T.bf16:
        return round_bf16(x)
    if T.is_float8(dt):
        return round_float8(x, dt)
    return x


def to_dtype(x, dt: T.DataType) -> np.ndarray:
    """`x` converted to `dt` with C/PyTorch semantics (float to int truncates, bool is != 0)."""
    x = np.asarray(x)
    with np.errstate(all="ignore"):
        if dt.is_bool:
            return x != 0
        if dt.is_integer and x.dtype.kind == "f":
            x = np.trunc(x)
            info = np.iinfo(np_dtype(dt))
            # Out-of-range and NaN conversions are undefined in C; x86 gives the minimum.
            if dt.nbytes < 4:
                # x86 converts to int32 first and the narrow type wraps: -1.0 gives 255 in u8.
                x = to_dtype(x, T.i32)
            else:
                bad = ~np.isfinite(x) | (x < float(info.min)) | (x > float(info.max))
                if np.any(bad):
                    x = np.where(bad, float(info.min), x)
        if T.is_float8(dt) and x.dtype == np.float64:
            x = x.astype(np.float32)  # float64 rounds to float32 first, as in PyTorch
        out = x.astype(np_dtype(dt))
    return rounded(out, dt)


def evaluate(
    t: TensorNode, inputs: dict[str, np.ndarray], sizes: dict[str, int] | None = None
) -> np.ndarray:
    """The value of tensor `t` given its inputs' arrays by name and the size symbols' values."""
    return np.array(_Evaluator(inputs, sizes or {}).tensor(t))


class _Scope:
    """The index arrays visible in one (nested) grid and the values computed in it."""

    def __init__(self, shape: tuple[int, ...], env: dict[Var, np.ndarray]):
        self.shape = shape
        self.env = env
        self.memo: dict[Expr, np.ndarray] = {}


class _Evaluator:
    def __init__(self, inputs: dict[str, np.ndarray], sizes: dict[str, int]):
        self.inputs = inputs
        self.sizes = sizes
        self.tensors: dict[TensorNode, np.ndarray] = {}

    # Tensors -----------------------------------------------------------------------------

    def dim(self, d) -> int:
        if isinstance(d, int):
            return d
        return int(self.expr(d, _Scope((), {})))

    def tensor(self, t: TensorNode) -> np.ndarray:
        hit = self.tensors.get(t)
        if hit is None:
            hit = self.tensors[t] = self._tensor(t)
        return hit

    def _tensor(self, t: TensorNode) -> np.ndarray:
        shape = tuple(self.dim(d) for d in t.shape)
        if isinstance(t, TensorInput):
            if t.name not in self.inputs:
                raise KeyError(f"no array given for input {t.name}")
            arr = np.asarray(self.inputs[t.name])
            if arr.shape != shape:
                raise ValueError(f"input {t.name} has shape {arr.shape}, expected {shape}")
            if arr.dtype != np_dtype(t.dtype):
                raise TypeError(f"input {t.name} is {arr.dtype}, expected {t.dtype.name}")
            return rounded(arr, t.dtype)
        if not isinstance(t, Compute):
            raise TypeError(f"cannot evaluate {type(t).__name__}")
        rank = len(shape)
        env = {}
        for k, (v, n) in enumerate(zip(t.axes, shape)):
            env[v] = np.arange(n, dtype=np.int64).reshape([n if j == k else 1 for j in range(rank)])
        body = self.expr(t.body, _Scope(shape, env))
        return np.array(np.broadcast_to(to_dtype(body, t.dtype), shape), order="C")

    # Expressions -------------------------------------------------------------------------

    def expr(self, e: Expr, scope: _Scope, live=None) -> np.ndarray:
        """The value of `e` over the scope's grid.

        `live` (a bool array, or None for everywhere) marks the elements whose value is used:
        a Select's branches and the right operand of and/or are evaluated only where they are
        taken, as generated code does, so index and division checks apply there only.
        """
        hit = scope.memo.get(e)
        if hit is not None and _covers(hit[1], live):
            return hit[0]
        with np.errstate(all="ignore"):
            value = self._expr(e, scope, live)
        scope.memo[e] = (value, live)
        return value

    def _expr(self, e: Expr, scope: _Scope, live) -> np.ndarray:
        if isinstance(e, Const):
            return to_dtype(np.array(e.value), e.dtype)
        if isinstance(e, Var):
            if e in scope.env:
                return scope.env[e]
            if e.name in self.sizes:
                return np.array(self.sizes[e.name], dtype=np.int64)
            raise KeyError(f"unbound variable {e.name}")
        if isinstance(e, Binary):
            a = self.expr(e.a, scope, live)
            if e.op in ("and", "or"):
                taken = a.astype(bool) if e.op == "and" else ~a.astype(bool)
                b = self.expr(e.b, scope, _narrow(live, taken))
            else:
                b = self.expr(e.b, scope, live)
            return _fix(_binary(e.op, a, b, e.a.dtype, live), e.dtype)
        if isinstance(e, Unary):
            return _fix(_unary(e.op, self.expr(e.a, scope, live)), e.dtype)
        if isinstance(e, Call):
            args = [self.expr(a, scope, live) for a in e.args]
            return _fix(_call(e.name, args, e.args[0].dtype, live), e.dtype)
        if isinstance(e, Cast):
            return to_dtype(self.expr(e.a, scope, live), e.type)
        if isinstance(e, Select):
            c = self.expr(e.cond, scope, live).astype(bool)
            a = self.expr(e.a, scope, _narrow(live, c))
            b = self.expr(e.b, scope, _narrow(live, ~c))
            return _fix(np.where(c, a, b), e.dtype)
        if isinstance(e, TensorElement):
            arr = self.tensor(e.tensor)
            idx = tuple(self.expr(i, scope, live) for i in e.indices)
            return _gather(arr, idx, e.tensor.name, live)
        if isinstance(e, Load):
            flat = np.asarray(self.inputs[e.buf.name]).reshape(-1)
            return _gather(flat, (self.expr(e.index, scope, live),), e.buf.name, live)
        if isinstance(e, Reduce):
            return self._reduce(e, scope, live)
        raise TypeError(f"cannot evaluate {type(e).__name__}")

    def _reduce(self, e: Reduce, scope: _Scope, live) -> np.ndarray:
        extents = tuple(self.dim(d) for d in e.extents)
        k = len(extents)
        outer = len(scope.shape)
        env = {v: np.asarray(a).reshape(np.shape(a) + (1,) * k) for v, a in scope.env.items()}
        for j, (v, n) in enumerate(zip(e.axes, extents)):
            env[v] = np.arange(n, dtype=np.int64).reshape(
                [1] * outer + [n if q == j else 1 for q in range(k)]
            )
        inner = _Scope(scope.shape + extents, env)
        if live is not None:
            live = np.reshape(live, np.shape(live) + (1,) * k)
        body = np.broadcast_to(self.expr(e.body, inner, live), inner.shape)
        return _fix(_reduce_axes(e.kind, body, outer, k, e.body.dtype), e.dtype)


def _fix(x, dt: T.DataType) -> np.ndarray:
    """A result in the numpy type of `dt` (rounded for bf16 and float8)."""
    x = np.asarray(x)
    if x.dtype != np_dtype(dt):
        x = x.astype(np_dtype(dt))
    return rounded(x, dt)


def _narrow(live, taken):
    return taken if live is None else live & taken


def _covers(done, live) -> bool:
    """Whether a value computed for the elements `done` serves the elements `live`."""
    if done is None:
        return True
    return live is not None and bool(np.all(done | ~live))


def _gather(arr: np.ndarray, idx: tuple, name: str, live) -> np.ndarray:
    safe = []
    for k, i in enumerate(idx):
        bad = (i < 0) | (i >= arr.shape[k])
        if np.any(bad if live is None else bad & live):
            raise IndexError(f"index out of range in axis {k} of {name} (size {arr.shape[k]})")
        # Elements nobody uses may hold any index; read element 0 for them.
        safe.append(np.where(bad, 0, i) if np.any(bad) else i)
    return arr[tuple(safe)] if safe else arr[()]


def _reduce_axes(kind: str, body: np.ndarray, outer: int, k: int, dt: T.DataType) -> np.ndarray:
    axes = tuple(range(outer, outer + k))
    if kind == "sum":
        return np.sum(body, axis=axes, dtype=body.dtype)
    if kind == "prod":
        return np.prod(body, axis=axes, dtype=body.dtype)
    if kind in ("max", "min"):
        if dt.is_float:
            init = -np.inf if kind == "max" else np.inf
        elif dt.is_bool:
            init = kind == "min"
        else:
            info = np.iinfo(body.dtype)
            init = info.min if kind == "max" else info.max
        fn = np.max if kind == "max" else np.min
        return fn(body, axis=axes, initial=init)
    if kind in ("argmax", "argmin"):
        flat = body.reshape(body.shape[:outer] + (-1,))
        if flat.shape[-1] == 0:
            raise ValueError(f"{kind} of an empty reduction")
        # numpy, like PyTorch, takes the first NaN as the extreme value, and the first of ties.
        fn = np.argmax if kind == "argmax" else np.argmin
        return fn(flat, axis=-1).astype(np.int64)
    if kind == "any":
        return np.any(body != 0, axis=axes)
    if kind == "all":
        return np.all(body != 0, axis=axes)
    raise ValueError(f"unknown reduction {kind}")


def _divisor(b: np.ndarray, live) -> np.ndarray:
    """An integer divisor, raising where a used element divides by zero."""
    zero = b == 0
    if np.any(zero if live is None else zero & live):
        raise ZeroDivisionError("integer division by zero")
    return np.where(zero, np.ones_like(b), b) if np.any(zero) else b


def _trunc_div(a, b):
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def _binary(op: str, a, b, dt: T.DataType, live=None):
    integral = dt.is_integer or dt.is_bool
    if integral and op in ("div", "idiv", "floordiv", "imod", "mod"):
        b = _divisor(b, live)
    if op == "add":
        return np.logical_or(a, b) if dt.is_bool else a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return np.logical_and(a, b) if dt.is_bool else a * b
    if op in ("div", "idiv"):
        if integral:
            return _trunc_div(a, b)
        return a / b if op == "div" else np.trunc(a / b)
    if op == "floordiv":
        return np.floor_divide(a, b)
    if op == "imod":
        return np.fmod(a, b)
    if op == "mod":
        m = np.fmod(a, b)
        return np.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)
    if op in ("max", "min"):
        return np.maximum(a, b) if op == "max" else np.minimum(a, b)
    if op == "pow":
        return _pow(a, b, integral)
    if op in ("bitand", "bitor", "bitxor"):
        return {"bitand": np.bitwise_and, "bitor": np.bitwise_or, "bitxor": np.bitwise_xor}[op](
            a, b
        )
    if op in ("shl", "shr"):
        return _shift(op, a, b, dt)
    if op in ("lt", "le", "gt", "ge", "eq", "ne"):
        fn = {
            "lt": np.less,
            "le": np.less_equal,
            "gt": np.greater,
            "ge": np.greater_equal,
            "eq": np.equal,
            "ne": np.not_equal,
        }[op]
        return fn(a, b)
    if op == "and":
        return np.logical_and(a, b)
    if op == "or":
        return np.logical_or(a, b)
    raise ValueError(f"unknown binary op {op}")


def _pow(a, b, integral: bool):
    if not integral:
        # C's pow (and PyTorch's) gives pow(-inf, 0.5) = inf; numpy's float32 power gives nan.
        return _call("pow", [a, b], T.f32)
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    out = np.power(a, np.where(b < 0, 0, b))
    # PyTorch: a negative integer exponent gives 1 for 1, +-1 for -1, and 0 otherwise.
    one = np.ones_like(out)
    neg_one_pow = np.where(b % 2 == 0, one, -one) if out.dtype.kind == "i" else one
    neg = np.where(a == 1, one, np.where(a == -1, neg_one_pow, np.zeros_like(out)))
    return np.where(b < 0, neg, out)


def _shift(op: str, a, b, dt: T.DataType):
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    bits = np_dtype(dt).itemsize * 8
    bad = (b < 0) | (b >= bits)
    s = np.where(bad, 0, b).astype(a.dtype)
    if op == "shl":
        return np.where(bad, np.zeros_like(a), np.left_shift(a, s))
    # Shifting right by the width or more fills with the sign, as PyTorch does.
    fill = np.right_shift(a, bits - 1) if dt.kind == "int" else np.zeros_like(a)
    return np.where(bad, fill, np.right_shift(a, s))


def _unary(op: str, a):
    if op == "neg":
        return np.negative(a)
    if op == "not":
        return np.logical_not(a)
    if op == "bitnot":
        return np.invert(a)
    raise ValueError(f"unknown unary op {op}")


def _torch_fn(name: str):
    import torch

    special = {
        "rint": torch.round,
        "isnan": torch.isnan,
        "isinf": torch.isinf,
        "gelu": torch.nn.functional.gelu,
    }
    return special.get(name) or getattr(torch, name)


def _call(name: str, args: list, dt: T.DataType, live=None):
    """Math functions through PyTorch's CPU kernels, so special values behave as PyTorch's."""
    import torch

    if name == "checked_index":
        index, size = args[0], args[1]
        bad = (index < 0) | (index >= size)
        if np.any(bad if live is None else bad & live):
            raise IndexError("index out of range")
        return np.where(bad, 0, index)
    if name in ("fmod",) and (dt.is_integer or dt.is_bool):
        return np.fmod(args[0], _divisor(args[1], live))
    if name in ("floor", "ceil", "trunc", "rint") and not dt.is_float:
        return args[0]
    if name == "abs" and dt.is_integer:
        return np.abs(args[0])
    if name == "cbrt":
        return np.cbrt(args[0])
    arrays = np.broadcast_arrays(*[np.asarray(a) for a in args])
    tensors = [torch.from_numpy(np.array(a, order="C")) for a in arrays]
    return _torch_fn(name)(*tensors).numpy()
