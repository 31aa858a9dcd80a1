"""The torch.compile entry point: AOTAutograd with our decompositions, then our compiler."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from minicomp import config
from minicomp.dynamo.decompositions import decomposition_table
from minicomp.dynamo.importer import import_graph
from minicomp.dynamo.lowering import CompileRecord, compile_graph

log = logging.getLogger("minicomp")


_recorders: list[list] = []


@contextlib.contextmanager
def recording(records: list) -> Iterator[None]:
    """Append a CompileRecord to `records` for every graph any minicomp backend compiles."""
    _recorders.append(records)
    try:
        yield
    finally:
        _recorders.remove(records)


def compile_aten_graph(
    gm: torch.fx.GraphModule, options: config.Options, kind: str, records: list | None = None
) -> Callable:
    """A callable running an ATen-level graph through minicomp (or eagerly, on failure)."""
    record = CompileRecord(
        kind=kind, trace=bool(records is not None or _recorders or options.verbose > 1)
    )
    record.aten_graph = gm.print_readable(print_output=False)
    record.aten_op_count = sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    )
    if records is not None:
        records.append(record)
    for extra in _recorders:
        extra.append(record)
    try:
        # AOTAutograd calls compilers with its fake mode active; constants are real tensors
        # and folding computes with them, so compile outside it.
        static = _static_inputs() if kind == "forward" else ()
        with unset_fake_temporarily():
            graph = import_graph(gm)
            plan = record.plan = compile_graph(
                graph, options, record, device_index=_cuda_index(gm), static_inputs=static
            )
    except Exception as e:
        record.error = f"{type(e).__name__}: {e}"
        if options.fallback == "error":
            raise
        warnings.warn(
            f"minicomp could not compile a {kind} graph and runs it eagerly: {record.error}",
            stacklevel=2,
        )
        return _boxed(gm)
    if options.verbose > 1:
        from minicomp.explain import report

        print(report(record))
    elif options.verbose:
        log.warning(
            "minicomp: %s graph: %d ATen ops -> %d kernels, %d ATen calls%s",
            kind,
            record.aten_op_count,
            len(record.kernels),
            len(record.fallbacks),
            "".join(f"\n  extern {k}: {v}" for k, v in record.fallbacks.items()),
        )

    def run(args: list) -> Any:
        out = plan(*args)
        args.clear()
        return out

    run._boxed_call = True  # AOTAutograd passes a list it lets us free
    return run


def _cuda_index(gm: torch.fx.GraphModule) -> int | None:
    """The CUDA device of the graph's tensor inputs (None if none is on CUDA)."""
    indices = set()
    for n in gm.graph.nodes:
        val = n.meta.get("val") if n.op == "placeholder" else None
        if isinstance(val, torch.Tensor) and val.device.type == "cuda":
            indices.add(val.device.index if val.device.index is not None else 0)
    if len(indices) > 1:
        raise ValueError(f"the graph's inputs are on several CUDA devices: {sorted(indices)}")
    return indices.pop() if indices else None


def _static_inputs() -> tuple[int, ...]:
    """Positions of the forward graph's inputs with stable addresses (parameters, buffers),
    as AOTAutograd recorded them."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    return tuple(getattr(meta, "static_input_indices", None) or ())


def _boxed(gm: torch.fx.GraphModule) -> Callable:
    def run(args: list) -> Any:
        return gm(*args)

    run._boxed_call = True
    return run


def make_backend(options: config.Options, records: list | None = None) -> Callable:
    """A dynamo backend compiling with these options, appending CompileRecords if asked."""
    from torch._dynamo.backends.common import aot_autograd

    def fw(gm, example_inputs):
        return compile_aten_graph(gm, options, "forward", records)

    def bw(gm, example_inputs):
        return compile_aten_graph(gm, options, "backward", records)

    return aot_autograd(fw_compiler=fw, bw_compiler=bw, decompositions=decomposition_table())


def minicomp_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list,
    *,
    mode: str | None = None,
    options: dict | None = None,
) -> Callable:
    """The `minicomp` backend of torch.compile.

    torch.compile calls it with ``mode=`` when a mode other than "default" is given (see
    config.from_torch_mode); explicitly set options win over the mode's preset.
    """
    resolved = config.resolve(options, mode=mode)
    return make_backend(resolved)(gm, example_inputs)
