"""The compiler: graph IR in, a runnable plan out.

`compile_graph` is `lower` (the stages from the target to the build) then `link` (the plan);
together they read top to bottom as the stages of the data flow:

    target     resolved once from the options and where the graph's tensors are
    passes     the target's graph passes, then fusion into groups (passes/)
    tune       the tuning decisions that rewrite the graph: fused attention's config, ATen's
               GEMM or a template for each product (tune/, on the targets that time kernels)
    schedule   one kernel function per fused group (schedule/), indices simplified
    build      the kernels compiled into one binary by the target (backends/)
    plan       a slot per value and a step per operator (runtime/), run as the target says

`lower`'s result, a `Lowered`, is what the whole-graph cache keeps (dynamo/graph_cache.py): a
graph compiled before is only linked.

Where scheduling or building fails and the fallback option allows it, KernelsFailed names the
ATen ops of the groups that fail on their own, and the caller compiles again with those ops
left to ATen (passes/graph/group_fallback.py; dynamo/backend.py compiles again).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from minicomp.backends import cache as build_cache
from minicomp.backends.cuda.arch import WGMMA_ARCH
from minicomp.backends.cuda.tensor_map import tensor_map_arguments
from minicomp.config import Options
from minicomp.ir import types as T
from minicomp.ir.func import Function
from minicomp.ir.graph import FusedOp, Graph, KernelOp, Value
from minicomp.ir.scratch import scratch_of
from minicomp.passes.graph.fusion import fuse
from minicomp.passes.graph.group_fallback import failed, failing_subset
from minicomp.passes.graph.input_mutations import write_inputs_in_place
from minicomp.passes.graph.layout import layouts_for
from minicomp.passes.graph.reinplace import reinplace_convolutions, reinplace_scatters
from minicomp.passes.graph.shared_views import duplicate_shared_views
from minicomp.passes.kernel.simplify_indices import simplify_indices
from minicomp.passes.pipeline import configured, run_passes
from minicomp.record import CompileRecord
from minicomp.runtime.plan_builder import PlanBuilder
from minicomp.targets import Target, resolve_target
from minicomp.tune.chooser import make_chooser
from minicomp.tune.tuner import notice_untuned


@dataclasses.dataclass(frozen=True)
class Lowered:
    """A graph compiled up to its binaries: the final graph and the kernel functions to
    build. Everything here pickles (the graph cache keeps it); `link` makes it a plan."""

    options: Options  # as resolved for the graph (sm_count set)
    graph: Graph
    kernels: tuple[Function, ...]  # one per fused group, in the graph's order
    launched: tuple[Function, ...]  # the script kernels the graph's KernelOps launch
    device_functions: tuple[Function, ...]  # the device functions those call
    tuning: tuple = ()  # the tuner's decisions: (group, template, tune.tuner.Choice)


def compile_graph(
    graph: Graph,
    options: Options,
    record: CompileRecord,
    *,
    device_index: int | None = None,
    static_inputs: Sequence[int] = (),
) -> Callable:
    """The plan running `graph`: passes and fusion, one kernel per group, built and linked.

    `device_index` is the CUDA device the graph's tensors are on (and the one whose SMs the
    heuristics fill, unless the `sm_count` option names a count); `static_inputs` are the
    positions of inputs with stable addresses (parameters, buffers), which CUDA graphs capture
    in place.
    """
    lowered, fns = lower(graph, options, record, device_index=device_index)
    return link(lowered, record, device_index, static_inputs, fns)


def lower(
    graph: Graph, options: Options, record: CompileRecord, *, device_index: int | None = None
) -> tuple[Lowered, dict]:
    """`graph` through passes, fusion, tuning and scheduling, and its kernels built: the
    lowered graph and the kernels' callables by name.

    Raises KernelsFailed naming the ATen ops of the groups that fail to schedule or build on
    their own, where options.fallback allows running them as ATen calls.
    """
    t0 = time.perf_counter()
    target = resolve_target(options.target, graph_devices(graph))
    record.target = target.name
    if options.sm_count is None:  # resolved once: every pass and scheduler sizes for it
        options = dataclasses.replace(options, sm_count=target.sm_count(options, device_index))
    if options.arch is None and target.runs_cuda:  # what the templates may use (float8 mma)
        options = dataclasses.replace(options, arch=target.arch(options, device_index))
    record.options = options
    trace = record.passes if record.trace else None

    # Every target's passes, then views given to each of their readers: fusion's input.
    passes = [*target.passes_for(graph, options), duplicate_shared_views]
    graph = unfused = run_passes(graph, passes, trace=trace)
    # On sm_90a the Hopper matmul reads operands as memory holds them: no computed prologue.
    tma = options.arch == WGMMA_ARCH and options.tensor_cores and target.runs_cuda
    graph = run_passes(graph, [configured(fuse, tma_products=tma)], trace=trace)
    graph = record.graph = place_constants(graph, target)
    layouts = layouts_for(graph)
    t1 = time.perf_counter()

    runner_for = target.runner_factory(layouts, options, device_index)
    if runner_for is None and options.search_space > 0:
        notice_untuned(target.name, options.search_space)
    choose = make_chooser(options, runner_for)
    tuned = target.tune_graph(graph, choose, layouts, options, device_index)
    if tuned is not graph:
        graph = record.graph = tuned
        layouts = layouts_for(graph)

    # Last: which values are memory of the plan's own is known once groups are final.
    in_place = [write_inputs_in_place, reinplace_scatters, reinplace_convolutions]
    graph = record.graph = run_passes(graph, in_place, trace=trace)
    if graph.input_writes:  # values computed in an input's memory take its strides
        layouts = layouts_for(graph)
    groups = [n for n in graph.nodes if isinstance(n, FusedOp)]
    kernels = _schedule(graph, target, layouts, choose, options, unfused)
    record.tuning = getattr(choose, "decisions", list)()  # a test's chooser may not keep them
    launched, device_functions = _script_functions(graph)
    record.kernels = kernels + launched
    t2 = time.perf_counter()
    record.times.update(passes=t1 - t0, schedule=t2 - t1)
    lowered = Lowered(
        options,
        graph,
        tuple(kernels),
        tuple(launched),
        tuple(device_functions),
        tuple(record.tuning),
    )
    try:
        fns = _build(lowered, record, device_index)
    except Exception as e:
        if options.fallback == "error":
            raise
        raise _build_failure(groups, kernels, unfused, e, target, options, device_index) from e
    return lowered, fns


def link(
    lowered: Lowered,
    record: CompileRecord,
    device_index: int | None = None,
    static_inputs: Sequence[int] = (),
    fns: dict | None = None,
) -> Callable:
    """The plan running a lowered graph: a step per operator, run as the target says. The
    kernels are `fns` (lower's), or built here (from the build cache, when an earlier process
    built them)."""
    options, graph = lowered.options, lowered.graph
    target = resolve_target(options.target, graph_devices(graph))
    record.target, record.options, record.graph = target.name, options, graph
    record.kernels = [*lowered.kernels, *lowered.launched]
    record.tuning = list(lowered.tuning)
    if fns is None:
        fns = _build(lowered, record, device_index)
    symbols = {
        k.name: [p.name for p in k.params if isinstance(p.type, T.DataType)]
        for k in lowered.kernels
    }
    t0 = time.perf_counter()
    scratch = {k.name: scratch_of(k) for k in lowered.kernels if k.attrs.scratch}
    maps = {
        k.name: tensor_map_arguments(k)
        for k in (*lowered.kernels, *lowered.launched)
        if k.attrs.tensor_maps
    }
    builder = PlanBuilder(graph, layouts_for(graph), fns, symbols, scratch, maps)
    plan = builder.build()
    # A graph whose sizes depend on data it computes cannot replay: it runs step by step.
    plan = target.finish(plan, options, static_inputs, replayable=not builder.late)
    record.times["plan"] = time.perf_counter() - t0
    return plan


def _build(lowered: Lowered, record: CompileRecord, device_index: int | None) -> dict:
    """The callables of the lowered graph's kernels by name; the source in `record`."""
    t0 = time.perf_counter()
    options = lowered.options
    target = resolve_target(options.target, graph_devices(lowered.graph))
    with build_cache.observing() as events:
        fns, record.source = target.build(
            [*lowered.kernels, *lowered.launched], options, device_index, lowered.device_functions
        )
    record.builds.extend(events)
    record.times["build"] = record.times.get("build", 0.0) + time.perf_counter() - t0
    return fns


