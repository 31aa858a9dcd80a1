"""The signature of a script function: its parameters' annotations, its kind and its name."""

from __future__ import annotations

import ast
import itertools
import threading
from dataclasses import dataclass

from minicomp.ir import c_names
from minicomp.ir import expr as E
from minicomp.ir.expr import Dim, Var
from minicomp.ir.types import DataType, i64
from minicomp.ir.types import PointerType as IRPointer
from minicomp.ir.types import TensorMapType as IRTensorMap
from minicomp.script import lang
from minicomp.script.errors import Issue, ScriptError, Source
from minicomp.script.expressions import ExprParser, check_scope_value, scope_value
from minicomp.script.types import (
    PointerType,
    ScalarType,
    TensorMapType,
    TensorType,
    check_tensor_map,
    ptr,
)
from minicomp.script.types import tensor_map as _tensor_map


@dataclass(frozen=True)
class Param:
    """A parameter: kind "scalar", "tensor" (with a shape), "pointer" or "tensor_map" (with the
    shape of the tensor the caller passes; its IR variable's type is an ir.types.TensorMapType),
    and its IR variable."""

    name: str
    kind: str
    dtype: DataType
    var: Var
    shape: tuple[Dim, ...] | None
    lineno: int


@dataclass(frozen=True)
class Signature:
    """What callers and the launcher need of a script function, without parsing its body."""

    py_name: str
    name: str  # its IR name: a kernel's Python name, a device function's unique in the process
    kind: str  # "kernel" or "device"
    params: tuple[Param, ...]
    ret: DataType | None
    lineno: int
    extra: tuple[Var, ...] = ()  # IR parameters given by `script(params=...)`, not by name

    @property
    def ir_params(self) -> tuple[Var, ...]:
        """The IR parameters: for kernels the pointers first, then the scalars (the order the
        runtime's launchers expect), then the extra ones; for device functions the script's
        order, then the extra ones."""
        if self.kind != "kernel":
            return tuple(p.var for p in self.params) + self.extra
        pointers = [p.var for p in self.params if p.kind != "scalar"]
        scalars = [p.var for p in self.params if p.kind == "scalar"]
        return tuple(pointers + scalars) + self.extra


class _AnnotationParser(ExprParser):
    """Evaluates annotations: scalar int parameters stand for themselves (runtime sizes)."""

    def __init__(self, src: Source, fn, sizes: dict[str, Var]):
        self.src = src
        self.fn = fn
        self.sizes = sizes

    def lookup(self, name: str):
        if name in self.sizes:
            return self.sizes[name]
        value = scope_value(self.fn, name)
        return value if value is _tensor_map else check_scope_value(name, value)

    def call(self, node: ast.Call):
        func = self.value(node.func)
        if func is ptr and len(node.args) == 1 and not node.keywords:
            return ptr(self.value(node.args[0]))
        raise Issue(
            "an annotation is a type such as f32, f32[m, n], ptr(f32) or "
            "tensor_map(f16[m, k], box=(64, 64), swizzle=128)"
        )


_names_lock = threading.Lock()
_names_taken: dict[str, itertools.count] = {}
_RESERVED = c_names.RESERVED | {
    "threadIdx",
    "blockIdx",
    "blockDim",
    "gridDim",
    "warpSize",
    "printf",
    "min",
    "max",
    "assert",
}


def c_name(py_name: str) -> str:
    """A usable C identifier for a function's Python name."""
    if py_name in _RESERVED or py_name.startswith(("mc_", "_")):
        return "script_" + py_name.lstrip("_")
    return py_name


def unique_name(py_name: str) -> str:
    """A C identifier for a new device function, distinct from every earlier one's (two
    instances of a template may meet in one module; the module gives them final names)."""
    base = c_name(py_name)
    with _names_lock:
        counter = _names_taken.setdefault(base, itertools.count())
        k = next(counter)
    return base if k == 0 else f"{base}_{k}"


def is_kernel(src: Source, fn) -> bool:
    """Whether the function sets launch attributes (`attrs.x = ...`) in its body."""
    parser = _AnnotationParser(src, fn, {})
    for stmt in ast.walk(src.tree):
        if not isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign):
            continue
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for t in targets:
            if isinstance(t, ast.Attribute):
                try:
                    if parser.value(t.value) is lang.attrs:
                        return True
                except ScriptError:
                    continue
    return False


