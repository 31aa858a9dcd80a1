"""The C-like renderer the C and CUDA backends share: kernel IR to C-style source text.

`CLikeRenderer` renders every expression and statement of the kernel IR and whole functions
and modules. A target subclasses it and overrides the hooks (methods documented as hooks
below): the header text, type names, literal spellings, function qualifiers, parameter and
variable declarations, array declarations (local or shared memory), loop pragmas and loop
collapsing, math function names, conversions of the narrow float types, and intrinsics such as
thread indices and barriers.

Conventions every target's header follows: helpers are named `mc_<op>_<short type>`
(`mc_max_f32`, `mc_floordiv_i64`, `mc_rsqrt_f64`, `mc_f32_to_f16`...), float16 and bfloat16
values are uint16_t bit patterns and the float8 formats' uint8_t ones (all of them computed in
float32, converted by `mc_<type>_to_f32` and `mc_f32_to_<type>`), and
`mc_isnan`/`mc_isinf`/`mc_signbit` give 0/1 for any float type. Integer divisions of tensor
data (`div`, `floordiv`, `mod`, `fmod`) never trap: they call helpers,
`mc_checked_<op>_<type>` with the kernel's error flag where the divisor may be zero
(ir/error_flag.py), `mc_<op>_<type>` otherwise. Intrinsic calls (names outside
MATH_FUNCTIONS that are no function of the module) render through `intrinsic_<name>` methods:
the base class maps `thread_idx_{x,y,z}`, `block_idx_*`, `block_dim_*`, `grid_dim_*` and
`syncthreads` onto the hooks `thread_index`, `block_index`, `block_dim`, `grid_dim` and
`barrier`, which a target without threads leaves raising.
"""

from __future__ import annotations

import contextlib
import math
import re
import struct
from collections.abc import Iterator

from minicomp.ir import c_names
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.error_flag import (
    ERROR_FLAG,
    division_operands,
    may_divide_by_zero,
    size_params,
)
from minicomp.ir.float8 import e4m3fn_saturates, float8_bits
from minicomp.ir.func import Function, Module
from minicomp.ir.functor import Functor, Visitor, collect
from minicomp.ir.types import DataType, PointerType, bf16, f8e4m3fn, f16, f32, is_narrow_float

# C operator precedence, higher binds tighter.
PREC_SELECT, PREC_OR, PREC_AND, PREC_BITOR, PREC_BITXOR, PREC_BITAND = 3, 4, 5, 6, 7, 8
PREC_EQ, PREC_REL, PREC_SHIFT, PREC_ADD, PREC_MUL, PREC_UNARY, PREC_ATOM = range(9, 16)

_INFIX = {
    "add": ("+", PREC_ADD),
    "sub": ("-", PREC_ADD),
    "mul": ("*", PREC_MUL),
    "div": ("/", PREC_MUL),
    "idiv": ("/", PREC_MUL),
    "imod": ("%", PREC_MUL),
    "shl": ("<<", PREC_SHIFT),
    "shr": (">>", PREC_SHIFT),
    "lt": ("<", PREC_REL),
    "le": ("<=", PREC_REL),
    "gt": (">", PREC_REL),
    "ge": (">=", PREC_REL),
    "eq": ("==", PREC_EQ),
    "ne": ("!=", PREC_EQ),
    "bitand": ("&", PREC_BITAND),
    "bitxor": ("^", PREC_BITXOR),
    "bitor": ("|", PREC_BITOR),
    "and": ("&&", PREC_AND),
    "or": ("||", PREC_OR),
}
# Operands of these get parentheses when they are other infix operations, for the reader
# (C's precedence between bitwise, shift and logical operators surprises people).
_GROUPED = ("shl", "shr", "bitand", "bitxor", "bitor", "and", "or")
_HELPER_OPS = ("max", "min", "floordiv", "mod")

_LAUNCH_INDEX = re.compile(r"(thread_idx|block_idx|block_dim|grid_dim)_([xyz])\Z")
_LAUNCH_HOOKS = {
    "thread_idx": "thread_index",
    "block_idx": "block_index",
    "block_dim": "block_dim",
    "grid_dim": "grid_dim",
}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def is_half(dt: DataType) -> bool:
    """Whether values of `dt` are stored as 16-bit patterns and computed in float32."""
    return dt == f16 or dt == bf16


