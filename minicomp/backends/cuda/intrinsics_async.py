"""Hopper asynchronous-barrier (mbarrier) and bulk-copy (cp.async.bulk) intrinsics of the CUDA
target.

`AsyncIntrinsics` is a mixin of `intrinsic_<name>` methods for CudaRenderer. Each intrinsic is
a kernel-IR `Call` whose memory operands are pairs `(buffer Var, element index)` naming one
element, as in minicomp.backends.cuda.intrinsics_mma; it renders as a call of a device
function of async.h (inline PTX) or, under the emulator, of emu_async.h (emu.h includes it):

- `mbarrier_init(bar, bi, count)`: `mbarrier.init.shared::cta.b64` (sm_80).
- `mbarrier_arrive(bar, bi)`: `mbarrier.arrive.shared::cta.b64`, the state token dropped
  (sm_80).
- `mbarrier_arrive_expect_tx(bar, bi, nbytes)`: `mbarrier.arrive.expect_tx.shared::cta.b64`
  (sm_90).
- `mbarrier_try_wait_parity(bar, bi, parity)` (bool): `mbarrier.try_wait.parity.shared::cta.b64`
  on sm_90, `mbarrier.test_wait.parity` on sm_80 to sm_89 (both may answer false before the
  phase completes).
- `mbarrier_wait(bar, bi, parity)`: the same in a loop until it answers true.
- `fence_proxy_async()`: `fence.proxy.async.shared::cta` (sm_90).
- `bulk_copy_g2s(dst, di, src, si, nbytes, bar, bi)`:
  `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes` (sm_90): `nbytes`, a
  multiple of 16, from 16-byte aligned global `src[si]` to 16-byte aligned shared `dst[di]`,
  completing that many transaction bytes on `bar[bi]`.

A kernel using an sm_90 one compiled for an older architecture fails to compile with a
static_assert naming the primitive and the architecture it needs.
"""

from __future__ import annotations

import os

from minicomp.ir import expr as E
from minicomp.ir.types import PointerType, i32, i64, u64

_DIR = os.path.dirname(os.path.abspath(__file__))
HEADER_PATH = os.path.join(_DIR, "async.h")
EMU_HEADER_PATH = os.path.join(_DIR, "emu_async.h")

ASYNC_INTRINSICS = frozenset(
    (
        "mbarrier_init",
        "mbarrier_arrive",
        "mbarrier_arrive_expect_tx",
        "mbarrier_try_wait_parity",
        "mbarrier_wait",
        "fence_proxy_async",
        "bulk_copy_g2s",
    )
)
"""Every intrinsic this module renders."""
BLOCKING_INTRINSICS = ASYNC_INTRINSICS - {"mbarrier_init", "fence_proxy_async"}
"""The intrinsics after which another thread may have to run first: the emulator runs a
kernel using one on fibers."""
HELPER_TOKENS = r"mc_mbarrier_\w+|mc_bulk_copy_\w+"
"""The CUDA spellings of the blocking intrinsics, as a regular expression."""
# Minimum architecture of each helper, for the SASS checks and the docs.
MIN_ARCH = {
    "mbarrier_init": 80,
    "mbarrier_arrive": 80,
    "mbarrier_try_wait_parity": 80,
    "mbarrier_wait": 80,
    "mbarrier_arrive_expect_tx": 90,
    "fence_proxy_async": 90,
    "bulk_copy_g2s": 90,
}


class AsyncIntrinsics:
    """`intrinsic_<name>` methods rendering the mbarrier and bulk-copy intrinsics (a mixin for a
    CLikeRenderer subclass: it uses `expr` and `name_of`)."""

    def _at(self, buf: E.Expr, index: E.Expr, what: str, space: str) -> str:
        if not isinstance(buf, E.Var) or not isinstance(buf.type, PointerType):
            raise ValueError(f"{what} needs a buffer variable, not {buf}")
        if buf.type.space not in (space, "dynamic" if space == "shared" else space):
            raise ValueError(f"{what} must be in {space} memory; {buf.name} is {buf.type.space}")
        return f"&{self.name_of(buf)}[{self.expr(index)}]"

    def _bar(self, e: E.Call, at: int = 0) -> str:
        buf, index = e.args[at], e.args[at + 1]
        if isinstance(buf, E.Var) and isinstance(buf.type, PointerType):
            if buf.type.elem not in (u64, i64):
                raise ValueError(f"the barrier of {e.name} is a 64-bit element, not {buf.type}")
        ref = self._at(buf, index, f"the barrier of {e.name}", "shared")
        return f"(uint64_t*){ref}"

    def _count(self, e: E.Expr) -> str:
        return f"(uint32_t)({self.expr(E.cast(e, i32))})"

    def _arity(self, e: E.Call, n: int, form: str) -> None:
        if len(e.args) != n:
            raise ValueError(f"{e.name} takes ({form}): {e}")

    def intrinsic_mbarrier_init(self, e: E.Call) -> str:
        self._arity(e, 3, "bar, bi, count")
        return f"mc_mbarrier_init({self._bar(e)}, {self._count(e.args[2])})"

    def intrinsic_mbarrier_arrive(self, e: E.Call) -> str:
        self._arity(e, 2, "bar, bi")
        return f"mc_mbarrier_arrive({self._bar(e)})"

    def intrinsic_mbarrier_arrive_expect_tx(self, e: E.Call) -> str:
        self._arity(e, 3, "bar, bi, nbytes")
        return f"mc_mbarrier_arrive_expect_tx({self._bar(e)}, {self._count(e.args[2])})"

    def intrinsic_mbarrier_try_wait_parity(self, e: E.Call) -> str:
        self._arity(e, 3, "bar, bi, parity")
        return f"mc_mbarrier_try_wait_parity({self._bar(e)}, {self._count(e.args[2])})"

    def intrinsic_mbarrier_wait(self, e: E.Call) -> str:
        self._arity(e, 3, "bar, bi, parity")
        return f"mc_mbarrier_wait({self._bar(e)}, {self._count(e.args[2])})"

    def intrinsic_fence_proxy_async(self, e: E.Call) -> str:
        self._arity(e, 0, "")
        return "mc_fence_proxy_async()"

    def intrinsic_bulk_copy_g2s(self, e: E.Call) -> str:
        self._arity(e, 7, "dst, di, src, si, nbytes, bar, bi")
        dst, di, src, si, nbytes = e.args[:5]
        if dst.type.elem != src.type.elem:
            raise ValueError(f"bulk_copy_g2s from {src.type.elem} to {dst.type.elem}: {e}")
        target = self._at(dst, di, "the destination of bulk_copy_g2s", "shared")
        source = self._at(src, si, "the source of bulk_copy_g2s", "global")
        return f"mc_bulk_copy_g2s({target}, {source}, {self._count(nbytes)}, {self._bar(e, 5)})"
