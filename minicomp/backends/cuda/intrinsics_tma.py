"""Hopper TMA intrinsics of the CUDA target: tensor-map parameters and tensor copies.

`TmaIntrinsics` is a mixin for CudaRenderer. A tensor-map parameter (an IR Var of type
ir.types.TensorMapType) renders as `const __grid_constant__ mc_tensor_map name` (tma.h; the
GPU's CUtensorMap, taken by value, 64-byte aligned). The intrinsics, memory operands as in
minicomp.backends.cuda.intrinsics_async (a buffer Var then an element index), coordinates in
the script's order (outermost first; rendered innermost first, as PTX takes them):

- `tma_load(dst, di, map, c..., bar, bi)`: `cp.async.bulk.tensor.Nd.shared::cluster.global.
  tile.mbarrier::complete_tx::bytes`, the box into shared `dst[di]`, its bytes completing
  transactions on `bar[bi]`.
- `tma_store(map, c..., src, si)`: `cp.async.bulk.tensor.Nd.global.shared::cta.bulk_group`.
- `bulk_commit_group()`: `cp.async.bulk.commit_group`.
- `bulk_wait_group(n)` / `bulk_wait_group_read(n)`: `cp.async.bulk.wait_group[.read] n`.

All need sm_90. A shared box must be 128-byte aligned, 1024 under a 128-byte swizzle
(TensorMapType.shared_alignment); the shared tensors these copies use are declared aligned to
128 bytes or to the swizzle's period, 8 * span, whichever is larger (`declared_alignment`), so
that a box at the start of one is swizzled from the pattern's first row (swizzle.h).
"""

from __future__ import annotations

import os

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.functor import Visitor
from minicomp.ir.types import TensorMapType

_DIR = os.path.dirname(os.path.abspath(__file__))
HEADER_PATH = os.path.join(_DIR, "tma.h")
EMU_HEADER_PATH = os.path.join(_DIR, "emu_tma.h")

TMA_INTRINSICS = frozenset(
    ("tma_load", "tma_store", "bulk_commit_group", "bulk_wait_group", "bulk_wait_group_read")
)
"""Every intrinsic this module renders; the emulator runs kernels using one on fibers."""
HELPER_TOKENS = r"mc_tma_\w+|mc_bulk_commit_group|mc_bulk_wait_group\w*"
"""The CUDA spellings of the intrinsics, as a regular expression."""
TENSOR_MAP_CTYPE = "mc_tensor_map"
"""The C type of a tensor-map parameter (tma.h)."""


def declared_alignment(swizzle: int) -> int:
    """The alignment of a shared tensor holding boxes under a `swizzle`-byte swizzle."""
    return max(128, 8 * swizzle)


class _TmaBuffers(Visitor):
    """The shared buffers of a function's TMA copies, with the alignment each needs."""

    def __init__(self):
        super().__init__()
        self.align: dict[E.Var, int] = {}

    def visit_Call(self, c: E.Call) -> None:
        if c.name in ("tma_load", "tma_store", "tma_load_multicast"):
            store = c.name == "tma_store"
            buf, m = (c.args[-2], c.args[0]) if store else (c.args[0], c.args[2])
            if isinstance(buf, E.Var) and isinstance(m, E.Var):
                need = declared_alignment(m.type.swizzle)
                self.align[buf] = max(need, self.align.get(buf, 16))
        self.visit(c.args)


class TmaIntrinsics:
    """`intrinsic_<name>` methods rendering the TMA intrinsics, the tensor-map parameters and
    the alignment of the shared buffers they copy (a mixin for CudaRenderer, before
    AsyncIntrinsics, whose `_at` and `_bar` it uses)."""

    _tma_align: dict = {}

    def begin_function(self, f) -> None:
        super().begin_function(f)
        found = _TmaBuffers()
        found.visit(f.body)
        self._tma_align = found.align

    def shared_alignment(self, s: S.DeclareArray) -> int:
        """The alignment of shared array `s`: 16 bytes, more for a TMA copy's box."""
        return self._tma_align.get(s.var, 16)

    def param_decl(self, v: E.Var, written: bool) -> str:
        if isinstance(v.type, TensorMapType):
            return f"const __grid_constant__ {TENSOR_MAP_CTYPE} {self.name_of(v)}"
        return super().param_decl(v, written)

    def _map(self, e: E.Call, m: E.Expr) -> tuple[str, TensorMapType]:
        if not isinstance(m, E.Var) or not isinstance(m.type, TensorMapType):
            raise ValueError(f"{e.name} needs a tensor-map parameter, not {m}")
        return f"&{self.name_of(m)}", m.type

    def _coords(self, coords) -> str:
        return ", ".join(self.expr(c) for c in reversed(coords))

    def intrinsic_tma_load(self, e: E.Call) -> str:
        return self._tma_load(e, "")

    def intrinsic_tma_load_multicast(self, e: E.Call) -> str:
        return self._tma_load(e, "multicast")

    def _tma_load(self, e: E.Call, multicast: str) -> str:
        """tma_load, or with `multicast` its form taking a CTA mask after the barrier."""
        m = e.args[2] if len(e.args) > 2 else None
        rank = m.type.rank if isinstance(m, E.Var) and isinstance(m.type, TensorMapType) else 0
        if not rank or len(e.args) != 5 + rank + bool(multicast):
            more = ", mask" if multicast else ""
            raise ValueError(f"{e.name} takes (dst, di, map, coordinates..., bar, bi{more}): {e}")
        ref, t = self._map(e, m)
        dst = self._at(e.args[0], e.args[1], f"the destination of {e.name}", "shared")
        if e.args[0].type.elem != t.elem:
            raise ValueError(f"{e.name} of {t.elem} elements into {e.args[0].type.elem}: {e}")
        coords = self._coords(e.args[3 : 3 + rank])
        bar = self._bar(e, 3 + rank)
        if multicast:
            mask = f"(uint16_t)({self.expr(e.args[-1])})"
            return f"mc_tma_load_multicast_{rank}d({dst}, {ref}, {bar}, {mask}, {coords})"
        return f"mc_tma_load_{rank}d({dst}, {ref}, {bar}, {coords})"

    def intrinsic_tma_store(self, e: E.Call) -> str:
        m = e.args[0] if e.args else None
        rank = m.type.rank if isinstance(m, E.Var) and isinstance(m.type, TensorMapType) else 0
        if not rank or len(e.args) != 3 + rank:
            raise ValueError(f"tma_store takes (map, coordinates..., src, si): {e}")
        ref, t = self._map(e, m)
        src = self._at(e.args[-2], e.args[-1], "the source of tma_store", "shared")
        if e.args[-2].type.elem != t.elem:
            raise ValueError(f"tma_store of {t.elem} elements from {e.args[-2].type.elem}: {e}")
        return f"mc_tma_store_{rank}d({ref}, {src}, {self._coords(e.args[1 : 1 + rank])})"

    def intrinsic_bulk_commit_group(self, e: E.Call) -> str:
        if e.args:
            raise ValueError(f"bulk_commit_group takes no arguments: {e}")
        return "mc_bulk_commit_group()"

    def _wait(self, e: E.Call) -> str:
        if len(e.args) != 1 or not isinstance(e.args[0], E.Const):
            raise ValueError(f"{e.name} takes one constant (the groups left pending): {e}")
        return f"mc_{e.name}<{int(e.args[0].value)}>()"

    def intrinsic_bulk_wait_group(self, e: E.Call) -> str:
        return self._wait(e)

    def intrinsic_bulk_wait_group_read(self, e: E.Call) -> str:
        return self._wait(e)
