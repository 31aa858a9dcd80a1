"""Hopper (sm_90) TMA copies in scripts: tensor-map parameters, tma_load, tma_store and the
bulk async-groups.

A kernel declares a tensor map as a parameter, `a: tensor_map(f16[dim.m, dim.k], box=(64, 64),
swizzle=128)`, and is called with the tensor itself (its innermost stride 1, the others
multiples of 16 bytes, its data 16-byte aligned); the launch encodes the map
(minicomp.backends.cuda.tensor_map). Inside the kernel the map is an operand of:

- `tma_load(dst, a, c0, ..., bar)`: copies the box of `a` whose first element is at
  coordinates (c0, ...) (one a dimension, outermost first, runtime i32, possibly negative or
  past the end: elements outside the tensor arrive as zeros) into the shared tensor `dst`,
  swizzled as the map says (minicomp/backends/cuda/swizzle.h); the box's bytes, out-of-bounds
  ones included, complete transactions on mbarrier `bar`, as bulk_copy_g2s's do
  (`cp.async.bulk.tensor.Nd.shared::cluster.global.tile.mbarrier::complete_tx::bytes`).
- `tma_store(a, c0, ..., src)`: writes the box at (c0, ...) from shared `src` (read in the
  swizzled arrangement) to the tensor, only its elements inside the tensor
  (`cp.async.bulk.tensor.Nd.global.shared::cta.bulk_group`). Threads that wrote `src` make
  their writes visible to the copy with `fence_proxy_async()` then `syncthreads()` first.
- `bulk_commit_group()`: closes this thread's stores issued so far into a bulk async-group.
- `bulk_wait_group(n)`: waits until at most `n` (a compile-time int) of this thread's
  committed groups are pending: their writes are done.
- `bulk_wait_group_read(n)`: waits only until those groups have read their shared sources,
  which may then be overwritten.

A shared operand is a `shared_tensor` with room for the box (rounded up to the swizzle span),
128-byte aligned (1024 with a 128-byte swizzle): the code generator aligns the static shared
tensors these copies use; a `dynamic_shared_tensor` must be placed at a multiple of the
alignment (the dynamic shared memory starts 1024-byte aligned). A compile-time element offset
is checked; a runtime one (a ring's stage `ring[s]`) is checked by the emulator.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from minicomp.ir import expr as E
from minicomp.ir import types as T
from minicomp.ir.expr import Dim
from minicomp.ir.func import MAX_CLUSTER
from minicomp.script import conversions as C
from minicomp.script.errors import Issue
from minicomp.script.hopper import _barrier, _int
from minicomp.script.lang import Primitive
from minicomp.script.mma import _aligned, _args, _check, _effect, operand
from minicomp.script.values import TensorRef

tma_load = Primitive("tma_load")
tma_store = Primitive("tma_store")
bulk_commit_group = Primitive("bulk_commit_group")
bulk_wait_group = Primitive("bulk_wait_group")
bulk_wait_group_read = Primitive("bulk_wait_group_read")

PRIMITIVES = (tma_load, tma_store, bulk_commit_group, bulk_wait_group, bulk_wait_group_read)
MAX_PENDING_GROUPS = 63  # cp.async.bulk.wait_group's immediate


def shared_room(m: T.TensorMapType) -> int:
    """The elements of shared memory a box occupies: its own, rounded up to the swizzle span
    (the swizzle permutes 16-byte chunks within each span)."""
    span = max(m.swizzle, 1)
    nbytes = -(-m.box_bytes // span) * span
    return nbytes // m.elem.nbytes


@dataclass(frozen=True)
class TensorMapRef:
    """A tensor-map parameter inside a script: its IR variable and its tensor's shape (None
    when written without one)."""

    name: str
    var: E.Var
    shape: tuple[Dim, ...] | None

    @property
    def type(self) -> T.TensorMapType:
        return self.var.type


def _map(p, node, name: str) -> TensorMapRef:
    m = p.value(node)
    if not isinstance(m, TensorMapRef):
        raise p.src.error(
            node, f"the tensor map of {name}() is a tensor_map parameter, not {C.describe(m)}"
        )
    return m


def _coords(p, nodes, m: TensorMapRef, name: str) -> list[E.Expr]:
    rank = m.type.rank
    if len(nodes) != rank:
        raise Issue(
            f"{name}() takes {rank} coordinates for {m.name} (a {rank}-dimensional tensor map), "
            f"{len(nodes)} given"
        )
    return [_int(p, node, name, f"coordinate {k}") for k, node in enumerate(nodes)]


def _shared_box(p, node, m: TensorMapRef, name: str, what: str):
    op = operand(p, node, f"the {what} of {name}()")
    full = f"the {what} of {name}()"
    if op.var in p.dynamic_vars:
        _dynamic_aligned(p, node, op, m, full)
    if op.dtype != m.type.elem:
        raise p.src.error(
            node,
            f"{name}() copies {m.type.elem} elements of {m.name}; {full} {op.name} holds "
            f"{op.dtype}: the types must match",
        )
    _check(p, node, op, full, "shared", shared_room(m.type))
    _aligned(p, node, op, full, m.type.shared_alignment)
    return op


def _dynamic_aligned(p, node, op, m: TensorMapRef, full: str) -> None:
    """Refuse a dynamic shared tensor placed off the box's alignment: the dynamic shared
    memory starts 1024-byte aligned (device.h), so a tensor placed at a multiple of the
    alignment is aligned; a compile-time index into it is checked by the caller, a runtime
    one by the emulator."""
    align = m.type.shared_alignment
    base = p.value(node.value if isinstance(node, ast.Subscript) else node)
    start = base.offset if isinstance(base, TensorRef) else None
    if isinstance(start, int) and start * op.dtype.nbytes % align:
        raise p.src.error(
            node,
            f"{full} must be placed at a multiple of {align} bytes of the dynamic shared memory; "
            f"{base.name} starts at byte {start * op.dtype.nbytes} (place it with "
            "dynamic_shared_tensor(..., at=bytes))",
        )


def _tma_load(p, name, args, kwargs):
    mask_node = kwargs.pop("multicast", None)
    if kwargs or len(args) < 3:
        raise Issue(f"{name}() takes (dst, map, coordinates..., bar[, multicast=mask])")
    m = _map(p, args[1], name)
    coords = _coords(p, args[2:-1], m, name)
    dst = _shared_box(p, args[0], m, name, "destination")
    bar = _barrier(p, args[-1], name)
    if mask_node is None or p.value(mask_node) is None:  # multicast=None: to this CTA only
        return _effect(name, dst.var, dst.index, m.var, *coords, bar.var, bar.index)
    # One copy into the same shared offset of every CTA of the mask, each CTA's barrier at
    # bar's offset completing its bytes (cluster.py).
    mask = _int(p, mask_node, name, "the multicast mask")
    if isinstance(mask, E.Const) and not 0 < mask.value < 1 << MAX_CLUSTER:
        raise p.src.error(
            mask_node,
            f"the multicast mask of {name}() names CTAs 0 to {MAX_CLUSTER - 1} of the cluster, "
            f"one bit each, and at least one: not {mask.value}",
        )
    args = (dst.var, dst.index, m.var, *coords, bar.var, bar.index, mask)
    return _effect("tma_load_multicast", *args)


def _tma_store(p, name, args, kwargs):
    if kwargs or len(args) < 2:
        raise Issue(f"{name}() takes (map, coordinates..., src)")
    m = _map(p, args[0], name)
    coords = _coords(p, args[1:-1], m, name)
    src = _shared_box(p, args[-1], m, name, "source")
    return _effect(name, m.var, *coords, src.var, src.index)


def _commit(p, name, args, kwargs):
    _args(name, args, kwargs, (), 0)
    return _effect(name)


def _wait_group(p, name, args, kwargs):
    (node,) = _args(name, args, kwargs, ("n",), 1)
    n = p.value(node)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_PENDING_GROUPS:
        raise p.src.error(
            node,
            f"{name}() takes a compile-time int from 0 to {MAX_PENDING_GROUPS} (the groups "
            f"left pending), not {C.describe(n)}",
        )
    return _effect(name, E.const(n, T.i32))


HANDLERS = {
    "tma_load": _tma_load,
    "tma_store": _tma_store,
    "bulk_commit_group": _commit,
    "bulk_wait_group": _wait_group,
    "bulk_wait_group_read": _wait_group,
}
"""The call handlers of minicomp.script.calls for these primitives, by name."""
