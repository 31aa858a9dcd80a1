"""`minicomp.explain`: what minicomp did to a function or a script, the first questions first.

`str(explanation)` is the summary. For each graph: its kind and the frame Dynamo found it in,
the ATen ops in it, the kernels out, the calls it makes to ATen grouped by why, what the
graph cache did and the compile time of each stage. Then for the whole run, from Dynamo's own
records (dynamo/watch.py): the graph breaks with their source lines and reasons, the
recompiles with the guard failures behind them, and the total compile time.

The rest comes on request: `ir()` (the graph after the last pass and every kernel's IR),
`source()`, `after_pass(name)`, `report()` (every stage of every graph) and `write(directory)`
(all of it as files). The runtime header every generated source starts with is left out of
each graph's source, named once instead.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minicomp import config
from minicomp.dynamo.importer import HIGHER_ORDER_REASON, SCRIPT_OP_REASON, UNBACKED_REASON
from minicomp.dynamo.watch import DynamoRun, GraphBreak, headline, hint, watching
from minicomp.ir.graph import ExternOp, FusedOp
from minicomp.ir.printer import function_str
from minicomp.lens.session import recording
from minicomp.passes.graph.library_calls import BY_DESIGN
from minicomp.record import (
    HEADER_MARK,
    CompileRecord,
    builds,
    graph_files,
    header_elided,
    report,
    split_header,
    write_files,
)

BY_DESIGN_GROUP = "by design"
VIEWS = "zero-copy views"
# Why an op is an ATen call, as the summary groups them: (group, prefixes of its reasons),
# most deliberate first. Any other reason (NO_LOWERING, or a lowering that does not take
# these arguments) is "unsupported".
REASON_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (BY_DESIGN_GROUP, (BY_DESIGN, "oneDNN ")),  # library_calls.py, onednn_calls/linear.py
    (
        "measured faster",  # aten_contraction.py, attention.py: tuning timed both
        (
            "cuBLAS measured faster",
            "PyTorch's attention measured faster",
            "operand of ",
            "result of ",
        ),
    ),
    (VIEWS, ("a view of its input's memory",)),  # alias_views.py
    (
        "effects, custom ops, data-dependent sizes",  # the importer
        (
            "returns nothing",
            "runs with effects",
            UNBACKED_REASON,
            SCRIPT_OP_REASON,
            HIGHER_ORDER_REASON,
        ),
    ),
    ("kernel failed to compile", ("its fused kernel failed to compile",)),  # group_fallback.py
)
UNSUPPORTED = "unsupported"
DETAILS = (
    "details: minicomp explain --ir | --source | --pass NAME | --out DIR "
    "(in Python: .ir(), .source(), .after_pass(name), .write(dir), .report())"
)
# How many names a summary line lists before saying how many more there are.
_LISTED = 8


def reason_group(reason: str) -> str:
    """The group of REASON_GROUPS an ATen call with this reason is counted in."""
    for group, prefixes in REASON_GROUPS:
        if reason.startswith(prefixes):
            return group
    return UNSUPPORTED


@dataclass
class Explanation:
    """Every graph minicomp compiled in a run, and what Dynamo did around them; `str()` is
    the summary."""

    records: list = field(default_factory=list)
    dynamo: DynamoRun = field(default_factory=DynamoRun)

    @property
    def kernel_count(self) -> int:
        """Kernels minicomp generated, over every graph."""
        return sum(len(r.kernels) for r in self.records)

    @property
    def aten_op_count(self) -> int:
        """ATen ops in the graphs minicomp received (before its passes)."""
        return sum(r.aten_op_count for r in self.records)

    @property
    def fused_groups(self) -> list[tuple[str, tuple[str, ...]]]:
        """Each generated kernel's name with the kinds of ATen operator it fused (each named
        once, in graph order), over every graph."""
        return [
            (n.name, tuple(dict.fromkeys(m.split(".")[0] for m in n.members)))
            for r in self.records
            if r.graph is not None
            for n in r.graph.nodes
            if isinstance(n, FusedOp)
        ]

    @property
    def aten_call_count(self) -> int:
        """Calls made to ATen per run of every graph once, zero-copy views included."""
        return sum(len(_externs(r)) for r in self.records)

    @property
    def fallbacks(self) -> dict[str, str]:
        """ATen operator → why it runs as an ATen call instead of a generated kernel."""
        out: dict[str, str] = {}
        for r in self.records:
            for name, reason in r.fallbacks.items():
                out.setdefault(name, reason)
            if r.error:
                out.setdefault("<whole graph>", r.error)
        return out

    @property
    def graph_breaks(self) -> list[GraphBreak]:
        """Where Dynamo broke the graph, with its reasons (dynamo/watch.py)."""
        return self.dynamo.graph_breaks

    @property
    def recompiles(self) -> list:
        """The frames Dynamo compiled again, each with the guard failures that made it."""
        return self.dynamo.recompiles

    @property
    def pass_names(self) -> list[str]:
        """The passes that ran, in order, each once."""
        return list(dict.fromkeys(name for r in self.records for name, _, _ in r.passes))

    def __str__(self) -> str:
        return self.summary()

    def summary(self) -> str:
        """Per graph where it came from, ops in, kernels out, ATen calls by reason, the graph
        cache and compile times; then the run's graph breaks, recompiles and compile time."""
        parts = [self.headline()]
        parts += [self._graph_summary(k, r) for k, r in enumerate(self.records, 1)]
        parts.append(self._run_summary())
        return "\n\n".join(p for p in parts if p)

    def ir(self) -> str:
        """Each graph's IR after its last pass, then each of its kernels' IR."""
        parts = []
        for k, r in enumerate(self.records, 1):
            if r.graph is not None:
                parts.append(
                    _section(f"graph {k} ({r.kind}): graph IR after the last pass", str(r.graph))
                )
            if r.tuning:
                lines = [f"{g}: {t} {c.config}\n    {c.describe()}" for g, t, c in r.tuning]
                parts.append(_section(f"graph {k}: template configs", "\n".join(lines)))
            for f in r.kernels:
                title = f"graph {k}: kernel IR: {f.name}"
                if f.name in r.estimates:
                    title += f" (estimated {r.estimates[f.name]})"
                parts.append(_section(title, function_str(f)))
        return "\n".join(parts) or "(no graph IR: minicomp compiled nothing)"

    def source(self) -> str:
        """Each graph's generated source, its runtime header left out and named."""
        parts = []
        for k, r in enumerate(self.records, 1):
            if r.source:
                title = f"graph {k} ({r.kind}): generated source"
                parts.append(_section(title, header_elided(r.source)))
        return "\n".join(parts) or "(no generated source: minicomp generated no kernel)"

    def after_pass(self, name: str) -> str:
        """Each graph's IR after pass `name` (each time it ran). Raises ValueError naming the
        passes that ran when none is called `name`."""
        known = self.pass_names
        if name not in known:
            ran = ", ".join(known) if known else "none (no graph traced its passes)"
            raise ValueError(f"no pass named {name!r} ran; the passes that ran: {ran}")
        parts = []
        for k, r in enumerate(self.records, 1):
            runs = [(s, text) for p, s, text in r.passes if p == name]
            for n, (seconds, text) in enumerate(runs, 1):
                which = f", run {n} of {len(runs)}" if len(runs) > 1 else ""
                title = (
                    f"graph {k} ({r.kind}): graph IR after {name} ({seconds * 1e3:.1f} ms{which})"
                )
                parts.append(_section(title, text))
        return "\n".join(parts)

    def report(self) -> str:
        """Every stage of every graph (record.report), each runtime header left out, then
        the summary."""
        parts = []
        for r in self.records:
            parts.append(report(dataclasses.replace(r, source=header_elided(r.source))))
        return "\n".join([*parts, self.summary()])

    def write(self, directory: str) -> list[str]:
        """Everything as files under `directory`: the summary, each runtime header once, and a
        folder per graph with its ATen graph, the IR after every pass, the final graph IR,
        each kernel's IR and its source. Returns the paths written."""
        return _write(self, directory)

    def headline(self) -> str:
        """One line: the graphs compiled, ATen ops in, kernels out, calls made to ATen."""
        if not self.records:
            return "minicomp compiled nothing in this run"
        kinds = Counter(r.kind for r in self.records)
        by_kind = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        return (
            f"minicomp compiled {len(self.records)} graph{_s(len(self.records))} ({by_kind}): "
            f"{self.aten_op_count} ATen ops in -> {self.kernel_count} kernels out, "
            f"{self.aten_call_count} calls made to ATen"
        )

    def _graph_summary(self, k: int, r: CompileRecord) -> str:
        lines = [f"graph {k} of {len(self.records)}: {r.kind}{self._origin(r)}"]
        ops = ", ".join(_counted(r.aten_ops)) if r.aten_ops else ""
        lines.append(_field("ops in the graph", f"{r.aten_op_count} ATen ops" + _colon(ops)))
        if r.error:
            lines.append(_field("runs eagerly", r.error))
        else:
            names = [_kernel_name(f) for f in r.kernels]
            lines.append(_field("kernels out", f"{len(names)}" + _colon(_listed(names))))
            lines += _aten_calls(r)
        if r.cache:
            lines.append(_field("graph cache", r.cache))
        if r.builds:
            lines.append(_field("binaries", builds(r)))
        if r.times:
            total = sum(r.times.values())
            stages = ", ".join(f"{stage} {s * 1e3:.1f}" for stage, s in r.times.items())
            lines.append(_field("compile time", f"{total * 1e3:.1f} ms ({stages} ms)"))
        return "\n".join(lines)

    def _origin(self, r: CompileRecord) -> str:
        if not r.compile_id:
            return ""
        frame = self.dynamo.frame(r.compile_id)
        if frame is None:
            return f", from Dynamo's frame compile {r.compile_id}"
        again = ", a recompile" if frame.recompile_reason else ""
        return (
            f", from {frame.function} at {_path(frame.filename)}:{frame.firstlineno} "
            f"(Dynamo compile {r.compile_id}{again})"
        )

    def _run_summary(self) -> str:
        lines = []
        breaks = self.graph_breaks
        lines.append(f"graph breaks: {len(breaks)}" + ("" if breaks else " (Dynamo saw none)"))
        for b in breaks:
            skipped = " [Dynamo skipped the frame: it runs eagerly]" if b.skipped_frame else ""
            lines.append(f"  {_path(b.filename)}:{b.lineno} in {b.function}{skipped}")
            if b.line:
                lines.append(f"      {b.line}")
            lines.append(f"    {headline(b.reason)}")
            if hint(b.reason):
                lines.append(f"    hint: {hint(b.reason)}")
        recompiles = self.recompiles
        lines.append(f"recompiles: {len(recompiles)}")
        for f in recompiles:
            why = "; ".join(_guard_failures(f.recompile_reason))
            lines.append(
                f"  {f.function} at {_path(f.filename)}:{f.firstlineno} "
                f"(Dynamo compile {f.compile_id}): {why}"
            )
        ours = sum(sum(r.times.values()) for r in self.records)
        dynamo = self.dynamo.compile_seconds
        if dynamo:
            lines.append(
                f"compile time: {dynamo:.2f} s in Dynamo's compiles (tracing, AOTAutograd, "
                f"minicomp), {ours:.2f} s of it in minicomp"
            )
        else:
            lines.append(f"compile time: {ours:.2f} s in minicomp")
        if self.records:
            lines.append(DETAILS)
        return "\n".join(lines)


