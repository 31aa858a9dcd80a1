"""Hopper warpgroup MMA in scripts (sm_90a): wgmma_fence, wgmma_mma_async, wgmma_commit_group
and wgmma_wait_group.

A warpgroup is four consecutive warps (threads 128g to 128g + 127); all 128 threads execute
each of these primitives together. The primitives, and what each lowers to (the kernel-IR
intrinsic of the same name, an Effect statement; minicomp.backends.cuda.intrinsics_wgmma
renders them):

- `wgmma_mma_async(acc, a, b, swizzle=0, scale_d=1, trans_a=False, trans_b=False)`: starts
  D = A * B^T + D (scale_d 1) or
  D = A * B^T (scale_d 0, a runtime value) for the warpgroup, PTX
  `wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}`, or `m64nNk32.f32.
  {e4m3,e5m2}.{e4m3,e5m2}` for float8 (f8e4m3fn, f8e5m2, either pair). `a` is a 64xK tile of
  A and `b` an NxK tile of B (B's rows are D's columns), a K step being 32 bytes (16 f16 or
  bf16 elements alike, 32 float8), both in shared memory and K-major. `acc` is a register
  tensor of N/2 f32, this thread's part of the 64xN accumulator (N is 8, 16, 32, 64, 96,
  128, 192 or 256): element i of thread t (warp w = t % 128 // 32, lane l = t % 32) is
  D[16w + l // 4 + 8 * (i // 2 % 2), 8 * (i // 4) + 2 * (l % 4) + i % 2].
  The shape of the shared tensors says the layout, from which the primitive builds the
  two 64-bit matrix descriptors (start address >> 4, leading and stride byte offsets,
  swizzle mode in bits 62-63):
    swizzle=0: a tensor of shape (..., R / 8, K / c, 8, c), c = 16 bytes of elements: the
      core matrices (8 rows of 16 bytes) stored one after another; the operand is the core
      matrix at the tile's first row group and K group, such as `a_s[0, 2 * kk]` (K step kk).
    swizzle=32, 64 or 128: a tensor of shape (..., R, S bytes of elements): rows of exactly
      one S-byte swizzle span, stored swizzled (the 16-byte chunk c of a row at chunk
      c ^ (its 128-byte unit of the address) % (S / 16), minicomp/backends/cuda/swizzle.h, as
      TMA writes them); the operand is the tile's first row at its K offset, such as
      `a_s[0, 16 * kk]`. Such a tensor must be a `dynamic_shared_tensor` placed at a multiple
      of 8 * S bytes (the swizzle pattern's period): static shared arrays are only 16-byte
      aligned.
  trans_a / trans_b (f16/bf16 only; PTX's imm-trans-a/-b) make that operand MN-major, its
  rows contiguous (a [K, N] matrix as B): swizzle=0 takes the same shape, each core matrix 8 K
  of 8 rows (element (r, k) at [r // 8, k // 8, k % 8, r % 8]); a swizzle S takes K rows of one
  span of rows, shape (..., K, S / 2) or (..., rows / (S / 2), K, S / 2) for several spans
  (leading byte offset: the next span of rows; stride: the next 8 K), the operand at the K
  step's first K row, `v_s[0, 16 * kk, 0]`.
  `a` may be a register tensor of 8 f16/bf16 from the operand: A from registers, element j of
  thread t being A[16w + l // 4 + 8 * (j // 2 % 2), 2 * (l % 4) + j % 2 + 8 * (j // 4)], the
  accumulator's layout (so an accumulator's elements 8kk to 8kk + 7, converted, are the A of
  K step kk of a second product).
  The accumulator reads as NaN, on the emulator, until the `wgmma_wait_group` that retires
  the mma; shared memory is read then too, so the operands must stay unchanged until it.
- `wgmma_fence()`: orders this thread's earlier register accesses before later mma_asyncs
  (PTX `wgmma.fence.sync.aligned`). Needed before the first mma_async, and after any access of
  an accumulator (or a wait) before the next mma_async on it, except between mma_asyncs
  chained on one accumulator.
- `wgmma_commit_group()`: closes the group of the mma_asyncs issued since the last commit.
- `wgmma_wait_group(n)` (n a compile-time int): waits until at most n committed groups of
  this thread are pending. `wgmma_wait_group(n, acc)` also fences the accumulator tensor's
  registers, so that the compiler cannot move a read of them above the wait.

`wgmma_mma_async(acc[0], a[i], b[j], n, swizzle, lbo_a, sbo_a, lbo_b, sbo_b, scale_d, trans_a,
trans_b)`, every argument positional (the flags may be left out: K-major), is the explicit form
the IR printer writes: the descriptors' byte offsets as given, checked only for range and
alignment.
"""

