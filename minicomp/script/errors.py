"""Errors of the script DSL, located at the line of the script that caused them."""

from __future__ import annotations

import ast
import inspect
import linecache
import textwrap
from dataclasses import dataclass


class ScriptError(ValueError):
    """A script that does not compile, or a launch whose arguments do not fit the kernel.

    The message starts with `file:line:` of the script's own source, followed by the source
    line itself. `filename`, `lineno` and `reason` (the message alone) are attributes.
    """

    def __init__(self, reason: str, filename: str | None = None, lineno: int | None = None):
        self.reason = reason
        self.filename = filename
        self.lineno = lineno
        text = reason if filename is None else f"{filename}:{lineno}: {reason}"
        line = linecache.getline(filename, lineno).strip() if filename and lineno else ""
        super().__init__(f"{text}\n    {line}" if line else text)


class Issue(Exception):
    """A problem found by a helper that does not know where it is; the parser turns it into a
    ScriptError at the construct it was handling."""


@dataclass
class Source:
    """The parsed source of one script function, with line numbers of its file."""

    filename: str
    tree: ast.FunctionDef

    @staticmethod
    def of(fn) -> Source:
        """The source of function `fn` (decorators included, indentation removed)."""
        try:
            filename = inspect.getsourcefile(fn) or inspect.getfile(fn)
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError) as e:
            raise ScriptError(
                f"cannot read the source of {getattr(fn, '__qualname__', fn)!r} ({e}); a script "
                "function must be defined in a file"
            ) from None
        tree = ast.parse(textwrap.dedent("".join(lines)))
        ast.increment_lineno(tree, first - 1)
        defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        if len(defs) != 1 or isinstance(defs[0], ast.AsyncFunctionDef):
            raise ScriptError(f"{fn.__qualname__} is not a plain function", filename, first)
        return Source(filename, defs[0])

    def error(self, node: ast.AST | None, reason: str) -> ScriptError:
        """A ScriptError at `node` (the function's definition when None)."""
        line = getattr(node, "lineno", None) or self.tree.lineno
        return ScriptError(reason, self.filename, line)
