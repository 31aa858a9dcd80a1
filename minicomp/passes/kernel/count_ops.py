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
- int divides: integer division and remainder by a value known only at run time (by a
  constant other than a power of two it is a multiply-high and a shift: integer instructions);
- special: calls of transcendental math functions (exp, log, sin, tanh, erf, rsqrt...), one each
  whatever sequence the compiler makes of them;
- conversions: casts to or from f16 and bf16; a float8 conversion is software (common.h's bit
  arithmetic around one float addition): FLOAT8_NARROW or FLOAT8_WIDEN integer instructions
  and one fp instruction instead, a conversion from float8 to float16 or bfloat16 adding one.
Loads and stores are not counted here: the emulator sees those itself. A loop's own increment
and test count as two integer instructions an iteration, none for a loop the compiler unrolls
(kind "unroll", or a constant trip count up to UNROLLED); both arms of a select count.

Integer work the compiler does not repeat is free: an integer operation whose operands are
constants in each unrolled copy (built from constants and unrolled loops' variables) folds,
and one whose operands do not change in the innermost loop that is not unrolled is hoisted out
of it. An expression's *variance* is the depth of the innermost rolled loop its value changes
in (-1: a constant; loads and calls change where they run), the depth at which the compiler
computes it. An integer operation that does not depend on an unrolled loop's variable is the
same in each unrolled copy, which the compiler computes once: it counts once, before that
loop (unless a condition around it depends on the variable). One written twice in a
statement counts once too (common subexpressions).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function
from minicomp.ir.functor import Visitor
from minicomp.ir.types import PointerType, is_float8, u64

_CHEAP_MATH = frozenset(("floor", "ceil", "rint", "trunc", "abs", "signbit", "isnan", "isinf"))
_FLOAT_ARITH = frozenset(("add", "sub", "mul", "div", "max", "min"))
# Special registers: fixed for the thread.
_THREAD_CONSTANTS = frozenset(("thread_idx", "block_idx", "block_dim", "grid_dim"))
UNROLLED = 32
"""The largest constant trip count assumed unrolled whole (no increment, no test)."""
FLOAT8_NARROW = 16
"""Integer instructions of a float32 -> float8 conversion (rounding, overflow and NaN selects)."""
FLOAT8_WIDEN = 6
"""Integer instructions of a float8 -> float32 conversion."""


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


CONSTANT = -1
"""The variance of a value that is a constant in each unrolled copy of the code."""


@dataclass
class _Unrolled:
    """An unrolled loop around the walk: the operations its copies share, counted once."""

    var: E.Var
    counts: OpCounts
    seen: set


class _Scope:
    """Where the walk is: the depth of rolled loops around it, each variable's variance, the
    unrolled loops (since the innermost rolled one) work may be hoisted before, and which of
    their variables each variable depends on (None: unknown)."""

    def __init__(self, assigned: dict[E.Var, int]):
        self.depth = 0
        self.variance: dict[E.Var, int] = {}
        self.assigned = assigned  # a reassigned variable changes where it is assigned
        self.unrolled: list[_Unrolled] = []
        self.deps: dict[E.Var, frozenset | None] = {}
        self._deps_memo: dict[E.Expr, frozenset | None] = {}

    def declare(self, var: E.Var, variance: int, deps: frozenset | None = None) -> None:
        self.variance[var] = max(variance, self.assigned.get(var, CONSTANT))
        if var in self.deps:
            self._deps_memo.clear()  # declared again: what was read of it may change
        self.deps[var] = None if var in self.assigned else deps

    def deps_of(self, e: E.Expr) -> frozenset | None:
        """The unrolled loops' variables `e` depends on; None where it reads memory or calls
        an intrinsic (its value may change between copies)."""
        hit = self._deps_memo.get(e, self)
        if hit is not self:
            return hit
        if isinstance(e, E.Var):
            out = frozenset() if isinstance(e.type, PointerType) else self.deps.get(e, frozenset())
        elif isinstance(e, E.Call) and e.name.rpartition("_")[0] in _THREAD_CONSTANTS:
            out = frozenset()
        elif isinstance(e, (E.Load, E.Call)):
            out = None
        else:
            out = frozenset()
            for child in e.children():
                d = self.deps_of(child) if isinstance(child, E.Expr) else frozenset()
                if d is None:
                    out = None
                    break
                out |= d
        self._deps_memo[e] = out
        return out

    def hoist_target(self, e: E.Expr) -> _Unrolled | None:
        """The outermost unrolled loop `e` is the same in every copy of (with those inside)."""
        if not self.unrolled:
            return None
        deps = self.deps_of(e)
        if deps is None:
            return None
        for i, u in enumerate(self.unrolled):
            if not any(v.var in deps for v in self.unrolled[i:]):
                return u
        return None


class _ExprCounter(Visitor):
    """The operations of the expressions it visits, added to `counts`; `visit` returns an
    expression's variance (module docstring), and integer operations whose variance is below
    the scope's depth cost nothing."""

    def __init__(self, counts: OpCounts, scope: _Scope):
        super().__init__()
        self.counts = counts
        self.scope = scope
        self.in_index = False
        self.seen: set = set()  # the integer operations of this statement counted so far

    def visit(self, n):
        # Every occurrence counts: a memoised visit would count a shared subexpression once.
        if isinstance(n, E.Expr):
            return self._dispatch(type(n))(self, n)
        if isinstance(n, tuple):
            return max((self.visit(x) for x in n), default=CONSTANT)
        return super().visit(n)

    def visit_Const(self, e: E.Const) -> int:
        return CONSTANT

    def visit_StringLiteral(self, e) -> int:
        return CONSTANT

    def visit_Var(self, e: E.Var) -> int:
        # Parameters and thread indices: fixed for the thread, computed once at the top.
        return self.scope.variance.get(e, 0)

    def _integer(self, e: E.Expr, dtype, variance: int, instructions: int = 1) -> None:
        if variance < self.scope.depth:
            return  # folded into a constant, or hoisted out of the loop
        target = self.scope.hoist_target(e)
        counts, seen = (self.counts, self.seen) if target is None else (target.counts, target.seen)
        if e in seen:
            return  # computed once already
        seen.add(e)
        if self.in_index:
            counts.address += instructions
        elif dtype.nbytes == 8:
            counts.int64 += instructions
        else:
            counts.int32 += instructions

    def visit_Binary(self, e: E.Binary) -> int:
        variance = max(self.visit(e.a), self.visit(e.b))
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
                if isinstance(e.b, E.Const):  # a multiply-high and a shift (and a multiply-sub)
                    self._integer(e, operand, variance, 2 if e.op in ("idiv", "div") else 3)
                elif variance >= self.scope.depth:
                    c.divides += 1
            else:
                self._integer(e, operand, variance)
        return variance

    def visit_Unary(self, e: E.Unary) -> int:
        variance = self.visit(e.a)
        if e.a.dtype.is_float:
            self.counts.fp += 1
        elif e.a.dtype.is_integer:
            self._integer(e, e.a.dtype, variance)
        return variance

    def visit_Cast(self, e: E.Cast) -> int:
        variance = self.visit(e.a)
        src, dst = e.a.dtype, e.type
        if src == dst:
            return variance
        for float8, cost in ((src, FLOAT8_WIDEN), (dst, FLOAT8_NARROW)):
            if is_float8(float8):
                self.counts.int32 += cost
                self.counts.fp += 1
        if src.is_float and src.nbytes == 2 or dst.is_float and dst.nbytes == 2:
            self.counts.conversions += 1
        return variance

    def visit_Call(self, e: E.Call) -> int:
        if e.name.rpartition("_")[0] in _THREAD_CONSTANTS:
            return 0
        variance = CONSTANT
        for before, arg in zip((None, *e.args), e.args):
            # An intrinsic's (buffer, index) pair: the index is the address of an element.
            pointer = isinstance(before, E.Var) and isinstance(before.type, PointerType)
            variance = max(variance, self.index(arg) if pointer else self.visit(arg))
        if e.name in E.MATH_FUNCTIONS:
            if e.name in _CHEAP_MATH:
                self.counts.fp += e.dtype.is_float
            else:
                self.counts.special += 1
            return variance
        return self.scope.depth  # an intrinsic: its result is new each time it runs

    def visit_Load(self, e: E.Load) -> int:
        self.index(e.index)
        return self.scope.depth  # memory may change between iterations

    def index(self, e: E.Expr) -> int:
        """Count `e` as address arithmetic."""
        outer, self.in_index = self.in_index, True
        variance = self.visit(e)
        self.in_index = outer
        return variance

    def visit_Select(self, e: E.Select) -> int:
        return max(self.visit(e.cond), self.visit(e.a), self.visit(e.b))


def _count(scope: _Scope, *nodes, index: E.Expr | None = None) -> OpCounts:
    counts = OpCounts()
    counter = _ExprCounter(counts, scope)
    for n in nodes:
        if n is not None:
            counter.visit(n)
    if index is not None:
        counter.index(index)
    return counts


def _variance(scope: _Scope, e: E.Expr | None) -> int:
    return CONSTANT if e is None else _ExprCounter(OpCounts(), scope).visit(e)


def _unrolled(s: S.For) -> bool:
    return s.kind == "unroll" or (isinstance(s.extent, E.Const) and s.extent.value <= UNROLLED)


def _assignment_depths(s: S.Stmt, depth: int = 0, out: dict | None = None) -> dict[E.Var, int]:
    """The innermost rolled-loop depth at which each reassigned variable is assigned."""
    out = {} if out is None else out
    if isinstance(s, S.Assign):
        out[s.var] = max(out.get(s.var, CONSTANT), depth)
    elif isinstance(s, S.Seq):
        for x in s.body:
            _assignment_depths(x, depth, out)
    elif isinstance(s, S.For):
        _assignment_depths(s.body, depth + (not _unrolled(s)), out)
    elif isinstance(s, S.While):
        _assignment_depths(s.body, depth + 1, out)
    elif isinstance(s, S.If):
        _assignment_depths(s.then, depth, out)
        if s.orelse is not None:
            _assignment_depths(s.orelse, depth, out)
    return out


def _expressions(s: S.Stmt) -> list[E.Expr]:
    """The expressions a simple statement evaluates (a Store's value and index...)."""
    values = (getattr(s, f.name) for f in fields(s))
    return [v for v in values if isinstance(v, E.Expr) and not isinstance(v, E.Var)]


def _with_count(counts: OpCounts, stmts: list[S.Stmt]) -> list[S.Stmt]:
    return [counts.call(), *stmts] if counts else stmts


def _instrument(s: S.Stmt, scope: _Scope) -> S.Stmt:
    if isinstance(s, S.Seq):
        return S.Seq(tuple(_instrument_run(s.body, scope)))
    return S.Seq(tuple(_instrument_run((s,), scope)))


def _instrument_run(body, scope: _Scope) -> list[S.Stmt]:
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

    def nested(body: S.Stmt, rolled: bool) -> S.Stmt:
        scope.depth += rolled
        try:
            return _instrument(body, scope)
        finally:
            scope.depth -= rolled

    for s in body:
        if isinstance(s, S.Seq):
            flush()
            out.extend(_instrument_run(s.body, scope))
        elif isinstance(s, S.For):
            add(_count(scope, s.extent))
            flush()
            unrolled = _unrolled(s)
            scope.declare(s.var, CONSTANT if unrolled else scope.depth + 1, frozenset((s.var,)))
            steps = 0 if unrolled else 2  # the increment and the test
            wide = s.var.dtype.nbytes == 8
            loop = OpCounts(int32=0 if wide else steps, int64=steps if wide else 0)
            outer = scope.unrolled
            scope.unrolled = [*outer, _Unrolled(s.var, OpCounts(), set())] if unrolled else []
            try:
                body_stmts = _with_count(loop, [nested(s.body, not unrolled)])
                shared = scope.unrolled[-1].counts if unrolled else OpCounts()
            finally:
                scope.unrolled = outer
            out.extend(_with_count(shared, [s.replace(body=S.Seq(tuple(body_stmts)))]))
        elif isinstance(s, S.While):
            flush()
            outer, scope.unrolled = scope.unrolled, []
            scope.depth += 1
            cond = _count(scope, s.cond)
            scope.depth -= 1
            try:
                body_stmts = _with_count(cond, [nested(s.body, True)])
            finally:
                scope.unrolled = outer
            out.append(s.replace(body=S.Seq(tuple(body_stmts))))
        elif isinstance(s, S.If):
            add(_count(scope, s.cond))
            flush()
            # Work under a condition that changes between the copies is not shared by them.
            deps = scope.deps_of(s.cond)
            outer = scope.unrolled
            if deps is None or any(u.var in deps for u in outer):
                scope.unrolled = []
            try:
                orelse = None if s.orelse is None else _instrument(s.orelse, scope)
                out.append(s.replace(then=_instrument(s.then, scope), orelse=orelse))
            finally:
                scope.unrolled = outer
        elif isinstance(s, (S.Break, S.Continue, S.Return)):
            add(_count(scope, *_expressions(s)))
            run.append(s)
            flush()
        elif isinstance(s, S.Store):
            add(_count(scope, s.value, index=s.index))
            run.append(s)
        else:
            add(_count(scope, *_expressions(s)))
            if isinstance(s, S.Declare):
                deps = frozenset() if s.init is None else scope.deps_of(s.init)
                scope.declare(s.var, _variance(scope, s.init), deps)
            elif isinstance(s, S.DeclareArray):
                scope.declare(s.var, scope.depth, None)
            run.append(s)
    flush()
    return out


def count_ops(fn: Function) -> Function:
    """`fn` with a `lens_ops` call before each straight run of statements (module docstring)."""
    return fn.replace(body=_instrument(fn.body, _Scope(_assignment_depths(fn.body))))