from __future__ import annotations

import ast

from minicomp.ir import expr as E
from minicomp.ir import types as T
from minicomp.script import conversions as C
from minicomp.script.errors import Issue
from minicomp.script.lang import Primitive
from minicomp.script.mma import Operand, _aligned, _args, _check, _effect, operand
from minicomp.script.values import TensorRef

wgmma_fence = Primitive("wgmma_fence")
wgmma_commit_group = Primitive("wgmma_commit_group")
wgmma_wait_group = Primitive("wgmma_wait_group")
wgmma_mma_async = Primitive("wgmma_mma_async")

PRIMITIVES = (wgmma_fence, wgmma_commit_group, wgmma_wait_group, wgmma_mma_async)
SIXTEEN_BIT = (T.f16, T.bf16)
FLOAT8 = (T.f8e4m3fn, T.f8e5m2)
WGMMA_TYPES = SIXTEEN_BIT + FLOAT8
N_VALUES = (8, 16, 32, 64, 96, 128, 192, 256)
"""The N of m64nNk16 the device helpers (wgmma.h) have."""
SWIZZLE_MODES = {0: 0, 128: 1, 64: 2, 32: 3}
"""The descriptor's swizzle field (bits 62-63) of each swizzle span in bytes."""
M = 64
K_BYTES = 32  # a K step: 16 elements of 16 bits, 32 of float8
CORE_BYTES = 128  # a core matrix: 8 rows of 16 bytes
MAX_OFFSET = 1 << 18  # descriptor byte offsets: 14 bits of bytes >> 4
_NAME = "wgmma_mma_async"


def _tile(p, node: ast.AST, what: str) -> tuple[Operand, TensorRef | None, tuple]:
    """The operand at `node`, its tensor and the indices it was written with."""
    op = operand(p, node, what)
    base, indices = None, ()
    if isinstance(node, ast.Subscript):
        base = p.value(node.value)
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        indices = tuple(p.value(i) for i in items)
    else:
        base = p.value(node)
    return op, base if isinstance(base, TensorRef) else None, indices


def _const(v) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    return v.value if isinstance(v, E.Const) else None


def _layout(
    p, node, what: str, rows: int, swizzle: int, mn: bool = False
) -> tuple[Operand, int, int]:
    """The K-major operand of `rows` x (a K step of 32 bytes) at `node`, with the leading and
    stride byte offsets its tensor's shape gives under `swizzle` (`mn`: the core matrices of
    an unswizzled MN-major operand, 8 K of 16 bytes of rows, in the same shape)."""
    op, base, idx = _tile(p, node, what)
    _check(p, node, op, what, "shared", 0, WGMMA_TYPES)
    shape = base.shape if base is not None else ()
    size = op.dtype.nbytes
    core = 16 // size  # elements a core matrix row
    known = all(isinstance(d, int) for d in shape)
    at = [_const(i) for i in idx] + [0] * (len(shape) - len(idx))
    if swizzle == 0:
        if not known or len(shape) < 4 or tuple(shape[-2:]) != (8, core):
            inner = "8 K of 8 rows (MN-major)" if mn else f"8 rows of {core} K"
            raise p.src.error(
                node,
                f"{what} without swizzle must be a tensor of core matrices of {inner}, shape "
                f"(..., rows / 8, K / {core}, 8, {core}); {op.name} has shape {tuple(shape)}",
            )
        groups, kgroups = shape[-4], shape[-3]
        if at[-2:] != [0, 0]:
            raise p.src.error(node, f"{what} starts at a core matrix: index it [..., rg, kg]")
        rg, kg = at[-4], at[-3]
        if rg is not None and (groups - rg) * 8 < rows:
            raise p.src.error(
                node, f"{what} needs {rows} rows; {op.name} has {(groups - rg) * 8} from there"
            )
        if kg is not None and kgroups - kg < 2:
            raise p.src.error(
                node,
                f"{what} needs {2 * core} K elements (2 core matrices); {op.name} has "
                f"{(kgroups - kg) * core} from there",
            )
        _aligned(p, node, op, what, 16)
        return op, CORE_BYTES, kgroups * CORE_BYTES
    span = shape[-1] * op.dtype.nbytes if known and len(shape) >= 2 else None
    if span != swizzle or shape[-2] % 8:
        raise p.src.error(
            node,
            f"{what} with a {swizzle}-byte swizzle must be a tensor of rows of one swizzle "
            f"span, shape (..., rows, {swizzle // op.dtype.nbytes}) with rows a multiple of 8; "
            f"{op.name} has shape {tuple(shape)}",
        )
    r0, k0 = at[-2], at[-1]
    if r0 is not None and (r0 % 8 or shape[-2] - r0 < rows):
        raise p.src.error(
            node,
            f"{what} needs {rows} rows from a multiple of 8; {op.name} has {shape[-2]} and the "
            f"tile starts at row {r0}",
        )
    if k0 is not None and (k0 % core or k0 * size + K_BYTES > swizzle):
        raise p.src.error(
            node,
            f"{what} starts at K element {k0}; it must be a multiple of {core} with "
            f"{K_BYTES // size} elements left in the {swizzle}-byte span",
        )
    _swizzle_aligned(p, node, op, what, swizzle, base.offset)
    return op, 16, 8 * swizzle


