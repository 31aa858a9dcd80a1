"""Hopper (sm_90) asynchronous barriers and bulk copies in scripts: mbarrier_* and bulk_copy_g2s.

An mbarrier is one u64 element of a shared tensor (`bars = shared_tensor(u64, (2,))`, then
`bars[s]`). The primitives, and what each lowers to (the kernel-IR intrinsic of the same name,
an Effect statement unless it returns a value; minicomp.backends.cuda.intrinsics_async renders
them):

- `mbarrier_init(bar, count)`: a new barrier expecting `count` arrivals a phase (1 to 2^20-1);
  its current phase has parity 0. One thread initialises; a `syncthreads()` after it makes the
  barrier visible to the others.
- `mbarrier_arrive(bar)`: one arrival on the current phase. It returns nothing (the PTX state
  token is dropped: waits name phases by parity instead).
- `mbarrier_arrive_expect_tx(bar, nbytes)`: announces `nbytes` more bytes of asynchronous
  copies for the current phase, then arrives (sm_90). A phase completes when all its
  arrivals are in and all its announced bytes have landed.
- `mbarrier_try_wait_parity(bar, parity)`: a bool, whether the phase of parity `parity`
  (0 or 1, a runtime i32) has completed: true while the barrier's current phase has the
  other parity. It may return false before then; loop on it, or use
- `mbarrier_wait(bar, parity)`: blocks until that phase has completed.
- `fence_proxy_async()`: orders this thread's generic-proxy shared-memory accesses before its
  later async-proxy ones (a bulk copy into a buffer it has just read or written; sm_90).
- `bulk_copy_g2s(dst, src, nbytes, bar)`: copies `nbytes` (a multiple of 16, both addresses
  16-byte aligned) from global `src` to shared `dst` asynchronously; the copy's bytes count
  towards `bar`'s transaction count, and the data may be read only after waiting for the
  phase it completes (sm_90, `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx`).

The usual ring: one thread waits for a slot to be free, announces the stage's bytes with
`mbarrier_arrive_expect_tx(full[s], bytes)` and issues the copies; consumers
`mbarrier_wait(full[s], k // STAGES % 2)`, read, and `mbarrier_arrive(empty[s])`; the producer
waits `mbarrier_wait(empty[s], k // STAGES % 2 ^ 1)` (the first round passes at once).
"""

from __future__ import annotations

from minicomp.ir import expr as E
from minicomp.ir import types as T
from minicomp.script import conversions as C
from minicomp.script.lang import Primitive
from minicomp.script.mma import _aligned, _args, _check, _effect, operand

mbarrier_init = Primitive("mbarrier_init")
mbarrier_arrive = Primitive("mbarrier_arrive")
mbarrier_arrive_expect_tx = Primitive("mbarrier_arrive_expect_tx")
mbarrier_try_wait_parity = Primitive("mbarrier_try_wait_parity")
mbarrier_wait = Primitive("mbarrier_wait")
fence_proxy_async = Primitive("fence_proxy_async")
bulk_copy_g2s = Primitive("bulk_copy_g2s")

PRIMITIVES = (
    mbarrier_init,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_try_wait_parity,
    mbarrier_wait,
    fence_proxy_async,
    bulk_copy_g2s,
)
BARRIER_TYPES = (T.u64, T.i64)
MAX_ARRIVALS = 2**20 - 1
BULK_ALIGN = 16


def _barrier(p, node, name: str):
    """The mbarrier operand of `name`: one 64-bit element of a shared tensor."""
    bar = operand(p, node, f"the barrier of {name}()")
    _check(p, node, bar, f"the barrier of {name}()", "shared", 1, BARRIER_TYPES)
    return bar


def _int(p, node, name: str, what: str) -> E.Expr:
    """A runtime integer argument as an i32 expression."""
    v = p.value(node)
    if isinstance(v, bool) or C.is_number(v) and not isinstance(v, int):
        raise p.src.error(node, f"{what} of {name}() is an integer, not {v!r}")
    v = C.to_expr(v, T.i32)
    if not v.dtype.is_integer:
        raise p.src.error(node, f"{what} of {name}() is a {v.dtype} value, not an integer")
    return E.cast(v, T.i32)


