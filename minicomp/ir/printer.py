"""Human-readable text of every IR: expressions, statements, functions, computes and graphs.

Kernel IR (statements, functions, modules) prints as script DSL (minicomp.script), which the
script parser reads back into the same IR (tests/ir/test_round_trip.py); expressions alone
(`expr_str`, also graph IR) print in a shorter Python-like form.
"""

from __future__ import annotations

import math

from minicomp.ir import compute as C
from minicomp.ir import expr as E
from minicomp.ir import graph as G
from minicomp.ir import stmt as S
from minicomp.ir.func import LAUNCH_DEFAULTS, Function, Module
from minicomp.ir.functor import Functor
from minicomp.ir.types import DataType, PointerType, TensorMapType, boolean, f32, i32, i64

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


# ---- kernel IR as script DSL ----

# The launch-index intrinsics, by the script's spelling of each (threadIdx.x...).
_LAUNCH_INDEX = {
    f"{prefix}_{axis}": f"{name}.{axis}"
    for prefix, name in (
        ("thread_idx", "threadIdx"),
        ("block_idx", "blockIdx"),
        ("block_dim", "blockDim"),
        ("grid_dim", "gridDim"),
    )
    for axis in "xyz"
}
# Intrinsics whose script form names memory operands, by how their IR arguments group: "m" a
# buffer and an index (`t[i]`), "l" a Load (`t[i]`), "r" a whole register tensor, "i" a
# compile-time int, "e" a value.
_OPERANDS = {
    "load_vec": "rli",
    "store_vec": "mri",
    "is_aligned": "li",
    "mma_sync_m16n8k16": "mmmm",
    "mma_sync_m16n8k32": "mmmm",
    **{f"ldmatrix_x{n}{t}": "mm" for n in (1, 2, 4) for t in ("", "_trans")},
    **{f"cp_async_{n}": "mm" for n in (4, 8, 16)},
    "cp_async_wait": "i",
    # minicomp.script.hopper
    "mbarrier_init": "me",
    "mbarrier_arrive": "m",
    "mbarrier_arrive_expect_tx": "me",
    "mbarrier_try_wait_parity": "me",
    "mbarrier_wait": "me",
    "bulk_copy_g2s": "mmem",
    # minicomp.script.cluster
    "mbarrier_arrive_cluster": "me",
    "cluster_load": "me",
    "cluster_store": "mee",
    # minicomp.script.tma (tma_load and tma_store: _tma_call)
    "bulk_wait_group": "i",
    "bulk_wait_group_read": "i",
    # minicomp.script.wgmma
    "wgmma_mma_async": "mmmiiiiiieii",
    "wgmma_wait_group": "imi",
}
_ARRAY_FUNCTIONS = {"local": "register_tensor", "shared": "shared_tensor"}
_LOOP_FUNCTIONS = {"unroll": "unroll", "parallel": "parallel", "vectorize": "vectorize"}


def type_name(t) -> str:
    """A type as the script DSL spells it: f32, boolean, ptr(f16), tensor_map(f16, box=(64, 64),
    swizzle=128)."""
    if isinstance(t, TensorMapType):
        return f"tensor_map({type_name(t.elem)}, box={t.box!r}, swizzle={t.swizzle})"
    if isinstance(t, PointerType):
        return f"ptr({type_name(t.elem)})"
    return "boolean" if t.is_bool else t.short


def _default_type(value) -> DataType:
    """The type the script DSL gives a literal nothing else types."""
    if isinstance(value, bool):
        return boolean
    if isinstance(value, float):
        return f32
    return i32 if -(2**31) <= value < 2**31 else i64


