"""Human-readable text of every IR: expressions, statements, functions, computes and graphs."""

from __future__ import annotations

from minicomp.ir import compute as C
from minicomp.ir import expr as E
from minicomp.ir import graph as G
from minicomp.ir import stmt as S
from minicomp.ir.func import LAUNCH_DEFAULTS, Function, Module
from minicomp.ir.functor import Functor

_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "idiv": "//",
    "imod": "%",
    "bitand": "&",
    "bitor": "|",
    "bitxor": "^",
    "shl": "<<",
    "shr": ">>",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
    "and": "and",
    "or": "or",
}
_PREC = {
    "or": 1,
    "and": 2,
    "lt": 4,
    "le": 4,
    "gt": 4,
    "ge": 4,
    "eq": 4,
    "ne": 4,
    "bitor": 5,
    "bitxor": 6,
    "bitand": 7,
    "shl": 8,
    "shr": 8,
    "add": 9,
    "sub": 9,
    "mul": 10,
    "div": 10,
    "idiv": 10,
    "imod": 10,
}


class ExprPrinter(Functor):
    """Renders expressions as Python-like text, parenthesising by precedence."""

    def visit_Const(self, e: E.Const) -> str:
        if e.dtype.is_bool:
            return str(bool(e.value))
        if e.dtype.is_float:
            text = E.float_literal(e.value)
            return text if e.dtype.short == "f32" else f"{e.dtype.short}({text})"
        return str(e.value) if e.dtype.short == "i64" else f"{e.dtype.short}({e.value})"

    def visit_Var(self, e: E.Var) -> str:
        return e.name

    def visit_Binary(self, e: E.Binary) -> str:
        if e.op not in _INFIX:
            return f"{e.op}({self.visit(e.a)}, {self.visit(e.b)})"
        p = _PREC[e.op]
        return f"{self._wrap(e.a, p, False)} {_INFIX[e.op]} {self._wrap(e.b, p, True)}"

    def _wrap(self, e: E.Expr, p: int, right: bool) -> str:
        text = self.visit(e)
        if isinstance(e, E.Binary) and e.op in _PREC:
            q = _PREC[e.op]
            # Comparisons chain in Python, so one inside another is always parenthesised.
            if q < p or (right and q == p) or (q == p == _PREC["lt"]):
                return f"({text})"
        if isinstance(e, E.Select):
            return f"({text})"
        return text

    def visit_Unary(self, e: E.Unary) -> str:
        sym = {"neg": "-", "not": "not ", "bitnot": "~"}[e.op]
        inner = self.visit(e.a)
        return f"{sym}({inner})" if isinstance(e.a, (E.Binary, E.Select)) else f"{sym}{inner}"

    def visit_Call(self, e: E.Call) -> str:
        return f"{e.name}({', '.join(self.visit(a) for a in e.args)})"

    def visit_Cast(self, e: E.Cast) -> str:
        return f"{e.type.short}({self.visit(e.a)})"

    def visit_Select(self, e: E.Select) -> str:
        return f"{self.visit(e.a)} if {self.visit(e.cond)} else {self.visit(e.b)}"

    def visit_Load(self, e: E.Load) -> str:
        return f"{e.buf.name}[{self.visit(e.index)}]"

    def visit_StringLiteral(self, e: E.StringLiteral) -> str:
        return repr(e.value)

    def visit_TensorElement(self, e: C.TensorElement) -> str:
        return f"{e.tensor.name}[{', '.join(self.visit(i) for i in e.indices)}]"

    def visit_TensorInput(self, e: C.TensorInput) -> str:
        return e.name

    def visit_Compute(self, e: C.Compute) -> str:
        return e.name

    def visit_Reduce(self, e: C.Reduce) -> str:
        axes = ", ".join(f"{a.name}<{self.visit(_dim(x))}" for a, x in zip(e.axes, e.extents))
        return f"{e.kind}[{axes}]({self.visit(e.body)})"


def _dim(d):
    return d if isinstance(d, E.Expr) else E.const(d)


def expr_str(e: E.Expr) -> str:
    """An expression as text."""
    return ExprPrinter().visit(e)


def shape_str(shape) -> str:
    """A shape as text: [4, s0, 16]."""
    return "[" + ", ".join(str(d) if isinstance(d, int) else expr_str(d) for d in shape) + "]"


