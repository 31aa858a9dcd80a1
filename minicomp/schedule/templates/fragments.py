"""Fragments: script code written once and expanded inline where a kernel calls it.

A fragment is a macro whose expansion parses a parameterless script function built over the
call's arguments (they are in its closure: IR values, tensors, compile-time constants,
other macros) and splices the result into the kernel being parsed:

- `Names.fragment(tag, build)`: statements, the body of `build(*args)`. Its locals are
  renamed apart, `<name>_<tag>` (then `<name>_<tag>2`...): IR variables are equal by name and
  type, so two expansions, or an expansion and its kernel, must never share one (templates'
  `finish` checks that no kernel declares a variable twice).
- `expression(build)`: a value, what `build(*args)` (straight-line assignments and a
  `return`) returns, its locals replaced by their values.

A script device function would be called, not inlined, and takes no views of tensors (a
stage of a shared buffer); a fragment is the template's own code at the call.
"""

from __future__ import annotations

from collections.abc import Callable

from minicomp.ir import stmt as S
from minicomp.ir.expr import Expr, Var
from minicomp.ir.functor import collect, substitute
from minicomp.script.function import ScriptFunction
from minicomp.script.lang import Macro, macro
from minicomp.script.values import TensorRef


class Names:
    """The names of the fragments expanded into one kernel: each local of each expansion
    gets its own, `<name>_<tag>` (then `<name>_<tag>2`...)."""

    def __init__(self):
        self.taken: set[str] = set()
        self.given: set[Var] = set()

    def splice(self, fn: ScriptFunction, tag: str) -> S.Stmt:
        """The body of parameterless script function `fn`, its locals renamed apart."""
        body = fn.ir.body
        outer = _closure_vars(fn.fn)
        mapping: dict[Var, Var] = {}
        for node in collect(body, (S.Declare, S.DeclareArray, S.For)):
            v = node.var
            if v in self.given or v in mapping:
                continue  # a nested fragment's, renamed already
            if v in outer:
                raise ValueError(f"fragment {fn.__name__}: its local {v.name} hides a value")
            name, k = f"{v.name}_{tag}", 2
            while name in self.taken:
                name, k = f"{v.name}_{tag}{k}", k + 1
            self.taken.add(name)
            mapping[v] = Var(name, v.type)
        self.given.update(mapping.values())
        return substitute(body, mapping)

    def fragment(self, tag: str, build: Callable[..., ScriptFunction]) -> Macro:
        """A macro expanding to the body of `build(*args)`, a parameterless script function
        over the call's arguments, its locals tagged `tag`."""

        def expand(*args):
            return self.splice(build(*args), tag)

        expand.__name__ = build.__name__
        return macro(expand)


def _closure_vars(fn) -> set[Var]:
    """The IR variables a Python function's closure holds (in expressions, tensors, tuples)."""
    found: set[Var] = set()

    def visit(value) -> None:
        if isinstance(value, Expr):
            found.update(collect(value, Var))
        elif isinstance(value, TensorRef):
            found.add(value.var)
            visit(value.offset)
            for d in value.shape:
                visit(d)
        elif isinstance(value, tuple | list):
            for v in value:
                visit(v)

    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a name the function's Python scope never assigned
            continue
        visit(value)
    return found


def expression(build: Callable[..., ScriptFunction]) -> Macro:
    """A macro whose value is what `build(*args)` returns: a parameterless script function
    of assignments and a final `return`, its locals replaced by their values."""

    def value(*args):
        fn = build(*args)
        body = fn.ir.body
        values: dict[Var, Expr] = {}
        for st in body.body if isinstance(body, S.Seq) else (body,):
            if isinstance(st, S.Declare) and st.init is not None:
                values[st.var] = substitute(st.init, values)
            elif isinstance(st, S.Return) and st.value is not None:
                return substitute(st.value, values)
            else:
                break
        raise ValueError(f"{fn.__name__} is not assignments and a final return")

    value.__name__ = build.__name__
    return macro(value)
