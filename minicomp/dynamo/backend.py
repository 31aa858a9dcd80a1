"""The torch.compile entry point: AOTAutograd with our decompositions, then our compiler."""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from minicomp import config
from minicomp.dynamo import diagnostics
from minicomp.dynamo.ddp import watch_ddp
from minicomp.dynamo.decompositions import decomposition_table
from minicomp.dynamo.eager_strides import restride_like_eager
from minicomp.dynamo.importer import import_graph
from minicomp.dynamo.opaque_inputs import kept_positions, passing_opaque, split_opaque_inputs
from minicomp.dynamo.output_aliases import (
    input_views,
    share_storages,
    shared_output_storages,
    view_inputs,
)
from minicomp.dynamo.overlap import find_overlapping_write
from minicomp.dynamo.scatter_views import write_scatters_into_views
from minicomp.logs import warn_user
from minicomp.passes.graph.group_fallback import KernelsFailed
from minicomp.record import CompileRecord

log = logging.getLogger(__name__)


class FallbackWarning(UserWarning):
    """minicomp gave up on a whole graph, which runs eagerly (at eager speed)."""


class KernelFallbackWarning(UserWarning):
    """A kernel minicomp generated failed to compile: its ATen ops run as ATen calls, the rest
    of the graph stays compiled."""


# Attempts at a graph whose kernels fail to compile, each running more of its ops as ATen
# calls, before the whole graph runs eagerly.
MAX_ATTEMPTS = 4


_recorders: list[list] = []
_pass_tracers: list[list] = []


@contextlib.contextmanager
def recording(records: list, *, passes: bool = False) -> Iterator[None]:
    """Append a CompileRecord to `records` for every graph any minicomp backend compiles.

    With `passes`, each record keeps the graph after every pass, so every graph is compiled
    in full (never linked from the graph cache) to show them, as `minicomp explain` does.
    """
    _recorders.append(records)
    if passes:
        _pass_tracers.append(records)
    try:
        yield
    finally:
        # By identity: list.remove compares by value, and nested recordings' lists are often
        # equal (both empty, or holding the same records).
        for stack in (_recorders, _pass_tracers) if passes else (_recorders,):
            del stack[next(k for k in reversed(range(len(stack))) if stack[k] is records)]


def compile_aten_graph(
    gm: torch.fx.GraphModule,
    options: config.Options,
    kind: str,
    records: list | None = None,
    freeze: Mapping[int, torch.Tensor] | None = None,
) -> Callable:
    """A callable running an ATen-level graph through minicomp (or eagerly, on failure).

    `kind` is the AOTAutograd compiler's: "forward" (of a graph with a backward), "backward"
    or "inference" (a forward with no backward). `freeze` maps positions of the graph's inputs
    to the tensors they hold (parameters and buffers, see freeze_candidates): those the graph
    neither mutates nor returns an alias of become constants of the graph (see FrozenRunner).
    """
    static = _static_inputs() if kind != "backward" else ()
    inner, opaque = split_opaque_inputs(gm)
    if not opaque.positions:
        return _compile_graph(gm, options, kind, records, freeze, static)
    # The graph without them; AOTAutograd's metadata still counts them, so nothing of it is
    # frozen (_frozen_inputs finds other inputs than its metadata describes).
    static = kept_positions(static, opaque, _placeholder_count(gm))
    call = _compile_graph(inner, options, kind, records, freeze, static)
    return passing_opaque(call, opaque)


def _compile_graph(
    gm: torch.fx.GraphModule,
    options: config.Options,
    kind: str,
    records: list | None,
    freeze: Mapping[int, torch.Tensor] | None,
    static: Sequence[int],
) -> Callable:
    frozen = _frozen_inputs(gm, freeze) if freeze is not None else {}
    plan = _compile(gm, options, kind, records, frozen, static)
    if plan is None:
        return _boxed(gm)
    if frozen:
        return FrozenRunner(gm, plan, frozen, static, options, kind, records)
    shared = shared_output_storages(gm)
    views = input_views(gm, _fw_metadata())

    entry = getattr(plan, "entry", None)
    call = entry() if entry is not None else lambda args: plan(*args)
    if not shared and not views:
        return _freeing(call)

    def run(args: list) -> Any:
        env = plan.bind(args) if shared or views else None
        out = call(args)
        out = view_inputs(out, views, args, env) if views else out
        args.clear()
        return share_storages(out, shared, env) if shared else out

    run._boxed_call = True  # AOTAutograd passes a list it lets us free
    return run


