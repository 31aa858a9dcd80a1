"""Tensor-core and async-copy primitives of scripts: mma_sync_m16n8k16 (f16/bf16),
mma_sync_m16n8k32 (8-bit integers, or float8 e4m3/e5m2 on sm_89+), ldmatrix, cp_async.

Each lowers to the kernel-IR intrinsic of its name (`cp_async(..., nbytes)` to
cp_async_<nbytes>; minicomp.backends.cuda.intrinsics_mma has the fragment layouts) as an Effect
statement. A memory operand is a tensor, a view of one (`acc[i, j]`: its elements) or an
element (`t[i, j, 0]`: the elements from it to the end of the tensor, row-major); the
intrinsic gets the buffer and the flat index of its first element. Sizes are checked where
they are known at compile time: an element with a runtime index is refused only when no index
in bounds leaves room.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir import types as T
from minicomp.script import conversions as C
from minicomp.script.errors import Issue
from minicomp.script.values import Effect, TensorRef, as_index, row_major_strides

MMA_TYPES = (T.f16, T.bf16)
# The operand types of mma_sync_m16n8k32 (either operand either type of one family): 8-bit
# integers summed in i32, or float8 (sm_89 and newer) summed in f32.
INT8_MMA_TYPES = (T.i8, T.u8)
FP8_MMA_TYPES = (T.f8e4m3fn, T.f8e5m2)
SIXTEEN_BIT = (T.f16, T.bf16, T.i16, T.u16)
# What 8-bit ldmatrix moves: bytes, whatever they encode.
EIGHT_BIT = (*INT8_MMA_TYPES, *T.FLOAT8_TYPES)
K32_TYPES = (*INT8_MMA_TYPES, *FP8_MMA_TYPES)
ASYNC_COPY_BYTES = (4, 8, 16)
_SCOPES = {"local": "a register tensor", "shared": "a shared tensor", "global": "a global tensor"}


@dataclass(frozen=True)
class Operand:
    """A memory operand: its tensor's variable, the flat index of its first element, how many
    elements there are from there at most (None when unknown), the index when it is a
    compile-time int, and whether the operand was written as an element."""

    name: str
    var: E.Var
    index: E.Expr
    room: int | None
    const_index: int | None
    element: bool = False

    @property
    def dtype(self) -> T.DataType:
        return self.var.type.elem

    @property
    def scope(self) -> str:
        return self.var.type.space


def operand(p, node: ast.AST, what: str) -> Operand:
    """The memory operand written at `node` (a tensor, a view of one, or an element)."""
    if isinstance(node, ast.Subscript):
        base = p.value(node.value)
        if isinstance(base, TensorRef):
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if any(isinstance(i, ast.Slice) for i in items):
                raise p.src.error(node, "slices are not supported; index every dimension")
            values = tuple(p.value(i) for i in items)
            flat, rest = base.index(values)
            if rest:
                return _whole(TensorRef(f"{base.name}[...]", base.var, rest, flat))
            room = _room_after(base, values)
            const = flat if isinstance(flat, int) else None
            return Operand(base.name, base.var, as_index(flat), room, const, element=True)
    v = p.value(node)
    if isinstance(v, TensorRef):
        return _whole(v)
    raise p.src.error(
        node,
        f"{what} takes a tensor, a view such as t[i] or an element such as t[i, j], "
        f"not {C.describe(v)}",
    )


def _known(shape: tuple) -> bool:
    """Whether every size of `shape` is known at compile time (a pointer parameter's shape,
    (-1,), is not)."""
    return all(isinstance(d, int) and d >= 0 for d in shape)


def _whole(ref: TensorRef) -> Operand:
    size = math.prod(ref.shape) if _known(ref.shape) else None
    const = ref.offset if isinstance(ref.offset, int) else None
    return Operand(ref.name, ref.var, as_index(ref.offset), size, const)


def _room_after(base: TensorRef, indices: tuple) -> int | None:
    """Elements from base[indices] to the end of `base`, taking runtime indices as 0 (the
    most room any in-bounds index leaves); None for a tensor of runtime size or a pointer."""
    if not _known(base.shape):
        return None
    strides = row_major_strides(base.shape)
    before = sum(i * s for i, s in zip(indices, strides) if isinstance(i, int))
    return math.prod(base.shape) - before


def _check(p, node, op: Operand, what: str, scope: str, count: int, types=None) -> None:
    """Refuse `op` unless it lies in `scope`, has an element type among `types` and holds
    `count` elements."""
    if op.scope != scope:
        have = _SCOPES.get(op.scope, f"a {op.scope} tensor")
        raise p.src.error(node, f"{what} must be {_SCOPES[scope]}; {op.name} is {have}")
    if types is not None and op.dtype not in types:
        allowed = " or ".join(t.short for t in types)
        raise p.src.error(node, f"{what} must hold {allowed} elements; {op.name} is {op.dtype}")
    if op.room is not None and op.room < count:
        where = " from there" if op.element else ""
        raise p.src.error(
            node, f"{what} needs {count} {op.dtype} elements; {op.name} has {op.room}{where}"
        )


def _aligned(p, node, op: Operand, what: str, nbytes: int) -> None:
    """Refuse a compile-time index whose address is not aligned to `nbytes` (shared arrays
    start 16-byte aligned)."""
    if op.const_index is not None and op.const_index * op.dtype.nbytes % nbytes:
        raise p.src.error(
            node,
            f"{what} must be {nbytes}-byte aligned; element {op.const_index} of "
            f"{op.name} is at byte {op.const_index * op.dtype.nbytes}",
        )


def _args(name: str, args: list, kwargs: dict, names: tuple[str, ...], required: int) -> list:
    """Positional and keyword arguments bound to `names` (None where left out)."""
    if len(args) > len(names):
        most = f"at most {len(names)}" if names else "no"
        raise Issue(f"{name}() takes {most} arguments, {len(args)} given")
    bound = list(args) + [None] * (len(names) - len(args))
    for key, value in kwargs.items():
        if key not in names:
            raise Issue(f"{name}() has no argument {key!r}")
        k = names.index(key)
        if bound[k] is not None:
            raise Issue(f"{name}() got two values for argument {key!r}")
        bound[k] = value
    missing = [n for n, v in zip(names[:required], bound) if v is None]
    if missing:
        raise Issue(f"{name}() is missing {', '.join(missing)} (it takes {', '.join(names)})")
    return bound


def _effect(name: str, *args: E.Expr) -> Effect:
    return Effect(S.Evaluate(E.Call(name, tuple(args), T.i32)), f"{name}()")


def _mma(p, name, args, kwargs):
    nodes = _args(name, args, kwargs, ("d", "a", "b", "c"), 4)
    ops = {}
    for key, node in zip("dabc", nodes):
        ops[key] = operand(p, node, f"the {key} operand of {name}()")
    d, a, b, c = (ops[k] for k in "dabc")
    _check(p, nodes[1], a, f"the a operand of {name}()", "local", 8, MMA_TYPES)
    if b.dtype != a.dtype:
        raise p.src.error(
            nodes[2],
            f"the b operand of {name}() must hold {a.dtype} elements like a; {b.name} is {b.dtype}",
        )
    _check(p, nodes[2], b, f"the b operand of {name}()", "local", 4)
    for key, node in (("c", nodes[3]), ("d", nodes[0])):
        _check(p, node, ops[key], f"the {key} operand of {name}()", "local", 4, (T.f32,))
    return _effect(name, d.var, d.index, a.var, a.index, b.var, b.index, c.var, c.index)


def _mma_k32(p, name, args, kwargs):
    nodes = _args(name, args, kwargs, ("d", "a", "b", "c"), 4)
    ops = {}
    for key, node in zip("dabc", nodes):
        ops[key] = operand(p, node, f"the {key} operand of {name}()")
    d, a, b, c = (ops[k] for k in "dabc")
    _check(p, nodes[1], a, f"the a operand of {name}()", "local", 16, K32_TYPES)
    # One family for both operands: integers (summed in i32) or float8 (summed in f32).
    family, acc = (INT8_MMA_TYPES, T.i32) if a.dtype in INT8_MMA_TYPES else (FP8_MMA_TYPES, T.f32)
    if b.dtype in K32_TYPES and b.dtype not in family:
        allowed = " or ".join(t.short for t in family)
        raise p.src.error(
            nodes[2],
            f"the b operand of {name}() must hold {allowed} elements like a ({a.dtype}); "
            f"{b.name} is {b.dtype}",
        )
    _check(p, nodes[2], b, f"the b operand of {name}()", "local", 8, family)
    for key, node in (("c", nodes[3]), ("d", nodes[0])):
        _check(p, node, ops[key], f"the {key} operand of {name}()", "local", 4, (acc,))
    return _effect(name, d.var, d.index, a.var, a.index, b.var, b.index, c.var, c.index)


def _ldmatrix(p, name, args, kwargs):
    dst_node, src_node = _args(name, args, kwargs, ("dst", "src"), 2)
    matrices = int(name.split("_")[1][1:])  # ldmatrix_x4_trans: 4 matrices
    dst = operand(p, dst_node, f"the destination of {name}()")
    src = operand(p, src_node, f"the source of {name}()")
    trans = name.endswith("_trans")
    if dst.dtype in EIGHT_BIT and trans:
        raise p.src.error(
            dst_node,
            f"{name}() transposes 16-bit elements; {dst.name} holds {dst.dtype} (load 8-bit "
            f"tiles stored K-major with {name[: -len('_trans')]}())",
        )
    widths = SIXTEEN_BIT if trans else SIXTEEN_BIT + EIGHT_BIT
    # 16 bytes a lane of each matrix: 2 elements of 16 bits, 4 of 8.
    count = matrices * 4 // dst.dtype.nbytes if dst.dtype in widths else 2 * matrices
    _check(p, dst_node, dst, f"the destination of {name}()", "local", count, widths)
    if src.dtype != dst.dtype:
        raise p.src.error(
            src_node,
            f"{name}() loads {src.dtype} elements of {src.name} into {dst.dtype} "
            f"register tensor {dst.name}; the types must match",
        )
    # Each lane names one 16-byte row.
    _check(p, src_node, src, f"the source row of {name}()", "shared", 16 // src.dtype.nbytes)
    _aligned(p, src_node, src, f"the source row of {name}()", 16)
    return _effect(name, dst.var, dst.index, src.var, src.index)


def _cp_async(p, name, args, kwargs):
    names = ("dst", "src", "nbytes", "src_bytes")
    dst_node, src_node, nbytes_node, fill_node = _args(name, args, kwargs, names, 3)
    nbytes = p.compile_time_int(nbytes_node, f"the byte count of {name}()")
    if nbytes not in ASYNC_COPY_BYTES:
        raise p.src.error(nbytes_node, f"{name}() copies 4, 8 or 16 bytes, not {nbytes}")
    dst = operand(p, dst_node, f"the destination of {name}()")
    src = operand(p, src_node, f"the source of {name}()")
    if src.dtype != dst.dtype:
        raise p.src.error(
            src_node,
            f"{name}() copies {src.dtype} elements of {src.name} into {dst.dtype} "
            f"tensor {dst.name}; the types must match",
        )
    if nbytes % dst.dtype.nbytes:
        raise p.src.error(
            nbytes_node, f"{name}() of {nbytes} bytes is not a whole number of {dst.dtype} elements"
        )
    count = nbytes // dst.dtype.nbytes
    _check(p, dst_node, dst, f"the destination of {name}()", "shared", count)
    _check(p, src_node, src, f"the source of {name}()", "global", count)
    _aligned(p, dst_node, dst, f"the destination of {name}()", nbytes)
    call_args = [dst.var, dst.index, src.var, src.index]
    if fill_node is not None:
        call_args.append(_src_bytes(p, fill_node, name, nbytes))
    return _effect(f"cp_async_{nbytes}", *call_args)


def _src_bytes(p, node, name: str, nbytes: int) -> E.Expr:
    v = p.value(node)
    if C.is_number(v):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= nbytes:
            raise p.src.error(node, f"src_bytes of {name}() must be 0 to {nbytes}, not {v!r}")
        return E.const(v, T.i32)
    v = C.to_expr(v)
    if not v.dtype.is_integer:
        raise p.src.error(node, f"src_bytes of {name}() is a {v.dtype} value, not an integer")
    return E.cast(v, T.i32)


def _cp_async_commit(p, name, args, kwargs):
    _args(name, args, kwargs, (), 0)
    return _effect(name)


def _cp_async_wait(p, name, args, kwargs):
    (node,) = _args(name, args, kwargs, ("n",), 1)
    n = p.compile_time_int(node, f"the group count of {name}()")
    if n < 0:
        raise p.src.error(
            node, f"{name}(n) waits until at most n groups are pending; n must be >= 0, not {n}"
        )
    return _effect(name, E.const(n, T.i32))


HANDLERS = {
    "mma_sync_m16n8k16": _mma,
    "mma_sync_m16n8k32": _mma_k32,
    **{f"ldmatrix_x{n}{t}": _ldmatrix for n in (1, 2, 4) for t in ("", "_trans")},
    "cp_async": _cp_async,
    "cp_async_commit": _cp_async_commit,
    "cp_async_wait": _cp_async_wait,
    "cp_async_wait_all": _cp_async_commit,
}
"""The call handlers of minicomp.script.calls for these primitives, by name."""
