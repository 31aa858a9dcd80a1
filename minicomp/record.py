"""What happened while compiling one graph, and its stage-by-stage text.

The compiler fills a CompileRecord as it goes; the torch.compile backend keeps the records
its callers ask for, and `minicomp.explain` and the verbose log print them.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from minicomp.backends.cache import describe_builder
from minicomp.config import Options
from minicomp.ir.func import Function
from minicomp.ir.graph import ExternOp, FusedOp, Graph
from minicomp.ir.printer import function_str


@dataclass
class CompileRecord:
    """What happened while compiling one graph; `report` prints it."""

    kind: str = "forward"  # AOTAutograd's compiler: forward, backward or inference
    compile_id: str = ""  # Dynamo's id of the frame compile it came from ("3/1"), if any
    aten_graph: str = ""
    aten_op_count: int = 0
    aten_ops: dict[str, int] = field(default_factory=dict)  # ATen op -> its nodes in the graph
    passes: list = field(default_factory=list)  # (name, seconds, graph text)
    graph: Graph | None = None
    kernels: list[Function] = field(default_factory=list)
    source: str = ""
    times: dict[str, float] = field(default_factory=dict)
    error: str = ""
    target: str = ""  # the name of the target the graph was compiled for
    plan: Any = None  # what runs the graph: a Plan, or a GraphedPlan on cuda
    trace: bool = False  # keep the graph text after every pass (explain, diagnostics)
    options: Options | None = None  # what the graph was compiled with
    tuning: list = field(default_factory=list)  # (group, template, tune.tuner.Choice)
    estimates: dict[str, str] = field(default_factory=dict)  # kernel -> the lens's estimate
    cache: str = ""  # what the whole-graph cache did: hit, stored, off or not kept (why)
    builds: list = field(default_factory=list)  # backends.cache.BuildEvent of each binary

    @property
    def fallbacks(self) -> dict[str, str]:
        """ATen operator -> why it runs as an ATen call, in the compiled graph."""
        if self.graph is None:
            return {}
        return {n.name: n.reason for n in self.graph.nodes if isinstance(n, ExternOp)}


def fused_groups(r: CompileRecord) -> str:
    """One line per fused group of the compiled graph: its kernel's name, the ops it computes."""
    groups = [n for n in r.graph.nodes if isinstance(n, FusedOp)] if r.graph else []
    return "\n".join(f"{g.name}: {', '.join(g.members)}" for g in groups) or "(none)"


def aten_calls(r: CompileRecord) -> str:
    """One line per op of the compiled graph run as an ATen call, and why."""
    return "\n".join(f"{name}: {reason}" for name, reason in r.fallbacks.items()) or "(none)"


def builds(r: CompileRecord) -> str:
    """Where the graph's binaries came from: built by this process or found in the build
    cache, and by whom (the rank, in a distributed job); "" when nothing was built."""
    counts = Counter(
        "built by " + describe_builder(e.builder)
        if e.built
        else "from the cache, built by " + describe_builder(e.builder)
        for e in r.builds
    )
    return ", ".join(f"{n} {text}" for text, n in counts.items())


def tuning(r: CompileRecord) -> str:
    """The template config of each tuned group, and how it was chosen."""
    lines = [
        f"{group}: {template} {c.config}\n    {c.describe()}" for group, template, c in r.tuning
    ]
    return "\n".join(lines) or "(none)"


