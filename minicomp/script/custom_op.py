"""Script kernels as PyTorch custom operators (torch.library), and their native graph form.

    op = minicomp.script.custom_op("mylib::scale_rows", scale_rows, outputs=("y",))
    y = op(x, s, alpha=2.0)  # or torch.ops.mylib.scale_rows(x, s, 2.0)

The op allocates the kernel's `outputs` (row-major, dtype and shape from their annotations) and
returns them; its arguments are the kernel's other tensor parameters in order, then its
scalar parameters that no input tensor's shape binds. It is functional: inputs are read, never
written (non-contiguous inputs are copied first, as the kernel reads row-major tensors). A fake
implementation gives dynamo and AOTAutograd the outputs' shapes (symbolic ones too), so the op
never breaks a graph. Inside a graph compiled by minicomp for `cuda` or `cuda-emu`, the importer
finds the op in this module's registry and the plan launches the kernel itself, compiled into
the same module as minicomp's own kernels (`CustomOp.kernel_op`); on `cpu` it is an ATen call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minicomp.ir import expr as E
from minicomp.ir.func import Function
from minicomp.ir.functor import Mutator
from minicomp.ir.graph import ArgRef, ExternOp, Graph, KernelOp
from minicomp.ir.types import fits, to_torch
from minicomp.passes.graph.layout import is_row_major
from minicomp.script.errors import ScriptError
from minicomp.script.function import ScriptFunction
from minicomp.script.signature import Param

# The prefix of the names the kernels of ops get in minicomp's modules, where every other
# function is one of minicomp's own kernels, named k<n>_... (mc_ is the device header's).
NAME_PREFIX = "op_"

_lock = threading.RLock()
_registry: dict[str, CustomOp] = {}
_prefixes: set[str] = set()


class NotNative(Exception):
    """Why a call of a custom op stays an ATen call instead of a launch in the plan."""


def size_symbol(d: Any) -> str | None:
    """The size parameter a dimension of an annotation is, when it is exactly one."""
    if isinstance(d, E.Cast):
        d = d.a
    return d.name if isinstance(d, E.Var) else None


def eval_size(d: Any, env: dict) -> Any:
    """A dimension of an annotation under a binding of the size parameters to ints or SymInts
    (so never through int(), which would specialise a SymInt)."""
    if isinstance(d, int):
        return d
    if isinstance(d, E.Const):
        return d.value
    if isinstance(d, E.Var):
        return env[d.name]
    if isinstance(d, E.Cast) and d.dtype.is_integer:
        return eval_size(d.a, env)
    if isinstance(d, E.Binary) and d.op in _SIZE_OPS:
        return _SIZE_OPS[d.op](eval_size(d.a, env), eval_size(d.b, env))
    raise ValueError(f"the size {d!r} is not an integer expression of size parameters")


# Sizes are non-negative, so C's truncating division and modulo are Python's.
_SIZE_OPS: dict[str, Callable] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "idiv": lambda a, b: a // b,
    "imod": lambda a, b: a % b,
}


def _schema_type(p: Param) -> str:
    if p.kind == "tensor":
        return "Tensor"
    if p.dtype.is_bool:
        return "bool"
    return "SymInt" if p.dtype.is_integer else "float"


class CustomOp:
    """A script kernel registered as the PyTorch operator `qualname` (see `custom_op`).

    Calling it calls the operator. `inputs` are the kernel's tensor parameters the op takes,
    `scalars` its scalar parameters the op takes, `outputs` the ones it allocates and returns;
    `schema` is the operator's schema and `opoverload` the operator itself.
    """

    def __init__(self, qualname: str, kernel: ScriptFunction, outputs: tuple[str, ...], backward):
        sig = kernel.signature()
        params = {p.name: p for p in sig.params}
        self.qualname = qualname
        self.kernel = kernel
        self.backward = backward
        self.outputs = tuple(params[name] for name in outputs)
        self.inputs = tuple(p for p in sig.params if p.kind == "tensor" and p.name not in outputs)
        # A size parameter binds from the first input dimension that is exactly it.
        self.bound: dict[str, tuple[int, int]] = {}
        for i, p in enumerate(self.inputs):
            for k, d in enumerate(p.shape):
                name = size_symbol(d)
                if name is not None:
                    self.bound.setdefault(name, (i, k))
        self.scalars = tuple(
            p for p in sig.params if p.kind == "scalar" and p.name not in self.bound
        )
        args = ", ".join(f"{_schema_type(p)} {p.name}" for p in self.inputs + self.scalars)
        rets = "Tensor" if len(self.outputs) == 1 else f"({', '.join(['Tensor'] * len(outputs))})"
        self.schema = f"({args}) -> {rets}"
        self.prefix = NAME_PREFIX  # made unique at registration
        self._opdef = None
        self._functions: tuple[Function, tuple[Function, ...]] | None = None

    @property
    def opoverload(self):
        """The registered operator (torch.ops.<namespace>.<name>.default)."""
        return self._opdef._opoverload

    def __call__(self, *args, **kwargs):
        return self.opoverload(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<custom op {self.qualname}{self.schema} launching {self.kernel.fn.__qualname__}>"

    # --- PyTorch's side: eager implementation, fake implementation, autograd -----------------

    def _register(self) -> None:
        opdef = torch.library.custom_op(
            self.qualname, self._run, mutates_args=(), schema=self.schema
        )
        opdef.register_fake(self._fake)
        if self.backward is not None:
            opdef.register_autograd(self._backward, setup_context=self._setup_context)
        self._opdef = opdef

    def _split(self, args: tuple) -> tuple[tuple, tuple]:
        n = len(self.inputs)
        return tuple(args[:n]), tuple(args[n:])

    def _output_shapes(self, tensors: tuple, scalars: tuple) -> list[tuple]:
        """The outputs' shapes for these arguments (ints or SymInts), after checking the input
        tensors against their annotations."""
        env: dict[str, Any] = {p.name: v for p, v in zip(self.scalars, scalars)}
        device = tensors[0].device
        for p, t in zip(self.inputs, tensors):
            where = f"{self.qualname}: input {p.name}"
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{where} is a tensor, not a {type(t).__name__}")
            if t.dtype != to_torch(p.dtype):
                raise ValueError(f"{where} must be a {to_torch(p.dtype)} tensor, not {t.dtype}")
            if t.device != device:
                raise ValueError(f"{where} is on {t.device}, the op's first input on {device}")
            if t.dim() != len(p.shape):
                raise ValueError(f"{where} must have {len(p.shape)} dimensions, not {t.dim()}")
        for name, (i, k) in self.bound.items():
            env[name] = tensors[i].shape[k]
        for p, t in zip(self.inputs, tensors):
            for k, (d, actual) in enumerate(zip(p.shape, t.shape)):
                want = eval_size(d, env)
                message = f"{self.qualname}: input {p.name}: dimension {k} is {actual}, not {want}"
                _check_size(want, actual, message)
        return [tuple(eval_size(d, env) for d in p.shape) for p in self.outputs]

    def _run(self, *args):
        tensors, scalars = self._split(args)
        shapes = self._output_shapes(tensors, scalars)
        device = tensors[0].device
        outs = [
            torch.empty(s, dtype=to_torch(p.dtype), device=device)
            for p, s in zip(self.outputs, shapes)
        ]
        kwargs = {p.name: t.contiguous() for p, t in zip(self.inputs, tensors)}
        kwargs.update({p.name: v for p, v in zip(self.scalars, scalars)})
        kwargs.update({p.name: t for p, t in zip(self.outputs, outs)})
        self.kernel(**kwargs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _fake(self, *args):
        tensors, scalars = self._split(args)
        shapes = self._output_shapes(tensors, scalars)
        outs = [
            tensors[0].new_empty(s, dtype=to_torch(p.dtype)) for p, s in zip(self.outputs, shapes)
        ]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _setup_context(self, ctx, inputs: tuple, output) -> None:
        tensors, scalars = self._split(inputs)
        outs = output if isinstance(output, tuple) else (output,)
        ctx.save_for_backward(*tensors, *outs)
        ctx.scalars = scalars

    def _backward(self, ctx, *grads):
        saved = ctx.saved_tensors
        n = len(self.inputs)
        tensors, outs = saved[:n], saved[n:]
        result = self.backward(tuple(tensors) + tuple(ctx.scalars), tuple(outs), tuple(grads))
        if n == 1 and not isinstance(result, (tuple, list)):
            result = (result,)
        if not isinstance(result, (tuple, list)) or len(result) != n:
            names = ", ".join(p.name for p in self.inputs)
            raise ValueError(
                f"the backward of {self.qualname} must return {n} gradients (or None), one per "
                f"input tensor ({names}); it returned {result!r:.80}"
            )
        return (*result, *([None] * len(self.scalars)))

    # --- minicomp's side: the call as a kernel launch in the plan ------------------------------

    def functions(self) -> tuple[Function, tuple[Function, ...]]:
        """The kernel and the device functions it calls, renamed for minicomp's modules: the
        kernel is `<prefix>`, a device function `<prefix>__<its name>`."""
        with _lock:
            if self._functions is None:
                module = self.kernel.module
                main = module.functions[-1]
                prefix = self.prefix
                names = {f.name: f"{prefix}__{f.name}" for f in module.functions[:-1]}
                names[main.name] = prefix
                rename = _RenameCalls(names)
                renamed = [
                    f.replace(name=names[f.name], body=rename.visit(f.body))
                    for f in module.functions
                ]
                self._functions = (renamed[-1], tuple(renamed[:-1]))
            return self._functions

    def kernel_op(self, call: ExternOp) -> KernelOp:
        """The graph node launching the kernel in place of `call`, an ATen call of this op;
        raises NotNative when the plan cannot launch it."""
        function, callees = self.functions()
        given = self._arguments(call)
        values = call.inputs + call.outputs
        refs: dict[str, ArgRef] = {}
        sizes: dict[str, Any] = {}
        for p in self.inputs:
            ref = given[p.name]
            if not isinstance(ref, ArgRef):
                raise NotNative(f"argument {p.name} is not a tensor of the graph")
            v = values[ref.index]
            if v.dtype != p.dtype or len(v.shape) != len(p.shape):
                raise NotNative(f"input {p.name} is {v.dtype.name}{list(v.shape)}")
            refs[p.name] = ref
            for d, actual in zip(p.shape, v.shape):
                name = size_symbol(d)
                if name is not None:
                    sizes.setdefault(name, actual)
        for k, (p, v) in enumerate(zip(self._ordered_outputs(call), call.outputs)):
            if v.type.strides is not None and not is_row_major(v.shape, v.type.strides):
                raise NotNative(f"output {p.name} is not row-major in PyTorch's graph")
            refs[p.name] = ArgRef(len(call.inputs) + k)
        params = {p.name: p for p in self.kernel.signature().params}
        args = []
        for var in function.params:
            p = params[var.name]
            if p.name in refs:
                args.append(refs[p.name])
            elif p.name in sizes:
                args.append(_scalar(p, sizes[p.name]))
            else:
                args.append(_scalar(p, given[p.name]))
        return KernelOp(call.name, call.inputs, call.outputs, function, callees, tuple(args))

    def _arguments(self, call: ExternOp) -> dict[str, Any]:
        """The call's arguments (ArgRefs, expressions, numbers) by parameter name."""
        names = [a.name for a in call.target._schema.arguments]
        given = dict(zip(names, call.args))
        given.update(dict(call.kwargs))
        missing = [p.name for p in self.inputs + self.scalars if p.name not in given]
        if missing:
            raise NotNative(f"the call gives no {', '.join(missing)}")
        return given

    def _ordered_outputs(self, call: ExternOp) -> list[Param]:
        if call.result_paths == ((),):
            return [self.outputs[0]]
        return [self.outputs[path[0]] for path in call.result_paths]