class ScriptExprPrinter(ExprPrinter):
    """Renders kernel-IR expressions as script DSL that parses back to the same expression:
    a constant is a bare literal where the script would give one its type (beside an operand
    of that type, or its default type: i32, f32, bool), else a cast such as `i64(3)`;
    intrinsics take their script spellings (`threadIdx.x`, `cp_async(s[i], g[j], 16)`)."""

    def bare(self, e: E.Const) -> str:
        """A constant as a Python literal, without its type."""
        if e.dtype.is_bool:
            return str(bool(e.value))
        if e.dtype.is_float:
            v = e.value
            if math.isnan(v):
                return "math.nan"
            if math.isinf(v):
                return "math.inf" if v > 0 else "-math.inf"
            return repr(float(v))
        return str(e.value)

    def typed(self, e: E.Const) -> str:
        """A constant with its type spelled out: `i64(3)`, `f16(0.5)`, `boolean(True)`."""
        return f"{type_name(e.dtype)}({self.bare(e)})"

    def literal(self, e: E.Expr, like: DataType | None) -> str:
        """`e` where a bare literal would take the type `like`."""
        if isinstance(e, E.Const) and e.dtype == like:
            return self.bare(e)
        return self.visit(e)

    def index(self, e: E.Expr) -> str:
        """An element index (the script widens indices to i64)."""
        return self.literal(e, i64)

    def visit_Const(self, e: E.Const) -> str:
        return self.bare(e) if e.dtype == _default_type(e.value) else self.typed(e)

    def operands(self, a: E.Expr, b: E.Expr) -> tuple[str, str]:
        """Two operands of one operation, typed as the script types them together."""
        if isinstance(a, E.Const) and isinstance(b, E.Const):
            return self.typed(a), self.literal(b, a.dtype)
        if isinstance(a, E.Const):
            return self.literal(a, b.dtype), self.visit(b)
        return self.visit(a), self.literal(b, a.dtype)

    def visit_Binary(self, e: E.Binary) -> str:
        a, b = self.operands(e.a, e.b)
        if e.op not in _INFIX or _no_operator(e):
            return f"{e.op}({a}, {b})"
        p = _PREC[e.op]
        a, b = self._paren(e.a, a, p, False), self._paren(e.b, b, p, True)
        return f"{a} {_INFIX[e.op]} {b}"

    def _paren(self, e: E.Expr, text: str, p: int, right: bool) -> str:
        if isinstance(e, E.Binary) and e.op in _PREC:
            q = _PREC[e.op]
            if q < p or (right and q == p) or (q == p == _PREC["lt"]):
                return f"({text})"
        if isinstance(e, E.Select) or _is_not(e) and p >= _PREC["lt"]:
            return f"({text})"
        return text

    def visit_Cast(self, e: E.Cast) -> str:
        return f"{type_name(e.type)}({self.visit(e.a)})"

    def visit_Select(self, e: E.Select) -> str:
        if isinstance(e.a, E.Const) and not isinstance(e.b, E.Const):
            a, b = self.literal(e.a, e.b.dtype), self.visit(e.b)
        elif isinstance(e.b, E.Const) and not isinstance(e.a, E.Const):
            a, b = self.visit(e.a), self.literal(e.b, e.a.dtype)
        else:
            a, b = self.visit(e.a), self.visit(e.b)
        parts = [(e.a, a), (e.cond, self.visit(e.cond)), (e.b, b)]
        a, cond, b = (f"({t})" if isinstance(x, E.Select) else t for x, t in parts)
        return f"{a} if {cond} else {b}"

    def visit_Load(self, e: E.Load) -> str:
        return f"{e.buf.name}[{self.index(e.index)}]"

    def visit_Call(self, e: E.Call) -> str:
        if e.name in _LAUNCH_INDEX and not e.args:
            return _LAUNCH_INDEX[e.name]
        args = e.args
        if e.name in _OPERANDS and len(args) >= len(_OPERANDS[e.name]):
            return self._operand_call(e)
        if e.name in ("tma_load", "tma_store", "tma_load_multicast"):
            return self._tma_call(e)
        if e.name in ("shfl_down_sync", "shfl_xor_sync", "shfl_sync") and len(args) == 2:
            texts = [self.visit(args[0]), self.literal(args[1], i32)]
        elif e.name in ("atomic_add", "atomic_max") and len(args) == 3:
            texts = [f"{args[0].name}[{self.index(args[1])}]", self.literal(args[2], e.dtype)]
        elif len(args) == 2 and e.name in E.MATH_FUNCTIONS:
            texts = list(self.operands(args[0], args[1]))
        else:
            texts = [self.visit(a) for a in args]
        return f"{e.name}({', '.join(texts)})"

    def _tma_call(self, e: E.Call) -> str:
        """tma_load(dst[i], map, coordinates..., bar[j]), tma_store(map, coordinates..., src[i]);
        tma_load_multicast as tma_load(..., multicast=mask)."""
        args = list(e.args)
        texts = []
        mask = args.pop(-1) if e.name == "tma_load_multicast" else None
        if e.name != "tma_store":
            buf, index = args.pop(0), args.pop(0)
            texts.append(f"{buf.name}[{self.index(index)}]")
        buf, index = args.pop(-2), args.pop(-1)
        texts += [self.visit(a) for a in args]
        texts.append(f"{buf.name}[{self.index(index)}]")
        if mask is not None:
            texts.append(f"multicast={self.visit(mask)}")
            return f"tma_load({', '.join(texts)})"
        return f"{e.name}({', '.join(texts)})"

    def _operand_call(self, e: E.Call) -> str:
        spec, args = _OPERANDS[e.name], list(e.args)
        texts = []
        for kind in spec:
            if kind == "m":
                buf, index = args.pop(0), args.pop(0)
                texts.append(f"{buf.name}[{self.index(index)}]")
            else:
                a = args.pop(0)
                texts.append(
                    self.bare(a) if kind == "i" and isinstance(a, E.Const) else self.visit(a)
                )
        name = e.name
        if name.startswith("cp_async_") and name[len("cp_async_") :].isdigit():
            name, nbytes = "cp_async", name[len("cp_async_") :]
            texts.append(nbytes)
            texts += [self.literal(a, i32) for a in args]
            args = []
        texts += [self.visit(a) for a in args]
        return f"{name}({', '.join(texts)})"


def _no_operator(e: E.Binary) -> bool:
    """Whether the script's operator for `e.op` means another op on these operands: `/` is
    refused on integers (the IR's checked integer division), `&`, `|` and `^` on bools are
    the logical and, or and `!=`. Such a Binary prints as a call the parser refuses."""
    if e.op == "div":
        return not e.a.dtype.is_float
    return e.op in ("bitand", "bitor", "bitxor") and e.a.dtype.is_bool