def graph_devices(graph: Graph) -> set[str]:
    """The device types of every tensor value of the graph."""
    values = [v for v in graph.inputs if isinstance(v, Value)]
    values += [v for n in graph.nodes for v in n.outputs]
    return {v.type.device for v in values}


def place_constants(graph: Graph, target: Target) -> Graph:
    """`graph` with the constants its kernels read moved to the target's device (PyTorch lets
    a CPU scalar tensor meet CUDA tensors; a kernel cannot read host memory); raises
    ValueError for a kernel reading a graph input on another device."""
    want = target.device
    moved = dict(graph.constants)
    changed = False
    for n in graph.nodes:
        if not isinstance(n, (FusedOp, KernelOp)):
            continue
        for v in (*n.inputs, *n.outputs):
            if v.type.device == want:
                continue
            t = moved.get(v.name)
            if t is None:
                raise ValueError(
                    f"kernel {n.name} would touch {v.name} on {v.type.device}, but the "
                    f"{target.name} target runs kernels on {want} tensors"
                )
            moved[v.name], changed = t.to(want), True
    return graph.replace(constants=moved) if changed else graph


def schedule_group(
    op: FusedOp,
    target: Target,
    layouts: dict,
    choose: Callable | None = None,
    options: Options | None = None,
) -> Function:
    """The kernel function of one fused group, its indices simplified."""
    return simplify_indices(target.schedule(op, layouts, choose, options))


