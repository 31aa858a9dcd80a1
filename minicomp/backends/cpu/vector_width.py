"""Which cpu kernels ask for 512-bit vectors: those whose loops stream more than a core's caches.

`-march=native` on an AVX-512 x86 CPU still has GCC prefer 256-bit vectors. Measured on this
project's Xeon (one thread, `benchmarks/cpu_math_ops.py --extra-cflags=-mprefer-vector-width=512`),
512-bit loops are 7-11% faster at 64 K floats and 14-24% faster at 16 MB (sin, cos, exp,
erf, gelu, log), but 3-6% slower at 16 K floats, in cache. So a kernel whose loops run at
least WIDE_MIN_ITERATIONS times, or an unknown number of times (symbolic sizes), is rendered
with the runtime header's MC_WIDE_VECTORS attribute (GCC's per-function
`target("prefer-vector-width=512")`, empty elsewhere); smaller ones keep GCC's choice.
`-DMC_NARROW_VECTORS` in the `cflags` option turns it off.
"""

from __future__ import annotations

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function

WIDE_MIN_ITERATIONS = 32768


def extent_bound(e: E.Expr) -> int | None:
    """A static upper bound of a loop extent, or None: constants, and min/max/+/* of bounded
    parts (min needs one; a tail loop's `min(4096, n - 4096 * c)` is at most 4096)."""
    if isinstance(e, E.Const):
        return int(e.value)
    if isinstance(e, E.Cast):
        return extent_bound(e.a)
    if isinstance(e, E.Binary) and e.op in ("min", "max", "add", "mul"):
        a, b = extent_bound(e.a), extent_bound(e.b)
        if e.op == "min":
            known = [x for x in (a, b) if x is not None]
            return min(known) if known else None
        if a is None or b is None:
            return None
        return {"max": max, "add": int.__add__, "mul": int.__mul__}[e.op](a, b)
    return None


def iterations(s: S.Stmt) -> int | None:
    """How many times the innermost loop bodies of `s` run at most, summed over its loop
    nests (0 without loops); None when a loop's extent has no static bound."""
    if isinstance(s, S.For):
        bound, inner = extent_bound(s.extent), iterations(s.body)
        return None if bound is None or inner is None else bound * max(inner, 1)
    if isinstance(s, S.While):
        inner = iterations(s.body)
        return None if inner else 0
    parts: tuple[S.Stmt, ...] = ()
    if isinstance(s, S.Seq):
        parts = s.body
    elif isinstance(s, S.If):
        parts = tuple(x for x in (s.then, s.orelse) if x is not None)
    total = 0
    for part in parts:
        n = iterations(part)
        if n is None:
            return None
        total += n
    return total


def prefers_wide_vectors(f: Function) -> bool:
    """Whether kernel `f` streams enough data for 512-bit vectors to pay (module docstring)."""
    n = iterations(f.body)
    return n is None or n >= WIDE_MIN_ITERATIONS