def narrow_bits(value: float, dt: DataType) -> int:
    """The bit pattern of a Python float in a narrow float type (float16, bfloat16 or a float8
    format; round to nearest even), as the kernels store it."""
    if dt.nbytes == 1:
        return float8_bits(value, dt)
    if dt == f16:
        try:
            return struct.unpack("<H", struct.pack("<e", value))[0]
        except OverflowError:
            return 0xFC00 if value < 0 else 0x7C00
    if math.isnan(value):
        return 0x7FC0
    try:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
    except OverflowError:
        return 0xFF80 if value < 0 else 0x7F80
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def _f32_repr(value: float) -> str:
    """The shortest decimal text that reads back as the float32 nearest to `value`."""
    target = struct.pack("<f", value)
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        try:
            if struct.pack("<f", float(text)) == target:
                return text
        except OverflowError:  # a short decimal above FLT_MAX
            continue
    return f"{value:.9g}"


def _is_atom(text: str) -> bool:
    """Whether `text` is one primary expression: a name, a number, a call or a parenthesis."""
    if text.startswith("-"):
        return False
    if not text.startswith("("):
        return True
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return i == len(text) - 1
    return False


class _PointerWrites(Visitor):
    """Pointer variables a function may write through: stored to, or escaping as a value."""

    def __init__(self):
        super().__init__()
        self.written: set[E.Var] = set()

    def visit_Store(self, s: S.Store) -> None:
        self.written.add(s.buf)
        self.visit(s.index)
        self.visit(s.value)

    def visit_Load(self, e: E.Load) -> None:
        self.visit(e.index)

    def visit_Var(self, v: E.Var) -> None:
        if isinstance(v.type, PointerType):
            self.written.add(v)


