"""Loading of the backends' C headers, with their local `#include "x.h"` lines inlined."""

import os
import re

BACKENDS_DIR = os.path.dirname(os.path.abspath(__file__))

# Only quoted bare names: system includes (<math.h>) stay as they are.
_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([A-Za-z0-9_]+\.h)"[ \t]*$', re.MULTILINE)


def inline_includes(path: str) -> str:
    """The text of the header at `path`, each `#include "name.h"` line replaced by the text of
    minicomp/backends/name.h (itself expanded the same way), so that a generated source stays a
    single self-contained file: the CPU build compiles one file and NVRTC takes one string."""
    return _expand(path, ())


def _expand(path: str, active: tuple[str, ...]) -> str:
    real = os.path.realpath(path)
    if real in active:
        raise ValueError(f"recursive #include of {path}")
    with open(path, encoding="utf-8") as f:
        text = f.read()

    def splice(m: re.Match) -> str:
        included = _expand(os.path.join(BACKENDS_DIR, m[1]), (*active, real))
        return included.rstrip("\n")

    return _LOCAL_INCLUDE.sub(splice, text)
