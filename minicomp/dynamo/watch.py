"""What Dynamo did during a run, from its own records: the frames it compiled (and why it
compiled one again), its graph breaks with their source lines, and the time it took.

Dynamo keeps all of it, whatever the backend:

- each graph break it resumes after is a `GraphCompileReason` appended to
  `torch._dynamo.utils.graph_break_reasons`: Dynamo's reason and the user's stack at the break
  (its last frame is where the break is);
- each frame compile leaves a `CompilationMetrics` (`torch._dynamo.utils.
  get_compilation_metrics()`): the compile id ("3/1": frame 3, its second compile), the code's
  name, file and first line, the time, the guard failures that made it a recompile
  (`recompile_reason`), and for a frame Dynamo gave up on (a graph break in a loop: the frame
  runs eagerly) the failure and its user line;
- a backward graph compiled at the first backward() leaves one with `is_forward` False.

`watching()` notes what those held when it starts and gives what was added when it ends.
`torch._dynamo.reset()` during the run empties the graph-break list, so breaks before a reset
are lost; Dynamo keeps only the last 64 metrics by default, so watching raises that limit for
its duration. Fields missing from an older PyTorch read as absent.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

# Dynamo's text between the graph break it reports and one that occurred handling it.
_ANOTHER = "*** While handling this graph break, another graph break occurred: ***"
# The code Dynamo makes to resume a function after a graph break.
_RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<name>.+)_at_(?P<line>\d+)$")
_METRICS_LIMIT = 100_000


def function_name(code_name: str) -> str:
    """A code object's name as the user knows it: Dynamo's resume functions are named
    after the function and the line they resume after."""
    m = _RESUME.match(code_name)
    return f"{m['name']} (resumed after line {m['line']})" if m else code_name


def headline(reason: str) -> str:
    """Dynamo's reason in one line: each graph break's title and its explanation."""
    parts = []
    for segment in reason.split(_ANOTHER):
        lines = [line.strip() for line in segment.strip().splitlines() if line.strip()]
        if not lines:
            continue
        explained = [line for line in lines[1:] if line.startswith("Explanation:")]
        text = lines[0]
        if explained:
            text += ": " + explained[0].removeprefix("Explanation:").strip()
        parts.append(text)
    return " -> then ".join(parts)


def hint(reason: str) -> str:
    """Dynamo's first hint for the graph break, or ""."""
    for line in reason.splitlines():
        if line.strip().startswith("Hint:"):
            return line.strip().removeprefix("Hint:").strip()
    return ""


@dataclass(frozen=True)
class GraphBreak:
    """One place Dynamo broke the graph: where, in the user's code, and Dynamo's reason."""

    reason: str  # Dynamo's full text
    filename: str
    lineno: int | None
    function: str  # the user's function holding the break
    line: str = ""  # the source line
    skipped_frame: bool = False  # Dynamo gave up on the frame, which runs eagerly
    hits: int = 1  # how many times Dynamo met it (once per compile of its frame)

    @property
    def where(self) -> str:
        return f"{self.filename}:{self.lineno}"


@dataclass(frozen=True)
class FrameCompile:
    """One compile of one frame by Dynamo."""

    compile_id: str  # "frame/compile": a compile after the first is a recompile
    function: str  # as the user knows it (function_name)
    filename: str
    firstlineno: int | None
    seconds: float | None  # Dynamo's whole compile of the frame, minicomp included
    recompile_reason: str = ""  # the guard failures that made Dynamo compile it again
    failure: str = ""  # why Dynamo gave up on it ("" when it compiled)

    @property
    def where(self) -> str:
        return f"{self.filename}:{self.firstlineno}"


@dataclass
class DynamoRun:
    """What Dynamo did while `watching()` was open."""

    frames: list[FrameCompile] = field(default_factory=list)
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    backward_seconds: float = 0.0  # backward graphs compiled at their first backward()

    @property
    def recompiles(self) -> list[FrameCompile]:
        """The frame compiles that were recompiles, each with Dynamo's guard failures."""
        return [f for f in self.frames if f.recompile_reason]

    @property
    def compile_seconds(self) -> float:
        """Dynamo's compile time over the run: every frame compile and backward graph."""
        return sum(f.seconds or 0.0 for f in self.frames) + self.backward_seconds

    def frame(self, compile_id: str) -> FrameCompile | None:
        """The frame compile with this id, or None."""
        return next((f for f in self.frames if f.compile_id == compile_id), None)


@contextlib.contextmanager
def watching() -> Iterator[DynamoRun]:
    """A DynamoRun filled, when the block ends, with the frames Dynamo compiled in it and the
    graph breaks it met."""
    from torch._dynamo import utils

    run = DynamoRun()
    breaks_before = list(utils.graph_break_reasons)
    metrics_before = utils.get_compilation_metrics()
    kept = getattr(getattr(utils, "_compilation_metrics", None), "maxlen", None)
    if kept is not None:
        utils.set_compilation_metrics_limit(max(kept, _METRICS_LIMIT))
    try:
        yield run
    finally:
        new = [m for m in utils.get_compilation_metrics() if not _among(m, metrics_before)]
        if kept is not None:
            utils.set_compilation_metrics_limit(kept)
        breaks = [r for r in utils.graph_break_reasons if not _among(r, breaks_before)]
        _fill(run, breaks, new)


def _among(x: Any, items: list) -> bool:
    return any(x is y for y in items)


def _fill(run: DynamoRun, reasons: list, metrics: list) -> None:
    """`run` with the graph breaks of these GraphCompileReasons and the frame compiles of
    these CompilationMetrics."""
    found: dict[tuple, GraphBreak] = {}
    for r in reasons:
        stack = list(getattr(r, "user_stack", None) or [])
        last = stack[-1] if stack else None
        brk = GraphBreak(
            reason=str(r.reason),
            filename=getattr(last, "filename", "?"),
            lineno=getattr(last, "lineno", None),
            function=function_name(getattr(last, "name", "?")),
            line=(getattr(last, "line", "") or "").strip(),
        )
        _add(found, brk)
    for m in metrics:
        name = getattr(m, "co_name", None)
        if getattr(m, "is_forward", True) is False or name is None:
            run.backward_seconds += (getattr(m, "duration_us", None) or 0) / 1e6
            continue
        seconds = getattr(m, "entire_frame_compile_time_s", None)
        failure = getattr(m, "fail_reason", None) or ""
        run.frames.append(
            FrameCompile(
                compile_id=str(getattr(m, "compile_id", "") or ""),
                function=function_name(name),
                filename=getattr(m, "co_filename", None) or "?",
                firstlineno=getattr(m, "co_firstlineno", None),
                seconds=seconds,
                recompile_reason=getattr(m, "recompile_reason", None) or "",
                failure=failure,
            )
        )
        filename = getattr(m, "fail_user_frame_filename", None)
        if failure and filename and getattr(m, "fail_type", None) == "Unsupported":
            lineno = getattr(m, "fail_user_frame_lineno", None)
            line = _source_line(filename, lineno)
            brk = GraphBreak(failure, filename, lineno, function_name(name), line, True)
            _add(found, brk)
    run.graph_breaks = list(found.values())


def _add(found: dict, brk: GraphBreak) -> None:
    key = (brk.filename, brk.lineno, headline(brk.reason))
    seen = found.get(key)
    skipped = brk.skipped_frame or (seen is not None and seen.skipped_frame)
    found[key] = brk if seen is None else replace(seen, hits=seen.hits + 1, skipped_frame=skipped)


def _source_line(filename: str, lineno: int | None) -> str:
    import linecache

    return linecache.getline(filename, lineno).strip() if lineno else ""
