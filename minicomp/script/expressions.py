"""Expressions of scripts: names, constants, operators, subscripts, attributes and calls.

An expression evaluates to a compile-time Python value (a number, a tuple, a type, a
primitive, a script function, a task mapping...), a kernel-IR expression, a TensorRef, or
an Effect (a call with no value). Operators on compile-time numbers fold at compile time.
"""

from __future__ import annotations

import ast
import types as pytypes

from minicomp.ir import expr as E
from minicomp.ir.expr import Expr
from minicomp.ir.types import DataType, i32
from minicomp.script import conversions as C
from minicomp.script import lang
from minicomp.script.errors import Issue, ScriptError, Source
from minicomp.script.mapping import TaskMapping, repeat, spatial
from minicomp.script.tma import TensorMapRef
from minicomp.script.types import PointerType, ScalarType, TensorType, ptr
from minicomp.script.values import Effect, TensorRef, as_index

# ast class name -> what an error message calls it.
CONSTRUCTS = {
    "With": "a `with` statement",
    "AsyncWith": "an `async with` statement",
    "Try": "a `try` statement",
    "TryStar": "a `try` statement",
    "Raise": "a `raise` statement",
    "Assert": "an `assert` statement",
    "Import": "an `import` statement",
    "ImportFrom": "an `import` statement",
    "Global": "a `global` declaration",
    "Nonlocal": "a `nonlocal` declaration",
    "Delete": "a `del` statement",
    "ClassDef": "a class definition",
    "FunctionDef": "a nested function definition",
    "AsyncFunctionDef": "a nested function definition",
    "AsyncFor": "an `async for` loop",
    "Match": "a `match` statement",
    "Lambda": "a lambda",
    "ListComp": "a list comprehension",
    "SetComp": "a set comprehension",
    "DictComp": "a dict comprehension",
    "GeneratorExp": "a generator expression",
    "Await": "an `await` expression",
    "Yield": "a `yield` expression",
    "YieldFrom": "a `yield from` expression",
    "JoinedStr": "an f-string",
    "NamedExpr": "an assignment expression (:=)",
    "Starred": "a starred expression",
    "Dict": "a dict display",
    "Set": "a set display",
    "Slice": "a slice",
}

# Compile-time values a script may take from its scope (besides numbers and tuples of them).
_SCOPE_TYPES = (
    ScalarType,
    TensorType,
    PointerType,
    lang.Primitive,
    lang.Macro,
    lang.LaunchIndex,
    lang.Attrs,
    lang.Dims,
    TaskMapping,
    pytypes.ModuleType,
    str,
    type(None),
)
# Python functions a script may call with compile-time arguments.
_COMPILE_TIME_CALLS = (spatial, repeat, ptr)


def scope_value(fn, name: str):
    """The value of `name` in the closure, then the globals, then the builtins of `fn`."""
    code = fn.__code__
    if name in code.co_freevars:
        cell = fn.__closure__[code.co_freevars.index(name)]
        try:
            return cell.cell_contents
        except ValueError:
            raise Issue(f"{name!r} is not assigned yet in the enclosing function") from None
    if name in fn.__globals__:
        return fn.__globals__[name]
    if name in lang.BUILTINS:
        return lang.BUILTINS[name]
    raise Issue(f"undefined name {name!r}")


def check_scope_value(name: str, value):
    """`value` when a script may use it as a compile-time value, else an Issue."""
    if isinstance(value, (bool, int, float, lang.ScriptFunctionBase, *_SCOPE_TYPES)):
        return value
    if isinstance(value, TensorRef | TensorMapRef):
        return value  # a kernel's buffer or tensor map, passed to a fragment (a template's)
    if isinstance(value, Expr) and not isinstance(value, E.Var):
        return value  # runtime values a template's instantiation gives (sizes)
    if isinstance(value, E.Var) and not isinstance(value.type, DataType):
        raise Issue(f"{name!r} is a pointer variable; wrap it in a TensorRef to index it")
    if isinstance(value, E.Var):
        return value
    if isinstance(value, DataType):
        return ScalarType(value)
    if any(value is f for f in (*lang.BUILTINS.values(), *_COMPILE_TIME_CALLS)):
        return value
    if isinstance(value, tuple | list):
        return tuple(check_scope_value(name, v) for v in value)
    raise Issue(
        f"{name!r} is a {type(value).__name__}; a script can use ints, floats, bools, tuples, "
        "script functions, task mappings, macros, IR expressions and minicomp.script "
        "primitives from its scope"
    )


