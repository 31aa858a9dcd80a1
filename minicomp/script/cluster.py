"""Hopper thread-block clusters and register reallocation in scripts: cluster_ctarank,
cluster_nctarank, cluster_sync, cluster_arrive, cluster_wait, fence_mbarrier_init,
mbarrier_arrive_cluster and setmaxnreg_inc/_dec.

A kernel with `attrs.cluster_dim = (x, y, z)` runs its blocks in clusters of x * y * z CTAs
that the GPU schedules together, which may wait on each other (a cluster barrier), signal each
other's mbarriers and receive one TMA copy together (`tma_load(..., multicast=mask)`,
minicomp.script.tma). Each primitive lowers to the kernel-IR intrinsic of the same name (an
Effect statement unless it returns a value; minicomp.backends.cuda.intrinsics_cluster renders
them):

- `cluster_ctarank()` / `cluster_nctarank()`: an i32, this CTA's rank in its cluster (0 to
  n - 1, x fastest) / the cluster's CTAs (1 without a cluster).
- `cluster_sync()`: every thread of every CTA of the cluster waits until all have arrived,
  and sees their writes before it (`barrier.cluster.arrive.release` then `wait.acquire`).
  `cluster_arrive()` and `cluster_wait()` are its two halves, for work in between.
- `fence_mbarrier_init()`: makes this thread's mbarrier_inits visible to the other CTAs of
  the cluster (`fence.mbarrier_init.release.cluster`), before the cluster_sync after which
  they may signal those barriers.
- `mbarrier_arrive_cluster(bar, cta)`: one arrival on the barrier at `bar`'s place in CTA
  `cta` of the cluster (a runtime i32: `mapa`, then `mbarrier.arrive.release.cluster`).
- `cluster_load(t[i], cta)` / `cluster_store(t[i], cta, value)`: read / write element `t[i]`
  of shared tensor `t` in CTA `cta` of the cluster (`mapa`, then `ld/st.shared::cluster`); a
  4- or 8-byte element type. The other CTA's writes are seen after a cluster_sync.
- `setmaxnreg_inc(n)` / `setmaxnreg_dec(n)`: the registers a thread of this warpgroup may use
  become `n` (a compile-time int, a multiple of 8 from 24 to 256): raised by `_inc` (waiting
  until the SM has them free), lowered by `_dec` (giving them back), so that a producer
  warpgroup that only issues copies hands its registers to the consumer warpgroups doing the
  math. All 128 threads of the warpgroup execute it together (PTX's `.sync.aligned`); sm_90a.
  The kernel must set `attrs.min_blocks`: ptxas ignores setmaxnreg when the launch bounds do not
  tell it the registers a thread has at entry.
"""

from __future__ import annotations

from minicomp.ir import expr as E
from minicomp.ir import types as T
from minicomp.ir.func import MAX_CLUSTER
from minicomp.script import conversions as C
from minicomp.script.hopper import _barrier, _int
from minicomp.script.lang import Primitive
from minicomp.script.mma import _args, _check, _effect, operand

cluster_ctarank = Primitive("cluster_ctarank")
cluster_nctarank = Primitive("cluster_nctarank")
cluster_sync = Primitive("cluster_sync")
cluster_arrive = Primitive("cluster_arrive")
cluster_wait = Primitive("cluster_wait")
fence_mbarrier_init = Primitive("fence_mbarrier_init")
mbarrier_arrive_cluster = Primitive("mbarrier_arrive_cluster")
cluster_load = Primitive("cluster_load")
cluster_store = Primitive("cluster_store")
setmaxnreg_inc = Primitive("setmaxnreg_inc")
setmaxnreg_dec = Primitive("setmaxnreg_dec")

PRIMITIVES = (
    cluster_ctarank,
    cluster_nctarank,
    cluster_sync,
    cluster_arrive,
    cluster_wait,
    fence_mbarrier_init,
    mbarrier_arrive_cluster,
    cluster_load,
    cluster_store,
    setmaxnreg_inc,
    setmaxnreg_dec,
)
MIN_REGISTERS, MAX_REGISTERS = 24, 256


def _setmaxnreg(p, name, args, kwargs):
    (node,) = _args(name, args, kwargs, ("n",), 1)
    n = p.compile_time_int(node, f"the register count of {name}()")
    if not MIN_REGISTERS <= n <= MAX_REGISTERS or n % 8:
        raise p.src.error(
            node,
            f"{name}() sets a multiple of 8 registers from {MIN_REGISTERS} to {MAX_REGISTERS} "
            f"a thread, not {n}",
        )
    if getattr(p, "setmaxnreg", None) is None:
        p.setmaxnreg = node
    return _effect(name, E.const(n, T.i32))


def _rank(p, name, args, kwargs):
    _args(name, args, kwargs, (), 0)
    return E.Call(name, (), T.i32)


def _no_args(p, name, args, kwargs):
    _args(name, args, kwargs, (), 0)
    return _effect(name)


def _arrive_cluster(p, name, args, kwargs):
    bar_node, cta_node = _args(name, args, kwargs, ("bar", "cta"), 2)
    bar = _barrier(p, bar_node, name)
    cta = _int(p, cta_node, name, "the CTA rank")
    if isinstance(cta, E.Const) and not 0 <= cta.value < MAX_CLUSTER:
        raise p.src.error(cta_node, f"the CTA rank of {name}() is 0 to {MAX_CLUSTER - 1}")
    return _effect(name, bar.var, bar.index, cta)


REMOTE_BYTES = (4, 8)  # the element sizes of ld/st.shared::cluster.b32 and .b64


def _cta(p, node, name: str) -> E.Expr:
    cta = _int(p, node, name, "the CTA rank")
    if isinstance(cta, E.Const) and not 0 <= cta.value < MAX_CLUSTER:
        raise p.src.error(node, f"the CTA rank of {name}() is 0 to {MAX_CLUSTER - 1}")
    return cta


def _remote(p, name, node):
    """The shared element `t[i]` another CTA's copy of which `name` reads or writes."""
    op = operand(p, node, f"the element of {name}()")
    _check(p, node, op, f"the element of {name}()", "shared", 1)
    if op.dtype.nbytes not in REMOTE_BYTES or op.dtype.is_bool:
        raise p.src.error(
            node,
            f"{name}() moves 4- or 8-byte elements (f32, i32, u32, f64, i64, u64); "
            f"{op.name} holds {op.dtype}",
        )
    return op


def _cluster_load(p, name, args, kwargs):
    t_node, cta_node = _args(name, args, kwargs, ("t", "cta"), 2)
    op = _remote(p, name, t_node)
    return E.Call(name, (op.var, op.index, _cta(p, cta_node, name)), op.dtype)


def _cluster_store(p, name, args, kwargs):
    t_node, cta_node, value_node = _args(name, args, kwargs, ("t", "cta", "value"), 3)
    op = _remote(p, name, t_node)
    value = C.implicit(p.value(value_node), op.dtype, f"the value of {name}()")
    return _effect(name, op.var, op.index, _cta(p, cta_node, name), value)


HANDLERS = {
    "cluster_load": _cluster_load,
    "cluster_store": _cluster_store,
    "cluster_ctarank": _rank,
    "cluster_nctarank": _rank,
    "cluster_sync": _no_args,
    "cluster_arrive": _no_args,
    "cluster_wait": _no_args,
    "fence_mbarrier_init": _no_args,
    "mbarrier_arrive_cluster": _arrive_cluster,
    "setmaxnreg_inc": _setmaxnreg,
    "setmaxnreg_dec": _setmaxnreg,
}
"""The call handlers of minicomp.script.calls for these primitives, by name."""