class StmtPrinter(Functor):
    """Renders statements as indented Python-like lines."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []
        self.depth = 0
        self.e = ExprPrinter()

    def visit(self, n):
        # Statements are printed for their effect; identical ones may repeat.
        return self._dispatch(type(n))(self, n)

    def emit(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def block(self, s: S.Stmt) -> None:
        self.depth += 1
        self.visit(s)
        self.depth -= 1

    def visit_Seq(self, s: S.Seq) -> None:
        for x in s.body:
            self.visit(x)

    def visit_For(self, s: S.For) -> None:
        hint = "" if s.kind == "serial" else f"  # {s.kind}"
        self.emit(f"for {s.var.name} in range({self.e.visit(s.extent)}):{hint}")
        self.block(s.body)

    def visit_While(self, s: S.While) -> None:
        self.emit(f"while {self.e.visit(s.cond)}:")
        self.block(s.body)

    def visit_If(self, s: S.If) -> None:
        self.emit(f"if {self.e.visit(s.cond)}:")
        self.block(s.then)
        if s.orelse is not None:
            self.emit("else:")
            self.block(s.orelse)

    def visit_Declare(self, s: S.Declare) -> None:
        init = "" if s.init is None else f" = {self.e.visit(s.init)}"
        self.emit(f"{s.var.name}: {s.var.type.short}{init}")

    def visit_DeclareArray(self, s: S.DeclareArray) -> None:
        self.emit(f"{s.var.name} = {s.scope}_tensor({s.dtype.short}, {s.size})")

    def visit_Assign(self, s: S.Assign) -> None:
        self.emit(f"{s.var.name} = {self.e.visit(s.value)}")

    def visit_Store(self, s: S.Store) -> None:
        self.emit(f"{s.buf.name}[{self.e.visit(s.index)}] = {self.e.visit(s.value)}")

    def visit_Evaluate(self, s: S.Evaluate) -> None:
        self.emit(self.e.visit(s.expr))

    def visit_Break(self, s) -> None:
        self.emit("break")

    def visit_Continue(self, s) -> None:
        self.emit("continue")

    def visit_Return(self, s: S.Return) -> None:
        self.emit("return" if s.value is None else f"return {self.e.visit(s.value)}")

    def visit_Comment(self, s: S.Comment) -> None:
        self.emit(f"# {s.text}")


def stmt_str(s: S.Stmt) -> str:
    """A statement as text."""
    p = StmtPrinter()
    p.visit(s)
    return "\n".join(p.lines)


def function_str(f: Function) -> str:
    """A function as text: signature, attributes, body."""
    params = ", ".join(f"{p.name}: {p.type.short}" for p in f.params)
    ret = f" -> {f.ret.short}" if f.ret is not None else ""
    p = StmtPrinter()
    p.emit(f"def {f.name}({params}){ret}:  # {f.kind}")
    p.depth = 1
    for k, v in f.attrs.items():
        if v != getattr(LAUNCH_DEFAULTS, k):
            p.emit(f"attrs.{k} = {v!r}")
    p.visit(f.body)
    return "\n".join(p.lines)


def module_str(m: Module) -> str:
    """A module as text."""
    return "\n\n".join(function_str(f) for f in m.functions)


def compute_str(t: C.Compute) -> str:
    """A compute definition as one line: name[i0, i1] = body."""
    axes = ", ".join(a.name for a in t.axes)
    return f"{t.name}{shape_str(t.shape)}: [{axes}] -> {expr_str(t.body)}"


def value_str(v: G.Value) -> str:
    """A value with its type: %x: f32[4, s0]."""
    return f"%{v.name}: {v.dtype.short}{shape_str(v.shape)}"


def op_str(n: G.Op) -> str:
    """One operator as text (several lines for a fused group)."""
    outs = ", ".join(value_str(v) for v in n.outputs)
    ins = ", ".join(f"%{v.name}" for v in n.inputs)
    if isinstance(n, G.ComputeOp):
        return f"{outs} = {n.name}({ins})  {{ {compute_str(n.definition)} }}"
    if isinstance(n, G.ExternOp):
        why = f"  # extern: {n.reason}" if n.reason else "  # extern"
        if n.binds:
            why += "; binds " + ", ".join(name for name, _ in n.binds)
        return f"{outs} = {n.name}({ins}){why}"
    if isinstance(n, G.FusedOp):
        return _fused_str(n, outs, ins)
    if isinstance(n, G.KernelOp):
        return f"{outs} = {n.name}({ins})  # kernel {_launch_str(n)}"
    return f"{outs} = {type(n).__name__}({ins})"


def _launch_str(n: G.KernelOp) -> str:
    """A kernel launch's call: kernel(param=%value or scalar, ...)."""
    values = n.inputs + n.outputs
    args = []
    for p, a in zip(n.function.params, n.args):
        text = f"%{values[a.index].name}" if isinstance(a, G.ArgRef) else expr_str(a)
        args.append(f"{p.name}={text}")
    return f"{n.function.name}({', '.join(args)})"


def _fused_str(n: G.FusedOp, outs: str, ins: str) -> str:
    e = ExprPrinter()
    lines = [f"{outs} = {n.name}({ins})  # fused: {', '.join(n.members)}"]
    loops = ", ".join(f"{v.name}<{e.visit(_dim(x))}" for v, x in zip(n.outer_vars, n.outer_extents))
    lines.append(f"    for {loops or '()'}:")
    inner = ", ".join(f"{v.name}<{e.visit(_dim(x))}" for v, x in zip(n.inner_vars, n.inner_extents))
    for st in n.stages:
        if isinstance(st, G.ReduceStage):
            lines.append(f"        {st.var.name} = {st.kind} over {inner}: {e.visit(st.body)}")
        else:
            idx = ", ".join(e.visit(i) for i in st.indices)
            where = f"for {inner}: " if st.inner else ""
            lines.append(f"        {where}%{n.outputs[st.output].name}[{idx}] = {e.visit(st.body)}")
    return "\n".join(lines)


def graph_str(g: G.Graph) -> str:
    """A graph as text: inputs, one line per operator, outputs."""
    ins = ", ".join(value_str(v) if isinstance(v, G.Value) else f"{v.name}: i64" for v in g.inputs)
    lines = [f"graph({ins}):"]
    for n in g.nodes:
        lines.extend("    " + line for line in op_str(n).splitlines())
    outs = ", ".join("None" if o is None else repr(o) for o in g.outputs)
    lines.append(f"    return ({outs})")
    return "\n".join(lines)