def _mbarrier_init(p, name, args, kwargs):
    bar_node, count_node = _args(name, args, kwargs, ("bar", "count"), 2)
    bar = _barrier(p, bar_node, name)
    count = _int(p, count_node, name, "the arrival count")
    if isinstance(count, E.Const) and not 1 <= count.value <= MAX_ARRIVALS:
        raise p.src.error(
            count_node, f"{name}() expects 1 to {MAX_ARRIVALS} arrivals, not {count.value}"
        )
    return _effect(name, bar.var, bar.index, count)


def _mbarrier_arrive(p, name, args, kwargs):
    (bar_node,) = _args(name, args, kwargs, ("bar",), 1)
    bar = _barrier(p, bar_node, name)
    return _effect(name, bar.var, bar.index)


def _mbarrier_expect_tx(p, name, args, kwargs):
    bar_node, bytes_node = _args(name, args, kwargs, ("bar", "nbytes"), 2)
    bar = _barrier(p, bar_node, name)
    nbytes = _int(p, bytes_node, name, "the byte count")
    if isinstance(nbytes, E.Const) and not 0 <= nbytes.value <= MAX_ARRIVALS:
        raise p.src.error(bytes_node, f"{name}() announces 0 to {MAX_ARRIVALS} bytes")
    return _effect(name, bar.var, bar.index, nbytes)


def _parity(p, node, name: str) -> E.Expr:
    parity = _int(p, node, name, "the phase parity")
    if isinstance(parity, E.Const) and parity.value not in (0, 1):
        raise p.src.error(node, f"the phase parity of {name}() is 0 or 1, not {parity.value}")
    return parity


def _mbarrier_try_wait(p, name, args, kwargs):
    bar_node, parity_node = _args(name, args, kwargs, ("bar", "parity"), 2)
    bar = _barrier(p, bar_node, name)
    return E.Call(name, (bar.var, bar.index, _parity(p, parity_node, name)), T.boolean)


def _mbarrier_wait(p, name, args, kwargs):
    bar_node, parity_node = _args(name, args, kwargs, ("bar", "parity"), 2)
    bar = _barrier(p, bar_node, name)
    return _effect(name, bar.var, bar.index, _parity(p, parity_node, name))


def _fence_proxy_async(p, name, args, kwargs):
    _args(name, args, kwargs, (), 0)
    return _effect(name)


def _bulk_copy(p, name, args, kwargs):
    names = ("dst", "src", "nbytes", "bar")
    dst_node, src_node, bytes_node, bar_node = _args(name, args, kwargs, names, 4)
    dst = operand(p, dst_node, f"the destination of {name}()")
    src = operand(p, src_node, f"the source of {name}()")
    if src.dtype != dst.dtype:
        raise p.src.error(
            src_node,
            f"{name}() copies {src.dtype} elements of {src.name} into {dst.dtype} "
            f"tensor {dst.name}; the types must match",
        )
    nbytes = _int(p, bytes_node, name, "the byte count")
    if isinstance(nbytes, E.Const):
        n = nbytes.value
        if n <= 0 or n % BULK_ALIGN:
            raise p.src.error(
                bytes_node, f"{name}() copies a positive multiple of {BULK_ALIGN} bytes, not {n}"
            )
        count = n // dst.dtype.nbytes
        _check(p, dst_node, dst, f"the destination of {name}()", "shared", count)
        _check(p, src_node, src, f"the source of {name}()", "global", count)
    else:
        _check(p, dst_node, dst, f"the destination of {name}()", "shared", 0)
        _check(p, src_node, src, f"the source of {name}()", "global", 0)
    _aligned(p, dst_node, dst, f"the destination of {name}()", BULK_ALIGN)
    _aligned(p, src_node, src, f"the source of {name}()", BULK_ALIGN)
    bar = _barrier(p, bar_node, name)
    return _effect(name, dst.var, dst.index, src.var, src.index, nbytes, bar.var, bar.index)


HANDLERS = {
    "mbarrier_init": _mbarrier_init,
    "mbarrier_arrive": _mbarrier_arrive,
    "mbarrier_arrive_expect_tx": _mbarrier_expect_tx,
    "mbarrier_try_wait_parity": _mbarrier_try_wait,
    "mbarrier_wait": _mbarrier_wait,
    "fence_proxy_async": _fence_proxy_async,
    "bulk_copy_g2s": _bulk_copy,
}
"""The call handlers of minicomp.script.calls for these primitives, by name."""