def _scalar(p: Param, value: Any) -> E.Expr:
    """A scalar kernel argument as an expression: a constant, or a size expression."""
    if isinstance(value, E.Expr):
        if not (p.dtype.is_integer and value.dtype.is_integer):
            raise NotNative(f"argument {p.name} is a symbolic {value.dtype.name}")
        return value
    if isinstance(value, bool) and not p.dtype.is_bool:
        raise NotNative(f"argument {p.name} is a bool")
    if not isinstance(value, int | float):
        raise NotNative(f"argument {p.name} is a {type(value).__name__}")
    if p.dtype.is_integer and not (isinstance(value, int) and fits(value, p.dtype)):
        raise NotNative(f"argument {p.name} = {value} is not a {p.dtype.name}")
    return E.const(value, p.dtype)


def _check_size(want: Any, actual: Any, message: str) -> None:
    if isinstance(want, int) and isinstance(actual, int):
        if want != actual:
            raise ValueError(message)
    else:
        torch._check(want == actual, lambda: message)


class _RenameCalls(Mutator):
    def __init__(self, names: dict[str, str]):
        super().__init__()
        self.names = names

    def visit_Call(self, e: E.Call) -> E.Expr:
        e = self.visit_default(e)
        return e.replace(name=self.names[e.name]) if e.name in self.names else e


