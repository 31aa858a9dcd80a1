"""Count what a kernel computes, for the performance lens: each straight run of statements gets
a `lens_ops` call carrying the operations the run performs, so that a counted emulator build
(emu_lens.h's mc_lens_ops) sums them per thread as the kernel runs.

What counts, per thread (the emulator adds the calls up; the lens divides by the warp):
- flops: float add, sub, mul, div, min and max are one each; an add or sub of a product is a
  fused multiply-add: two flops, one instruction;
- fp instructions: those operations, fused pairs counted once, and float comparisons;
- int and int64 instructions: integer arithmetic, bit operations and comparisons, by the width
  of the operands (a 64-bit operation is one here; the estimate prices it), except in
- address instructions: the integer work inside a load's or store's index, which compilers
  mostly hoist, strength-reduce or fold into the access's addressing;
- int divides: integer division and remainder by anything but a constant power of two;
- special: calls of transcendental math functions (exp, log, sin, tanh, erf, rsqrt...), one each
  whatever sequence the compiler makes of them;
- conversions: casts to or from f16 and bf16.
Loads and stores are not counted here: the emulator sees those itself. A loop's own increment
and test count as two integer instructions an iteration, none for a loop the compiler unrolls
(kind "unroll", or a constant trip count up to UNROLLED); both arms of a select count.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function
from minicomp.ir.functor import Visitor
from minicomp.ir.types import u64

_CHEAP_MATH = frozenset(("floor", "ceil", "rint", "trunc", "abs", "signbit", "isnan", "isinf"))
_FLOAT_ARITH = frozenset(("add", "sub", "mul", "div", "max", "min"))
UNROLLED = 32
"""The largest constant trip count assumed unrolled whole (no increment, no test)."""


@dataclass
class OpCounts:
    """The operations of a run of statements, in mc_lens_ops's argument order."""

    flops: int = 0
    fp: int = 0
    int32: int = 0
    int64: int = 0
    divides: int = 0
    special: int = 0
    conversions: int = 0
    address: int = 0

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))

    def call(self) -> S.Stmt:
        """The statement that adds these counts to the running thread's."""
        args = tuple(E.Const(getattr(self, f.name), u64) for f in fields(self))
        return S.Evaluate(E.Call("lens_ops", args, u64))


def _is_pow2_const(e: E.Expr) -> bool:
    return (
        isinstance(e, E.Const)
        and isinstance(e.value, int)
        and e.value > 0
        and not (e.value & (e.value - 1))
    )


class _ExprCounter(Visitor):
    """The operations of the expressions it visits, added to `counts`."""

    def __init__(self, counts: OpCounts):
        super().__init__()
        self.counts = counts
        self.in_index = False

    def visit(self, n):
        # Every occurrence counts: a memoised visit would count a shared subexpression once.
        if isinstance(n, E.Expr):
            return self._dispatch(type(n))(self, n)
        return super().visit(n)

    def _integer(self, dtype) -> None:
        if self.in_index:
            self.counts.address += 1
        elif dtype.nbytes == 8:
            self.counts.int64 += 1
        else:
            self.counts.int32 += 1

    def visit_Binary(self, e: E.Binary) -> None:
        self.visit(e.a)
        self.visit(e.b)
        operand = e.a.dtype
        c = self.counts
        if operand.is_float:
            if e.op in _FLOAT_ARITH:
                c.flops += 1
                fused = e.op in ("add", "sub") and any(
                    isinstance(x, E.Binary) and x.op == "mul" and x.dtype.is_float
                    for x in (e.a, e.b)
                )
                c.fp += 0 if fused else 1  # the product's instruction does both
            elif e.op == "pow":
                c.special += 1
            else:
                c.fp += 1
        elif operand.is_integer:
            if e.op in ("idiv", "imod", "floordiv", "mod", "div") and not _is_pow2_const(e.b):
                c.divides += 1
            else:
                self._integer(operand)

    def visit_Unary(self, e: E.Unary) -> None:
        self.visit(e.a)
        if e.a.dtype.is_float:
            self.counts.fp += 1
        elif e.a.dtype.is_integer:
            self._integer(e.a.dtype)

    def visit_Cast(self, e: E.Cast) -> None:
        self.visit(e.a)
        src, dst = e.a.dtype, e.type
        if src != dst and (src.is_float and src.nbytes == 2 or dst.is_float and dst.nbytes == 2):
            self.counts.conversions += 1

    def visit_Call(self, e: E.Call) -> None:
        self.visit(e.args)
        if e.name in E.MATH_FUNCTIONS:
            if e.name in _CHEAP_MATH:
                self.counts.fp += e.dtype.is_float
            else:
                self.counts.special += 1

    def visit_Load(self, e: E.Load) -> None:
        self.index(e.index)

    def index(self, e: E.Expr) -> None:
        """Count `e` as address arithmetic."""
        outer, self.in_index = self.in_index, True
        self.visit(e)
        self.in_index = outer

    def visit_Select(self, e: E.Select) -> None:
        self.visit(e.cond)
        self.visit(e.a)
        self.visit(e.b)