def explain(fn: Callable, *args: Any, options: dict | None = None, **kwargs: Any) -> Explanation:
    """Compile `fn` for these arguments, run it once, and explain what minicomp did. With the
    lens option (target cuda-emu), each kernel's IR carries its estimated time on the
    lens_device."""
    import torch

    from minicomp.dynamo.backend import make_backend
    from minicomp.dynamo.backend import recording as recording_records

    records: list = []
    resolved = config.resolve(options)
    backend = make_backend(resolved)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    with watching() as run, recording_records(records, passes=True), recording() as session:
        compiled(*args, **kwargs)
    torch._dynamo.reset()
    if session.launches:
        _attach_estimates(records, session, resolved.lens_device)
    return Explanation(records, run)


class ScriptError(Exception):
    """The script `explain_file` ran raised; `tail` is the end of its traceback."""

    def __init__(self, script: str, error: BaseException):
        text = str(error).strip()
        first = text.splitlines()[0] if text else ""
        super().__init__(f"{script} raised {type(error).__name__}" + _colon(first))
        self.tail = _traceback_tail(script, error)


def explain_file(script: str, args: list[str]) -> Explanation:
    """Run a Python script (with `args` as its sys.argv[1:]) and explain every graph minicomp
    compiles in it. Raises FileNotFoundError when there is no such script and ScriptError when
    it raises (a SystemExit with status 0 is a normal end)."""
    import runpy
    import sys

    from minicomp.dynamo import backend

    if not os.path.isfile(script):
        raise FileNotFoundError(f"no such script: {script}")
    records: list = []
    saved = sys.argv
    sys.argv = [script, *args]
    try:
        with watching() as run, backend.recording(records, passes=True), recording() as session:
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                if e.code not in (None, 0):
                    raise ScriptError(script, e) from e
            except Exception as e:
                raise ScriptError(script, e) from e
    finally:
        sys.argv = saved
    if session.launches:
        _attach_estimates(records, session, config.resolve().lens_device)
    return Explanation(records, run)


