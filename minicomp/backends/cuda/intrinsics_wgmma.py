"""Hopper warpgroup MMA (wgmma) intrinsics of the CUDA target (sm_90a).

`WgmmaIntrinsics` is a mixin of `intrinsic_<name>` methods for CudaRenderer. Each intrinsic is
a kernel-IR `Call` (an Effect statement) whose memory operands are pairs `(buffer Var,
element index)`, as in minicomp.backends.cuda.intrinsics_mma; it renders as a call of a macro
of wgmma.h (inline PTX) or, under the emulator, of emu_wgmma.h (emu.h includes it):

- `wgmma_fence()`: `wgmma.fence.sync.aligned`.
- `wgmma_commit_group()`: `wgmma.commit_group.sync.aligned`.
- `wgmma_wait_group(n[, acc, ai, count])`: `wgmma.wait_group.sync.aligned n`; with an
  accumulator, an empty asm on each of its `count` registers after it.
- `wgmma_mma_async(acc, ai, a, aidx, b, bidx, n, swizzle, lbo_a, sbo_a, lbo_b, sbo_b,
  scale_d, trans_a, trans_b)`: `wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}`,
  or `m64nNk32.f32.{e4m3,e5m2}.{e4m3,e5m2}` for float8 (f8e4m3fn, f8e5m2, either pair), the
  operands in shared memory through descriptors built from `&a[aidx]` and `&b[bidx]` with the
  given byte offsets and swizzle span (0, 32, 64 or 128 bytes), K-major, or MN-major where
  trans_a / trans_b is 1 (PTX's imm-trans-a/-b; 16-bit types only). An `a` in local memory is
  A from registers (`{a regs}, b-desc`: the 8 f16/bf16 elements from `a[aidx]` as four
  .f16x2 registers; lbo_a, sbo_a and trans_a unused). `acc[ai]` on are this thread's n/2 f32
  accumulators, `scale_d` (0 or 1) whether they are added. (13 arguments: both transpose
  flags 0.)

A kernel using one compiled for anything but sm_90a fails to compile with a static_assert
naming the primitive and sm_90a.
"""

from __future__ import annotations

import os

from minicomp.backends.cuda.intrinsics_cluster import SM90A_INTRINSICS
from minicomp.ir import expr as E
from minicomp.ir.func import Module
from minicomp.ir.functor import Visitor
from minicomp.ir.types import PointerType, bf16, f8e4m3fn, f8e5m2, f16, f32, i32

_DIR = os.path.dirname(os.path.abspath(__file__))
HEADER_PATH = os.path.join(_DIR, "wgmma.h")
EMU_HEADER_PATH = os.path.join(_DIR, "emu_wgmma.h")
SWIZZLE_HEADER_PATH = os.path.join(_DIR, "swizzle.h")

WGMMA_INTRINSICS = frozenset(
    ("wgmma_fence", "wgmma_commit_group", "wgmma_wait_group", "wgmma_mma_async")
)
"""Every intrinsic this module renders; the emulator runs a kernel using one on fibers (it
keeps each thread's pending mma_asyncs)."""
HELPER_TOKENS = r"mc_wgmma_\w+"
"""Their CUDA spellings, as a regular expression."""
SWIZZLE_MODES = {0: 0, 128: 1, 64: 2, 32: 3}
N_VALUES = (8, 16, 32, 64, 96, 128, 192, 256)
# wgmma.h's KIND of each operand type pair: m64nNk16 of 16-bit types, m64nNk32 of float8.
KINDS = {
    (f16, f16): 0,
    (bf16, bf16): 1,
    (f8e4m3fn, f8e4m3fn): 2,
    (f8e4m3fn, f8e5m2): 3,
    (f8e5m2, f8e4m3fn): 4,
    (f8e5m2, f8e5m2): 5,
}
_OPERAND_TYPES = (f16, bf16, f8e4m3fn, f8e5m2)
_SIXTEEN_BIT = (f16, bf16)


class _WgmmaFinder(Visitor):
    def __init__(self):
        super().__init__()
        self.found = False

    def visit_Call(self, c: E.Call) -> None:
        self.found |= c.name in WGMMA_INTRINSICS or c.name in SM90A_INTRINSICS
        self.visit(c.args)


def uses_wgmma(module: Module) -> bool:
    """Whether a function of `module` uses a wgmma intrinsic (or another that only sm_90a has:
    setmaxnreg)."""
    finder = _WgmmaFinder()
    for f in module.functions:
        finder.visit(f.body)
    return finder.found


def feature_arch(arch: str, module: Module) -> str:
    """The architecture to compile `module` for on a device of `arch`: sm_90a, where wgmma
    exists, for a module using it on an sm_90 device; else `arch`."""
    return arch + "a" if arch == "sm_90" and uses_wgmma(module) else arch


