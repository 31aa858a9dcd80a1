"""C code generation for the cpu target: kernel IR to C with OpenMP pragmas.

Loop kinds map onto pragmas: `parallel` opens `#pragma omp parallel for` (with `collapse(n)`
over directly nested parallel loops whose extents do not depend on the outer ones; a parallel
loop inside a parallel region runs serially in its thread), `vectorize` gives `#pragma omp
simd`, `unroll` gives `#pragma GCC unroll 8`. A loop's `reductions` become OpenMP reduction
clauses: `+`, `*`, and for max/min the built-in `max`/`min` on integers but, on floats, the
user-defined reductions `mc_max_f32`... of the runtime header, because OpenMP's own float
max/min drop NaNs while PyTorch propagates them. A loop reducing into a float16/bfloat16/float8
accumulator (bit patterns, which OpenMP would add as integers) gets no pragma and runs
serially.

A vector loop calling float32 sin, cos or erf calls their near versions (runtime.h: cheaper,
as accurate below a bound), ORs the far tests of their arguments into a flag, and, where the
flag is set, runs again with the exact versions, its reduction accumulators first restored
(`near_math.py` says which loops may run twice):

    {
        int32_t far = 0;
        float acc_before = acc;
        #pragma omp simd reduction(+:acc) reduction(|:far)
        for (...) { far |= mc_trig_far_f32(x[i]); acc = acc + mc_sin_near_f32(x[i]); }
        if (far) {
            acc = acc_before;
            #pragma omp simd reduction(+:acc)
            for (...) { acc = acc + mc_sin_f32(x[i]); }
        }
    }
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

from minicomp.backends.c_like import CLikeRenderer, uses_any
from minicomp.backends.cpu.near_math import NEAR_F32, far_tests, near_calls, runs_again_safely
from minicomp.backends.cpu.vector_width import prefers_wide_vectors
from minicomp.backends.headers import inline_includes
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function, Module
from minicomp.ir.types import DataType, f32, i32, is_narrow_float

HEADER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime.h")
UNROLL_FACTOR = 8
_FAST_F32 = ("exp", "tanh", "erf", "sin", "cos", "log")


@functools.lru_cache(maxsize=1)
def runtime_header() -> str:
    """The text of runtime.h (common.h inlined), which every generated source carries inline."""
    return inline_includes(HEADER_PATH)


class CRenderer(CLikeRenderer):
    """Renders kernel IR as C99 with OpenMP for GCC or Clang."""

    def __init__(self):
        super().__init__()
        self._parallel_depth = 0
        # While a loop renders with near math: its far flag, and the loop (for its pragma).
        self._far: E.Var | None = None
        self._near_loop: S.For | None = None

    def header(self) -> str:
        return runtime_header()

    def function_qualifier(self, f: Function) -> str:
        if f.kind == "kernel" and prefers_wide_vectors(f):
            return "MC_WIDE_VECTORS"
        return super().function_qualifier(f)

    def math_function_name(self, name: str, dt: DataType) -> str:
        # libm's float exp, tanh, erf, sin, cos and log are calls GCC cannot vectorise (the
        # whole fused loop then runs scalar); the header's are. Doubles keep libm's.
        if name in _FAST_F32 and dt == f32:
            near = self._far is not None and name in NEAR_F32
            return f"mc_{name}_near_f32" if near else f"mc_{name}_f32"
        if name == "lgamma":
            return f"mc_lgamma_{dt.short}"
        return super().math_function_name(name, dt)

    def visit_Binary(self, e: E.Binary) -> tuple[str, int]:
        # Float pow is a binary op, not a math call: powf -> the header's vectorisable one.
        if e.op == "pow" and e.a.dtype == f32:
            return self._call("mc_pow_f32", e.a, e.b)
        return super().visit_Binary(e)

    def array_decl(self, s: S.DeclareArray) -> str:
        # Aligned so that vector loads of the array's first elements need no peeling.
        return (
            f"{self.type_name(s.dtype)} {self.name_of(s.var)}[{s.size}] "
            "__attribute__((aligned(64)));"
        )

    def visit_For(self, s: S.For) -> list[str]:
        if (
            s.kind != "vectorize"
            or self._far is not None
            or not near_calls(s.body)
            or not runs_again_safely(s)
        ):
            return super().visit_For(s)
        far = E.Var("far", i32)
        saved = [(acc, E.Var(f"{acc.name}_before", acc.type)) for _, acc in s.reductions]
        lines = [self.var_decl(far, "0")]
        lines += [self.var_decl(before, self.name_of(acc)) for acc, before in saved]
        with self._near_math(far, s):
            lines += super().visit_For(s)
        lines.append(f"if ({self.name_of(far)}) {{")
        again = [f"{self.name_of(acc)} = {self.name_of(before)};" for acc, before in saved]
        again += super().visit_For(s)
        lines += [self.indent_unit + line if line else line for line in again]
        lines.append("}")
        # A block, so that a function with several such loops declares each flag in its own.
        return ["{", *(self.indent_unit + line if line else line for line in lines), "}"]

    @contextlib.contextmanager
    def _near_math(self, far: E.Var, loop: S.For) -> Iterator[None]:
        # Expressions render to other text meanwhile: a memo of their own.
        memo = self.memo
        self.memo, self._far, self._near_loop = {}, far, loop
        try:
            yield
        finally:
            self.memo, self._far, self._near_loop = memo, None, None

    def stmt(self, s: S.Stmt) -> list[str]:
        lines = super().stmt(s)
        if self._far is None:
            return lines
        flag = self.name_of(self._far)
        tests = [f"{flag} |= {test}({self.expr(arg)});" for test, arg in far_tests(s)]
        return tests + lines

    def intrinsic_transpose16_f32(self, e: E.Call) -> str:
        """(tile, buf, index, stride): the 16x16 float32 block of `buf` from element `index`,
        rows `stride` apart, transposed into the local array `tile` (schedule/cpu.py)."""
        tile, buf, index, stride = e.args
        src = f"&{self.name_of(buf)}[{self.expr(index)}]"
        return f"mc_transpose16_f32({src}, {self.expr(stride)}, {self.name_of(tile)})"

    def collapse_loops(self, loop: S.For) -> list[S.For]:
        loops = [loop]
        if loop.kind != "parallel" or self._parallel_depth:
            return loops
        outer = {loop.var}
        inner = loop.body
        # OpenMP collapses only rectangular nests: no statement between the loops and no
        # inner extent computed from an outer index.
        while isinstance(inner, S.For) and inner.kind == "parallel":
            if uses_any(inner.extent, outer):
                break
            loops.append(inner)
            outer.add(inner.var)
            inner = inner.body
        return loops

    @contextlib.contextmanager
    def loop_scope(self, loops: list[S.For]) -> Iterator[None]:
        opened = loops[0].kind == "parallel"
        self._parallel_depth += opened
        try:
            yield
        finally:
            self._parallel_depth -= opened

    def loop_pragmas(self, loops: list[S.For]) -> list[str]:
        kind = loops[0].kind
        if kind == "unroll":
            return [f"#pragma GCC unroll {UNROLL_FACTOR}"]
        if kind == "serial" or kind == "parallel" and self._parallel_depth:
            return []
        clauses = self._reduction_clauses(loops)
        if clauses is None:
            return ["// serial: a narrow float accumulator cannot be an OpenMP reduction"]
        if kind == "parallel":
            words = ["#pragma omp parallel for"]
            if len(loops) > 1:
                words.append(f"collapse({len(loops)})")
        else:
            words = ["#pragma omp simd"]
            if loops[0] is self._near_loop:
                clauses.append(f"reduction(|:{self.name_of(self._far)})")
        return [" ".join(words + clauses)]

    def _reduction_clauses(self, loops: list[S.For]) -> list[str] | None:
        by_op: dict[str, list[str]] = {}
        for loop in loops:
            for op, acc in loop.reductions:
                dt = acc.dtype
                if is_narrow_float(dt):
                    return None
                if op in ("add", "mul"):
                    identifier = "+" if op == "add" else "*"
                elif op in ("max", "min"):
                    identifier = self.helper_name(op, dt) if dt.is_float else op
                else:
                    raise ValueError(f"unknown reduction {op!r} on {acc.name}")
                by_op.setdefault(identifier, []).append(self.name_of(acc))
        return [f"reduction({op}:{', '.join(names)})" for op, names in by_op.items()]


def render_module(module: Module) -> str:
    """The complete C source of a module: the runtime header, device functions (static
    inline), then kernels (exported), in module order. The same module gives the same text."""
    return CRenderer().render_module(module)