def _write(e: Explanation, directory: str) -> list[str]:
    written = write_files(directory, {"summary.txt": e.summary()})
    headers: dict[str, str] = {}
    for k, r in enumerate(e.records, 1):
        files = graph_files(r)
        name, header, body = split_header(r.source)
        if name:  # each source includes the one copy of its runtime header
            headers[name] = header
            source = "source.c" if r.target == "cpu" else "source.cu"
            files[source] = body.replace(HEADER_MARK, f'#include "../{name}"')
        written += write_files(os.path.join(directory, f"graph-{k}-{r.kind}"), files)
    return written + write_files(directory, headers)


def _attach_estimates(records: list, session: Any, device: str) -> None:
    """Give each record the lens's estimate of every kernel it launched (the first launch)."""
    from minicomp.lens.devices import get_device
    from minicomp.lens.profile import profile_session

    estimates = profile_session(session, get_device(device)).graph.kernels
    for launch, k in zip(session.launches, estimates):
        for r in records:
            if any(f is launch.function for f in r.kernels):
                text = (
                    f"{k.time * 1e6:.2f} us on {k.device.name}, {k.bound}-bound, "
                    f"{k.fraction_of_roofline:.0%} of roofline"
                )
                r.estimates.setdefault(k.kernel, text)


def _externs(r: CompileRecord) -> list[ExternOp]:
    return [n for n in r.graph.nodes if isinstance(n, ExternOp)] if r.graph is not None else []


