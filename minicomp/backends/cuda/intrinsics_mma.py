"""Tensor-core (mma.sync, ldmatrix) and async-copy (cp.async) intrinsics of the CUDA target.

`MmaIntrinsics` is a mixin of `intrinsic_<name>` methods for CudaRenderer. Each intrinsic is a
kernel-IR `Call` (dtype i32, used as an `Evaluate` statement) whose memory operands are pairs
`(buffer Var, element index)` naming the first element, like `store_vec`, and renders as a
call of a device function of mma.h (inline PTX, sm_80+) or, in the emulator, of emu_mma.h:

- `mma_sync_m16n8k16(d, di, a, ai, b, bi, c, ci)`: D = A * B + C for one warp, A 16x16 (row
  major), B 16x8 (column major), C and D 16x8 f32. `a`/`b` hold this lane's 8/4 elements,
  both f16 or both bf16; `c`/`d` its 4 f32 accumulators (`d` may be `c`). PTX
  `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`.
- `mma_sync_m16n8k32(d, di, a, ai, b, bi, c, ci)`: the same for 8-bit integers, A 16x32 (row
  major), B 32x8 (column major), C and D 16x8 s32. `a`/`b` hold this lane's 16/8 elements, each
  operand i8 or u8 (any of the four pairs); `c`/`d` its 4 i32 accumulators. PTX
  `mma.sync.aligned.m16n8k32.row.col.s32.{s8,u8}.{s8,u8}.s32`, without .satfinite: the sums
  wrap modulo 2^32 as eager's int32 arithmetic does.
  With float8 operands (f8e4m3fn or f8e5m2, any pair; sm_89 and newer) the same layouts are
  summed in f32: `c`/`d` are 4 f32, PTX `mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.
  {e4m3,e5m2}.f32`. (sm_89 runs it as one QMMA; sm_90 as two f16 HMMA.16816 after unpacking
  the bytes to f16 with F2FP, at the f16 mma.sync rate.) Compiled for an older architecture,
  a kernel using it fails to compile with a message naming the instruction and sm_89.
- `ldmatrix_x1|x2|x4[_trans](dst, di, src, si)`: loads 1, 2 or 4 8x8 matrices of 16-bit
  elements from shared memory; `src[si]` is the 16-byte row this lane names (lanes 8m..8m+7
  give rows 0..7 of matrix m, 16-byte aligned), `dst` receives 2 elements a matrix. PTX
  `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16`. Without .trans the elements may
  be 8-bit (i8, u8, float8): a row is then 16 of them and `dst` receives 4 consecutive ones a matrix
  (lane l: row l / 4, columns 4 * (l % 4) + 0..3), the A and B fragments of m16n8k32 as they
  come from K-major tiles. .trans moves 16-bit elements only: it cannot transpose bytes.
- `cp_async_4|8|16(dst, di, src, si[, src_bytes])`: copies 4, 8 or 16 bytes from global
  `src[si]` to shared `dst[di]` asynchronously (.ca for 4 and 8 bytes, .cg for 16), both
  aligned to the size; with `src_bytes`, only that many are read and the rest is zero-filled.
- `cp_async_commit()`, `cp_async_wait(n)` (n a constant: wait until at most n committed
  groups are pending), `cp_async_wait_all()`.

Fragment layouts, from the PTX ISA (section "Matrix Fragments for mma.m16n8k16 with floating
point type", and "Warp-level matrix load instruction: ldmatrix"), with g = lane >> 2 and
t = lane % 4 (`mma_fragment` below computes them):

    A a_i (i < 8): row g + 8 * ((i >> 1) & 1), column 2t + (i & 1) + 8 * (i >> 2)
    B b_i (i < 4): row 2t + (i & 1) + 8 * (i >> 1), column g
    C/D c_i (i < 4): row g + 8 * (i >> 1), column 2t + (i & 1)
    ldmatrix, matrix m, dst[2m + j]: row lane / 4, column 2 * (lane % 4) + j of matrix m;
        with .trans, row 2 * (lane % 4) + j, column lane / 4 (rows as given by the addresses).

So `ldmatrix_x4` over the A tile's quadrants (rows 0-7/8-15 at column 0, then at column 8:
lane l names row l % 16, column 8 * (l // 16)) yields a0..a7, and `ldmatrix_x2_trans` over a
row-major 16x8 B tile (lane l names row l % 16) yields b0..b3.

m16n8k32 with 8-bit integers or float8 ("Matrix Fragments for mma.m16n8k32": the .s8/.u8
and .e4m3/.e5m2 tables are one; four elements a .b32 register, the lower index in the low
byte):

    A a_i (i < 16): row g + 8 * ((i >> 2) & 1), column 4t + (i & 3) + 16 * (i >> 3)
    B b_i (i < 8):  row 4t + (i & 3) + 16 * (i >> 2), column g
    C/D c_i (i < 4): as for m16n8k16 (s32)

So the same addresses give them from K-major tiles of bytes: `ldmatrix_x4` over the A tile
(lane l names row l % 16, column 16 * (l // 16)) yields a0..a15, and `ldmatrix_x2` over the B
tile stored as rows of N (lane l names row l % 8, column 16 * (l // 8 % 2)) yields b0..b7.
"""

