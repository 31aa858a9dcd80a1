"""Which vector loops may run their math's near versions and fall back to running again.

runtime.h has, for some float32 math functions, a near version: cheaper, as accurate where the
argument passes the function's far test (sin and cos below 2^18, erf away from tiny values).
Lanes cannot branch, so the C renderer runs such a loop with the near versions, ORs the far
tests of their arguments into a flag, and when the flag is set runs the whole loop again with
the exact versions. That is only right for a loop whose second run gives what one run of the
exact loop would: this module decides that, and finds the calls and their arguments.
"""

from __future__ import annotations

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.functor import collect
from minicomp.ir.types import bf16, f16, f32

# Function -> the runtime's test of its argument, true where the near version may be off.
NEAR_F32 = {"sin": "mc_trig_far_f32", "cos": "mc_trig_far_f32", "erf": "mc_erf_far_f32"}
# Half-precision calls are computed in float32 (c_like's render_call), so they have them too.
_NEAR_TYPES = (f32, f16, bf16)


def near_calls(node) -> list[E.Call]:
    """The calls in `node` (an expression or statement) that have a near version."""
    return [c for c in collect(node, E.Call) if c.name in NEAR_F32 and c.dtype in _NEAR_TYPES]


def far_tests(s: S.Stmt) -> list[tuple[str, E.Expr]]:
    """(far test, float32 argument) for the near calls of a statement's own expressions (not
    those of the statements inside it), without repeats: run just before the statement, the
    argument's variables are all defined."""
    out: list[tuple[str, E.Expr]] = []
    for e in _own_exprs(s):
        for c in near_calls(e):
            test = (NEAR_F32[c.name], E.cast(c.args[0], f32))
            if test not in out:
                out.append(test)
    return out


def _own_exprs(s: S.Stmt) -> tuple[E.Expr, ...]:
    if isinstance(s, S.Store):
        return (s.index, s.value)
    if isinstance(s, S.Assign | S.Evaluate):
        return (s.value if isinstance(s, S.Assign) else s.expr,)
    if isinstance(s, S.Declare):
        return () if s.init is None else (s.init,)
    if isinstance(s, S.For):
        return (s.extent,)
    if isinstance(s, S.If):
        # The renderer writes an else-if chain as one statement.
        conds = []
        while isinstance(s, S.If):
            conds.append(s.cond)
            s = s.orelse
        return tuple(conds)
    return ()


def runs_again_safely(loop: S.For) -> bool:
    """Whether running `loop` a second time, after restoring its reduction accumulators, gives
    what running it once would: its body writes only memory it does not read (so a second run
    reads the same values; pointers do not alias, as `__restrict__` already promises), locals
    declared inside it and its own accumulators, and has no loop of its own that is
    parallel or vectorised (a nested vector loop would need its own flag)."""
    accumulators = {acc for _, acc in loop.reductions}
    local: set[E.Var] = set()
    stored: set[E.Var] = set()

    def ok(s: S.Stmt) -> bool:
        if isinstance(s, S.Seq):
            return all(ok(x) for x in s.body)
        if isinstance(s, S.For):
            local.add(s.var)
            return s.kind in ("serial", "unroll") and ok(s.body)
        if isinstance(s, S.If):
            return ok(s.then) and (s.orelse is None or ok(s.orelse))
        if isinstance(s, S.Declare | S.DeclareArray):
            local.add(s.var)
            return True
        if isinstance(s, S.Assign):
            return s.var in local or s.var in accumulators
        if isinstance(s, S.Store):
            stored.add(s.buf)
            return True
        return isinstance(s, S.Comment)  # not While, Evaluate, Break, Continue, Return

    if not ok(loop.body):
        return False
    loaded = {load.buf for load in collect(loop.body, E.Load)}
    return not ((stored - local) & loaded)