def _aten_calls(r: CompileRecord) -> list[str]:
    """The summary's lines on the calls graph `r` makes to ATen: how many, then one line per
    reason, grouped as REASON_GROUPS orders them."""
    externs = _externs(r)
    if not externs:
        return [_field("calls made to ATen", "0")]
    by_reason: dict[str, Counter] = {}
    for n in externs:
        by_reason.setdefault(n.reason or "(no reason given)", Counter())[_op_name(n.name)] += 1
    order = [g for g, _ in REASON_GROUPS] + [UNSUPPORTED]
    groups = Counter(reason_group(n.reason) for n in externs)
    counts = ", ".join(f"{g} {groups[g]}" for g in order if groups[g])
    lines = [_field("calls made to ATen", f"{len(externs)} each run ({counts})")]
    ranked = sorted(by_reason, key=lambda reason: order.index(reason_group(reason)))
    for reason in ranked:
        names = _listed(_counted(by_reason[reason]))
        lines.append(f"    {_group_label(reason)}: {names}")
    return lines


def _group_label(reason: str) -> str:
    """How the summary names ATen calls with this reason: the reason, said as its group."""
    group = reason_group(reason)
    if group == VIEWS:
        return "views (no copy)"
    if group == UNSUPPORTED:
        return f"unsupported ({reason})"
    if group == BY_DESIGN_GROUP and not reason.startswith(BY_DESIGN):
        return f"by design: {reason}"
    return reason


def _op_name(name: str) -> str:
    return name.removesuffix(" (zero-copy view)").removesuffix(".default")


def _kernel_name(f: Any) -> str:
    template = getattr(f.attrs, "template", None)
    return f"{f.name} [{template.split('[')[0]}]" if template else f.name


def _counted(counts: dict[str, int] | Counter) -> list[str]:
    return [f"{_op_name(n)} x{c}" if c > 1 else _op_name(n) for n, c in counts.items()]


def _listed(names: list[str]) -> str:
    if len(names) <= _LISTED:
        return ", ".join(names)
    return ", ".join(names[:_LISTED]) + f" and {len(names) - _LISTED} more"


def _field(name: str, value: str) -> str:
    return f"  {name:<20} {value}"


def _colon(text: str) -> str:
    return f": {text}" if text else ""


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _section(title: str, body: str) -> str:
    return f"==== {title} ====\n{body.rstrip()}\n"


def _path(filename: str) -> str:
    """`filename` relative to the working directory when it is under it."""
    try:
        relative = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if relative.startswith("..") else relative


def _guard_failures(reason: str) -> list[str]:
    """Dynamo's recompile reason as its guard failures, each without the id of the compile
    whose guard failed."""
    lines = [re.sub(r"^\d+/\d+: ", "", line.strip()) for line in reason.splitlines()]
    return [line for line in lines if line]


def _traceback_tail(script: str, error: BaseException, limit: int = 6) -> str:
    """The end of `error`'s traceback from the script's own frame on: its last `limit`
    frames and the error."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    real = os.path.realpath(script)
    start = next((i for i, f in enumerate(frames) if os.path.realpath(f.filename) == real), 0)
    frames = frames[start:]
    lines = [f"  ... {len(frames) - limit} frames before these\n"] if len(frames) > limit else []
    lines += traceback.format_list(frames[-limit:])
    lines += traceback.format_exception_only(type(error), error)
    return "".join(lines).rstrip("\n")
