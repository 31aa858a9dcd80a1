"""What a compiled graph tells the user: the log line, TORCH_LOGS artifacts, TORCH_TRACE events
and the debug directory, all read from its CompileRecord.

- The `minicomp` logger at INFO (`TORCH_LOGS=minicomp`, or the verbose option at 1): one line
  per graph with its counts and ATen calls; at DEBUG (`TORCH_LOGS=+minicomp`) also what the
  graph cache did and each stage's time.
- The artifacts of `minicomp.logs.ARTIFACTS`, each named in TORCH_LOGS or all of them at
  verbose 2.
- With TORCH_TRACE set, `trace_structured` artifact events (PREFIX + name), which torch
  attaches to the compile id Dynamo is compiling, so tlparse shows them under their graph.
- With the `debug_dir` option, a folder per compiled graph (write_debug_dir).

The IR after each pass exists only when the record traced the passes (`wants_passes`), which
compiles the graph in full instead of linking it from the graph cache, as explain does.
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import os
import threading

import torch

from minicomp import config
from minicomp.ir.printer import function_str
from minicomp.logs import artifact_on, log_artifact, log_forced
from minicomp.record import (
    CompileRecord,
    aten_calls,
    file_name,
    fused_groups,
    graph_files,
    header_elided,
    report,
    tuning,
    write_files,
)

log = logging.getLogger(__name__)

PREFIX = "minicomp_"  # of the TORCH_TRACE artifact names


def wants_passes(options: config.Options) -> bool:
    """Whether graphs compiled with these options keep the IR after every pass (and so skip
    the graph cache's entries)."""
    return options.verbose > 1 or options.debug_dir is not None or artifact_on("minicomp_passes")


def compile_id() -> str:
    """The id Dynamo gave the frame whose graph is compiling ("3/1": frame 3, its second
    compile), also while a backward graph compiles at the first backward(); "" outside."""
    cid = torch._guards.CompileContext.current_compile_id()
    return str(cid) if cid is not None else ""


def report_graph(record: CompileRecord, options: config.Options) -> None:
    """Log, trace and write down what compiling one graph did (or why it runs eagerly)."""
    cid = record.compile_id
    if record.error:
        headline = f"minicomp: {record.kind} graph {cid} runs eagerly: {record.error}"
    else:
        headline = summary_line(record, cid)
        if options.verbose or log.isEnabledFor(logging.INFO):
            log_forced(log, logging.INFO, headline)
        if log.isEnabledFor(logging.DEBUG):
            times = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in record.times.items())
            log.debug(
                "minicomp: %s graph %s: graph cache %s; times: %s",
                record.kind,
                cid,
                record.cache or "unused",
                times,
            )
    _log_artifacts(record, options, headline)
    _trace(record, cid)
    if options.debug_dir is not None:
        try:
            write_debug_dir(record, options.debug_dir, cid)
        except OSError as e:
            log.warning("minicomp: could not write the debug directory: %s", e)


def summary_line(record: CompileRecord, cid: str = "") -> str:
    """The verbose log's line: counts, then one line per ATen call and why."""
    graph = f"{record.kind} graph" + (f" {cid}" if cid else "")
    return (
        f"minicomp: {graph}: {record.aten_op_count} ATen ops -> {len(record.kernels)} kernels, "
        f"{len(record.fallbacks)} ATen calls"
        + (" (from the graph cache)" if record.cache.startswith("hit") else "")
        + "".join(f"\n  extern {k}: {v}" for k, v in record.fallbacks.items())
    )


def _log_artifacts(record: CompileRecord, options: config.Options, headline: str) -> None:
    force = options.verbose > 1

    def titled(text: str) -> str:
        return f"{headline.splitlines()[0]}\n{text}"

    if record.passes:
        log_artifact("minicomp_passes", lambda: titled(_passes(record)), force=force)
    if record.graph is not None:
        log_artifact("minicomp_fusion", lambda: titled(fused_groups(record)), force=force)
    log_artifact("minicomp_fallbacks", lambda: titled(_fallbacks(record)), force=force)
    if record.tuning:
        log_artifact("minicomp_tuning", lambda: titled(tuning(record)), force=force)
    if record.kernels:
        log_artifact("minicomp_kernels", lambda: titled(_kernel_ir(record)), force=force)
    if record.source:
        # The runtime header is the same in every graph: the debug directory's source has it.
        source = record.source
        log_artifact("minicomp_source", lambda: titled(header_elided(source)), force=force)


def _passes(record: CompileRecord) -> str:
    return "\n".join(
        f"==== graph IR after {name} ({seconds * 1e3:.1f} ms) ====\n{text.rstrip()}"
        for name, seconds, text in record.passes
    )


def _fallbacks(record: CompileRecord) -> str:
    if record.error:
        return f"the whole graph runs eagerly: {record.error}"
    return aten_calls(record)


def _kernel_ir(record: CompileRecord) -> str:
    return "\n\n".join(function_str(k).rstrip() for k in record.kernels)


def summary(record: CompileRecord, cid: str = "") -> dict:
    """The compile summary as JSON-able data (the trace's and the debug directory's)."""
    return {
        "kind": record.kind,
        "compile_id": cid,
        "target": record.target,
        "aten_ops": record.aten_op_count,
        "kernels": [k.name for k in record.kernels],
        "aten_calls": record.fallbacks,
        "graph_cache": record.cache,
        "times_ms": {k: round(v * 1e3, 3) for k, v in record.times.items()},
        "error": record.error,
    }


def _trace(record: CompileRecord, cid: str) -> None:
    """TORCH_TRACE artifact events; torch computes no payload when no trace is written."""
    events = {
        "graph_ir": lambda: str(record.graph) if record.graph is not None else None,
        "fused_groups": lambda: fused_groups(record),
        "aten_calls": lambda: _fallbacks(record),
        "kernel_source": lambda: record.source or None,
        "compile_summary": lambda: json.dumps(summary(record, cid)),
    }
    if record.passes:
        events["passes"] = lambda: _passes(record)
    if record.tuning:
        events["tuning"] = lambda: tuning(record)
    for name, payload in events.items():
        encoding = "json" if name == "compile_summary" else "string"
        torch._logging.trace_structured(
            "artifact",
            metadata_fn=lambda name=name, encoding=encoding: {
                "name": PREFIX + name,
                "encoding": encoding,
            },
            payload_fn=payload,
        )


_counter = itertools.count()
_runs: dict[str, str] = {}
_runs_lock = threading.Lock()


def _run_dir(root: str) -> str:
    """This process's folder under `root`, made on the first graph written there."""
    with _runs_lock:
        if root not in _runs:
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            _runs[root] = os.path.join(root, f"run-{stamp}-pid{os.getpid()}")
        return _runs[root]


def write_debug_dir(record: CompileRecord, root: str, cid: str = "") -> str:
    """Write what compiling the record's graph did into a new folder under `root`; its path.

    record.graph_files, plus report.txt (explain's text of the graph) and summary.json.
    """
    name = f"{next(_counter):03d}-{record.kind}" + (f"-{file_name(cid)}" if cid else "")
    folder = os.path.join(_run_dir(root), name)
    os.makedirs(folder)
    files = graph_files(record)
    files["report.txt"] = report(record)
    files["summary.json"] = json.dumps(summary(record, cid), indent=2)
    write_files(folder, files)
    return folder