def _compile(
    gm: torch.fx.GraphModule,
    options: config.Options,
    kind: str,
    records: list | None,
    frozen: Mapping[int, torch.Tensor],
    static: Sequence[int],
) -> Callable | None:
    """The plan of `gm` with the inputs at `frozen`'s positions as constants; None when it
    cannot be compiled and options.fallback allows running it eagerly."""
    record = CompileRecord(
        kind=kind, trace=bool(_pass_tracers) or diagnostics.wants_passes(options)
    )
    record.compile_id = diagnostics.compile_id()
    record.aten_graph = gm.print_readable(print_output=False)
    ops = [
        str(n.target).removeprefix("aten.")
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
    ]
    record.aten_ops = dict(collections.Counter(ops))
    record.aten_op_count = len(ops)
    if records is not None:
        records.append(record)
    for extra in _recorders:
        extra.append(record)
    kept = [k for k in range(_placeholder_count(gm)) if k not in frozen]
    static = tuple(kept.index(k) for k in static if k not in frozen)
    try:
        # AOTAutograd calls compilers with its fake mode active; constants are real tensors
        # and folding computes with them, so compile outside it.
        with unset_fake_temporarily():
            plan = record.plan = _import_and_compile(gm, options, record, frozen, static)
    except Exception as e:
        record.error = f"{type(e).__name__}: {e}"
        diagnostics.report_graph(record, options)
        if options.fallback == "error":
            raise
        warn_user(
            f"minicomp could not compile {'an' if kind == 'inference' else 'a'} {kind} graph "
            f"and runs it eagerly: {record.error}",
            FallbackWarning,
        )
        return None
    diagnostics.report_graph(record, options)
    return plan


def _import_and_compile(
    gm: torch.fx.GraphModule,
    options: config.Options,
    record: CompileRecord,
    frozen: Mapping[int, torch.Tensor],
    static: Sequence[int],
) -> Callable:
    """The plan of `gm`: linked from the whole-graph cache when it was compiled before, else
    compiled (and kept there)."""
    # Lazy for import cost: the compiler brings the schedulers, templates and backends (about
    # 150 ms), which `import minicomp` registering the backend does not need.
    from minicomp.compiler import link
    from minicomp.dynamo import graph_cache

    # Before the key: the graph as the importer reads it.
    restride_like_eager(gm)
    write_scatters_into_views(gm)
    device_index = _cuda_index(gm)
    key = None
    t0 = time.perf_counter()
    if not options.graph_cache:
        record.cache = "off (the graph_cache option)"
    elif frozen:
        record.cache = "not kept: its weights are frozen into it"
    else:
        try:
            key = graph_cache.graph_key(gm, options, record.kind, static, device_index)
        except graph_cache.Uncacheable as e:
            record.cache = f"not kept: {e}"
    # A graph traced for explain or diagnostics (diagnostics.wants_passes) runs every pass
    # again, to show them.
    if key is None or record.trace:
        return _compile_and_keep(gm, options, record, frozen, static, device_index, key)
    kept = graph_cache.load(options, key)
    if kept is None:
        # One compile for all the processes sharing the cache (a job's ranks): the first
        # compiles the graph, the others wait for it and link what it kept.
        with graph_cache.compiling(options, key):
            kept = graph_cache.load(options, key)
            if kept is None:
                return _compile_and_keep(gm, options, record, frozen, static, device_index, key)
    record.times["graph cache"] = time.perf_counter() - t0
    try:
        plan = link(kept.lowered, record, device_index, static)
    except Exception as e:  # noqa: BLE001 - whatever went stale: compile it again
        log.info("minicomp: a cached graph does not link (%s); compiling it", e)
        return _compile_and_keep(gm, options, record, frozen, static, device_index, key)
    for message in kept.warnings:
        warn_user(message, KernelFallbackWarning)
    record.cache = f"hit ({key[:16]}, compiled by {graph_cache.compiled_by(options, key)})"
    return plan


