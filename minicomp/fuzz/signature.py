"""What identifies a failure across programs: its status and a pattern of its message with
the numbers, names and paths that vary between programs taken out."""

from __future__ import annotations

import re

_PATTERN_CHARS = 160


def innermost(exc: BaseException) -> BaseException:
    """The exception at the bottom of a chain: what minicomp raised under Dynamo's wrappers."""
    seen = {id(exc)}
    while True:
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is None or id(inner) in seen:
            return exc
        seen.add(id(inner))
        exc = inner


def normalize(text: str) -> str:
    """The first line of a message with addresses, paths and numbers replaced."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else ""
    line = re.sub(r"0x[0-9a-fA-F]+", "ADDR", line)
    line = re.sub(r"(?:/[\w.+\-]+){2,}", "PATH", line)
    line = re.sub(r"\d+", "N", line)
    return line[:_PATTERN_CHARS]


def error_pattern(exc: BaseException) -> str:
    """`ExceptionType: normalized message` of the innermost exception."""
    inner = innermost(exc)
    return f"{type(inner).__name__}: {normalize(str(inner))}"