class WgmmaIntrinsics:
    """`intrinsic_<name>` methods rendering the wgmma intrinsics (a mixin for a CLikeRenderer
    subclass: it uses `expr` and `name_of`)."""

    def _wgmma_buffer(self, buf: E.Expr, what: str, space: str, elems: tuple) -> str:
        if not isinstance(buf, E.Var) or not isinstance(buf.type, PointerType):
            raise ValueError(f"{what} needs a buffer variable, not {buf}")
        if buf.type.space != space:
            raise ValueError(f"{what} must be in {space} memory; {buf.name} is {buf.type.space}")
        if buf.type.elem not in elems:
            raise ValueError(f"{what} holds {buf.type.elem}, not {' or '.join(map(str, elems))}")
        return self.name_of(buf)

    @staticmethod
    def _wgmma_const(e: E.Expr, what: str) -> int:
        if not isinstance(e, E.Const) or not e.dtype.is_integer:
            raise ValueError(f"{what} must be a constant integer, not {e}")
        return e.value

    def intrinsic_wgmma_fence(self, e: E.Call) -> str:
        if e.args:
            raise ValueError(f"wgmma_fence takes no arguments: {e}")
        return "mc_wgmma_fence()"

    def intrinsic_wgmma_commit_group(self, e: E.Call) -> str:
        if e.args:
            raise ValueError(f"wgmma_commit_group takes no arguments: {e}")
        return "mc_wgmma_commit_group()"

    def intrinsic_wgmma_wait_group(self, e: E.Call) -> str:
        if len(e.args) not in (1, 4):
            raise ValueError(f"wgmma_wait_group takes (n[, acc, ai, count]): {e}")
        n = self._wgmma_const(e.args[0], "the group count of wgmma_wait_group")
        if len(e.args) == 1:
            return f"mc_wgmma_wait_group({n})"
        acc = self._wgmma_buffer(e.args[1], "the accumulator of wgmma_wait_group", "local", (f32,))
        count = self._wgmma_const(e.args[3], "the accumulator count of wgmma_wait_group")
        return f"mc_wgmma_wait_group_fenced({n}, {count}, &{acc}[{self.expr(e.args[2])}])"

    def intrinsic_wgmma_mma_async(self, e: E.Call) -> str:
        if len(e.args) not in (13, 15):
            raise ValueError(
                "wgmma_mma_async takes (acc, ai, a, aidx, b, bidx, n, swizzle, lbo_a, sbo_a, "
                f"lbo_b, sbo_b, scale_d[, trans_a, trans_b]): {e}"
            )
        acc, ai, a, aidx, b, bidx = e.args[:6]
        n, swizzle, *offsets = (
            self._wgmma_const(x, "an argument of wgmma_mma_async") for x in e.args[6:12]
        )
        trans_a, trans_b = (
            (self._wgmma_const(x, "a transpose flag of wgmma_mma_async") for x in e.args[13:])
            if len(e.args) == 15
            else (0, 0)
        )
        if n not in N_VALUES or swizzle not in SWIZZLE_MODES:
            raise ValueError(f"wgmma_mma_async has no m64n{n}k16 or no {swizzle}-byte swizzle")
        if trans_a not in (0, 1) or trans_b not in (0, 1):
            raise ValueError(f"wgmma_mma_async's transpose flags are 0 or 1: {e}")
        d = self._wgmma_buffer(acc, "the accumulator of wgmma_mma_async", "local", (f32,))
        registers = (
            isinstance(a, E.Var) and isinstance(a.type, PointerType) and (a.type.space == "local")
        )
        a_space, a_types = ("local", _SIXTEEN_BIT) if registers else ("shared", _OPERAND_TYPES)
        a_name = self._wgmma_buffer(a, "the a operand of wgmma_mma_async", a_space, a_types)
        b_name = self._wgmma_buffer(b, "the b operand of wgmma_mma_async", "shared", _OPERAND_TYPES)
        kind = KINDS.get((a.type.elem, b.type.elem))
        if kind is None:
            raise ValueError(f"wgmma_mma_async has no {a.type.elem} by {b.type.elem}: {e}")
        if (trans_a or trans_b) and a.type.elem not in _SIXTEEN_BIT:
            raise ValueError(f"wgmma_mma_async has MN-major operands for f16/bf16 only: {e}")
        lbo_a, sbo_a, lbo_b, sbo_b = offsets
        scale = self.expr(E.cast(e.args[12], i32))
        if registers:
            if trans_a:
                raise ValueError(f"wgmma_mma_async's a in registers has no transpose: {e}")
            return (
                f"mc_wgmma_mma_async_rs({n}, {kind}, {trans_b}, &{d}[{self.expr(ai)}], "
                f"{a_name}, {self.expr(aidx)}, {b_name}, {self.expr(bidx)}, {lbo_b}, {sbo_b}, "
                f"{SWIZZLE_MODES[swizzle]}, {scale})"
            )
        return (
            f"mc_wgmma_mma_async({n}, {kind}, {2 * trans_a + trans_b}, &{d}[{self.expr(ai)}], "
            f"{a_name}, {self.expr(aidx)}, {lbo_a}, {sbo_a}, {b_name}, {self.expr(bidx)}, "
            f"{lbo_b}, {sbo_b}, {SWIZZLE_MODES[swizzle]}, {scale})"
        )