def graph_files(r: CompileRecord) -> dict[str, str]:
    """What compiling graph `r` did, as files (relative path -> text): aten_graph.py,
    passes/<nn>-<pass>.txt, graph_ir.txt, fused_groups.txt, aten_calls.txt, tuning.txt,
    kernels/<kernel>.txt, source.c (cpu) or source.cu, and error.txt, each where there is one.
    The layout `minicomp explain --out` and the debug directory share."""
    files = {"aten_graph.py": r.aten_graph}
    for k, (name, seconds, text) in enumerate(r.passes):
        files[f"passes/{k:02d}-{file_name(name)}.txt"] = f"# {seconds * 1e3:.1f} ms\n{text}"
    if r.graph is not None:
        files["graph_ir.txt"] = str(r.graph)
        files["fused_groups.txt"] = fused_groups(r)
        files["aten_calls.txt"] = aten_calls(r)
    if r.tuning:
        files["tuning.txt"] = tuning(r)
    for k in r.kernels:
        files[f"kernels/{file_name(k.name)}.txt"] = function_str(k)
    if r.source:
        files["source.c" if r.target == "cpu" else "source.cu"] = r.source
    if r.error:
        files["error.txt"] = r.error
    return files


def write_files(folder: str, files: dict[str, str]) -> list[str]:
    """Write each text of `files` (relative path -> text) under `folder`; the paths written."""
    written = []
    for relative, text in files.items():
        path = os.path.join(folder, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        written.append(path)
    return written


def file_name(text: str) -> str:
    """`text` made safe as a file name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "_"


def _section(title: str, body: str) -> str:
    return f"==== {title} ====\n{body.rstrip()}\n"


def report(r: CompileRecord) -> str:
    """The stage-by-stage text of one CompileRecord."""
    parts = [_section(f"{r.kind} graph: ATen ({r.aten_op_count} ops)", r.aten_graph)]
    for name, seconds, text in r.passes:
        parts.append(_section(f"graph IR after {name} ({seconds * 1e3:.1f} ms)", text))
    if r.graph is not None:
        count = sum(isinstance(n, FusedOp) for n in r.graph.nodes)
        parts.append(_section(f"fused groups ({count})", fused_groups(r)))
        parts.append(_section(f"ops run by ATen ({len(r.fallbacks)})", aten_calls(r)))
    if r.tuning:
        parts.append(_section(f"template configs ({len(r.tuning)})", tuning(r)))
    if r.estimates:
        lines = [f"{name}: {text}" for name, text in r.estimates.items()]
        parts.append(_section("estimated time per launch (the lens)", "\n".join(lines)))
    for k in r.kernels:
        title = f"kernel IR: {k.name}"
        if k.name in r.estimates:
            title += f" (estimated {r.estimates[k.name]})"
        parts.append(_section(title, function_str(k)))
    if r.source:
        parts.append(_section("generated source", r.source))
    if r.cache:
        parts.append(_section("graph cache", r.cache))
    if r.builds:
        parts.append(_section("binaries", builds(r)))
    if r.times:
        parts.append(
            _section(
                "compile time", "\n".join(f"{k}: {v * 1e3:.1f} ms" for k, v in r.times.items())
            )
        )
    if r.error:
        parts.append(_section("fell back to eager", r.error))
    return "\n".join(parts)


def split_header(source: str) -> tuple[str, str, str]:
    """(the header's file name, its text, `source` without it) for a generated source that
    carries a runtime header (the cpu target's runtime.h, the CUDA targets' device.h), else
    ("", "", source)."""
    if not source:
        return "", "", source
    # Imported here: the backends load with the first compile, not with `import minicomp`.
    from minicomp.backends.cpu.codegen import runtime_header
    from minicomp.backends.cuda.codegen import device_header

    for name, text in (("runtime.h", runtime_header()), ("device.h", device_header())):
        header = text.strip("\n")
        if header and header in source:
            return name, header, source.replace(header, HEADER_MARK, 1)
    return "", "", source


# Where split_header took the header out, for the caller to put a note or an #include.
HEADER_MARK = "\0minicomp header\0"


def elided(body: str, name: str) -> str:
    """`body` (split_header's third part) with a one-line note where the header was."""
    note = (
        f"/* {name}, minicomp's runtime header (the same in every graph), left out: "
        f"`minicomp explain --out DIR` writes it once as DIR/{name} */"
    )
    return body.replace(HEADER_MARK, note)


def header_elided(source: str) -> str:
    """`source` with its runtime header replaced by a one-line note."""
    name, _, body = split_header(source)
    return elided(body, name)