from __future__ import annotations

import os

from minicomp.ir import expr as E
from minicomp.ir.types import (
    FLOAT8_TYPES,
    DataType,
    PointerType,
    bf16,
    f8e4m3fn,
    f8e5m2,
    f16,
    f32,
    i8,
    i32,
    u8,
)

_DIR = os.path.dirname(os.path.abspath(__file__))
HEADER_PATH = os.path.join(_DIR, "mma.h")
EMU_HEADER_PATH = os.path.join(_DIR, "emu_mma.h")

_LDMATRIX = {
    f"ldmatrix_x{num}{suffix}": (num, trans)
    for num in (1, 2, 4)
    for suffix, trans in (("", False), ("_trans", True))
}
WARP_COLLECTIVE_INTRINSICS = frozenset(("mma_sync_m16n8k16", "mma_sync_m16n8k32", *_LDMATRIX))
"""The intrinsics every lane of a warp must reach together (the emulator runs them on fibers)."""
ASYNC_COPY_BYTES = {4: "ca4", 8: "ca8", 16: "cg16"}
MMA_INTRINSICS = WARP_COLLECTIVE_INTRINSICS | frozenset(
    (
        *(f"cp_async_{n}" for n in ASYNC_COPY_BYTES),
        "cp_async_commit",
        "cp_async_wait",
        "cp_async_wait_all",
    )
)
"""Every intrinsic this module renders."""
_SIXTEEN_BIT = ("f16", "bf16", "i16", "u16")
_EIGHT_BIT = ("i8", "u8", *(t.short for t in FLOAT8_TYPES))
# The PTX type of each 8-bit operand of m16n8k32: integers (s32 sums) or float8 (f32 sums).
_INT8_MMA = {i8: "s8", u8: "u8"}
_FP8_MMA = {f8e4m3fn: "e4m3", f8e5m2: "e5m2"}


def mma_fragment(operand: str, lane: int, i: int, shape: str = "m16n8k16") -> tuple[int, int]:
    """The (row, column) of element `i` that `lane` holds of operand "a", "b" or "c" (C and D
    share a layout) of mma `shape` ("m16n8k16": f16/bf16; "m16n8k32": 8-bit integers), per
    the PTX ISA's fragment tables."""
    g, t = lane >> 2, lane % 4
    if operand == "c" and 0 <= i < 4:
        return g + 8 * (i >> 1), 2 * t + (i & 1)
    if shape == "m16n8k16":
        if operand == "a" and 0 <= i < 8:
            return g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)
        if operand == "b" and 0 <= i < 4:
            return 2 * t + (i & 1) + 8 * (i >> 1), g
    elif shape == "m16n8k32":
        if operand == "a" and 0 <= i < 16:
            return g + 8 * ((i >> 2) & 1), 4 * t + (i & 3) + 16 * (i >> 3)
        if operand == "b" and 0 <= i < 8:
            return 4 * t + (i & 3) + 16 * (i >> 2), g
    else:
        raise ValueError(f"no mma shape {shape!r}")
    raise ValueError(f"mma.{shape} has no element {i} of operand {operand!r}")