def _is_not(e: E.Expr) -> bool:
    return isinstance(e, E.Unary) and e.op == "not"


class StmtPrinter(Functor):
    """Renders kernel-IR statements as script DSL (minicomp.script), indented: what
    minicomp.script.text.parse_function reads back into the same statements."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []
        self.depth = 0
        self.e = ScriptExprPrinter()
        self.ret: DataType | None = None  # the return type of the function printed

    def visit(self, n):
        # Statements are printed for their effect; identical ones may repeat.
        return self._dispatch(type(n))(self, n)

    def emit(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def block(self, s: S.Stmt) -> None:
        self.depth += 1
        if isinstance(s, S.Seq) and not s.body:
            self.emit("pass")
        else:
            self.visit(s)
        self.depth -= 1

    def visit_Seq(self, s: S.Seq) -> None:
        for x in s.body:
            self.visit(x)

    def visit_For(self, s: S.For) -> None:
        extent = self.e.visit(s.extent)
        loop = f"range({extent})"
        if s.kind != "serial":
            # parallel and vectorize loops (the cpu target's) are not script DSL: the parser
            # refuses these names.
            extra = ""
            if s.reductions:
                pairs = ", ".join(f"({op!r}, {v.name})" for op, v in s.reductions)
                extra = f", reductions=[{pairs}]"
            loop = f"{_LOOP_FUNCTIONS[s.kind]}({loop}{extra})"
        self.emit(f"for {s.var.name} in {loop}:")
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
        t = s.var.type
        init = "" if s.init is None else f" = {self.e.literal(s.init, t)}"
        self.emit(f"{s.var.name}: {type_name(t)}{init}")

    def visit_DeclareArray(self, s: S.DeclareArray) -> None:
        t = type_name(s.dtype)
        if s.scope == "dynamic":
            # Placed at the start of the dynamic shared memory, as the IR's array is.
            self.emit(f"{s.var.name} = dynamic_shared_tensor({t}, {s.size}, at=0)")
        else:
            function = _ARRAY_FUNCTIONS.get(s.scope, f"{s.scope}_tensor")
            self.emit(f"{s.var.name} = {function}({t}, {s.size})")

    def visit_Assign(self, s: S.Assign) -> None:
        self.emit(f"{s.var.name} = {self.e.literal(s.value, s.var.type)}")

    def visit_Store(self, s: S.Store) -> None:
        value = self.e.literal(s.value, s.buf.type.elem)
        self.emit(f"{s.buf.name}[{self.e.index(s.index)}] = {value}")

    def visit_Evaluate(self, s: S.Evaluate) -> None:
        self.emit(self.e.visit(s.expr))

    def visit_Break(self, s) -> None:
        self.emit("break")

    def visit_Continue(self, s) -> None:
        self.emit("continue")

    def visit_Return(self, s: S.Return) -> None:
        if s.value is None:
            self.emit("return")
        else:
            self.emit(f"return {self.e.literal(s.value, self.ret)}")

    def visit_Comment(self, s: S.Comment) -> None:
        self.emit(f"comment({s.text!r})")


def stmt_str(s: S.Stmt) -> str:
    """A statement as script DSL text."""
    p = StmtPrinter()
    p.visit(s)
    return "\n".join(p.lines)


def function_str(f: Function) -> str:
    """A function as script DSL text (minicomp.script): its signature, `attrs.<field> = ...`
    for every launch attribute not at its default, then its body. The script parser reads it
    back into the same function (minicomp.script.text.parse_function), but for what the DSL
    cannot say: the cpu target's loop kinds, and the few intrinsics it does not name."""
    params = ", ".join(f"{p.name}: {type_name(p.type)}" for p in f.params)
    ret = f" -> {type_name(f.ret)}" if f.ret is not None else ""
    p = StmtPrinter()
    p.ret = f.ret
    p.emit(f"def {f.name}({params}){ret}:  # {f.kind}")
    p.depth = 1
    for k, v in f.attrs.items():
        if v != getattr(LAUNCH_DEFAULTS, k):
            p.emit(f"attrs.{k} = {_attr_text(p.e, v)}")
    if isinstance(f.body, S.Seq) and not f.body.body:
        p.emit("pass")
    else:
        p.visit(f.body)
    return "\n".join(p.lines)


def _attr_text(e: ScriptExprPrinter, v) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_attr_text(e, d) for d in v) + ")"
    if isinstance(v, E.Expr):
        return e.visit(v)
    return repr(v)


def module_str(m: Module) -> str:
    """A module as script DSL text: its functions, callees first."""
    return "\n\n\n".join(function_str(f) for f in m.functions)


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
    for value, name in g.input_writes.items():
        lines.append(f"    # %{value} is written in the memory of input %{name}")
    outs = ", ".join("None" if o is None else repr(o) for o in g.outputs)
    lines.append(f"    return ({outs})")
    return "\n".join(lines)