class CLikeRenderer(Functor):
    """Renders kernel IR as C-like source; targets override the hooks.

    Expressions render through the memoised `visit` to (text, precedence) pairs; statements
    render to lists of unindented lines through `stmt`, which is not memoised because a
    loop's rendering may depend on the loops around it.
    """

    indent_unit = "    "
    restrict = "__restrict__"
    # Hook: names the target predefines (beyond C's), which variables and functions avoid.
    reserved_names: frozenset[str] = frozenset()

    def __init__(self):
        super().__init__()
        self._functions: dict[str, Function] = {}
        self._names: dict[E.Var, str] = {}
        self._taken: set[str] = set()
        self._error_flag: E.Var | None = None
        self._sizes: set[E.Var] = set()

    # ---- hooks: text a target defines ----

    def header(self) -> str:
        """Hook: the text placed before the functions (includes and helpers)."""
        return ""

    def type_name(self, t: DataType | PointerType) -> str:
        """Hook: the C spelling of a scalar or pointer type."""
        if isinstance(t, PointerType):
            return f"{self.type_name(t.elem)}*"
        return c_names.C_TYPES[t.short]

    def literal(self, c: E.Const) -> str:
        """Hook: the spelling of a constant (a negative one is treated as a unary minus)."""
        t = c.dtype
        if t.is_bool:
            return "1" if c.value else "0"
        if is_narrow_float(t):
            return f"0x{narrow_bits(float(c.value), t):0{2 * t.nbytes}x}"
        if t.is_float:
            return self.float_literal(float(c.value), t)
        return self.int_literal(int(c.value), t)

    def int_literal(self, v: int, t: DataType) -> str:
        """Hook: an integer constant of type `t`; 64-bit ones carry a suffix."""
        bits = 8 * t.nbytes
        lo, hi = (0, 2**bits - 1) if t.kind == "uint" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        if not lo <= v <= hi:
            raise ValueError(f"constant {v} does not fit {t}")
        suffix = c_names.INT_SUFFIX.get(t.short, "")
        if v == lo and t.kind == "int" and bits >= 32:
            # The negation of 2**63 would overflow before the minus applies.
            return f"({v + 1}{suffix} - 1)"
        return f"{v}{suffix}"

    def float_literal(self, v: float, t: DataType) -> str:
        """Hook: a float32 or float64 constant; inf and nan spelled with math.h's macros."""
        single = t == f32
        if math.isnan(v) or math.isinf(v):
            name = "NAN" if math.isnan(v) else "INFINITY"
            text = name if single else f"(double){name}"
            return "-" + text if v < 0 else text
        if single:
            try:
                text = _f32_repr(v)
            except OverflowError:
                return "INFINITY" if v > 0 else "-INFINITY"
        else:
            text = repr(v)
        if not any(ch in text for ch in ".en"):
            text += ".0"
        return text + "f" if single else text

    def function_qualifier(self, f: Function) -> str:
        """Hook: what precedes a function's return type."""
        return "static inline" if f.kind == "device" else ""

    def param_decl(self, v: E.Var, written: bool) -> str:
        """Hook: one parameter; pointers never written through are const."""
        name = self.name_of(v)
        if isinstance(v.type, PointerType):
            const = "" if written else "const "
            return f"{const}{self.type_name(v.type.elem)}* {self.restrict} {name}"
        return f"{self.type_name(v.type)} {name}"

    def var_decl(self, v: E.Var, init: str | None) -> str:
        """Hook: the declaration of a scalar local (or a pointer local), with its `;`."""
        text = f"{self.type_name(v.type)} {self.name_of(v)}"
        return f"{text} = {init};" if init is not None else f"{text};"

    def array_decl(self, s: S.DeclareArray) -> str:
        """Hook: a local or shared array; a target without shared memory makes both local."""
        return f"{self.type_name(s.dtype)} {self.name_of(s.var)}[{s.size}];"

    def for_header(self, loop: S.For) -> str:
        """Hook: the `for (...)` line of a loop, without its brace."""
        i = self.name_of(loop.var)
        extent = self.expr(loop.extent)
        return f"for ({self.type_name(loop.var.dtype)} {i} = 0; {i} < {extent}; ++{i})"

    def loop_pragmas(self, loops: list[S.For]) -> list[str]:
        """Hook: pragma lines before a loop nest (`loops`, outermost first, as collapsed)."""
        return []

    def collapse_loops(self, loop: S.For) -> list[S.For]:
        """Hook: the perfectly nested loops, starting at `loop`, rendered under one pragma."""
        return [loop]

    @contextlib.contextmanager
    def loop_scope(self, loops: list[S.For]) -> Iterator[None]:
        """Hook: a context held while the body of a loop nest renders."""
        yield

    def math_function_name(self, name: str, dt: DataType) -> str:
        """Hook: the function computing math function `name` on float32 or float64."""
        if name in c_names.HEADER_MATH:
            return f"mc_{name}_{dt.short}"
        if name in c_names.PREDICATES:
            return f"mc_{name}"
        base = c_names.LIBM[name]
        return base + "f" if dt == f32 else base

    def helper_name(self, op: str, dt: DataType) -> str:
        """Hook: the header helper for a binary op (max, min, floordiv, mod, pow, and on
        integers div, fmod and their checked_ versions) or abs."""
        return f"mc_{op}_{dt.short}"

    def half_conversion(self, src: DataType, dst: DataType) -> str:
        """Hook: the function converting between a narrow float type and float32 (to e4m3fn:
        the installed PyTorch's overflow, ir/float8.py)."""
        if dst == f8e4m3fn and not e4m3fn_saturates():
            return "mc_f32_to_f8e4m3fn_nonsat"
        return f"mc_{src.short}_to_{dst.short}"

    def comment(self, text: str) -> list[str]:
        """Hook: comment lines (a line ending in a backslash would swallow the next)."""
        return [f"// {line}".rstrip().rstrip("\\") for line in text.splitlines() or [""]]

    def thread_index(self, axis: str) -> str:
        """Hook: the thread index inside a block along `axis` (x, y or z)."""
        raise NotImplementedError(f"{type(self).__name__} has no thread indices")

    def block_index(self, axis: str) -> str:
        """Hook: the block index along `axis`."""
        raise NotImplementedError(f"{type(self).__name__} has no block indices")

    def block_dim(self, axis: str) -> str:
        """Hook: the number of threads of a block along `axis`."""
        raise NotImplementedError(f"{type(self).__name__} has no blocks")

    def grid_dim(self, axis: str) -> str:
        """Hook: the number of blocks along `axis`."""
        raise NotImplementedError(f"{type(self).__name__} has no grid")

    def barrier(self) -> str:
        """Hook: a barrier across the threads of a block."""
        raise NotImplementedError(f"{type(self).__name__} has no barriers")

    # ---- names ----

    def name_of(self, v: E.Var) -> str:
        """The C identifier of a variable, fixed on first use within a function.

        Names are kept when they are valid identifiers free of reserved words; otherwise they
        are mangled, and distinct variables sharing a name get numeric suffixes.
        """
        name = self._names.get(v)
        if name is None:
            name = base = _sanitize(v.name)
            if base in self.reserved_names:
                name = base = base + "_"
            k = 1
            while name in self._taken:
                name = f"{base}_{k}"
                k += 1
            self._names[v] = name
            self._taken.add(name)
        return name

    # ---- expressions ----

    def expr(self, e: E.Expr) -> str:
        """The text of an expression."""
        return self.visit(e)[0]

    def operand(self, e: E.Expr, min_prec: int) -> str:
        """The text of `e`, parenthesised when it binds less tightly than `min_prec`."""
        text, prec = self.visit(e)
        return f"({text})" if prec < min_prec else text

    def _call(self, fn: str, *args: E.Expr) -> tuple[str, int]:
        return f"{fn}({', '.join(self.expr(a) for a in args)})", PREC_ATOM

    def _narrow(self, text: str, prec: int, dt: DataType) -> tuple[str, int]:
        # C computes on types narrower than int in int: convert back to wrap like PyTorch.
        if dt.nbytes < 4 or dt.is_bool:
            return f"({self.type_name(dt)})({text})", PREC_UNARY
        return text, prec

    def visit_Const(self, e: E.Const) -> tuple[str, int]:
        text = self.literal(e)
        return text, PREC_ATOM if _is_atom(text) else PREC_UNARY

    def visit_Var(self, e: E.Var) -> tuple[str, int]:
        return self.name_of(e), PREC_ATOM

    def visit_Load(self, e: E.Load) -> tuple[str, int]:
        return f"{self.name_of(e.buf)}[{self.expr(e.index)}]", PREC_ATOM

    def visit_Select(self, e: E.Select) -> tuple[str, int]:
        c = self.operand(e.cond, PREC_SELECT + 1)
        a = self.operand(e.a, PREC_SELECT + 1)
        b = self.operand(e.b, PREC_SELECT)
        return f"{c} ? {a} : {b}", PREC_SELECT

    def visit_Binary(self, e: E.Binary) -> tuple[str, int]:
        dt, op = e.a.dtype, e.op
        if is_narrow_float(dt):
            return self.visit(_widen_binary(e))
        if division_operands(e) is not None:
            return self._int_division(e)
        if op in _HELPER_OPS or op == "pow" and not dt.is_float:
            return self._call(self.helper_name(op, dt), e.a, e.b)
        if op == "pow":
            return self._call("powf" if dt == f32 else "pow", e.a, e.b)
        if dt.is_float and op in ("idiv", "imod"):
            fn = ("trunc" if op == "idiv" else "fmod") + ("f" if dt == f32 else "")
            if op == "idiv":
                return self._call(fn, E.Binary("div", e.a, e.b))
            return self._call(fn, e.a, e.b)
        sym, p = _INFIX[op]
        if op in _GROUPED:
            # Shifts do not associate: their right operand never drops its parentheses.
            a = self._grouped_operand(e.a, p, True)
            b = self._grouped_operand(e.b, p, op not in ("shl", "shr"))
        else:
            a, b = self.operand(e.a, p), self.operand(e.b, p + 1)
        text = f"{a} {sym} {b}"
        if op in E.COMPARE_OPS or op in E.LOGIC_OPS:
            return text, p
        return self._narrow(text, p, e.dtype)

    def _int_division(self, e: E.Expr) -> tuple[str, int]:
        """An integer division of tensor data (ir/error_flag.py) through its header
        helper, which never traps: the checked one, reporting a zero divisor to the kernel's
        error flag, when the divisor may be zero and the function has the flag."""
        a, b = division_operands(e)
        op = "fmod" if isinstance(e, E.Call) else e.op
        if self._error_flag is None or not may_divide_by_zero(e, self._sizes):
            return self._call(self.helper_name(op, a.dtype), a, b)
        flag = self.name_of(self._error_flag)
        fn = self.helper_name(f"checked_{op}", a.dtype)
        return f"{fn}({self.expr(a)}, {self.expr(b)}, {flag})", PREC_ATOM

    def _grouped_operand(self, e: E.Expr, p: int, chain: bool) -> str:
        """An operand of a bitwise, shift or logical operator of precedence `p`: bare when
        unary or primary, or when `chain` allows an operation of precedence `p` (a & b & c)."""
        text, prec = self.visit(e)
        return text if prec >= PREC_UNARY or chain and prec == p else f"({text})"

    def visit_Unary(self, e: E.Unary) -> tuple[str, int]:
        dt = e.a.dtype
        if is_narrow_float(dt):
            return self.visit(E.Cast(E.Unary(e.op, E.Cast(e.a, f32)), dt))
        if e.op == "not" or dt.is_bool:
            return "!" + self.operand(e.a, PREC_UNARY), PREC_UNARY
        sym = "-" if e.op == "neg" else "~"
        inner = self.operand(e.a, PREC_UNARY)
        if inner.startswith(("-", "~")):
            inner = f"({inner})"
        return self._narrow(sym + inner, PREC_UNARY, dt)

    def visit_Cast(self, e: E.Cast) -> tuple[str, int]:
        src, dst = e.a.dtype, e.type
        if src == dst:
            return self.visit(e.a)
        if is_narrow_float(src):
            wide = f"{self.half_conversion(src, f32)}({self.expr(e.a)})"
            if dst == f32:
                return wide, PREC_ATOM
            if dst.is_bool:
                return f"{wide} != 0", PREC_EQ
            if is_narrow_float(dst):
                return f"{self.half_conversion(f32, dst)}({wide})", PREC_ATOM
            return f"({self.type_name(dst)}){wide}", PREC_UNARY
        if dst.is_bool:
            return f"{self.operand(e.a, PREC_EQ + 1)} != 0", PREC_EQ
        if is_narrow_float(dst):
            # Through float32 from any type (float64 rounding twice), as PyTorch converts.
            arg = e.a if src == f32 else E.Cast(e.a, f32)
            return f"{self.half_conversion(f32, dst)}({self.expr(arg)})", PREC_ATOM
        return f"({self.type_name(dst)}){self.operand(e.a, PREC_UNARY)}", PREC_UNARY

    def visit_Call(self, e: E.Call) -> tuple[str, int]:
        if e.name in E.MATH_FUNCTIONS:
            return self.render_call(e), PREC_ATOM
        if e.name in self._functions:
            return self._call(e.name, *e.args)
        return self.render_intrinsic(e), PREC_ATOM

    def render_call(self, e: E.Call) -> str:
        """Hook: a math function call, its C function chosen by the computing type."""
        if len(e.args) != E.MATH_FUNCTIONS[e.name]:
            raise ValueError(f"{e.name} takes {E.MATH_FUNCTIONS[e.name]} arguments: {e}")
        if e.name in c_names.PREDICATES:
            return self._predicate(e)
        dt = e.dtype
        if is_narrow_float(dt):
            inner = E.Call(e.name, tuple(E.cast(a, f32) for a in e.args), f32)
            return self.expr(E.Cast(inner, dt))
        args = tuple(E.cast(a, dt) for a in e.args)
        if not dt.is_float:
            if e.name == "fmod":
                return self._int_division(E.Call(e.name, args, dt))[0]
            if e.name == "abs":
                return self._call(self.helper_name("abs", dt), *args)[0]
            if e.name in c_names.INTEGRAL_IDENTITY:
                return self.operand(args[0], PREC_ATOM)
            raise ValueError(f"{e.name} is not defined on {dt}: {e}")
        return self._call(self.math_function_name(e.name, dt), *args)[0]

    def _predicate(self, e: E.Call) -> str:
        (a,) = e.args
        if e.name == "signbit":
            # A narrow float's sign is the top bit of its pattern, which a conversion to a wider
            # float keeps (NaN's too); GCC 12 crashes vectorising it read from the float.
            half = a.a if isinstance(a, E.Cast) and a.dtype.is_float else a
            if is_narrow_float(half.dtype):
                top = 8 * half.dtype.nbytes - 1
                return f"({self.operand(half, PREC_SHIFT + 1)} >> {top})"
        if a.dtype.is_float:
            arg = E.cast(a, f32) if is_narrow_float(a.dtype) else a
            return self._call(self.math_function_name(e.name, arg.dtype), arg)[0]
        if e.name == "signbit" and a.dtype.kind == "int":
            return f"({self.operand(a, PREC_REL + 1)} < 0)"
        return "0"

    def render_intrinsic(self, e: E.Call) -> str:
        """Hook: a call of a backend intrinsic, through the method `intrinsic_<name>`."""
        launch = _LAUNCH_INDEX.match(e.name)
        if launch is not None:
            return getattr(self, _LAUNCH_HOOKS[launch[1]])(launch[2])
        method = getattr(self, f"intrinsic_{e.name}", None)
        if method is None:
            raise ValueError(f"{type(self).__name__} does not know the function {e.name!r}")
        return method(e)

    def intrinsic_syncthreads(self, e: E.Call) -> str:
        return self.barrier()

    def intrinsic_checked_index(self, e: E.Call) -> str:
        """An index read from a tensor, range-checked (ir/error_flag.py); without the flag
        (a function that does not take it) it is only kept in bounds."""
        flag = "0" if self._error_flag is None else self.name_of(self._error_flag)
        args = ", ".join(self.expr(a) for a in e.args)
        return f"mc_checked_index({args}, {flag})"

    # ---- statements ----

    def stmt(self, s: S.Stmt) -> list[str]:
        """The lines of a statement, unindented."""
        return self._dispatch(type(s))(self, s)

    def block(self, s: S.Stmt) -> list[str]:
        """The lines of a statement, indented one level (a block's body)."""
        return [self.indent_unit + line if line else line for line in self.stmt(s)]

    def visit_Seq(self, s: S.Seq) -> list[str]:
        return [line for st in s.body for line in self.stmt(st)]

    def visit_For(self, s: S.For) -> list[str]:
        loops = self.collapse_loops(s)
        lines = list(self.loop_pragmas(loops))
        with self.loop_scope(loops):
            lines += self._loop_nest(loops)
        return lines

    def _loop_nest(self, loops: list[S.For]) -> list[str]:
        inner = self._loop_nest(loops[1:]) if len(loops) > 1 else self.stmt(loops[0].body)
        body = [self.indent_unit + line if line else line for line in inner]
        return [self.for_header(loops[0]) + " {", *body, "}"]

    def visit_While(self, s: S.While) -> list[str]:
        return [f"while ({self.expr(s.cond)}) {{", *self.block(s.body), "}"]

    def visit_If(self, s: S.If) -> list[str]:
        lines = [f"if ({self.expr(s.cond)}) {{", *self.block(s.then)]
        orelse = s.orelse
        while isinstance(orelse, S.If):
            lines += [f"}} else if ({self.expr(orelse.cond)}) {{", *self.block(orelse.then)]
            orelse = orelse.orelse
        if orelse is not None:
            lines += ["} else {", *self.block(orelse)]
        return lines + ["}"]

    def visit_Declare(self, s: S.Declare) -> list[str]:
        init = None if s.init is None else self.expr(s.init)
        return [self.var_decl(s.var, init)]

    def visit_DeclareArray(self, s: S.DeclareArray) -> list[str]:
        return [self.array_decl(s)]

    def visit_Assign(self, s: S.Assign) -> list[str]:
        return [f"{self.name_of(s.var)} = {self.expr(s.value)};"]

    def visit_Store(self, s: S.Store) -> list[str]:
        return [f"{self.name_of(s.buf)}[{self.expr(s.index)}] = {self.expr(s.value)};"]

    def visit_Evaluate(self, s: S.Evaluate) -> list[str]:
        return [f"{self.expr(s.expr)};"]

    def visit_Break(self, s: S.Break) -> list[str]:
        return ["break;"]

    def visit_Continue(self, s: S.Continue) -> list[str]:
        return ["continue;"]

    def visit_Return(self, s: S.Return) -> list[str]:
        return ["return;" if s.value is None else f"return {self.expr(s.value)};"]

    def visit_Comment(self, s: S.Comment) -> list[str]:
        return self.comment(s.text)

    # ---- functions and modules ----

    def begin_function(self, f: Function) -> None:
        """Forget the names and memoised texts of the previous function."""
        self.memo = {}
        self._names = {}
        self._taken = set(self._functions)
        self._error_flag = ERROR_FLAG if ERROR_FLAG in f.params else None
        self._sizes = size_params(f)

    def signature(self, f: Function) -> str:
        """The function's head, up to its closing parenthesis."""
        written = _PointerWrites()
        written.visit(f.body)
        params = ", ".join(self.param_decl(p, p in written.written) for p in f.params)
        ret = self.type_name(f.ret) if f.ret is not None else "void"
        qualifier = self.function_qualifier(f)
        head = f"{ret} {f.name}({params or 'void'})"
        return f"{qualifier} {head}" if qualifier else head

    def render_function(self, f: Function) -> str:
        """The definition of one function."""
        self.begin_function(f)
        head = self.signature(f)
        return "\n".join([head + " {", *self.block(f.body), "}"])

    def render_prototype(self, f: Function) -> str:
        """The declaration of one function."""
        self.begin_function(f)
        return self.signature(f) + ";"

    def module_preamble(self, module: Module) -> str:
        """Hook: the first lines of a module's source."""
        return f"// minicomp module {module.name}: generated code, do not edit"

    def render_module(self, module: Module) -> str:
        """The whole source of a module: preamble, header, prototypes, then the functions."""
        self._functions = {}
        for f in module.functions:
            reserved = f.name in c_names.RESERVED or f.name in self.reserved_names
            if not _IDENT.match(f.name) or reserved or f.name.startswith("mc_"):
                raise ValueError(f"function name {f.name!r} is not usable as a C identifier")
            if f.name in self._functions:
                raise ValueError(f"two functions are called {f.name!r}")
            self._functions[f.name] = f
        parts = [self.module_preamble(module), self.header()]
        prototypes = [self.render_prototype(f) for f in module.functions if f.kind == "device"]
        if prototypes:
            parts.append("\n".join(prototypes))
        parts += [self.render_function(f) for f in module.functions]
        return "\n\n".join(p.strip("\n") for p in parts if p) + "\n"


def _widen_binary(e: E.Binary) -> E.Expr:
    """A narrow float operation recomputed in float32 (and converted back unless boolean)."""
    a, b = E.Cast(e.a, f32), E.Cast(e.b, f32)
    if e.op in E.COMPARE_OPS or e.op in E.LOGIC_OPS:
        return E.Binary(e.op, a, b)
    return E.Cast(E.Binary(e.op, a, b), e.a.dtype)


def _sanitize(name: str) -> str:
    text = re.sub(r"[^A-Za-z0-9_]", "_", name) or "v"
    if text[0].isdigit() or text.startswith(("mc_", "MC_", "__")) or re.match(r"_[A-Z]", text):
        text = "v_" + text.lstrip("_")
    if text in c_names.RESERVED:
        text += "_"
    return text


def uses_any(e: E.Expr, variables: set[E.Var]) -> bool:
    """Whether expression `e` mentions one of `variables`."""
    return any(v in variables for v in collect(e, E.Var))
