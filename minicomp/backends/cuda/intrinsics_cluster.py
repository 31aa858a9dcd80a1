"""Hopper cluster and register-reallocation intrinsics of the CUDA target.

`ClusterIntrinsics` is a mixin of `intrinsic_<name>` methods for CudaRenderer. Each intrinsic is
a kernel-IR `Call`; it renders as a call of a macro of cluster.h (inline PTX) or, under the
emulator, of emu_cluster.h (emu.h includes it):

- `cluster_ctarank()` / `cluster_nctarank()` (i32): `%cluster_ctarank` / `%cluster_nctarank`.
- `cluster_arrive()`, `cluster_wait()`, `cluster_sync()`: `barrier.cluster.arrive.release`,
  `barrier.cluster.wait.acquire`, both.
- `fence_mbarrier_init()`: `fence.mbarrier_init.release.cluster`.
- `mbarrier_arrive_cluster(bar, bi, cta)`: `mapa.shared::cluster` of `&bar[bi]` to CTA `cta`,
  then `mbarrier.arrive.release.cluster.shared::cluster.b64`.
- `cluster_load(t, ti, cta)` (t's element type) / `cluster_store(t, ti, cta, value)`: `mapa`
  of `&t[ti]` to CTA `cta`, then `ld.shared::cluster.b32/.b64` / `st.shared::cluster`.
- `tma_load_multicast(dst, di, map, c..., bar, bi, mask)` (rendered by TmaIntrinsics):
  tma_load's `cp.async.bulk.tensor` with `.multicast::cluster` and a 16-bit CTA mask.
- `setmaxnreg_inc(n)` / `setmaxnreg_dec(n)`: `setmaxnreg.{inc,dec}.sync.aligned.u32 n` (sm_90a),
  n a constant multiple of 8 from 24 to 256.

All need sm_90, setmaxnreg sm_90a; a kernel with `attrs.cluster_dim` is rendered with
`__cluster_dims__(x, y, z)` (codegen), which the driver launches in clusters.

A kernel using an sm_90a one compiled for anything else fails to compile with a static_assert
naming the primitive and the architecture it needs.
"""

from __future__ import annotations

import os

from minicomp.ir import expr as E

_DIR = os.path.dirname(os.path.abspath(__file__))
HEADER_PATH = os.path.join(_DIR, "cluster.h")
EMU_HEADER_PATH = os.path.join(_DIR, "emu_cluster.h")

CLUSTER_INTRINSICS = frozenset(
    (
        "cluster_ctarank",
        "cluster_nctarank",
        "cluster_arrive",
        "cluster_wait",
        "cluster_sync",
        "fence_mbarrier_init",
        "mbarrier_arrive_cluster",
        "cluster_load",
        "cluster_store",
        "tma_load_multicast",
        "setmaxnreg_inc",
        "setmaxnreg_dec",
    )
)
"""Every intrinsic of this module (tma_load_multicast is rendered with tma_load)."""
SM90A_INTRINSICS = frozenset(("setmaxnreg_inc", "setmaxnreg_dec"))
"""Those that exist only in the architecture-specific sm_90a."""
BLOCKING_INTRINSICS = CLUSTER_INTRINSICS
"""Those the emulator runs on fibers: after most another thread, or another CTA of the
cluster, may have to run first (the rank is the fiber's block's)."""
HELPER_TOKENS = (
    r"mc_setmaxnreg_\w+|mc_cluster_\w+|mc_fence_mbarrier_init|mc_mbarrier_arrive_cluster|"
    r"mc_tma_load_multicast_\w+"
)
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

    def _no_args(self, e: E.Call) -> str:
        if e.args:
            raise ValueError(f"{e.name} takes no arguments: {e}")
        return f"mc_{e.name}()"

    intrinsic_cluster_ctarank = _no_args
    intrinsic_cluster_nctarank = _no_args
    intrinsic_cluster_arrive = _no_args
    intrinsic_cluster_wait = _no_args
    intrinsic_cluster_sync = _no_args
    intrinsic_fence_mbarrier_init = _no_args

    def intrinsic_mbarrier_arrive_cluster(self, e: E.Call) -> str:
        if len(e.args) != 3:
            raise ValueError(f"mbarrier_arrive_cluster takes (bar, bi, cta): {e}")
        return f"mc_mbarrier_arrive_cluster({self._bar(e)}, {self._count(e.args[2])})"

    def _remote_element(self, e: E.Call, n: int) -> str:
        if len(e.args) != n:
            raise ValueError(f"{e.name} takes {n} arguments: {e}")
        return self._at(e.args[0], e.args[1], f"the element of {e.name}", "shared")

    def intrinsic_cluster_load(self, e: E.Call) -> str:
        at = self._remote_element(e, 3)
        return f"mc_cluster_load({at}, {self._count(e.args[2])})"

    def intrinsic_cluster_store(self, e: E.Call) -> str:
        at = self._remote_element(e, 4)
        t = self.type_name(e.args[0].type.elem)
        return f"mc_cluster_store({at}, {self._count(e.args[2])}, ({t})({self.expr(e.args[3])}))"

    def intrinsic_setmaxnreg_inc(self, e: E.Call) -> str:
        return f"mc_setmaxnreg_inc({self._registers(e)})"

    def intrinsic_setmaxnreg_dec(self, e: E.Call) -> str:
        return f"mc_setmaxnreg_dec({self._registers(e)})"
