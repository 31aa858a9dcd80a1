"""Simplification of integer index expressions: canonical sums, and divisions proven exact.

Integer sums of products are put in a canonical form (terms with constant coefficients, in a
fixed order, constant last). Divisions and remainders by a positive constant (or by a size
symbol) are simplified when interval bounds on the variables prove the dividend non-negative
and show which terms divide exactly, so the index maps of a reshape followed by its inverse
collapse back to plain axes: with 0 <= j < 8, (i*8 + j) // 8 is i and (i*8 + j) % 8 is j.
Only integer arithmetic is reassociated; floating-point expressions keep their order.

What a guard establishes is used where it holds: the later terms of a conjunction and the
first arm of a select are simplified knowing the comparisons before them true, so the clamp
of a guarded read goes (`i >= 0 and i < 7 ? x[min(max(i, 0), 6)] : 0` reads `x[i]`). A
minimum or maximum whose order is proven (by bounds or by such facts) is the operand it picks.
The indices of reads and the arguments of calls are simplified without such facts: a backend
may evaluate a select's other arm, and a read there must stay in bounds (ops/shape.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from minicomp.ir.expr import (
    Binary,
    Call,
    Cast,
    Const,
    Expr,
    Select,
    Unary,
    Var,
    binary,
    const,
    unary,
)
from minicomp.ir.functor import Mutator

Bounds = Mapping[Var, tuple]
# A linear form: {atom: coefficient} plus a constant; atoms are non-sum expressions.
Linear = tuple[dict, int]
# What CUDA guarantees of the launch indices (a block has at most 1024 threads).
_LAUNCH_INDEX_BOUNDS = {
    **{f"thread_idx_{a}": (0, 1023) for a in "xyz"},
    **{f"block_idx_{a}": (0, None) for a in "xyz"},
    **{f"block_dim_{a}": (1, 1024) for a in "xyz"},
    **{f"grid_dim_{a}": (1, None) for a in "xyz"},
}


def simplify_expr(e: Expr, bounds: Bounds | None = None, assuming: Expr | None = None) -> Expr:
    """`e` simplified, given (lo, hi) inclusive bounds of some variables (either may be None;
    hi may be an expression such as `s - 1` for an axis of symbolic extent `s`), and knowing
    boolean `assuming` true where given (its integer comparisons).

    Returns `e` itself when nothing simplifies.
    """
    simplifier = _Simplifier(bounds or {})
    if assuming is not None:
        simplifier = simplifier.knowing(simplifier.visit(assuming))
    return simplifier.visit(e)


_ARITHMETIC = (Binary, Unary, Cast, Select, Const, Var)


class _Simplifier(Mutator):
    def __init__(self, bounds: Bounds, facts: tuple[Linear, ...] = ()):
        super().__init__()
        self.bounds = bounds
        self.facts = facts  # linear forms known to be >= 0

    def knowing(self, cond: Expr) -> _Simplifier:
        """A simplifier that also knows `cond`'s integer comparisons (where it is true)."""
        found = _facts(self, cond)
        return _Simplifier(self.bounds, self.facts + found) if found else self

    def visit(self, n):
        if self.facts and isinstance(n, Expr) and not isinstance(n, _ARITHMETIC):
            return _Simplifier(self.bounds).visit(n)  # a read, a call
        out = super().visit(n)
        return n if out is not n and out == n else out

    def visit_Binary(self, e: Binary) -> Expr:
        a = self.visit(e.a)
        if e.op == "and":
            b = self.knowing(a).visit(e.b)
            return e if a is e.a and b is e.b else binary("and", a, b)
        b = self.visit(e.b)
        if not a.dtype.is_integer or e.op not in _INT_RULES:
            return e if a is e.a and b is e.b else binary(e.op, a, b)
        return _INT_RULES[e.op](self, e.op, a, b)

    def visit_Unary(self, e: Unary) -> Expr:
        a = self.visit(e.a)
        if e.op == "neg" and e.dtype.is_integer:
            return self.from_linear(_scale(self.linear(a), -1), e.dtype)
        return e if a is e.a else unary(e.op, a)

    def visit_Select(self, e: Select) -> Expr:
        cond = self.visit(e.cond)
        if isinstance(cond, Const):
            return self.visit(e.a if cond.value else e.b)
        a, b = self.knowing(cond).visit(e.a), self.visit(e.b)
        if cond is e.cond and a is e.a and b is e.b:
            return e
        return Select(cond, a, b)

    # Sums of products -------------------------------------------------------------------

    def linear(self, e: Expr) -> Linear:
        """`e` (already simplified) as a linear form over its non-sum parts."""
        if isinstance(e, Const):
            return {}, int(e.value)
        if isinstance(e, Binary) and e.op in ("add", "sub"):
            sign = 1 if e.op == "add" else -1
            return _add(self.linear(e.a), _scale(self.linear(e.b), sign))
        if isinstance(e, Binary) and e.op == "mul":
            return self.product(self.linear(e.a), self.linear(e.b), e)
        if isinstance(e, Unary) and e.op == "neg":
            return _scale(self.linear(e.a), -1)
        return {e: 1}, 0

    def product(self, x: Linear, y: Linear, whole: Expr) -> Linear:
        if not x[0]:
            return _scale(y, x[1])
        if not y[0]:
            return _scale(x, y[1])
        if len(x[0]) == 1 and len(y[0]) == 1 and x[1] == 0 and y[1] == 0:
            (ta, ka), (tb, kb) = next(iter(x[0].items())), next(iter(y[0].items()))
            ta, tb = sorted((ta, tb), key=repr)
            return {Binary("mul", ta, tb): ka * kb}, 0
        return {whole: 1}, 0

    def from_linear(self, form: Linear, dt) -> Expr:
        """The canonical expression of a linear form: positive terms first, by text."""
        terms, c = _merge_divmod(form)
        items = sorted(
            ((t, k) for t, k in terms.items() if k), key=lambda p: (p[1] < 0, repr(p[0]))
        )
        out: Expr | None = None
        if items and items[0][1] < 0 and c > 0:
            out, c = const(c, dt), 0
        for t, k in items:
            term = t if abs(k) == 1 else binary("mul", t, const(abs(k), dt))
            if out is None:
                out = term if k > 0 else unary("neg", term)
            else:
                out = Binary("add" if k > 0 else "sub", out, term)
        if out is None:
            return const(c, dt)
        if c:
            out = Binary("add" if c > 0 else "sub", out, const(abs(c), dt))
        return out

    def sum_rule(self, op: str, a: Expr, b: Expr) -> Expr:
        x, y = self.linear(a), self.linear(b)
        if op == "add":
            form = _add(x, y)
        elif op == "sub":
            form = _add(x, _scale(y, -1))
        else:
            form = self.product(x, y, binary(op, a, b))
        return self.from_linear(form, a.dtype)

    # Bounds ---------------------------------------------------------------------------

    def interval(self, e: Expr) -> tuple:
        """Inclusive (lo, hi) integer bounds of `e`; None where unknown."""
        return self.form_interval(self.linear(e))

    def form_interval(self, form: Linear) -> tuple:
        terms, c = form
        lo, hi = c, c
        for t, k in terms.items():
            tlo, thi = self.atom_interval(t)
            if k < 0:
                tlo, thi = thi, tlo
            lo = None if lo is None or tlo is None else lo + k * tlo
            hi = None if hi is None or thi is None else hi + k * thi
        return lo, hi

    def atom_interval(self, t: Expr) -> tuple:
        if isinstance(t, Var):
            lo, hi = self.bounds.get(t, (None, None))
            return lo, hi if isinstance(hi, int) else None
        if isinstance(t, Call) and not t.args and t.name in _LAUNCH_INDEX_BOUNDS:
            return _LAUNCH_INDEX_BOUNDS[t.name]
        if isinstance(t, Cast) and t.dtype.is_integer and t.a.dtype.is_integer:
            if t.dtype.nbytes > t.a.dtype.nbytes or t.dtype == t.a.dtype:
                return self.interval(t.a)
        if isinstance(t, Binary) and isinstance(t.b, Const) and t.b.value > 0:
            lo, hi = self.interval(t.a)
            if lo is None or lo < 0:
                return None, None
            n = t.b.value
            if t.op == "idiv":
                return lo // n, None if hi is None else hi // n
            if t.op == "imod":
                return (lo, hi) if hi is not None and hi < n else (0, n - 1)
        if isinstance(t, Binary) and t.op == "mul":
            (alo, ahi), (blo, bhi) = self.interval(t.a), self.interval(t.b)
            if alo is not None and blo is not None and alo >= 0 and blo >= 0:
                return alo * blo, None if ahi is None or bhi is None else ahi * bhi
        if isinstance(t, Binary) and t.op == "imod" and self.nonneg(t.a):
            return 0, None
        return None, None

    def nonneg(self, e: Expr) -> bool:
        lo = self.interval(e)[0]
        return lo is not None and lo >= 0

    def form_nonneg(self, form: Linear) -> bool:
        """Whether form >= 0 is proven, by bounds or by a known fact it exceeds by a constant."""
        lo = self.form_interval(form)[0]
        if lo is not None and lo >= 0:
            return True
        for fact in self.facts:
            terms, c = _add(form, _scale(fact, -1))
            if not terms and c >= 0:
                return True
        return False

    def below(self, form: Linear, d: Expr) -> bool:
        """Whether 0 <= form < d is proven (d a constant or a size expression)."""
        lo = self.form_interval(form)[0]
        if lo is None or lo < 0:
            return False
        hi = self.upper(form)
        if hi is None:
            return False
        slack_lo = self.form_interval(_add(self.linear(d), _scale(hi, -1)))[0]
        return slack_lo is not None and slack_lo >= 1

    def upper(self, form: Linear) -> Linear | None:
        """An upper bound of a linear form as a linear form over size symbols, or None."""
        terms, c = form
        out: Linear = ({}, c)
        for t, k in terms.items():
            lo, hi = self.atom_interval(t)
            if k > 0 and isinstance(t, Var) and isinstance(self.bounds.get(t, (0, 0))[1], Expr):
                bound = self.linear(self.visit(self.bounds[t][1]))
            elif k > 0 and hi is not None:
                bound = ({}, hi)
            elif k < 0 and lo is not None:
                bound = ({}, lo)
            else:
                return None
            out = _add(out, _scale(bound, k))
        return out

    # Division ---------------------------------------------------------------------------

    def div_rule(self, op: str, a: Expr, b: Expr) -> Expr:
        split = _split(self.linear(a), self.linear(b)) if self.positive(b) else None
        if split is None or not self.nonneg(a):
            return self.nested_div(op, a, b)
        # a = b*q + r with r the terms b does not divide; with 0 <= a and 0 <= r, truncation
        # is floor division and a // b = q + r // b, a % b = r % b.
        q, r = split
        rlo = self.form_interval(r)[0]
        if rlo is None or rlo < 0:
            return self.nested_div(op, a, b)
        small = self.below(r, b)
        if not q[0] and not small:
            return self.nested_div(op, a, b)
        r_expr = self.from_linear(r, a.dtype)
        if op == "imod":
            return r_expr if small else binary("imod", r_expr, b)
        rest = const(0, a.dtype) if small else binary("idiv", r_expr, b)
        return self.from_linear(_add(q, self.linear(rest)), a.dtype)

    def positive(self, b: Expr) -> bool:
        lo = self.interval(b)[0]
        return lo is not None and lo >= 1

    def nested_div(self, op: str, a: Expr, b: Expr) -> Expr:
        """(x // m) // n is x // (m*n) and (x % m) % n is x % n when n divides m (x >= 0)."""
        if (
            isinstance(a, Binary)
            and a.op == op
            and isinstance(a.b, Const)
            and isinstance(b, Const)
            and a.b.value > 0
            and b.value > 0
            and self.nonneg(a.a)
        ):
            m, n = a.b.value, b.value
            if op == "idiv":
                return self.div_rule(op, a.a, const(m * n, a.dtype))
            if m % n == 0:
                return self.div_rule(op, a.a, b)
        return binary(op, a, b)

    def compare_rule(self, op: str, a: Expr, b: Expr) -> Expr:
        known = self.decide(op, a, b)
        return binary(op, a, b) if known is None else known

    def decide(self, op: str, a: Expr, b: Expr) -> Expr | None:
        """`a op b` where bounds or facts decide it or a min or max in it, else None."""
        if op in ("gt", "ge"):  # b < a, b <= a
            return self.decide("lt" if op == "gt" else "le", b, a)
        # a < b is b - a - 1 >= 0; a <= b is b - a >= 0.
        diff = _add(self.linear(b), _scale(self.linear(a), -1))
        strict = 1 if op == "lt" else 0
        if self.form_nonneg(_add(diff, ({}, -strict))):
            return const(True)
        if self.form_nonneg(_add(_scale(diff, -1), ({}, strict - 1))):
            return const(False)
        # max(x, y) < b is x < b and y < b; a < min(x, y) likewise: one part known true
        # leaves the other.
        for side, pick in ((a, "max"), (b, "min")):
            if not (isinstance(side, Binary) and side.op == pick):
                continue
            pairs = [(x, b) if side is a else (a, x) for x in (side.a, side.b)]
            for this, other in (pairs, pairs[::-1]):
                known = self.decide(op, *this)
                if isinstance(known, Const):
                    return self.compare_rule(op, *other) if known.value else known
        return None

    def minmax_rule(self, op: str, a: Expr, b: Expr) -> Expr:
        a_minus_b = _add(self.linear(a), _scale(self.linear(b), -1))
        if self.form_nonneg(a_minus_b):  # a >= b
            return a if op == "max" else b
        if self.form_nonneg(_scale(a_minus_b, -1)):  # b >= a
            return b if op == "max" else a
        return binary(op, a, b)