def _compile_and_keep(
    gm: torch.fx.GraphModule,
    options: config.Options,
    record: CompileRecord,
    frozen: Mapping[int, torch.Tensor],
    static: Sequence[int],
    device_index: int | None,
    key: str | None,
) -> Callable:
    """`gm` compiled, and kept in the whole-graph cache under `key` (unless None)."""
    from minicomp.compiler import link  # lazy: see _import_and_compile
    from minicomp.dynamo import graph_cache

    messages: list[str] = []
    lowered, fns = _lower_with_fallbacks(gm, options, record, frozen, device_index, messages)
    if key is not None:
        try:
            summary = {
                "kind": record.kind,
                "target": record.target,
                "aten ops": record.aten_op_count,
                "kernels": len(record.kernels),
                "aten calls": len(record.fallbacks),
                "compile seconds": round(sum(record.times.values()), 3),
            }
            kept = graph_cache.CachedGraph(lowered, tuple(messages))
            graph_cache.store(options, key, kept, summary)
            record.cache = f"stored ({key[:16]})"
        except graph_cache.Uncacheable as e:
            record.cache = f"not kept: {e}"
    return link(lowered, record, device_index, static, fns)


def _lower_with_fallbacks(
    gm: torch.fx.GraphModule,
    options: config.Options,
    record: CompileRecord,
    frozen: Mapping[int, torch.Tensor],
    device_index: int | None,
    messages: list[str],
) -> tuple:
    """`gm` imported and lowered (compiler.lower); where some fused kernels fail to compile,
    again with their ATen ops as ATen calls, up to MAX_ATTEMPTS times, with a
    KernelFallbackWarning whose message is appended to `messages`."""
    from minicomp.compiler import lower

    externs: dict[str, str] = {}
    attempts = 1
    while True:
        t0 = time.perf_counter()
        graph = import_graph(gm, frozen, externs)
        record.times["import"] = record.times.get("import", 0.0) + time.perf_counter() - t0
        record.passes.clear()
        try:
            return lower(graph, options, record, device_index=device_index)
        except KernelsFailed as e:
            new = {k: v for k, v in e.externs.items() if k not in externs}
            if not new or attempts == MAX_ATTEMPTS:
                raise e.cause from e
            reason = next(iter(new.values()))
            messages.append(f"minicomp runs {', '.join(sorted(new))} as ATen calls: {reason}")
            warn_user(messages[-1], KernelFallbackWarning)
            externs.update(new)
            attempts += 1


def freeze_candidates(gm: torch.fx.GraphModule, example_inputs: Sequence) -> dict[int, Any]:
    """The inputs of a Dynamo graph that `options={"freeze": True}` may turn into constants:
    position -> tensor, for the parameters, buffers and other tensor attributes of modules.

    Dynamo lifts them to graph inputs (it traces into modules and does not specialise on
    them); the placeholders' sources say which inputs they are. Tensors marked static by other
    means (torch._dynamo.mark_static_address, e.g. a KV cache) are left as inputs: they are
    meant to change between calls.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = {}
    for k, (n, t) in enumerate(zip(placeholders, example_inputs)):
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            continue
        grapharg = n.meta.get("grapharg")
        source = getattr(grapharg, "source", None)
        if source is None:
            module_state = isinstance(t, torch.nn.Parameter)
        else:
            guard = source.guard_source
            module_state = guard.is_unspecialized_nn_module() or guard.is_specialized_nn_module()
        if module_state:
            out[k] = t
    return out


def _placeholder_count(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "placeholder")


def _frozen_inputs(
    gm: torch.fx.GraphModule, candidates: Mapping[int, torch.Tensor]
) -> dict[int, torch.Tensor]:
    """The inputs of this ATen graph that become constants: the candidates (at Dynamo-level
    positions) and the parameters AOTAutograd lifted from the Dynamo graph itself (when Dynamo
    does not inline modules), by position in the ATen graph.

    AOTAutograd's inference graph takes its lifted parameters, then Dynamo's inputs in
    Dynamo's order; where that cannot be confirmed (a different count, a placeholder whose
    shape, strides, dtype or device differ from the tensor's) nothing is frozen there. Inputs
    the graph mutates, or whose alias it returns, stay inputs: AOTAutograd writes those
    mutations into, and rebuilds those aliases from, the real tensors, which a constant would
    not see.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    meta = _fw_metadata()
    if meta is None or len(placeholders) != len(meta.input_info):
        return {}
    lifted = _lifted_parameters()
    candidates = {
        **dict(enumerate(lifted)),
        **{len(lifted) + k: t for k, t in candidates.items()},
    }
    aliased = {o.base_idx for o in meta.output_info if o.base_idx is not None}
    out = {}
    for k, t in candidates.items():
        if k >= len(placeholders) or k in aliased:
            continue
        info = meta.input_info[k]
        if info.mutates_data or info.mutates_metadata:
            continue
        val = placeholders[k].meta.get("val")
        if isinstance(val, torch.Tensor) and _same_tensor_type(val, t):
            out[k] = t
    return out


