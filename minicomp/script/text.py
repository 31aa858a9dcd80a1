"""Script functions from text: the kernel IR's printed form (minicomp.ir.printer) read back.

`parse_function(text)` parses the one function `text` defines, `parse_module(text, name)`
several (device functions before their callers), exactly as written: the IR a name gets is
the name written (device functions are not renamed apart), and the parse skips the index
simplification that `@script` functions get. The text sees the language's names (the
primitives of minicomp.script.lang, .hopper, .cluster and .wgmma, the types of
minicomp.script.types) and the module `math` (the printer writes infinities as `math.inf`);
errors are ScriptErrors at its lines, under a file name such as `<script text 3>`.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import linecache
import math
import types

from minicomp.ir.func import Function, Module
from minicomp.script import cluster, hopper, lang, tma, wgmma
from minicomp.script import types as script_types
from minicomp.script.errors import ScriptError
from minicomp.script.function import ScriptFunction
from minicomp.script.parser import FunctionParser
from minicomp.script.signature import c_name

_texts = itertools.count(1)


def parse_function(text: str) -> Function:
    """The kernel-IR function of the one script function `text` defines."""
    functions = parse_module(text, "").functions
    if len(functions) != 1:
        raise ScriptError(f"the text defines {len(functions)} functions, not one")
    return functions[0]


def parse_module(text: str, name: str) -> Module:
    """The module `name` of the script functions `text` defines, in their order; calls
    between them are to the functions defined before."""
    filename = f"<script text {next(_texts)}>"
    lines = text.splitlines(keepends=True)
    # inspect (Source.of) and error messages read the text through linecache.
    linecache.cache[filename] = (len(text), None, lines, filename)
    try:
        tree = ast.parse(text, filename)
        names = [d.name for d in tree.body if isinstance(d, ast.FunctionDef)]
        if len(names) != len(tree.body):
            raise ScriptError("script text holds function definitions only", filename, 1)
        scope = _namespace()
        exec(compile(tree, filename, "exec"), scope)  # noqa: S102 - the caller's own text
        functions = []
        for py_name in names:
            fn = scope[py_name]
            if not isinstance(fn, types.FunctionType):
                raise ScriptError(f"{py_name} is not a plain function", filename, 1)
            sf = ScriptFunction(fn)
            state = sf._state
            # The IR name is the name written, also for a device function.
            state._signature = dataclasses.replace(state.signature, name=c_name(py_name))
            scope[py_name] = sf  # calls from the functions after it
            functions.append(FunctionParser(state).parse())
        return Module(name, tuple(functions))
    finally:
        del linecache.cache[filename]


def _namespace() -> dict:
    """The names a script text sees: the language's primitives and types, and `math`."""
    primitive = (lang.Primitive, lang.LaunchIndex, lang.Attrs, lang.Dims)
    scope = {k: v for k, v in vars(lang).items() if isinstance(v, primitive)}
    scope.update(lang.MATH)
    scope.update({p.name: p for p in hopper.PRIMITIVES})
    scope.update({p.name: p for p in cluster.PRIMITIVES})
    scope.update({p.name: p for p in tma.PRIMITIVES}, tensor_map=script_types.tensor_map)
    scope.update({p.name: p for p in wgmma.PRIMITIVES})
    scope.update({repr(t): t for t in script_types.SCALAR_TYPES})
    scope.update(ptr=script_types.ptr, math=math)
    return scope
