"""Script functions: the `@script` decorator, the parsed IR and module, and kernel launches."""

from __future__ import annotations

import functools
import threading
from typing import Any

from minicomp.backends.cuda.codegen import render_module
from minicomp.ir.expr import Call, Expr
from minicomp.ir.func import Function, Module
from minicomp.ir.functor import Mutator
from minicomp.passes.kernel.simplify_indices import simplify_indices
from minicomp.script.errors import Source
from minicomp.script.lang import ScriptFunctionBase
from minicomp.script.parser import FunctionParser
from minicomp.script.signature import Signature, c_name, parse_signature

# Runs a kernel called from Python: script/launch.py registers it (`set_launcher`) when
# imported, which importing any module of minicomp.script does (the package imports it). It
# sits above the targets it builds through, which the language sits below.
_launcher: Any = None


def set_launcher(launch: Any) -> None:
    """Make `launch(script_function, args, kwargs)` run kernels called from Python."""
    global _launcher
    _launcher = launch


class _State:
    """What every view of one script function shares: source, signature, IR and builds."""

    def __init__(self, fn, params: tuple = ()):
        self.fn = fn
        self.params = tuple(params)
        self.lock = threading.RLock()
        self._source: Source | None = None
        self._signature: Signature | None = None
        self._ir: Function | None = None
        self._callees: list[ScriptFunction] = []
        self._module: Module | None = None
        self._cuda_source: str | None = None
        self.builds: dict[tuple, Any] = {}
        self.launcher = None

    @property
    def source(self) -> Source:
        with self.lock:
            if self._source is None:
                self._source = Source.of(self.fn)
            return self._source

    @property
    def signature(self) -> Signature:
        with self.lock:
            if self._signature is None:
                self._signature = parse_signature(self.source, self.fn, self.params)
            return self._signature

    def parse(self) -> tuple[Function, list[ScriptFunction]]:
        with self.lock:
            if self._ir is None:
                parser = FunctionParser(self)
                # Task-mapping indices such as (t // 16 * 4 + i) % 4 fold to i under the
                # loops' bounds, so register tensors keep constant indices (and registers).
                self._ir = simplify_indices(parser.parse())
                self._callees = list(parser.callees.values())
            return self._ir, self._callees


class ScriptFunction(ScriptFunctionBase):
    """A function written in the script DSL: a kernel (it sets `attrs.grid_dim` and
    `attrs.block_dim`) or a device function (callable from other script functions).

    Parsing is lazy: the first use of `ir`, `module`, `source` or a launch parses it (errors
    are ScriptErrors at the script's line). Calling a kernel with torch tensors and Python
    numbers launches it: on `cuda` for CUDA tensors, in the emulator (`cuda-emu`) for CPU
    tensors, or on the target given by `with_target` (or the `target` option when it names
    one of them; minicomp.targets.script_target). Each target's build is made once per
    kernel and reused.
    """

    def __init__(
        self, fn, target: str | None = None, *, params: tuple = (), _state: _State | None = None
    ):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.target = target
        self._state = _state or _State(fn, params)

    def signature(self) -> Signature:
        """Parameters, kind and name, from the annotations alone."""
        return self._state.signature

    @property
    def kind(self) -> str:
        """ "kernel" or "device"."""
        return self.signature().kind

    @property
    def ir(self) -> Function:
        """The kernel-IR Function."""
        return self._state.parse()[0]

    @property
    def module(self) -> Module:
        """The IR module: the device functions it calls (transitively), then this function.
        Device functions are renamed there to their Python names (numbered when two differ
        but share a name)."""
        state = self._state
        with state.lock:
            if state._module is None:
                ir, todo = state.parse()
                found: dict[_State, tuple[str, Function]] = {}
                todo = list(todo)
                while todo:
                    sf = todo.pop(0)
                    if sf._state in found or sf._state is state:
                        continue
                    callee_ir, more = sf._state.parse()
                    found[sf._state] = (sf.signature().py_name, callee_ir)
                    todo += more
                main = (self.signature().py_name, ir)
                state._module = _final_names(main, list(found.values()))
            return state._module

    @property
    def source(self) -> str:
        """The CUDA C source of `module` (device header included)."""
        state = self._state
        with state.lock:
            if state._cuda_source is None:
                state._cuda_source = render_module(self.module)
            return state._cuda_source

    def with_target(self, target: str | None) -> ScriptFunction:
        """This kernel launching on `target` ("cuda" or "cuda-emu"; None: by the tensors)."""
        return ScriptFunction(self.fn, target, _state=self._state)

    def __call__(self, *args, **kwargs) -> None:
        _launcher(self, args, kwargs)

    def __repr__(self) -> str:
        target = f", target={self.target!r}" if self.target else ""
        return f"<script function {self.fn.__qualname__}{target}>"


class _Rename(Mutator):
    def __init__(self, names: dict[str, str]):
        super().__init__()
        self.names = names

    def visit_Call(self, e: Call) -> Expr:
        e = self.visit_default(e)
        return e.replace(name=self.names[e.name]) if e.name in self.names else e


def _final_names(main: tuple[str, Function], callees: list[tuple[str, Function]]) -> Module:
    """The module of function `main` and its device functions, these under their Python
    names (main and callees are (Python name, IR) pairs)."""
    kernel = main[1] if main[1].kind == "kernel" else None
    taken = {kernel.name} if kernel is not None else set()
    names = {}
    for py_name, f in callees + ([] if kernel is not None else [main]):
        base = name = c_name(py_name)
        k = 1
        while name in taken:
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        names[f.name] = name
    rename = _Rename(names)
    functions = [f for _, f in callees] + [main[1]]
    final = [
        f.replace(name=names.get(f.name, f.name), body=rename.visit(f.body)) for f in functions
    ]
    return Module(final[-1].name, tuple(final))


def script(fn=None, *, target: str | None = None, params: tuple = ()):
    """Decorator: `@script` or `@script(target="cuda-emu")` turns a typed Python function
    into a ScriptFunction (a kernel or a device function of the script DSL).

    `params` (kernel-IR Vars) are appended to the function's IR parameters; the script reaches
    them through IR expressions and macros of its scope (minicomp.script.lang.macro), which is
    how templates take the buffers and sizes of the fused group they compute."""
    if fn is None:
        return lambda f: script(f, target=target, params=params)
    if isinstance(fn, ScriptFunction):
        return fn.with_target(target) if target else fn
    if not callable(fn) or not hasattr(fn, "__code__"):
        raise TypeError(f"@script decorates a Python function, not {fn!r}")
    return ScriptFunction(fn, target, params=params)