def parse_signature(src: Source, fn, extra: tuple[Var, ...] = ()) -> Signature:
    """The signature of script function `fn` from its source's annotations, with the IR
    parameters `extra` after the declared ones."""
    tree = src.tree
    a = tree.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.kw_defaults:
        raise src.error(tree, "script functions take plain positional parameters only")
    kind = "kernel" if is_kernel(src, fn) else "device"
    args = [*a.posonlyargs, *a.args]
    for arg in args:
        if arg.annotation is None:
            raise src.error(arg, f"parameter {arg.arg} needs a type annotation such as f32[n]")
    evaluated = getattr(fn, "__annotations__", {})
    scalar_parser = _AnnotationParser(src, fn, {})
    annotations = {arg.arg: _annotation(src, scalar_parser, arg, evaluated) for arg in args}
    sizes = {
        name: Var(name, t.dtype)
        for name, t in annotations.items()
        if isinstance(t, ScalarType) and t.dtype.is_integer
    }
    params = []
    for arg in args:
        t = annotations[arg.arg]
        if isinstance(t, ScalarType):
            v = sizes[arg.arg] if arg.arg in sizes else Var(arg.arg, t.dtype)
            params.append(Param(arg.arg, "scalar", t.dtype, v, None, arg.lineno))
        elif isinstance(t, PointerType):
            v = Var(arg.arg, IRPointer(t.dtype))
            params.append(Param(arg.arg, "pointer", t.dtype, v, None, arg.lineno))
        elif isinstance(t, TensorMapType):
            node = _tensor_node(arg.annotation)
            shape = None
            if isinstance(node, ast.Subscript):  # else only the rank is known: the box's
                shape = _shape(src, fn, arg, t.tensor, sizes, evaluated, node)
            if shape is not None and len(shape) != len(t.box):
                raise src.error(
                    node,
                    f"parameter {arg.arg}: the box has {len(t.box)} sizes, the tensor "
                    f"{len(shape)} dimensions",
                )
            v = Var(arg.arg, IRTensorMap(t.dtype, t.box, t.swizzle))
            params.append(Param(arg.arg, "tensor_map", t.dtype, v, shape, arg.lineno))
        else:
            shape = _shape(src, fn, arg, t, sizes, evaluated)
            v = Var(arg.arg, IRPointer(t.dtype))
            params.append(Param(arg.arg, "tensor", t.dtype, v, shape, arg.lineno))
    ret = None
    if tree.returns is not None:
        r = scalar_parser.value(tree.returns)
        if r is not None and not isinstance(r, ScalarType):
            raise src.error(tree.returns, "a device function returns a scalar type such as f32")
        if r is not None and kind == "kernel":
            raise src.error(tree.returns, "a kernel returns nothing; remove the return annotation")
        ret = r.dtype if r is not None else None
    name = c_name(fn.__name__) if kind == "kernel" else unique_name(fn.__name__)
    taken = {p.name for p in params}
    for v in extra:
        if not isinstance(v, Var) or v.name in taken:
            raise src.error(tree, f"extra parameter {v!r} is not an IR variable of a new name")
        taken.add(v.name)
    return Signature(fn.__name__, name, kind, tuple(params), ret, tree.lineno, tuple(extra))


def _annotation(src: Source, parser: _AnnotationParser, arg: ast.arg, evaluated: dict):
    node = arg.annotation
    if isinstance(node, ast.Call) and _is_tensor_map(parser, node.func):
        return _tensor_map_annotation(src, parser, arg, evaluated)
    if isinstance(node, ast.Subscript):
        # Only the element type now; the shape waits until the size parameters are known.
        base = _evaluate(src, parser, node.value, evaluated.get(arg.arg), "scalar")
        if not isinstance(base, ScalarType):
            raise src.error(node, f"parameter {arg.arg}: {base!r} is not a scalar type")
        return TensorType(base, ())
    t = _evaluate(src, parser, node, evaluated.get(arg.arg), "whole")
    if not isinstance(t, ScalarType | TensorType | PointerType):
        raise src.error(node, f"parameter {arg.arg}: {t!r} is not a type such as f32 or f32[n]")
    return t