class ExprParser(ast.NodeVisitor):
    """Evaluates expressions; the host class supplies `lookup(name)` and handles calls."""

    src: Source

    def lookup(self, name: str):
        raise NotImplementedError

    def call(self, node: ast.Call):
        raise NotImplementedError

    # ---- error handling ----

    def visit(self, node: ast.AST):
        try:
            return super().visit(node)
        except ScriptError:
            raise
        except Issue as e:
            raise self.src.error(node, str(e)) from None
        except (ValueError, TypeError) as e:
            # A construction the IR refused (a constant that does not fit, a bad operand...).
            raise self.src.error(node, f"{type(e).__name__}: {e}") from e

    def generic_visit(self, node: ast.AST):
        name = type(node).__name__
        what = CONSTRUCTS.get(name, f"the construct {name}")
        raise Issue(f"unsupported syntax: {what} is not part of the script language")

    # ---- helpers ----

    def value(self, node: ast.AST):
        """The value of an expression, which must not be an Effect."""
        v = self.visit(node)
        if isinstance(v, Effect):
            raise self.src.error(node, f"{v.what} returns nothing; it has no value to use")
        return v

    def scalar(self, node: ast.AST, like=None) -> Expr:
        """A scalar value as an IR expression (literals typed `like` when given)."""
        return C.to_expr(self.value(node), like)

    def constant(self, node: ast.AST, what: str):
        """A compile-time value (not an IR expression)."""
        v = self.value(node)
        if isinstance(v, Expr | TensorRef):
            reason = f"{what} must be a compile-time constant, not {C.describe(v)}"
            raise self.src.error(node, reason)
        return v

    def compile_time_int(self, node: ast.AST, what: str) -> int:
        v = self.constant(node, what)
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.src.error(node, f"{what} must be a compile-time int, not {v!r}")
        return v

    # ---- leaves ----

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, bool | int | float | str) or node.value is None:
            return node.value
        if node.value is Ellipsis:
            return Ellipsis
        raise Issue(f"the constant {node.value!r} ({type(node.value).__name__}) is not supported")

    def visit_Name(self, node: ast.Name):
        return self.lookup(node.id)

    def visit_Tuple(self, node: ast.Tuple):
        return tuple(self.value(e) for e in node.elts)

    visit_List = visit_Tuple

    def visit_Attribute(self, node: ast.Attribute):
        base = self.value(node.value)
        attr = node.attr
        if isinstance(base, lang.Dims):
            return getattr(base, attr)
        if isinstance(base, lang.LaunchIndex):
            if attr not in ("x", "y", "z"):
                raise Issue(f"{base.name} has the fields x, y and z, not {attr!r}")
            return E.Call(f"{base.intrinsic}_{attr}", (), i32)
        if isinstance(base, TensorRef):
            if attr == "shape":
                return base.shape
            if attr == "dtype":
                return ScalarType(base.dtype)
            raise Issue(f"a tensor has the attributes shape and dtype, not {attr!r}")
        if isinstance(base, Expr):
            raise Issue(f"a {base.dtype} value has no attribute {attr!r}")
        if isinstance(base, lang.Attrs):
            raise Issue("attrs can only be assigned (attrs.grid_dim = ...), not read")
        if isinstance(base, TaskMapping):
            if attr in ("num_workers", "task_shape"):
                return getattr(base, attr)
            if attr == "on":
                raise Issue("a task mapping's .on(worker) can only be iterated by a for loop")
        if not isinstance(base, pytypes.ModuleType):
            raise Issue(f"cannot read the attribute {attr!r} of {C.describe(base)} in a script")
        try:
            found = getattr(base, attr)
        except AttributeError:
            raise Issue(f"module {base.__name__} has no attribute {attr!r}") from None
        return check_scope_value(f"{base.__name__}.{attr}", found)

    def visit_Subscript(self, node: ast.Subscript):
        base = self.value(node.value)
        index = node.slice
        items = index.elts if isinstance(index, ast.Tuple) else [index]
        if any(isinstance(i, ast.Slice) for i in items):
            raise Issue("slices are not supported; index every dimension")
        values = tuple(self.value(i) for i in items)
        if isinstance(base, TensorRef):
            flat, rest = base.index(values)
            if rest:
                return TensorRef(f"{base.name}[...]", base.var, rest, flat)
            return E.Load(base.var, as_index(flat))
        if isinstance(base, ScalarType):
            return TensorType(base, values)
        if isinstance(base, tuple):
            if len(values) != 1 or not isinstance(values[0], int):
                raise Issue("a tuple is indexed with one compile-time int")
            try:
                return base[values[0]]
            except IndexError:
                n = len(base)
                raise Issue(f"index {values[0]} is out of range for a tuple of {n}") from None
        raise Issue(f"{C.describe(base)} cannot be indexed")

    # ---- operators ----

    def visit_BinOp(self, node: ast.BinOp):
        a, b = self.value(node.left), self.value(node.right)
        op = type(node.op).__name__
        if op == "MatMult":
            raise Issue("unsupported syntax: the operator @")
        if isinstance(a, tuple) and isinstance(b, tuple) and op == "Add":
            return a + b
        if isinstance(a, TaskMapping) and isinstance(b, TaskMapping) and op == "Mult":
            return a * b
        for v in (a, b):
            if not C.is_number(v) and not isinstance(v, Expr):
                raise Issue(f"{C.describe(v)} cannot be an operand of {_symbol(op)}")
        return C.binop(C.op_name(op), a, b)

    def visit_UnaryOp(self, node: ast.UnaryOp):
        op = {"USub": "neg", "UAdd": "pos", "Not": "not", "Invert": "invert"}
        return C.unop(op[type(node.op).__name__], self.value(node.operand))

    def visit_BoolOp(self, node: ast.BoolOp):
        is_and = isinstance(node.op, ast.And)
        parts = []
        for operand in node.values:
            v = C.truth(self.value(operand), "an operand of and/or")
            if isinstance(v, bool):
                # A compile-time operand decides the result, or drops out.
                if v != is_and:
                    return v
                continue
            parts.append(v)
        if not parts:
            return is_and
        out = parts[0]
        for p in parts[1:]:
            out = E.binary("and" if is_and else "or", out, p)
        return out

    def visit_Compare(self, node: ast.Compare):
        left = self.value(node.left)
        result = True
        for op, right_node in zip(node.ops, node.comparators):
            right = self.value(right_node)
            name = type(op).__name__
            if name in ("Is", "IsNot", "In", "NotIn"):
                raise Issue(f"unsupported syntax: the comparison {name}")
            if isinstance(left, str | tuple) or isinstance(right, str | tuple):
                if not isinstance(left, Expr) and not isinstance(right, Expr):
                    if name not in ("Eq", "NotEq"):
                        raise Issue("only == and != compare compile-time strings and tuples")
                    step = (left == right) == (name == "Eq")
                else:
                    raise Issue(f"cannot compare {C.describe(left)} with {C.describe(right)}")
            else:
                step = C.binop(C.op_name(name), left, right)
            if isinstance(step, bool):
                if not step:
                    return False
            else:
                result = step if result is True else E.binary("and", result, step)
            left = right
        return result

    def visit_IfExp(self, node: ast.IfExp):
        cond = C.truth(self.value(node.test))
        if isinstance(cond, bool):
            return self.value(node.body if cond else node.orelse)
        a, b = self.value(node.body), self.value(node.orelse)
        x, y = C.operands(a, b)
        if x.dtype.is_bool != y.dtype.is_bool:
            raise Issue(f"the two branches have the types {x.dtype} and {y.dtype}")
        return E.select(cond, x, y)

    def visit_Call(self, node: ast.Call):
        return self.call(node)


def _symbol(op: str) -> str:
    return C.SYMBOLS.get(C.op_name(op), op) if op != "MatMult" else "@"
