"""The statement parser: a script function's body to a kernel-IR Function.

One `visit_<Construct>` per supported Python statement; anything else is an error naming the
construct at its line. Names follow Python's function scoping: a variable first assigned inside
a branch or a loop and used after it is declared (without a value) at the start of the
innermost block enclosing both, and its first assignment becomes a plain assignment. An
annotated assignment (`x: f32 = ...`) to a name whose variable was declared in a block that
has ended (an earlier loop body or branch) declares a new variable, as C's block scoping
would: the kernel IR's printed form redeclares a name in sibling blocks that way.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import math
from collections.abc import Iterator

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.expr import Expr, Var
from minicomp.ir.func import MAX_CLUSTER, Function, LaunchAttrs
from minicomp.ir.functor import Mutator, collect, substitute
from minicomp.ir.symbols import python_source
from minicomp.ir.types import DataType, PointerType, TensorMapType, i64
from minicomp.script import calls, lang
from minicomp.script import conversions as C
from minicomp.script.errors import Issue
from minicomp.script.expressions import ExprParser, check_scope_value, scope_value
from minicomp.script.mapping import TaskMapping
from minicomp.script.tma import TensorMapRef
from minicomp.script.types import ScalarType
from minicomp.script.values import Binding, Effect, TensorRef

# Repeat loops of a task mapping up to this extent are unrolled.
UNROLL_EXTENT = 16
_MAX_THREADS = 1024
# The most resident blocks per SM any CUDA architecture allows (the second launch bound).
_MAX_MIN_BLOCKS = 32


class _Block:
    """A statement list being built, and the variables hoisted to its start."""

    def __init__(self, parent: _Block | None):
        self.parent = parent
        self.stmts: list[S.Stmt] = []
        self.hoisted: list[Var] = []

    def encloses(self, other: _Block) -> bool:
        b: _Block | None = other
        while b is not None:
            if b is self:
                return True
            b = b.parent
        return False


class _Unhoist(Mutator):
    """Turns the declarations of hoisted variables into assignments."""

    def __init__(self, hoisted: set[Var]):
        super().__init__()
        self.hoisted = hoisted

    def visit_Declare(self, s: S.Declare) -> S.Stmt:
        if s.var not in self.hoisted:
            return s
        return S.Seq(()) if s.init is None else S.Assign(s.var, s.init)

    def visit_Seq(self, s: S.Seq) -> S.Stmt:
        # Flattened again, as blocks are: no empty Seq stays where a declaration was.
        body = [self.visit(x) for x in s.body]
        return s if all(a is b for a, b in zip(body, s.body)) else S.seq(*body)

    def visit_default(self, n):
        # Expressions hold no declarations.
        return n if isinstance(n, Expr) else super().visit_default(n)


def _assigned_once(tree: ast.FunctionDef) -> set[str]:
    """Names bound by exactly one plain assignment (candidates for compile-time constants)."""
    counts: collections.Counter = collections.Counter()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        counts[n.id] += 1
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For):
            for n in ast.walk(node.target):
                if isinstance(n, ast.Name):
                    counts[n.id] += 2
    return {name for name, k in counts.items() if k == 1}


class FunctionParser(ExprParser):
    """Parses the body of one script function (`state`: its ScriptFunction's shared state)."""

    def __init__(self, state):
        self.state = state
        self.src = state.source
        self.fn = state.fn
        self.sig = state.signature
        self.names: dict[str, Binding] = {}
        self.taken: set[str] = set()
        self.root = _Block(None)
        self.block = self.root
        self.loops: list[str] = []
        self.attrs: dict[str, object] = {}
        self.callees: dict[object, object] = {}
        self.dynamic_bytes = 0
        self.dynamic_vars: set[Var] = set()  # the dynamic shared tensors' variables
        self.setmaxnreg: ast.AST | None = None  # the first setmaxnreg call (it needs min_blocks)
        self.pending_name: str | None = None
        self.once = _assigned_once(self.src.tree)
        self.inits: dict[Var, Expr] = {}  # the value of each variable assigned only once

    # ---- driving ----

    def parse(self) -> Function:
        """The kernel-IR function; `self.callees` then holds the script functions it calls."""
        sig = self.sig
        for p in sig.params:
            self.taken.add(p.name)
            if p.kind == "scalar":
                self.names[p.name] = Binding("var", p.var, self.root)
            elif p.kind == "tensor_map":
                self.names[p.name] = Binding("const", TensorMapRef(p.name, p.var, p.shape))
            else:
                shape = p.shape if p.kind == "tensor" else (-1,)
                self.names[p.name] = Binding("tensor", TensorRef(p.name, p.var, shape))
        for stmt in self.src.tree.body:
            self.visit(stmt)
        body = self.close(self.root)
        attrs = self.finish_attrs() if sig.kind == "kernel" else LaunchAttrs()
        return Function(sig.name, sig.ir_params, body, sig.kind, sig.ret, attrs)

    def emit(self, stmt: S.Stmt) -> None:
        self.block.stmts.append(stmt)

    @contextlib.contextmanager
    def nested(self, loop: str | None = None) -> Iterator[_Block]:
        """A block for a branch or a loop body (`loop`: the kind of loop it is the body of)."""
        outer = self.block
        self.block = _Block(outer)
        if loop:
            self.loops.append(loop)
        try:
            yield self.block
        finally:
            self.block = outer
            if loop:
                self.loops.pop()

    def close(self, block: _Block) -> S.Stmt:
        """The statement a finished block stands for, with its hoisted declarations."""
        stmts = block.stmts
        if block.hoisted:
            unhoist = _Unhoist(set(block.hoisted))
            stmts = [S.Declare(v) for v in block.hoisted] + [unhoist.visit(s) for s in stmts]
        return S.seq(*stmts) if stmts else S.Seq(())

    def fresh(self, name: str) -> str:
        """A variable name not used before in this function."""
        base, k = name, 1
        while name in self.taken:
            name = f"{base}_{k}"
            k += 1
        self.taken.add(name)
        return name

    # ---- names ----

    def lookup(self, name: str):
        b = self.names.get(name)
        if b is None:
            return check_scope_value(name, scope_value(self.fn, name))
        if b.kind == "gone":
            raise Issue(b.note)
        if b.kind == "var":
            self.touch(b)
        return b.value

    def touch(self, b: Binding) -> None:
        """Make variable `b` visible in the current block, hoisting its declaration."""
        if b.block.encloses(self.block):
            return
        common = b.block
        while not common.encloses(self.block):
            common = common.parent
        common.hoisted.append(b.value)
        b.block = common

    def out_of_scope(self, b: Binding | None) -> bool:
        """Whether `b` is a variable declared in a block that has ended (a sibling branch or
        loop body): an annotated assignment then declares a new variable of its name."""
        return b is not None and b.kind == "var" and not b.block.encloses(self.block)

    def bind_new(self, name: str, kind: str, value, note: str = "") -> Binding | None:
        """Bind a loop variable or task index, refusing to hide a live local; returns the
        binding it replaces."""
        old = self.names.get(name)
        if old is not None and old.kind in ("var", "tensor", "loop", "alias"):
            what = {"var": "a variable", "tensor": "a tensor"}.get(old.kind, "a loop variable")
            raise Issue(f"{name} is already {what} here; the loop needs another name")
        self.names[name] = Binding(kind, value)
        return old

    def declare_array(
        self, scope: str, dt: DataType, shape: tuple[int, ...], at: int | None = None
    ) -> TensorRef:
        """Declare a shared, dynamic shared or register tensor named after the assignment; a
        dynamic one at byte `at` of the dynamic shared memory, else after the ones before."""
        name = self.pending_name or f"{scope}_tensor"
        size = math.prod(shape)
        space = "local" if scope == "local" else "shared"
        var = Var(self.fresh(name), PointerType(dt, space))
        offset = 0
        if scope == "dynamic":
            # Every dynamic array starts where the dynamic shared memory starts (like CUDA's
            # extern __shared__): each tensor is an offset into it, 16-byte aligned.
            start = -(-self.dynamic_bytes // 16) * 16 if at is None else at
            if start % dt.nbytes:
                raise Issue(f"dynamic shared tensor {name} is not aligned to its {dt}")
            offset = start // dt.nbytes
            self.dynamic_vars.add(var)
            self.dynamic_bytes = max(self.dynamic_bytes, start + size * dt.nbytes)
            size += offset
        self.emit(S.DeclareArray(var, dt, size, scope))
        return TensorRef(name, var, shape, offset)

    def use_callee(self, sf) -> None:
        self.callees[sf._state] = sf

    def call(self, node: ast.Call):
        return calls.call(self, node)

    # ---- assignment ----

    def visit_Assign(self, node: ast.Assign):
        if len(node.targets) != 1:
            raise Issue("unsupported syntax: chained assignment (a = b = ...)")
        target = node.targets[0]
        self.pending_name = target.id if isinstance(target, ast.Name) else None
        try:
            value = self.value(node.value)
        finally:
            self.pending_name = None
        self.assign(target, value)

    def assign(self, target: ast.AST, value) -> None:
        if isinstance(target, ast.Name):
            self.assign_name(target.id, value)
        elif isinstance(target, ast.Subscript):
            self.store(target, value)
        elif isinstance(target, ast.Attribute):
            if self.value(target.value) is not lang.attrs:
                raise self.src.error(target, "only attrs.<name> attributes can be assigned")
            self.set_attr(target, target.attr, value)
        elif isinstance(target, ast.Tuple | ast.List):
            if not isinstance(value, tuple) or len(value) != len(target.elts):
                raise self.src.error(
                    target, f"cannot unpack {C.describe(value)} into {len(target.elts)} names"
                )
            for t, v in zip(target.elts, value):
                self.assign(t, v)
        else:
            self.visit(target)  # reports the construct

    def assign_name(self, name: str, value, declared: DataType | None = None) -> None:
        if isinstance(value, Effect):
            raise Issue(f"{value.what} returns nothing; it has no value to assign")
        b = self.names.get(name)
        if declared is not None and self.out_of_scope(b):
            b = None  # a new variable of that name
        if b is not None and b.kind != "gone":
            if declared is not None:
                raise Issue(f"{name} is already declared; annotate its first assignment only")
            if b.kind == "var":
                self.touch(b)
                self.inits.pop(b.value, None)
                value = C.implicit(value, b.value.dtype, f"assignment to {name}")
                self.emit(S.Assign(b.value, value))
                return
            if b.kind == "const" and not isinstance(value, Expr | TensorRef):
                b.value = value
                return
            what = {
                "loop": "a loop variable",
                "alias": "a task index",
                "tensor": "a tensor",
                "const": "a compile-time constant (assigned once with a compile-time value)",
            }[b.kind]
            raise Issue(f"cannot assign to {name}: it is {what}")
        if isinstance(value, TensorRef):
            if declared is not None:
                raise Issue(f"{name} is a tensor; it takes no scalar annotation")
            self.names[name] = Binding("tensor", value)
            return
        compile_time = not isinstance(value, Expr)
        if declared is None and compile_time and (name in self.once or not C.is_number(value)):
            self.names[name] = Binding("const", value)
            return
        if declared is not None:
            init = C.implicit(value, declared, f"assignment to {name}")
        else:
            init = C.to_expr(value)
        var = Var(self.fresh(name), init.dtype)
        self.emit(S.Declare(var, init))
        self.names[name] = Binding("var", var, self.block)
        if name in self.once:
            self.inits[var] = init

    def store(self, target: ast.Subscript, value) -> None:
        """`t[i, j] = value`."""
        element = self.value(target)
        if isinstance(element, TensorRef):
            raise self.src.error(target, f"assign to single elements of {element.name}")
        if not isinstance(element, E.Load):
            raise self.src.error(target, f"cannot assign to an element of {C.describe(element)}")
        name = element.buf.name
        value = C.implicit(value, element.dtype, f"store to {name}")
        self.emit(S.Store(element.buf, element.index, value))

    def visit_AugAssign(self, node: ast.AugAssign):
        op = C.op_name(type(node.op).__name__)
        target = node.target
        rhs = self.value(node.value)
        if isinstance(target, ast.Name):
            b = self.names.get(target.id)
            if b is None or b.kind not in ("var", "const"):
                current = self.value(target)  # reports undefined names
                raise Issue(f"cannot update {target.id}: it is {C.describe(current)}")
            self.assign_name(target.id, C.binop(op, self.value(target), rhs))
        elif isinstance(target, ast.Subscript):
            element = self.value(target)
            if not isinstance(element, E.Load):
                raise Issue(f"cannot update {C.describe(element)}")
            self.store(target, C.binop(op, element, rhs))
        else:
            raise Issue("unsupported syntax: augmented assignment to an attribute")

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if not isinstance(node.target, ast.Name):
            raise Issue("only names can be declared with a type (x: f32 = ...)")
        t = self.constant(node.annotation, "a variable's annotation")
        if not isinstance(t, ScalarType):
            raise Issue(f"a variable's annotation is a scalar type such as f32, not {t!r}")
        name = node.target.id
        if node.value is None:
            b = self.names.get(name)
            if b is not None and b.kind != "gone" and not self.out_of_scope(b):
                raise Issue(f"{name} is already declared")
            var = Var(self.fresh(name), t.dtype)
            self.emit(S.Declare(var))
            self.names[name] = Binding("var", var, self.block)
            return
        self.assign_name(name, self.value(node.value), declared=t.dtype)

    # ---- launch attributes ----

    def set_attr(self, node: ast.AST, name: str, value) -> None:
        if name not in lang.Attrs.NAMES:
            raise self.src.error(
                node, f"attrs has no attribute {name!r} (known: {', '.join(lang.Attrs.NAMES)})"
            )
        if self.block is not self.root:
            raise self.src.error(node, f"attrs.{name} must be set at the top level of the kernel")
        if name in self.attrs:
            raise self.src.error(node, f"attrs.{name} is set twice")
        if name in ("grid_dim", "block_dim"):
            self.attrs[name] = self.launch_dims(name, value)
            return
        if name == "template":
            if not isinstance(value, str):
                raise self.src.error(node, f"attrs.template is a string, not {C.describe(value)}")
            self.attrs[name] = value
            return
        if name == "scratch":
            self.attrs[name] = self.scratch(node, value)
            return
        if name == "tensor_maps":
            self.attrs[name] = self.tensor_maps(node, value)
            return
        if name == "cluster_dim":
            self.attrs[name] = self.cluster_dim(node, value)
            return
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.src.error(node, f"attrs.{name} is a compile-time int, not {value!r}")
        if name == "launch_bounds" and not 1 <= value <= _MAX_THREADS:
            raise self.src.error(node, f"attrs.launch_bounds is 1 to {_MAX_THREADS}, not {value}")
        if name == "block_group" and value < 1:
            raise self.src.error(node, f"attrs.block_group is at least 1, not {value}")
        if name == "min_blocks" and not 1 <= value <= _MAX_MIN_BLOCKS:
            raise self.src.error(node, f"attrs.min_blocks is 1 to {_MAX_MIN_BLOCKS}, not {value}")
        self.attrs[name] = value

    def scratch(self, node: ast.AST, value) -> tuple:
        """attrs.scratch: (pointer parameter, elements, zeroed) entries (LaunchAttrs)."""
        pointers = {v.name for v in self.sig.ir_params if isinstance(v.type, PointerType)}
        entries = value if isinstance(value, tuple) else (value,)
        out = []
        for entry in entries:
            ok = isinstance(entry, tuple) and len(entry) == 3
            param, elements, zeroed = entry if ok else (None, None, None)
            if isinstance(param, TensorRef):
                param = param.var.name
            if isinstance(zeroed, E.Const) and zeroed.dtype.is_bool:
                zeroed = bool(zeroed.value)
            if isinstance(elements, E.Const) and elements.dtype.is_integer:
                elements = int(elements.value)
            if not (
                ok
                and param in pointers
                and isinstance(elements, int)
                and not isinstance(elements, bool)
                and elements >= 0
                and isinstance(zeroed, bool)
            ):
                raise self.src.error(
                    node,
                    "attrs.scratch holds (tensor parameter, elements, zeroed) entries, not "
                    f"{C.describe(entry)}",
                )
            out.append((param, elements, zeroed))
        return tuple(out)

    def tensor_maps(self, node: ast.AST, value) -> tuple:
        """attrs.tensor_maps: (tensor-map parameter, pointer parameter, base, shape, strides)
        entries (LaunchAttrs), as the printer writes them: names as strings, ints, and sizes
        computed from the scalar parameters (a symbolic M)."""
        params = {v.name: v.type for v in self.sig.ir_params}
        entries = value if isinstance(value, tuple) else (value,)
        out = []
        for entry in entries:
            entry = _ints(entry)
            ok = isinstance(entry, tuple) and len(entry) == 5
            param, buffer, base, shape, strides = entry if ok else (None,) * 5
            if not (
                ok
                and isinstance(params.get(param), TensorMapType)
                and isinstance(params.get(buffer), PointerType)
                and type(base) is int
                and isinstance(shape, tuple)
                and isinstance(strides, tuple)
                and len(shape) == len(strides) == params[param].rank
                and all(type(x) is int or isinstance(x, Expr) for x in (*shape, *strides))
            ):
                raise self.src.error(
                    node,
                    "attrs.tensor_maps holds (tensor-map parameter, pointer parameter, base, "
                    f"shape, strides) entries, not {C.describe(entry)}",
                )
            shape, strides = (
                tuple(self.size("tensor_maps", d) for d in dims) for dims in (shape, strides)
            )
            out.append((param, buffer, base, shape, strides))
        return tuple(out)

    def cluster_dim(self, node: ast.AST, value) -> tuple[int, int, int]:
        """attrs.cluster_dim: 1 to 3 compile-time ints, at most MAX_CLUSTER CTAs in all."""
        items = _ints(value if isinstance(value, tuple) else (value,))
        if not 1 <= len(items) <= 3 or not all(type(d) is int and d >= 1 for d in items):
            raise self.src.error(
                node, f"attrs.cluster_dim is 1 to 3 positive compile-time ints, not {value!r}"
            )
        if math.prod(items) > MAX_CLUSTER:
            raise self.src.error(
                node,
                f"attrs.cluster_dim {items} has {math.prod(items)} CTAs; a cluster has at most "
                f"{MAX_CLUSTER}",
            )
        return tuple(items) + (1,) * (3 - len(items))

    def launch_dims(self, name: str, value) -> tuple:
        items = value if isinstance(value, tuple) else (value,)
        if not 1 <= len(items) <= 3:
            raise Issue(f"attrs.{name} has 1 to 3 dimensions, not {len(items)}")
        dims: list = []
        for d in items:
            if C.is_number(d) and isinstance(d, int) and not isinstance(d, bool):
                if d < 1:
                    raise Issue(f"attrs.{name} has a dimension of {d}")
                dims.append(d)
                continue
            dims.append(self.size(name, d))
        if name == "block_dim" and all(isinstance(d, int) for d in dims):
            if math.prod(dims) > _MAX_THREADS:
                raise Issue(f"a block of {math.prod(dims)} threads; CUDA allows {_MAX_THREADS}")
        return tuple(dims) + (1,) * (3 - len(dims))

    def size(self, name: str, d) -> int | Expr:
        """Size `d` of attrs.`name`: an int, or an i64 expression of the scalar parameters
        that the runtime evaluates at each launch."""
        if type(d) is int:
            return d
        if not isinstance(d, Expr) or not d.dtype.is_integer:
            raise Issue(f"attrs.{name}: a dimension is an int, not {C.describe(d)}")
        scalars = {p.var for p in self.sig.params if p.kind == "scalar"}
        scalars |= {v for v in self.sig.extra if isinstance(v.type, DataType)}
        others = [v.name for v in collect(d, Var) if v not in scalars]
        if others or collect(d, (E.Call, E.Load)):
            what = f"uses {', '.join(others)}" if others else "reads memory or threads"
            raise Issue(
                f"attrs.{name}: a dimension is computed from the kernel's scalar parameters "
                f"only; this one {what}"
            )
        dim = E.cast(d, i64)
        try:
            python_source(dim)
        except NotImplementedError as e:
            raise Issue(f"attrs.{name}: the runtime cannot evaluate {d} ({e})") from None
        return dim

    def finish_attrs(self) -> LaunchAttrs:
        attrs = dict(self.attrs)
        for required in ("grid_dim", "block_dim"):
            if required not in attrs:
                raise self.src.error(None, f"kernel {self.sig.py_name} sets no attrs.{required}")
        block = attrs["block_dim"]
        bound = attrs.get("launch_bounds")
        constant_block = all(isinstance(d, int) for d in block)
        if "min_blocks" in attrs and bound is None and not constant_block:
            raise self.src.error(
                None, "attrs.min_blocks needs a constant attrs.block_dim or attrs.launch_bounds"
            )
        cluster = attrs.get("cluster_dim")
        if cluster is not None:
            for axis, g, c in zip("xyz", attrs["grid_dim"], cluster):
                if isinstance(g, int) and g % c:
                    raise self.src.error(
                        None,
                        f"attrs.grid_dim {tuple(attrs['grid_dim'])} is not a multiple of "
                        f"attrs.cluster_dim {cluster} along {axis}",
                    )
        if self.setmaxnreg is not None and "min_blocks" not in attrs:
            # ptxas ignores setmaxnreg ("unable to determine register count at entry") in a
            # kernel whose launch bounds name no blocks per SM.
            raise self.src.error(
                self.setmaxnreg,
                "setmaxnreg needs attrs.min_blocks (such as 1): without it ptxas cannot tell "
                "the registers a thread has at entry and ignores it",
            )
        if bound is not None and constant_block:
            if math.prod(block) > bound:
                raise self.src.error(
                    None, f"attrs.block_dim has {math.prod(block)} threads, over its launch bounds"
                )
        if self.dynamic_bytes:
            given = attrs.get("dynamic_smem")
            if given is not None and given < self.dynamic_bytes:
                raise self.src.error(
                    None,
                    f"attrs.dynamic_smem is {given} bytes; the dynamic shared tensors need "
                    f"{self.dynamic_bytes}",
                )
            attrs.setdefault("dynamic_smem", self.dynamic_bytes)
        return LaunchAttrs(**attrs)

    # ---- statements with effects ----

    def visit_Expr(self, node: ast.Expr):
        v = self.visit(node.value)
        if isinstance(v, Effect):
            self.emit(v.stmt)
        elif isinstance(v, E.Call):
            self.emit(S.Evaluate(v))
        elif isinstance(v, Expr | TensorRef):
            raise Issue("this statement computes a value and drops it (it has no effect)")

    def visit_Pass(self, node: ast.Pass):
        pass

    def visit_Return(self, node: ast.Return):
        ret = self.sig.ret
        if node.value is None:
            if ret is not None:
                raise Issue(f"{self.sig.py_name} must return a {ret} value")
            self.emit(S.Return())
            return
        value = self.value(node.value)
        if ret is None:
            what = "a kernel" if self.sig.kind == "kernel" else f"{self.sig.py_name}"
            raise Issue(f"{what} returns nothing (give a device function a return annotation)")
        self.emit(S.Return(C.implicit(value, ret, "the return value")))

    def visit_Break(self, node: ast.Break):
        self.loop_jump("break", S.Break())

    def visit_Continue(self, node: ast.Continue):
        self.loop_jump("continue", S.Continue())

    def loop_jump(self, word: str, stmt: S.Stmt) -> None:
        if not self.loops:
            raise Issue(f"{word} outside a loop")
        if self.loops[-1] != "runtime":
            kind = self.loops[-1]
            raise Issue(f"{word} is not supported in a loop over a {kind}")
        self.emit(stmt)

    # ---- control flow ----

    def visit_If(self, node: ast.If):
        cond = C.truth(self.value(node.test))
        if isinstance(cond, bool):
            # A compile-time condition: only the branch taken exists.
            for stmt in node.body if cond else node.orelse:
                self.visit(stmt)
            return
        with self.nested() as then_block:
            for stmt in node.body:
                self.visit(stmt)
        orelse = None
        if node.orelse:
            with self.nested() as else_block:
                for stmt in node.orelse:
                    self.visit(stmt)
            orelse = self.close(else_block)
        self.emit(S.If(cond, self.close(then_block), orelse))

    def visit_While(self, node: ast.While):
        if node.orelse:
            raise Issue("unsupported syntax: while ... else")
        cond = C.truth(self.value(node.test))
        if cond is False:
            return
        with self.nested("runtime") as body:
            for stmt in node.body:
                self.visit(stmt)
        cond_expr = E.const(True) if cond is True else cond
        self.emit(S.While(cond_expr, self.close(body)))

    def visit_For(self, node: ast.For):
        if node.orelse:
            raise Issue("unsupported syntax: for ... else")
        it = node.iter
        if isinstance(it, ast.Call):
            f = it.func
            if isinstance(f, ast.Attribute) and f.attr == "on":
                base = self.value(f.value)
                if isinstance(base, TaskMapping):
                    return self.for_mapping(node, base, it)
            fv = self.value(f)
            if fv is range:
                return self.for_range(node, it, "serial")
            if fv is lang.unroll:
                inner = it.args[0] if len(it.args) == 1 and not it.keywords else None
                if not isinstance(inner, ast.Call) or self.value(inner.func) is not range:
                    raise Issue("unroll() takes one range(...): for i in unroll(range(n))")
                return self.for_range(node, inner, "unroll")
        values = self.value(it)
        if not isinstance(values, tuple):
            raise Issue(
                "a for loop iterates over range(...), unroll(range(...)), a task mapping's "
                f".on(worker) or a compile-time tuple, not {C.describe(values)}"
            )
        self.for_static(node, values)

    def loop_target(self, node: ast.For) -> str:
        if not isinstance(node.target, ast.Name):
            raise self.src.error(node.target, "the loop variable must be a single name")
        return node.target.id

    def end_loop(self, name: str, old: Binding | None, line: int) -> None:
        note = f"the loop variable {name} is not visible after its loop (line {line})"
        if old is not None and old.kind == "const":
            self.names[name] = old
        else:
            self.names[name] = Binding("gone", None, note=note)

    def for_range(self, node: ast.For, call: ast.Call, kind: str) -> None:
        if call.keywords or not 1 <= len(call.args) <= 3:
            raise self.src.error(call, "range() takes 1 to 3 positional arguments")
        vals = [self.value(a) for a in call.args]
        start, stop, step = (0, vals[0], 1) if len(vals) == 1 else (*vals[:2], 1)
        if len(vals) == 3:
            step = vals[2]
        if not isinstance(step, int) or isinstance(step, bool) or step == 0:
            raise self.src.error(call, f"the step of range() is a nonzero compile-time int: {step}")
        typed = []
        for v in (start, stop):
            if isinstance(v, Expr):
                if not v.dtype.is_integer:
                    raise self.src.error(call, f"range() over a {v.dtype} value")
                typed.append(v.dtype)
            elif not isinstance(v, int) or isinstance(v, bool):
                raise self.src.error(call, f"range() takes integers, not {C.describe(v)}")
        dt = typed[0] if typed else C.literal_type(max(abs(start), abs(stop)))
        if len(typed) == 2 and typed[0] != typed[1]:
            dt = E.promote(typed[0], typed[1])
        name = self.loop_target(node)
        if start == 0 and not isinstance(start, Expr) and step == 1:
            var = Var(self.fresh(name), dt)
            extent = stop
            first = None
        else:
            var = Var(self.fresh(f"{name}_k"), dt)
            lo, hi = (start, stop) if step > 0 else (stop, start)
            span = C.binop("add", C.binop("sub", hi, lo), abs(step) - 1)
            extent = C.binop("idiv", span, abs(step))
            value = E.cast(C.to_expr(C.binop("add", start, C.binop("mul", var, step)), dt), dt)
            first = Var(self.fresh(name), dt)
        extent = E.cast(C.to_expr(extent, dt), dt)
        old = self.bind_new(name, "loop", first if first is not None else var)
        with self.nested("runtime") as body:
            if first is not None:
                self.emit(S.Declare(first, value))
            for stmt in node.body:
                self.visit(stmt)
        self.end_loop(name, old, node.lineno)
        self.emit(S.For(var, extent, self.close(body), kind))

    def for_static(self, node: ast.For, values: tuple) -> None:
        """A loop over a compile-time tuple: the body is parsed once per element."""
        if isinstance(node.target, ast.Name):
            name = node.target.id
            old = self.names.get(name)
            if old is not None and old.kind in ("var", "tensor", "loop", "alias"):
                raise Issue(f"{name} is already a variable here; the loop needs another name")
        self.loops.append("compile-time tuple")
        try:
            for v in values:
                if isinstance(node.target, ast.Name):
                    self.names[node.target.id] = Binding("const", v)
                else:
                    self.assign(node.target, v)
                for stmt in node.body:
                    self.visit(stmt)
        finally:
            self.loops.pop()

    def for_mapping(self, node: ast.For, m: TaskMapping, call: ast.Call) -> None:
        """`for i, j in m.on(worker)`: loops over the worker's tasks, guarded by
        `worker < m.num_workers` unless `exact=True` or the block has exactly that many
        threads along the worker's axis."""
        if len(call.args) != 1 or any(k.arg != "exact" for k in call.keywords):
            raise self.src.error(call, "on() takes one worker expression (and exact=...)")
        exact = False
        for k in call.keywords:
            exact = self.constant(k.value, "exact")
        worker = C.to_expr(self.value(call.args[0]))
        if not worker.dtype.is_integer:
            raise self.src.error(call, f"the worker is an integer, not a {worker.dtype} value")
        tasks = m.on(worker)
        renamed = {v: Var(self.fresh("rep"), i64) for v, _ in tasks.loops}
        indices = [substitute(ix, renamed) for ix in tasks.indices]
        targets = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
        if len(targets) != len(indices) or not all(isinstance(t, ast.Name) for t in targets):
            raise self.src.error(
                node.target, f"{m!r} has {len(indices)} task dimensions: name one for each"
            )
        olds = [(t.id, self.bind_new(t.id, "alias", ix)) for t, ix in zip(targets, indices)]
        with self.nested("task mapping") as body:
            for stmt in node.body:
                self.visit(stmt)
        for name, old in olds:
            self.end_loop(name, old, node.lineno)
        stmt = self.close(body)
        for v, extent in reversed(tasks.loops):
            kind = "unroll" if extent <= UNROLL_EXTENT else "serial"
            stmt = S.For(renamed[v], E.const(extent, i64), stmt, kind)
        if not exact and not self.covers(worker, m.num_workers):
            guard = C.binop("lt", worker, m.num_workers)
            if not E.is_const(guard, True):
                stmt = S.If(guard, stmt)
        self.emit(stmt)

    def covers(self, worker: Expr, workers: int) -> bool:
        """Whether `worker` is a thread index whose block extent is exactly `workers`."""
        block = self.attrs.get("block_dim")
        worker = self.inits.get(worker, worker) if isinstance(worker, Var) else worker
        if block is None or not isinstance(worker, E.Call) or worker.args:
            return False
        for axis, extent in zip("xyz", block):
            if worker.name == f"thread_idx_{axis}":
                return extent == workers
        return False


def _ints(value):
    """`value` with integer constants as ints, through tuples (attribute values)."""
    if isinstance(value, tuple):
        return tuple(_ints(v) for v in value)
    if isinstance(value, E.Const) and value.dtype.is_integer:
        return int(value.value)
    return value