def _is_tensor_map(parser: _AnnotationParser, func: ast.AST) -> bool:
    try:
        return parser.value(func) is _tensor_map
    except ScriptError:
        return False


def _tensor_map_annotation(src: Source, parser: _AnnotationParser, arg: ast.arg, evaluated):
    """`tensor_map(dtype[dims], box=(...), swizzle=s)`: its element type, box and swizzle now
    (the shape waits for the size parameters, as a tensor's does)."""
    node = arg.annotation
    names = ("tensor", "box", "swizzle")
    if len(node.args) > 3 or any(k.arg not in names for k in node.keywords):
        raise src.error(node, "tensor_map() takes (tensor type, box=(...), swizzle=0)")
    given = dict(zip(names, node.args)) | {k.arg: k.value for k in node.keywords}
    if "tensor" not in given or "box" not in given:
        raise src.error(node, f"parameter {arg.arg}: tensor_map() needs a tensor type and a box")
    tensor = given["tensor"]
    fallback = evaluated.get(arg.arg)
    fallback = fallback.tensor.scalar if isinstance(fallback, TensorMapType) else None
    element = tensor.value if isinstance(tensor, ast.Subscript) else tensor
    base = _evaluate(src, parser, element, fallback, "scalar")
    if not isinstance(base, ScalarType):
        raise src.error(tensor, f"parameter {arg.arg}: {base!r} is not a scalar type")
    known = evaluated.get(arg.arg)
    known = known if isinstance(known, TensorMapType) else None
    box = _evaluate(src, parser, given["box"], known and known.box, "whole")
    swizzle = 0
    if "swizzle" in given:
        swizzle = _evaluate(src, parser, given["swizzle"], known and known.swizzle, "whole")
    t = _tensor_map(base, box, swizzle)
    try:
        check_tensor_map(t)
    except ValueError as e:
        raise src.error(node, f"parameter {arg.arg}: {e}") from None
    return t


def _tensor_node(node: ast.Call) -> ast.AST:
    """The tensor type written in a tensor_map() annotation."""
    for k in node.keywords:
        if k.arg == "tensor":
            return k.value
    return node.args[0]


def _evaluate(src, parser, node, fallback, part: str):
    """An annotation (or its element type) from the source; when a name in it is not visible
    to the script (used only in the annotation, so absent from the closure), the value
    Python computed at definition time."""
    try:
        return parser.value(node)
    except ScriptError as e:
        if fallback is None or isinstance(fallback, str) or "undefined name" not in e.reason:
            raise
    if part == "scalar":
        return fallback.scalar if isinstance(fallback, TensorType) else fallback
    return fallback


def _shape(src, fn, arg, t: TensorType, sizes: dict[str, Var], evaluated: dict, node=None):
    node = arg.annotation if node is None else node
    parser = _AnnotationParser(src, fn, sizes)
    if isinstance(node, ast.Subscript):
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        fallback = evaluated.get(arg.arg)
        fallback = fallback.tensor if isinstance(fallback, TensorMapType) else fallback
        dims = []
        for k, item in enumerate(items):
            try:
                d = parser.value(item)
            except ScriptError as e:
                ok = isinstance(fallback, TensorType) and len(fallback.shape) == len(items)
                if not ok or "undefined name" not in e.reason:
                    raise
                d = fallback.shape[k]
            dims.append(_dim(src, item, arg.arg, d, sizes))
        return tuple(dims)
    return tuple(_dim(src, node, arg.arg, d, sizes) for d in t.shape)


def _dim(src, node, param: str, d, sizes: dict[str, Var]) -> Dim:
    if isinstance(d, str):
        if d not in sizes:
            raise src.error(
                node, f"parameter {param}: the size {d!r} names no int parameter of the function"
            )
        d = sizes[d]
    if isinstance(d, bool) or not isinstance(d, int | E.Expr):
        raise src.error(node, f"parameter {param}: a size is an int or an int parameter, not {d!r}")
    if isinstance(d, int):
        if d < 0:
            raise src.error(node, f"parameter {param}: negative size {d}")
        return d
    if not d.dtype.is_integer:
        raise src.error(node, f"parameter {param}: a size must be an integer, not a {d.dtype}")
    return E.cast(d, i64)