def _mn_layout(p, node, what: str, rows: int, swizzle: int) -> tuple[Operand, int, int]:
    """The MN-major operand of `rows` x (a K step of 16 elements) at `node` (16-bit only),
    with the leading and stride byte offsets its tensor's shape gives under `swizzle`."""
    op, base, idx = _tile(p, node, what)
    _check(p, node, op, what, "shared", 0, WGMMA_TYPES)
    if op.dtype not in SIXTEEN_BIT:
        raise p.src.error(
            node,
            f"{what} is MN-major, which wgmma has for f16 and bf16 only; {op.name} is "
            f"{op.dtype} (float8 operands are K-major)",
        )
    if swizzle == 0:
        # Core matrices of 8 K of 8 rows: the K-major tensor shape, each core matrix transposed,
        # with the same offsets (lbo the next 8 K, sbo the next 8 rows).
        return _layout(p, node, what, rows, 0, mn=True)
    shape = base.shape if base is not None else ()
    size = op.dtype.nbytes
    span = swizzle // size  # rows a K row holds
    known = all(isinstance(d, int) for d in shape)
    blocks = rows // span
    if not known or len(shape) < 2 or shape[-1] != span or shape[-2] % 8:
        raise p.src.error(
            node,
            f"{what} (MN-major) with a {swizzle}-byte swizzle must be a tensor of K rows of one "
            f"swizzle span of {span} rows, shape (..., K, {span}) with K a multiple of 8 (and a "
            f"dimension of {span}-row blocks before K for more rows); {op.name} has shape "
            f"{tuple(shape)}",
        )
    if rows % span or (blocks > 1 and len(shape) < 3):
        raise p.src.error(
            node,
            f"{what} (MN-major) needs {rows} rows, whole {swizzle}-byte spans of {span}: a "
            f"tensor of shape (..., {max(blocks, 1)}, K, {span}); {op.name} has shape "
            f"{tuple(shape)}",
        )
    at = [_const(i) for i in idx] + [0] * (len(shape) - len(idx))
    k0, r0 = at[-2], at[-1]
    if r0 != 0:
        raise p.src.error(node, f"{what} (MN-major) starts at a row span: index it [..., k, 0]")
    if k0 is not None and (k0 % 8 or shape[-2] - k0 < M // 4):
        raise p.src.error(
            node,
            f"{what} (MN-major) needs 16 K rows from a multiple of 8; {op.name} has "
            f"{shape[-2]} and the tile starts at K row {k0}",
        )
    if blocks > 1 and at[-3] is not None and shape[-3] - at[-3] < blocks:
        raise p.src.error(
            node,
            f"{what} (MN-major) needs {blocks} blocks of {span} rows; {op.name} has "
            f"{shape[-3] - at[-3]} from there",
        )
    _swizzle_aligned(p, node, op, what, swizzle, base.offset)
    return op, shape[-2] * swizzle, 8 * swizzle


def _register_a(p, node, what: str, trans: bool) -> Operand:
    """A from registers: 8 f16/bf16 elements of a register tensor (four .f16x2 registers)."""
    op = operand(p, node, what)
    _check(p, node, op, what, "local", 8, SIXTEEN_BIT)
    if trans:
        raise p.src.error(node, f"{what} in registers has no transpose: trans_a is for shared a")
    return op


def _flag(p, node, what: str) -> int:
    if node is None:
        return 0
    v = p.constant(node, f"{what} of {_NAME}()")
    if not isinstance(v, bool | int) or v not in (0, 1):
        raise p.src.error(node, f"{what} of {_NAME}() is a compile-time True or False, not {v!r}")
    return int(v)


def _swizzle_aligned(p, node, op: Operand, what: str, swizzle: int, start=None) -> None:
    """Refuse a swizzled operand that is not in dynamic shared memory at a multiple of the
    pattern's period: its tensor's `start` (an element offset), and its own index where it is
    known at compile time."""
    period = 8 * swizzle
    if op.var not in p.dynamic_vars:
        raise p.src.error(
            node,
            f"{what} with a {swizzle}-byte swizzle must be a dynamic_shared_tensor placed at a "
            f"multiple of {period} bytes; {op.name} is a static shared tensor (16-byte aligned)",
        )
    if isinstance(start, int) and start * op.dtype.nbytes % period:
        raise p.src.error(
            node,
            f"{what} with a {swizzle}-byte swizzle must be a tensor placed at a multiple of "
            f"{period} bytes; {op.name} starts at dynamic shared byte {start * op.dtype.nbytes}",
        )
    if op.const_index is not None and op.const_index * op.dtype.nbytes % period >= swizzle:
        raise p.src.error(
            node,
            f"{what} with a {swizzle}-byte swizzle must start in the first row of a "
            f"{period}-byte aligned pattern; element {op.const_index} of {op.name} is at "
            f"dynamic shared byte {op.const_index * op.dtype.nbytes}",
        )


def _accumulator(p, node) -> tuple[Operand, int]:
    acc = operand(p, node, f"the accumulator of {_NAME}()")
    _check(p, node, acc, f"the accumulator of {_NAME}()", "local", 0, (T.f32,))
    if acc.element or acc.room is None or 2 * acc.room not in N_VALUES:
        allowed = ", ".join(str(n // 2) for n in N_VALUES)
        raise p.src.error(
            node,
            f"the accumulator of {_NAME}() is a whole register tensor of N/2 f32 ({allowed}) "
            f"for m64nNk16; {acc.name} has {acc.room}",
        )
    return acc, 2 * acc.room


def _scale_d(p, node) -> E.Expr:
    if node is None:
        return E.const(1, T.i32)
    v = p.value(node)
    if isinstance(v, bool) or C.is_number(v):
        if v not in (0, 1):
            raise p.src.error(node, f"scale_d of {_NAME}() is 0 or 1, not {v!r}")
        return E.const(int(v), T.i32)
    v = C.to_expr(v)
    if not (v.dtype.is_integer or v.dtype.is_bool):
        raise p.src.error(node, f"scale_d of {_NAME}() is a {v.dtype} value, not an integer")
    return E.cast(v, T.i32)


def _swizzle(p, node) -> int:
    if node is None:
        return 0
    s = p.compile_time_int(node, f"the swizzle of {_NAME}()")
    if s not in SWIZZLE_MODES:
        raise p.src.error(node, f"the swizzle of {_NAME}() is 0, 32, 64 or 128 bytes, not {s}")
    return s


def _same_type(p, node, a: Operand, b: Operand) -> None:
    """Refuse b unless it is a's type (16-bit) or a float8 type like a's."""
    family = FLOAT8 if a.dtype in FLOAT8 else (a.dtype,)
    if b.dtype not in family:
        allowed = " or ".join(t.short for t in family)
        raise p.src.error(
            node,
            f"the b operand of {_NAME}() must hold {allowed} elements like a; {b.name} is "
            f"{b.dtype}",
        )


def _mma_async(p, name, args, kwargs):
    if len(args) in (10, 12) and not kwargs:
        return _mma_async_explicit(p, args)
    if len(args) > 3:
        raise Issue(
            f"{name}() takes (acc, a, b, swizzle=0, scale_d=1, trans_a=False, trans_b=False), "
            f"all but acc, a and b by keyword; {len(args)} positional arguments given"
        )
    names = ("acc", "a", "b", "swizzle", "scale_d", "trans_a", "trans_b")
    bound = _args(name, args, kwargs, names, 3)
    acc_node, a_node, b_node, swizzle_node, scale_node, ta_node, tb_node = bound
    acc, n = _accumulator(p, acc_node)
    swizzle = _swizzle(p, swizzle_node)
    trans_a, trans_b = _flag(p, ta_node, "trans_a"), _flag(p, tb_node, "trans_b")
    a_what, b_what = f"the a operand of {name}()", f"the b operand of {name}()"
    if operand(p, a_node, a_what).scope == "local":
        a, lbo_a, sbo_a = _register_a(p, a_node, a_what, trans_a), 0, 0
    elif trans_a:
        a, lbo_a, sbo_a = _mn_layout(p, a_node, a_what, M, swizzle)
    else:
        a, lbo_a, sbo_a = _layout(p, a_node, a_what, M, swizzle)
    if trans_b:
        b, lbo_b, sbo_b = _mn_layout(p, b_node, b_what, n, swizzle)
    else:
        b, lbo_b, sbo_b = _layout(p, b_node, b_what, n, swizzle)
    _same_type(p, b_node, a, b)
    offsets = (lbo_a, sbo_a, lbo_b, sbo_b)
    return _call(acc, a, b, n, swizzle, offsets, _scale_d(p, scale_node), trans_a, trans_b)


def _mma_async_explicit(p, args):
    acc = operand(p, args[0], f"the accumulator of {_NAME}()")
    n = p.compile_time_int(args[3], f"the N of {_NAME}()")
    if n not in N_VALUES:
        raise p.src.error(args[3], f"{_NAME}() has N {', '.join(map(str, N_VALUES))}, not {n}")
    _check(p, args[0], acc, f"the accumulator of {_NAME}()", "local", n // 2, (T.f32,))
    swizzle = _swizzle(p, args[4])
    trans = [_flag(p, node, what) for node, what in zip(args[10:], ("trans_a", "trans_b"))]
    trans_a, trans_b = trans or (0, 0)
    ops = []
    for node, what in ((args[1], "a"), (args[2], "b")):
        what = f"the {what} operand of {_NAME}()"
        op = operand(p, node, what)
        if not ops and op.scope == "local":
            ops.append(_register_a(p, node, what, trans_a))
            continue
        _check(p, node, op, what, "shared", 0, WGMMA_TYPES)
        _aligned(p, node, op, what, 16)
        if swizzle:
            _swizzle_aligned(p, node, op, what, swizzle)
        ops.append(op)
    _same_type(p, args[2], *ops)
    if (trans_a or trans_b) and ops[0].dtype not in SIXTEEN_BIT:
        raise p.src.error(args[1], f"{_NAME}() has MN-major operands for f16 and bf16 only")
    offsets = []
    for node in args[5:9]:
        v = p.compile_time_int(node, f"a byte offset of {_NAME}()")
        if v % 16 or not 0 <= v < MAX_OFFSET:
            raise p.src.error(node, f"{_NAME}() byte offsets are multiples of 16 below 2^18")
        offsets.append(v)
    return _call(acc, *ops, n, swizzle, offsets, _scale_d(p, args[9]), trans_a, trans_b)


def _call(acc, a, b, n, swizzle, offsets, scale_d, trans_a, trans_b):
    consts = [E.const(v, T.i32) for v in (n, swizzle, *offsets)]
    flags = [E.const(v, T.i32) for v in (trans_a, trans_b)]
    return _effect(
        _NAME, acc.var, acc.index, a.var, a.index, b.var, b.index, *consts, scale_d, *flags
    )


def _no_args(p, name, args, kwargs):
    _args(name, args, kwargs, (), 0)
    return _effect(name)


def _wait_group(p, name, args, kwargs):
    n_node, acc_node, count_node = _args(name, args, kwargs, ("n", "acc", "count"), 1)
    n = p.compile_time_int(n_node, f"the group count of {name}()")
    if not 0 <= n <= 7:
        raise p.src.error(n_node, f"{name}(n) leaves 0 to 7 groups pending, not {n}")
    if acc_node is None:
        return _effect(name, E.const(n, T.i32))
    acc = operand(p, acc_node, f"the accumulator of {name}()")
    if count_node is None and (acc.element or acc.room is None):
        raise p.src.error(acc_node, f"the accumulator of {name}() is a whole register tensor")
    count = acc.room if count_node is None else p.compile_time_int(count_node, "the count")
    _check(p, acc_node, acc, f"the accumulator of {name}()", "local", count, (T.f32,))
    if not 0 < count <= max(N_VALUES) // 2:
        raise p.src.error(acc_node, f"{name}() fences 1 to 128 accumulators, not {count}")
    return _effect(name, E.const(n, T.i32), acc.var, acc.index, E.const(count, T.i32))


HANDLERS = {
    "wgmma_fence": _no_args,
    "wgmma_commit_group": _no_args,
    "wgmma_wait_group": _wait_group,
    "wgmma_mma_async": _mma_async,
}
"""The call handlers of minicomp.script.calls for these primitives, by name."""