def _same_tensor_type(fake: torch.Tensor, real: torch.Tensor) -> bool:
    def ints(dims) -> tuple | None:
        return tuple(dims) if all(isinstance(d, int) for d in dims) else None

    shape, strides = ints(fake.shape), ints(fake.stride())
    return (
        shape == tuple(real.shape)
        and strides == tuple(real.stride())
        and fake.dtype == real.dtype
        and fake.device == real.device
    )


# Plans one frozen graph keeps for different module instances before it runs eagerly.
MAX_FROZEN_PLANS = 4


class FrozenRunner:
    """Runs a graph compiled with frozen inputs (AOTAutograd's boxed calling convention): it
    passes the other inputs to the plan of the tensors found at the frozen positions.

    Dynamo does not guard on the identity of module parameters, so another instance of the
    same module class (each `torch.compile(model)` of it), or a parameter replaced by a new
    tensor, reaches the same compiled graph with other tensors there. Those get a plan of
    their own, compiled on first sight (its kernels come from the kernel cache: only the
    constants differ), up to MAX_FROZEN_PLANS; past that the graph runs eagerly with a
    warning (fallback="eager") or raises (fallback="error"). In-place changes to a frozen
    tensor are not checked: see docs/freeze.md.
    """

    _boxed_call = True

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        plan: Callable,
        frozen: Mapping[int, torch.Tensor],
        static: Sequence[int],
        options: config.Options,
        kind: str,
        records: list | None,
    ):
        self.gm = gm
        self.positions = tuple(frozen)
        self.kept = [k for k in range(_placeholder_count(gm)) if k not in frozen]
        self.shared = shared_output_storages(gm)
        self.views = input_views(gm, _fw_metadata())
        self.plans: list[tuple[tuple, Callable]] = [(tuple(frozen.values()), plan)]
        self.compile = functools.partial(_compile, gm, options, kind, records, static=static)
        self.fallback = options.fallback
        self.warned = False

    def __call__(self, args: list) -> Any:
        tensors = tuple(args[k] for k in self.positions)
        plan = self.plan_for(tensors)
        if plan is None:
            out = self.gm(*args)
        else:
            kept = [args[k] for k in self.kept]
            env = plan.bind(kept) if self.shared or self.views else None
            out = plan(*kept)
            out = view_inputs(out, self.views, args, env) if self.views else out
            out = share_storages(out, self.shared, env) if self.shared else out
        args.clear()
        return out

    def plan_for(self, tensors: tuple) -> Callable | None:
        """The plan compiled for these frozen tensors (compiled now if need be), or None."""
        for frozen, plan in self.plans:
            if all(a is b for a, b in zip(tensors, frozen)):
                return plan
        first = self.plans[0][0]
        if len(self.plans) < MAX_FROZEN_PLANS and all(
            _same_layout(a, b) for a, b in zip(tensors, first)
        ):
            plan = self.compile(frozen=dict(zip(self.positions, tensors)))
            if plan is not None:
                self.plans.append((tensors, plan))
                return plan
        message = (
            f"minicomp froze the parameters of a graph (options={{'freeze': True}}) for "
            f"{len(self.plans)} sets of module tensors and is now called with another"
        )
        if self.fallback == "error":
            raise RuntimeError(message + "; call torch._dynamo.reset() to recompile")
        if not self.warned:
            warn_user(message + ": it runs eagerly", FallbackWarning)
            self.warned = True
        return None


def _same_layout(a: Any, b: torch.Tensor) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.device == b.device
    )


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


def _lifted_parameters() -> list:
    """The parameters and buffers of the Dynamo graph module that AOTAutograd passes as the
    first inputs of the graph being compiled (none when Dynamo inlines modules)."""
    context = torch._guards.TracingContext.try_get()
    return list(getattr(context, "params_flat", None) or []) if context is not None else []


def _fw_metadata() -> Any:
    """AOTAutograd's metadata of the graph being compiled (None outside AOTAutograd)."""
    context = torch._guards.TracingContext.try_get()
    return getattr(context, "fw_metadata", None) if context is not None else None


