"""Hopper cluster and register-reallocation intrinsics of the CUDA target.

`ClusterIntrinsics` is a mixin of `intrinsic_<name>` methods for CudaRenderer. Each intrinsic is
a kernel-IR `Call`; it renders as a call of a macro of cluster.h (inline PTX) or, under the
emulator, of emu_cluster.h (emu.h includes it):

- `setmaxnreg_inc(n)` / `setmaxnreg_dec(n)`: `setmaxnreg.{inc,dec}.sync.aligned.u32 n` (sm_90a),
  n a constant multiple of 8 from 24 to 256.

A kernel using an sm_90a one compiled for anything else fails to compile with a static_assert
naming the primitive and the architecture it needs.
"""

from __future__ import annotations

import os

from minicomp.ir import expr as E

_DIR = os.path.dirname(os.path.abspath(__file__))
HEADER_PATH = os.path.join(_DIR, "cluster.h")
EMU_HEADER_PATH = os.path.join(_DIR, "emu_cluster.h")

CLUSTER_INTRINSICS = frozenset(("setmaxnreg_inc", "setmaxnreg_dec"))
"""Every intrinsic this module renders."""
SM90A_INTRINSICS = frozenset(("setmaxnreg_inc", "setmaxnreg_dec"))
"""Those that exist only in the architecture-specific sm_90a."""
BLOCKING_INTRINSICS = frozenset(("setmaxnreg_inc", "setmaxnreg_dec"))
"""Those after which another thread may have to run first: the emulator runs a kernel using
one on fibers (setmaxnreg waits for its whole warpgroup)."""
HELPER_TOKENS = r"mc_setmaxnreg_\w+"
"""Their CUDA spellings, as a regular expression."""


class ClusterIntrinsics:
    """`intrinsic_<name>` methods rendering the cluster intrinsics (a mixin for a
    CLikeRenderer subclass: it uses `expr` and `name_of`)."""

    @staticmethod
    def _registers(e: E.Call) -> int:
        if len(e.args) != 1:
            raise ValueError(f"{e.name} takes (n): {e}")
        n = e.args[0]
        if not isinstance(n, E.Const) or not n.dtype.is_integer:
            raise ValueError(f"the register count of {e.name} must be a constant, not {n}")
        if not 24 <= n.value <= 256 or n.value % 8:
            raise ValueError(f"{e.name} sets a multiple of 8 registers from 24 to 256: {e}")
        return n.value

    def intrinsic_setmaxnreg_inc(self, e: E.Call) -> str:
        return f"mc_setmaxnreg_inc({self._registers(e)})"

    def intrinsic_setmaxnreg_dec(self, e: E.Call) -> str:
        return f"mc_setmaxnreg_dec({self._registers(e)})"