_INT_RULES = {
    "add": _Simplifier.sum_rule,
    "sub": _Simplifier.sum_rule,
    "mul": _Simplifier.sum_rule,
    "idiv": _Simplifier.div_rule,
    "imod": _Simplifier.div_rule,
    "lt": _Simplifier.compare_rule,
    "le": _Simplifier.compare_rule,
    "gt": _Simplifier.compare_rule,
    "ge": _Simplifier.compare_rule,
    "max": _Simplifier.minmax_rule,
    "min": _Simplifier.minmax_rule,
}


def _facts(s: _Simplifier, cond: Expr) -> tuple[Linear, ...]:
    """The linear forms `cond` (a conjunction of comparisons, in part) proves >= 0."""
    if isinstance(cond, Binary) and cond.op == "and":
        return _facts(s, cond.a) + _facts(s, cond.b)
    if not (isinstance(cond, Binary) and cond.op in ("lt", "le", "gt", "ge")):
        return ()
    if not cond.a.dtype.is_integer:
        return ()
    low, high = (cond.a, cond.b) if cond.op in ("lt", "le") else (cond.b, cond.a)
    strict = 1 if cond.op in ("lt", "gt") else 0
    return (_add(_add(s.linear(high), _scale(s.linear(low), -1)), ({}, -strict)),)


