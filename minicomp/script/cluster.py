"""Hopper thread-block clusters and register reallocation in scripts: setmaxnreg_inc/_dec.

Each primitive lowers to the kernel-IR intrinsic of the same name (an Effect statement unless it
returns a value; minicomp.backends.cuda.intrinsics_cluster renders them):

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
from minicomp.script.lang import Primitive
from minicomp.script.mma import _args, _effect

setmaxnreg_inc = Primitive("setmaxnreg_inc")
setmaxnreg_dec = Primitive("setmaxnreg_dec")

PRIMITIVES = (setmaxnreg_inc, setmaxnreg_dec)
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


HANDLERS = {
    "setmaxnreg_inc": _setmaxnreg,
    "setmaxnreg_dec": _setmaxnreg,
}
"""The call handlers of minicomp.script.calls for these primitives, by name."""