def _static_inputs() -> tuple[int, ...]:
    """Positions of the forward graph's inputs with stable addresses (parameters, buffers),
    as AOTAutograd recorded them."""
    return tuple(getattr(_fw_metadata(), "static_input_indices", None) or ())


def _freeing(call: Callable[[list], Any]) -> Callable:
    """`call` in AOTAutograd's boxed convention: it may free its argument list."""

    def run(args: list) -> Any:
        out = call(args)
        args.clear()
        return out

    run._boxed_call = True
    return run


def _boxed(gm: torch.fx.GraphModule) -> Callable:
    def run(args: list) -> Any:
        return gm(*args)

    run._boxed_call = True
    return run


FREEZE_NEEDS_GRAD = (
    "minicomp: options={'freeze': True} does not apply to a graph that computes gradients "
    "(grad mode is on and a parameter or input requires grad): its parameters stay inputs. "
    "Run the compiled module under torch.no_grad() or torch.inference_mode() to freeze them."
)


def make_backend(options: config.Options, records: list | None = None) -> Callable:
    """A dynamo backend compiling with these options, appending CompileRecords if asked.

    With options.freeze, the graphs AOTAutograd compiles for inference (no gradients needed)
    take the modules' parameters and buffers as constants. A graph that needs gradients is
    compiled without freezing, with a warning (FREEZE_NEEDS_GRAD): gradients must flow to the
    parameters, and the user asked for speed, not for different results or an eager run.
    """
    from torch._dynamo.backends.common import aot_autograd

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        overlap = find_overlapping_write(gm)
        if overlap is not None:
            # AOTAutograd's functional graph would perform a write eager refuses, or give
            # another answer than eager's for one it performs. The graph runs as Dynamo
            # captured it: raising eager's error, or computing eager's result eagerly.
            if not overlap.raises_in_eager:
                message = (
                    f"minicomp runs a graph eagerly: {overlap.op} writes to a broadcast view "
                    "(elements sharing memory), which a functional graph cannot express"
                )
                if options.fallback == "error":
                    raise RuntimeError(message)
                warn_user(message, FallbackWarning)
            return gm
        candidates = freeze_candidates(gm, example_inputs) if options.freeze else {}

        def fw(aten_gm, aten_inputs):
            if candidates or options.freeze and _lifted_parameters():
                warn_user(FREEZE_NEEDS_GRAD, UserWarning)
            return compile_aten_graph(aten_gm, options, "forward", records)

        def inference(aten_gm, aten_inputs):
            freeze = candidates if options.freeze else None
            return compile_aten_graph(aten_gm, options, "inference", records, freeze)

        def bw(aten_gm, aten_inputs):
            return compile_aten_graph(aten_gm, options, "backward", records)

        compiler = aot_autograd(
            fw_compiler=fw,
            bw_compiler=bw,
            inference_compiler=inference,
            decompositions=decomposition_table(),
            # An inference graph ends with copy_(input, new value) for each input whose data
            # it mutates, which the plan writes in the input's own memory
            # (passes/graph/input_mutations.py); a training graph's mutations stay
            # AOTAutograd's, copied back after the call.
            keep_inference_input_mutations=not needs_grad(gm, example_inputs),
        )
        return compiler(gm, example_inputs)

    return backend


def needs_grad(gm: torch.fx.GraphModule, example_inputs: Sequence) -> bool:
    """Whether AOTAutograd may make a graph with a backward of this Dynamo graph: grad mode
    is on and an input or a parameter requires grad (else it is an inference graph)."""
    if not torch.is_grad_enabled():
        return False
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    return any(t.requires_grad for t in (*tensors, *gm.parameters()))


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
    watch_ddp()  # again after a torch._dynamo.reset(), which drops it
    resolved = config.resolve(options, mode=mode)
    return make_backend(resolved)(gm, example_inputs)


def ensure_registered() -> None:
    """Register the "minicomp" torch.compile backend where no entry point did (a checkout on
    PYTHONPATH that was never installed)."""
    if "minicomp" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(minicomp_backend, name="minicomp")


# Where torch.compile(DDP(model)) compiles nothing, Dynamo never calls the backend: the
# warning comes from a callback Dynamo calls after each frame compile (ddp.py), registered when
# torch.compile loads the backend.
watch_ddp()