def _unique_prefix(qualname: str) -> str:
    """The name of an op's kernel in minicomp's modules, unique among registered ops."""
    base = NAME_PREFIX + qualname.replace("::", "_").replace(".", "_")
    prefix, k = base, 1
    while prefix in _prefixes:
        prefix, k = f"{base}_{k}", k + 1
    _prefixes.add(prefix)
    return prefix


def registered_op(target: Any) -> CustomOp | None:
    """The custom op registered from a script kernel that `target` (an OpOverload) calls."""
    schema = getattr(target, "_schema", None)
    if schema is None or schema.overload_name:
        return None
    op = _registry.get(schema.name)
    return op if op is not None and op.opoverload is target else None


def has_script_ops(graph: Graph) -> bool:
    """Whether `graph` calls ops registered from script kernels."""
    return any(isinstance(n, ExternOp) and registered_op(n.target) for n in graph.nodes)


def lower_script_ops(graph: Graph) -> Graph:
    """Calls of ops registered from script kernels as launches of their kernels (KernelOps);
    a call the plan cannot launch stays an ATen call whose reason says why."""
    nodes = []
    for n in graph.nodes:
        op = registered_op(n.target) if isinstance(n, ExternOp) else None
        if op is not None:
            try:
                n = op.kernel_op(n)
            except NotNative as e:
                n = n.replace(reason=f"script kernel op not launched natively: {e}")
        nodes.append(n)
    return graph.replace(nodes=tuple(nodes))