def _schedule(
    graph: Graph,
    target: Target,
    layouts: dict,
    choose: Callable,
    options: Options,
    unfused: Graph,
) -> list[Function]:
    """One kernel per fused group of `graph`. Where scheduling fails, raises KernelsFailed
    naming the ATen ops of the groups that fail on their own (the error itself with
    options.fallback "error", or when no group does)."""
    groups = [n for n in graph.nodes if isinstance(n, FusedOp)]
    try:
        return [schedule_group(g, target, layouts, choose, options) for g in groups]
    except Exception as e:
        if options.fallback == "error":
            raise
        cause = e

    def schedules(g: FusedOp) -> bool:
        try:
            schedule_group(g, target, layouts, choose, options)
        except Exception:
            return False
        return True

    bad = [g for g in groups if not schedules(g)]
    if not bad:
        raise cause
    raise failed(bad, unfused, cause) from cause


def _build_failure(
    groups: list[FusedOp],
    kernels: list[Function],
    unfused: Graph,
    cause: Exception,
    target: Target,
    options: Options,
    device_index: int | None,
) -> Exception:
    """What to raise when building the graph's kernels raised `cause`: KernelsFailed naming
    the ATen ops of the kernels that fail to build on their own, else `cause`."""

    def builds(some: Sequence[Function]) -> bool:
        try:
            target.build(list(some), options, device_index)
        except Exception:
            return False
        return True

    bad = {k.name for k in failing_subset(kernels, builds)} if kernels else set()
    if not bad:
        return cause
    return failed([g for g, k in zip(groups, kernels) if k.name in bad], unfused, cause)


def _script_functions(graph: Graph) -> tuple[list[Function], list[Function]]:
    """The kernels the graph's KernelOps launch and the device functions they call, each once
    (an op called twice launches one compiled kernel)."""
    kernels: dict[str, Function] = {}
    device: dict[str, Function] = {}
    for n in graph.nodes:
        if not isinstance(n, KernelOp):
            continue
        for f, found in [(n.function, kernels)] + [(c, device) for c in n.callees]:
            if found.setdefault(f.name, f) != f:
                raise ValueError(f"two different kernel functions are named {f.name}")
    return list(kernels.values()), list(device.values())