def _count(*nodes, index: E.Expr | None = None) -> OpCounts:
    counts = OpCounts()
    counter = _ExprCounter(counts)
    for n in nodes:
        if n is not None:
            counter.visit(n)
    if index is not None:
        counter.index(index)
    return counts


def _expressions(s: S.Stmt) -> list[E.Expr]:
    """The expressions a simple statement evaluates (a Store's value and index...)."""
    values = (getattr(s, f.name) for f in fields(s))
    return [v for v in values if isinstance(v, E.Expr) and not isinstance(v, E.Var)]


def _with_count(counts: OpCounts, stmts: list[S.Stmt]) -> list[S.Stmt]:
    return [counts.call(), *stmts] if counts else stmts


def _instrument(s: S.Stmt) -> S.Stmt:
    if isinstance(s, S.Seq):
        return S.Seq(tuple(_instrument_run(s.body)))
    return S.Seq(tuple(_instrument_run((s,))))


def _instrument_run(body) -> list[S.Stmt]:
    """`body` with each straight run of statements preceded by its counts."""
    out: list[S.Stmt] = []
    run: list[S.Stmt] = []
    pending = OpCounts()

    def flush() -> None:
        nonlocal pending
        out.extend(_with_count(pending, run))
        run.clear()
        pending = OpCounts()

    def add(counts: OpCounts) -> None:
        for f in fields(OpCounts):
            setattr(pending, f.name, getattr(pending, f.name) + getattr(counts, f.name))

    for s in body:
        if isinstance(s, S.Seq):
            flush()
            out.extend(_instrument_run(s.body))
        elif isinstance(s, S.For):
            add(_count(s.extent))
            flush()
            unrolled = s.kind == "unroll" or (
                isinstance(s.extent, E.Const) and s.extent.value <= UNROLLED
            )
            steps = 0 if unrolled else 2  # the increment and the test
            wide = s.var.dtype.nbytes == 8
            loop = OpCounts(int32=0 if wide else steps, int64=steps if wide else 0)
            body_stmts = _with_count(loop, [_instrument(s.body)])
            out.append(s.replace(body=S.Seq(tuple(body_stmts))))
        elif isinstance(s, S.While):
            flush()
            body_stmts = _with_count(_count(s.cond), [_instrument(s.body)])
            out.append(s.replace(body=S.Seq(tuple(body_stmts))))
        elif isinstance(s, S.If):
            add(_count(s.cond))
            flush()
            orelse = None if s.orelse is None else _instrument(s.orelse)
            out.append(s.replace(then=_instrument(s.then), orelse=orelse))
        elif isinstance(s, (S.Break, S.Continue, S.Return)):
            add(_count(*_expressions(s)))
            run.append(s)
            flush()
        elif isinstance(s, S.Store):
            add(_count(s.value, index=s.index))
            run.append(s)
        else:
            add(_count(*_expressions(s)))
            run.append(s)
    flush()
    return out


def count_ops(fn: Function) -> Function:
    """`fn` with a `lens_ops` call before each straight run of statements (module docstring)."""
    return fn.replace(body=_instrument(fn.body))