class MmaIntrinsics:
    """`intrinsic_<name>` methods rendering the tensor-core and async-copy intrinsics (a mixin
    for a CLikeRenderer subclass: it uses `expr` and `name_of`)."""

    def _element(self, buf: E.Expr, index: E.Expr, what: str, space: str | None = None) -> str:
        if not isinstance(buf, E.Var) or not isinstance(buf.type, PointerType):
            raise ValueError(f"{what} needs a buffer variable, not {buf}")
        if space is not None and buf.type.space != space:
            raise ValueError(f"{what} must be in {space} memory; {buf.name} is {buf.type.space}")
        return f"&{self.name_of(buf)}[{self.expr(index)}]"

    @staticmethod
    def _elem(buf: E.Expr) -> DataType | None:
        if isinstance(buf, E.Var) and isinstance(buf.type, PointerType):
            return buf.type.elem
        return None

    def intrinsic_mma_sync_m16n8k16(self, e: E.Call) -> str:
        if len(e.args) != 8:
            raise ValueError(f"mma_sync_m16n8k16 takes (d, di, a, ai, b, bi, c, ci): {e}")
        d, di, a, ai, b, bi, c, ci = e.args
        kind = self._elem(a)
        if kind not in (f16, bf16) or self._elem(b) != kind:
            raise ValueError(
                f"mma_sync_m16n8k16 multiplies f16 by f16 or bf16 by bf16, not "
                f"{self._elem(a)} by {self._elem(b)}"
            )
        if self._elem(c) != f32 or self._elem(d) != f32:
            raise ValueError(f"mma_sync_m16n8k16 accumulates in f32 arrays: {e}")
        operands = ", ".join(
            self._element(buf, index, f"the {name} of mma_sync_m16n8k16")
            for name, buf, index in (("d", d, di), ("a", a, ai), ("b", b, bi), ("c", c, ci))
        )
        return f"mc_mma_m16n8k16_{kind.short}({operands})"

    def intrinsic_mma_sync_m16n8k32(self, e: E.Call) -> str:
        if len(e.args) != 8:
            raise ValueError(f"mma_sync_m16n8k32 takes (d, di, a, ai, b, bi, c, ci): {e}")
        d, di, a, ai, b, bi, c, ci = e.args
        kinds = self._elem(a), self._elem(b)
        families = [(f, acc) for f, acc in ((_INT8_MMA, i32), (_FP8_MMA, f32)) if kinds[0] in f]
        if not families or kinds[1] not in families[0][0]:
            raise ValueError(
                f"mma_sync_m16n8k32 multiplies 8-bit integers (i8, u8) or float8 (f8e4m3fn, "
                f"f8e5m2), not {kinds[0]} by {kinds[1]}"
            )
        family, acc = families[0]
        if self._elem(c) != acc or self._elem(d) != acc:
            raise ValueError(f"mma_sync_m16n8k32 of {kinds[0]} accumulates in {acc} arrays: {e}")
        operands = ", ".join(
            self._element(buf, index, f"the {name} of mma_sync_m16n8k32")
            for name, buf, index in (("d", d, di), ("a", a, ai), ("b", b, bi), ("c", c, ci))
        )
        return f"mc_mma_m16n8k32_{family[kinds[0]]}{family[kinds[1]]}({operands})"

    def _ldmatrix(self, e: E.Call) -> str:
        if len(e.args) != 4:
            raise ValueError(f"{e.name} takes (dst, di, src, si): {e}")
        dst, di, src, si = e.args
        widths = _SIXTEEN_BIT if e.name.endswith("_trans") else _SIXTEEN_BIT + _EIGHT_BIT
        for buf in (dst, src):
            elem = self._elem(buf)
            if elem is None or elem.short not in widths:
                what = "16-bit" if widths is _SIXTEEN_BIT else "16-bit or 8-bit"
                raise ValueError(f"{e.name} moves {what} elements, not {elem}: {e}")
        if self._elem(dst) != self._elem(src):
            raise ValueError(f"{e.name} from {self._elem(src)} to {self._elem(dst)}: {e}")
        target = self._element(dst, di, f"the destination of {e.name}")
        row = self._element(src, si, f"the source of {e.name}", space="shared")
        # 8-bit elements: the same instruction, its registers unpacked into bytes.
        suffix = "_b8" if self._elem(dst).short in _EIGHT_BIT else ""
        return f"mc_{e.name}{suffix}({target}, {row})"

    def _cp_async(self, e: E.Call, nbytes: int) -> str:
        if len(e.args) not in (4, 5):
            raise ValueError(f"{e.name} takes (dst, di, src, si[, src_bytes]): {e}")
        dst, di, src, si, *src_bytes = e.args
        if self._elem(dst) != self._elem(src):
            raise ValueError(f"{e.name} from {self._elem(src)} to {self._elem(dst)}: {e}")
        target = self._element(dst, di, f"the destination of {e.name}", space="shared")
        source = self._element(src, si, f"the source of {e.name}", space="global")
        helper = f"mc_cp_async_{ASYNC_COPY_BYTES[nbytes]}"
        if not src_bytes:
            return f"{helper}({target}, {source})"
        count = self.expr(E.cast(src_bytes[0], i32))
        return f"{helper}_zfill({target}, {source}, {count})"

    def intrinsic_cp_async_commit(self, e: E.Call) -> str:
        if e.args:
            raise ValueError(f"cp_async_commit takes no arguments: {e}")
        return "mc_cp_async_commit()"

    def intrinsic_cp_async_wait(self, e: E.Call) -> str:
        count = e.args[0] if len(e.args) == 1 else None
        if not isinstance(count, E.Const) or not count.dtype.is_integer:
            raise ValueError(f"cp_async_wait takes a constant count of groups: {e}")
        n = count.value
        if n < 0:
            raise ValueError(f"cp_async_wait of {n} groups")
        return f"mc_cp_async_wait<{n}>()"

    def intrinsic_cp_async_wait_all(self, e: E.Call) -> str:
        if e.args:
            raise ValueError(f"cp_async_wait_all takes no arguments: {e}")
        return "mc_cp_async_wait_all()"

    # One method a name, so that render_intrinsic finds each.

    def intrinsic_ldmatrix_x1(self, e: E.Call) -> str:
        return self._ldmatrix(e)

    def intrinsic_ldmatrix_x2(self, e: E.Call) -> str:
        return self._ldmatrix(e)

    def intrinsic_ldmatrix_x4(self, e: E.Call) -> str:
        return self._ldmatrix(e)

    def intrinsic_ldmatrix_x1_trans(self, e: E.Call) -> str:
        return self._ldmatrix(e)

    def intrinsic_ldmatrix_x2_trans(self, e: E.Call) -> str:
        return self._ldmatrix(e)

    def intrinsic_ldmatrix_x4_trans(self, e: E.Call) -> str:
        return self._ldmatrix(e)

    def intrinsic_cp_async_4(self, e: E.Call) -> str:
        return self._cp_async(e, 4)

    def intrinsic_cp_async_8(self, e: E.Call) -> str:
        return self._cp_async(e, 8)

    def intrinsic_cp_async_16(self, e: E.Call) -> str:
        return self._cp_async(e, 16)