def _add(x: Linear, y: Linear) -> Linear:
    terms = dict(x[0])
    for t, k in y[0].items():
        terms[t] = terms.get(t, 0) + k
    return {t: k for t, k in terms.items() if k}, x[1] + y[1]


def _scale(x: Linear, k: int) -> Linear:
    if k == 0:
        return {}, 0
    return {t: c * k for t, c in x[0].items()}, x[1] * k


def _split(form: Linear, b: Linear) -> tuple[Linear, Linear] | None:
    """form = b*q + r: q gathers the terms b divides, r the rest (with a constant divisor,
    the constant too, leaving r's in [0, b)); None for a divisor that is not one term."""
    terms, c = form
    q: dict = {}
    r: dict = {}
    if not b[0]:
        n = b[1]
        for t, k in terms.items():
            if k % n == 0:
                q[t] = k // n
            else:
                r[t] = k
        return (q, c // n), (r, c % n)
    if len(b[0]) != 1 or b[1] != 0:
        return None
    ((atom, n),) = b[0].items()
    qc = 0
    for t, k in terms.items():
        other = _cofactor(t, atom) if k % n == 0 else None
        if other is None:
            r[t] = k
        elif isinstance(other, int):
            qc += k // n
        else:
            q[other] = q.get(other, 0) + k // n
    return (q, qc), (r, c)


def _cofactor(t: Expr, b: Expr) -> Expr | int | None:
    """x when the atom t is x*b, 1 when it is b, else None."""
    if t == b:
        return 1
    if isinstance(t, Binary) and t.op == "mul":
        if t.b == b:
            return t.a
        if t.a == b:
            return t.b
    return None


def _merge_divmod(form: Linear) -> Linear:
    """Rewrite k*n*(x // n) + k*(x % n) as k*x: truncating division satisfies it for any x."""
    terms, c = dict(form[0]), form[1]
    changed = True
    while changed:
        changed = False
        for t, k in list(terms.items()):
            if not (isinstance(t, Binary) and t.op == "imod" and isinstance(t.b, Const)):
                continue
            quotient = Binary("idiv", t.a, t.b)
            if terms.get(quotient) == k * t.b.value:
                del terms[t], terms[quotient]
                x = _linear_plain(t.a)
                terms_x, cx = _scale(x, k)
                for a, ka in terms_x.items():
                    terms[a] = terms.get(a, 0) + ka
                c += cx
                terms = {a: ka for a, ka in terms.items() if ka}
                changed = True
                break
    return terms, c


def _linear_plain(e: Expr) -> Linear:
    """A linear form without bounds (the structural part of `_Simplifier.linear`)."""
    return _Simplifier({}).linear(e)