def custom_op(
    qualname: str,
    kernel: ScriptFunction,
    *,
    outputs: Sequence[str] | str,
    backward: Callable | None = None,
) -> CustomOp:
    """Register script kernel `kernel` as the PyTorch operator `qualname` ("namespace::name").

    `outputs` names the kernel's tensor parameters the op allocates and returns; the op takes
    the other tensor parameters, then the scalar parameters no input's shape binds (ints as
    SymInt, floats, bools). `backward(inputs, outputs, grad_outputs)` (optional) returns one
    gradient (or None) per input tensor; `inputs` holds every argument of the op. Registering
    the same kernel under the same name again returns the existing op.
    """
    if not isinstance(kernel, ScriptFunction):
        raise ValueError(f"custom_op registers a script kernel (@minicomp.script), not {kernel!r}")
    sig = kernel.signature()
    where = f"custom_op {qualname!r}"
    if sig.kind != "kernel":
        raise ScriptError(
            f"{where}: {sig.py_name} is a device function (it sets no attrs.grid_dim); an op "
            "launches a kernel",
            kernel._state.source.filename,
            sig.lineno,
        )
    for p in sig.params:
        if p.kind == "pointer":
            raise ScriptError(
                f"{where}: parameter {p.name} is a raw pointer; an op's tensors need shapes, "
                f"so annotate it as a tensor such as {p.dtype.short}[dim.n]",
                kernel._state.source.filename,
                p.lineno,
            )
        if p.kind == "tensor_map":
            raise ScriptError(
                f"{where}: parameter {p.name} is a TMA tensor map; an op's launches inside "
                "compiled graphs pass tensors as pointers, so call the kernel directly instead",
                kernel._state.source.filename,
                p.lineno,
            )
    names = (outputs,) if isinstance(outputs, str) else tuple(outputs)
    tensors = [p.name for p in sig.params if p.kind == "tensor"]
    for name in names:
        if name not in tensors:
            raise ValueError(
                f"{where}: output {name!r} is not a tensor parameter of {sig.py_name} "
                f"({', '.join(tensors)})"
            )
    if not names or len(set(names)) != len(names):
        raise ValueError(f"{where}: outputs must name distinct tensor parameters, got {names}")
    if len(names) == len(tensors):
        raise ValueError(
            f"{where}: the op needs an input tensor (its outputs go on that tensor's device)"
        )
    if backward is not None and not callable(backward):
        raise ValueError(f"{where}: backward must be callable, not {backward!r}")
    with _lock:
        existing = _registry.get(qualname)
        if existing is not None:
            same = (existing.kernel._state is kernel._state, existing.backward is backward)
            if same == (True, True) and tuple(p.name for p in existing.outputs) == names:
                return existing
            raise ValueError(
                f"{where}: the name is already registered for {existing!r}; pick another name"
            )
        op = CustomOp(qualname, kernel, names, backward)
        op.prefix = _unique_prefix(qualname)
        op.functions()  # parse now: a script error shows at registration, not at the first call
        try:
            op._register()
        except RuntimeError as e:
            raise ValueError(f"{where}: PyTorch refused the registration: {e}") from e
        _registry[qualname] = op
        return op
