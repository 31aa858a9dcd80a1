"""From graph IR to an execution plan: passes, fusion, scheduling, building, slot assignment."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from minicomp.config import Options
from minicomp.dynamo.group_fallback import failed, failing_subset
from minicomp.ir import types as T
from minicomp.ir.expr import Const, Expr, Var
from minicomp.ir.func import Function, Module
from minicomp.ir.graph import ArgRef, ExternOp, FusedOp, Graph, KernelOp, Value
from minicomp.ir.symbols import free_symbols, launch_dims
from minicomp.passes.graph.layout import eager_stride_reads, layouts_for
from minicomp.passes.kernel.simplify_indices import simplify_indices
from minicomp.runtime.plan import (
    ExternStep,
    KernelStep,
    LaunchStep,
    Plan,
    SlotInfo,
    Step,
    dims_fn,
)


@dataclass
class CompileRecord:
    """What happened while compiling one graph; `minicomp.explain` prints it."""

    kind: str = "forward"
    aten_graph: str = ""
    aten_op_count: int = 0
    passes: list = field(default_factory=list)  # (name, seconds, graph text)
    graph: Graph | None = None
    kernels: list[Function] = field(default_factory=list)
    source: str = ""
    fallbacks: dict[str, str] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    error: str = ""
    target: str = ""
    plan: Any = None  # what runs the graph: a Plan, or a GraphedPlan on cuda
    trace: bool = False  # keep the graph text after every pass (explain, verbose)
    options: Options | None = None  # what the graph was compiled with


def schedule_graph(
    graph: Graph,
    target: str,
    layouts: dict,
    choose: Callable | None = None,
    options: Options | None = None,
) -> list[Function]:
    """One kernel function per fused group; on CUDA targets `choose` (see make_chooser) picks
    each template's config, and `options` say whether templates may use tensor cores."""
    groups = [n for n in graph.nodes if isinstance(n, FusedOp)]
    return [schedule_group(n, target, layouts, choose, options) for n in groups]


def schedule_group(
    op: FusedOp,
    target: str,
    layouts: dict,
    choose: Callable | None = None,
    options: Options | None = None,
) -> Function:
    """The kernel function of one fused group (see schedule_graph)."""
    if target == "cpu":
        from minicomp.schedule.cpu import schedule_cpu

        return schedule_cpu(op, layouts)
    if target not in ("cuda", "cuda-emu"):
        raise ValueError(f"unknown target {target!r}")
    from minicomp.schedule.cuda import schedule_cuda

    return schedule_cuda(op, layouts, choose, options)


def make_chooser(
    options: Options, target: str, layouts: dict, device_index: int | None = None
) -> Callable:
    """The function a CUDA template calls to pick its config for one fused group:
    ``choose(template, problem, op, aten=None) -> tune.tuner.Choice``.

    On the cuda target with search space 1 or 2 it tunes (tune/tuner.py) with a CudaRunner
    for the group; `aten`, when given, is the ATen candidate: a function of a
    tune.tuner.Workload writing the group's outputs with PyTorch operators. Elsewhere, and
    for groups that cannot be measured (symbolic sizes, non-float inputs), it returns the
    template's heuristic config.

    A chooser remembers its answers by template and group: the scheduler's call for a group
    that tune_contractions already asked about (with the ATen candidate) gets that answer
    back, without tuning the group a second time.
    """
    from minicomp.tune.tuner import fusion_signature, tune

    chosen: dict[tuple[str, Any], Any] = {}

    def decide(template: Any, problem: Any, op: FusedOp, aten: Callable | None):
        if target != "cuda":
            return tune(template, problem, options=options, runner=None)
        if options.search_space == 0 or not CudaRunner.can_measure(op, layouts):
            return tune(template, problem, options=options, runner=None, level=0)
        runner = CudaRunner(op, layouts, options, device_index, aten)
        return tune(template, problem, options=options, runner=runner, fusion=fusion_signature(op))

    def choose(template: Any, problem: Any, op: FusedOp, aten: Callable | None = None):
        key = (template.name, op)
        if key not in chosen:
            chosen[key] = decide(template, problem, op, aten)
        return chosen[key]

    return choose


class CudaRunner:
    """Builds candidate kernels of one fused group and runs them on random inputs on the GPU:
    the tuner's tune.tuner.Runner for the cuda target.

    A kernel takes the group's input buffers, then its outputs (the order KernelStep passes).
    """

    def __init__(
        self,
        op: FusedOp,
        layouts: dict,
        options: Options,
        device_index: int | None = None,
        aten: Callable | None = None,
    ):
        from minicomp.backends.cuda.module import pick_arch
        from minicomp.backends.cuda.nvrtc import compile_cuda

        self.op = op
        self.layouts = layouts
        self.options = options
        self.index = torch.cuda.current_device() if device_index is None else device_index
        self.arch = options.arch or pick_arch(self.index)
        self.l2_bytes = torch.cuda.get_device_properties(self.index).L2_cache_size
        self.compile_job = functools.partial(
            compile_cuda, arch=self.arch, cache_dir=options.cache_dir
        )
        self.aten = aten
        self.timer = None

    @staticmethod
    def can_measure(op: FusedOp, layouts: dict) -> bool:
        """Whether random inputs can run the group: static sizes and strides, float inputs (an
        index input holding random values could send a kernel out of bounds)."""
        for v in (*op.inputs, *op.outputs):
            dims = (*v.shape, *layouts[v.name])
            if not all(isinstance(d, int) for d in dims):
                return False
        return all(v.dtype.is_float for v in op.inputs)

    def render(self, kernel: Function) -> str:
        from minicomp.backends.cuda.codegen import render_module

        return render_module(Module(kernel.name, (kernel,)))

    def load(self, kernel: Function, source: str) -> Callable:
        from minicomp.backends.cuda.module import build

        module = build(
            Module(kernel.name, (kernel,)),
            device_index=self.index,
            cache_dir=self.options.cache_dir,
            arch=self.arch,
        )
        launcher = module.kernel(kernel.name, launch_dims(kernel))

        def launch(w) -> None:
            launcher(*(t.data_ptr() for t in (*w.inputs, *w.outputs)), *w.scalars)

        return launch

    def workload(self, seed: int):
        from minicomp.tune.tuner import Workload

        device = torch.device("cuda", self.index)
        gen = torch.Generator(device=device).manual_seed(seed)

        def tensor(v: Value, random: bool) -> torch.Tensor:
            # Filled through its storage: a broadcast input's strides overlap elements.
            strides = self.layouts[v.name]
            size = 1 + sum((n - 1) * s for n, s in zip(v.shape, strides)) if all(v.shape) else 0
            base = torch.empty(size, dtype=T.to_torch(v.dtype), device=device)
            if random:
                base.uniform_(-1.0, 1.0, generator=gen)
            return base.as_strided(v.shape, strides)

        inputs = [tensor(v, True) for v in self.op.inputs]
        return Workload(inputs, [tensor(v, False) for v in self.op.outputs])


def build_kernels(
    kernels: list[Function],
    target: str,
    options: Options,
    device_index: int | None = None,
    device_functions: Sequence[Function] = (),
) -> tuple[dict[str, Callable], str]:
    """Compile the kernels (and the device functions they call) into one binary; callables by
    kernel name, and the source.

    A callable takes the kernel's parameters (buffer addresses, then scalars).
    """
    if not kernels:
        return {}, ""
    module = Module("graph", tuple(device_functions) + tuple(kernels))
    if target == "cpu":
        from minicomp.backends.cpu.module import build

        cflags = options.cflags + (" -g" if options.debug else "")
        lib = build(module, cc=options.cc, cflags=cflags, cache_dir=options.cache_dir)
        return {k.name: lib.kernel(k.name) for k in kernels}, lib.source
    if target == "cuda-emu":
        from minicomp.backends.cuda.codegen import render_module
        from minicomp.backends.cuda.emu import build_emulated

        source = render_module(module)
        emu = build_emulated(source, kernels, cache_dir=options.cache_dir)
        return {k.name: _emulated_launcher(emu, k) for k in kernels}, source
    if target == "cuda":
        from minicomp.backends.cuda.module import build

        index = torch.cuda.current_device() if device_index is None else device_index
        cuda = build(module, device_index=index, cache_dir=options.cache_dir, arch=options.arch)
        return {k.name: cuda.kernel(k.name, launch_dims(k)) for k in kernels}, cuda.source
    raise ValueError(f"unknown target {target!r}")


def _emulated_launcher(emu, kernel: Function) -> Callable:
    """A callable launching `kernel` in the emulator, its grid (and dynamic shared memory)
    computed from the sizes."""
    from minicomp.backends.cuda.module import dynamic_shared_bytes

    name, dims, shared = kernel.name, launch_dims(kernel), dynamic_shared_bytes(kernel)

    def launch(*args: Any) -> None:
        grid, block = dims(args)
        nbytes = shared(args) if callable(shared) else shared
        if nbytes:
            emu.launch(name, grid, block, args, nbytes)
        else:
            emu.launch(name, grid, block, args)

    return launch


def graph_devices(graph: Graph) -> set[str]:
    """The device types of every tensor value of the graph."""
    values = [v for v in graph.inputs if isinstance(v, Value)]
    values += [v for n in graph.nodes for v in n.outputs]
    return {v.type.device for v in values}


def resolve_target(requested: str, graph: Graph) -> str:
    """The target that runs `graph`: `requested`, or for "auto" the device its tensors are on.

    Raises ValueError when the target cannot run the graph's tensors where they are.
    """
    devices = graph_devices(graph)
    if requested == "auto":
        return "cuda" if "cuda" in devices else "cpu"
    if requested in ("cpu", "cuda-emu") and "cuda" in devices:
        raise ValueError(
            f"target {requested!r} runs kernels on CPU tensors, but this graph has tensors on "
            "cuda; use target='cuda' (or 'auto')"
        )
    if requested == "cuda" and devices and "cuda" not in devices:
        raise ValueError(
            f"target 'cuda' needs tensors on a CUDA device; this graph's are on "
            f"{', '.join(sorted(devices))}; use target='cpu' or 'cuda-emu' (or 'auto')"
        )
    return requested


def _kernel_device(target: str) -> str:
    return "cuda" if target == "cuda" else "cpu"


def place_constants(graph: Graph, target: str) -> Graph:
    """`graph` with the constants its kernels read moved to the target's device (PyTorch lets
    a CPU scalar tensor meet CUDA tensors; a kernel cannot read host memory); raises
    ValueError for a kernel reading a graph input on another device."""
    want = _kernel_device(target)
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
                    f"{target} target runs kernels on {want} tensors"
                )
            moved[v.name], changed = t.to(want), True
    return graph.replace(constants=moved) if changed else graph


class PlanBuilder:
    """Assigns a slot to every value and turns operators into plan steps."""

    def __init__(
        self,
        graph: Graph,
        layouts: dict,
        kernels: dict[str, Callable],
        symbols: dict[str, list[str]],
    ):
        self.graph = graph
        self.layouts = layouts
        self.kernels = kernels
        self.symbols = symbols
        self.slot: dict[str, int] = {}
        self.slots: list[SlotInfo] = []
        # Symbols ATen calls bind while the plan runs: values sized by them cannot live in
        # the workspace, which is laid out when a call starts.
        self.late = {s for n in graph.nodes if isinstance(n, ExternOp) for s, _ in n.binds}

    def add_slot(self, v: Value, workspace: bool = False, strides: tuple | None = None) -> int:
        k = len(self.slots)
        self.slot[v.name] = k
        self.slots.append(
            SlotInfo(
                v.name,
                dims_fn(v.shape),
                dims_fn(self.layouts[v.name] if strides is None else strides),
                T.to_torch(v.dtype),
                v.type.device,
                workspace,
            )
        )
        return k

    def build(self) -> Plan:
        g = self.graph
        outputs = g.output_values()
        inputs, binders, checked = [], [], []
        kernel_reads = {v for n in g.nodes if isinstance(n, _LAUNCHED) for v in n.inputs}
        kernel_reads |= eager_stride_reads(g)
        for pos, v in enumerate(g.inputs):
            if isinstance(v, Var):
                inputs.append(("symbol", v.name))
                continue
            k = self.add_slot(v)
            inputs.append(("tensor", k))
            if v in kernel_reads:
                checked.append(k)
            for d, size in enumerate(v.shape):
                if isinstance(size, Var):
                    binders.append((pos, d, size.name))
        constants = {}
        returned = {v.name: v for v in outputs}
        for name, t in g.constants.items():
            # A returned constant is copied out with the strides PyTorch gave the value.
            v = returned.get(name)
            if v is not None and v.type.strides is not None:
                constants[self.add_slot(v, strides=v.type.strides)] = t
            else:
                constants[self.add_slot(Value(name, _constant_type(t)))] = t
        steps: list[Step] = []
        fresh = []
        for n in g.nodes:
            for v in n.outputs:
                if v.name in self.slot:
                    continue
                internal = isinstance(n, _LAUNCHED) and v not in outputs and not self.is_late(v)
                k = self.add_slot(v, workspace=internal)
                if isinstance(n, _LAUNCHED) and not internal:
                    fresh.append(k)
            if isinstance(n, FusedOp):
                steps.append(self.kernel_step(n))
            elif isinstance(n, KernelOp):
                steps.append(self.launch_step(n))
            else:
                steps.append(self.extern_step(n))
        extern_reads = {k for s in steps if isinstance(s, ExternStep) for k in s.reads}
        for k, info in enumerate(self.slots):
            # Workspace intermediates only kernels read are passed as bare addresses.
            info.as_tensor = not info.workspace or k in extern_reads
        outs = []
        for o in g.outputs:
            if o is None:
                outs.append(("none", None))
            elif isinstance(o, Value):
                outs.append(("slot", self.slot[o.name]))
            elif isinstance(o, Expr):
                fn = dims_fn([o])
                outs.append(("size", lambda env, fn=fn: fn(env)[0]))
            else:
                outs.append(("size", lambda env, o=o: o))
        return Plan(self.slots, inputs, steps, outs, constants, fresh, binders, checked)

    def is_late(self, v: Value) -> bool:
        """Whether the size or layout of `v` uses a symbol bound while the plan runs."""
        return bool(self.late) and not self.late.isdisjoint(
            free_symbols((*v.shape, *self.layouts[v.name]))
        )

    def kernel_step(self, n: FusedOp) -> KernelStep:
        buffers = [self.slot[v.name] for v in n.inputs + n.outputs]
        outputs = [self.slot[v.name] for v in n.outputs]
        return KernelStep(n.name, self.kernels[n.name], buffers, outputs, self.symbols[n.name])

    def launch_step(self, n: KernelOp) -> LaunchStep:
        values = n.inputs + n.outputs
        pairs = list(zip(n.function.params, n.args))
        buffers = [self.slot[values[a.index].name] for _, a in pairs if isinstance(a, ArgRef)]
        scalars = [(p, a) for p, a in pairs if not isinstance(a, ArgRef)]
        if any(isinstance(a, ArgRef) for _, a in pairs[len(buffers) :]):
            raise ValueError(f"kernel {n.function.name} takes a pointer after a scalar")
        outputs = [self.slot[v.name] for v in n.outputs]
        fn = self.kernels[n.function.name]
        return LaunchStep(
            n.name, fn, buffers, outputs, (), _scalars_builder(scalars), launch_dims(n.function)
        )

    def extern_step(self, n: ExternOp) -> ExternStep:
        reads = [self.slot[v.name] for v in n.inputs]
        args_fn = _args_builder(n, reads)
        expected = [
            dims_fn(v.type.strides) if v.type.strides is not None else None for v in n.outputs
        ]
        schema = getattr(n.target, "_schema", None)
        view_like = (
            getattr(n.target, "is_view", False)
            or schema is not None
            and any(r.alias_info is not None for r in schema.returns)
        )
        return ExternStep(
            n.name,
            n.target,
            args_fn,
            [self.slot[v.name] for v in n.outputs],
            n.result_paths,
            expected,
            reads,
            reads if view_like else [],
            n.binds,
        )


# Operators the plan launches as kernels of its own module.
_LAUNCHED = (FusedOp, KernelOp)


def _scalars_builder(scalars: list[tuple[Var, Expr]]) -> Callable[[dict], list]:
    """A function of the size binding giving a kernel's scalar arguments, in the form its
    launcher takes (f16 and bf16 as their bits; integers checked to fit)."""
    from minicomp.backends.c_like import half_bits
    from minicomp.script.conversions import fits

    getters = []
    for p, a in scalars:
        dt = p.type
        if isinstance(a, Const):
            value = half_bits(float(a.value), dt) if dt in (T.f16, T.bf16) else a.value
            getters.append(lambda env, value=value: value)
            continue
        size = dims_fn([a])

        def get(env: dict, size=size, dt=dt, name=p.name) -> int:
            value = size(env)[0]
            if not fits(value, dt):
                raise ValueError(f"kernel argument {name} = {value} does not fit in {dt.name}")
            return value

        getters.append(get)
    return lambda env: [g(env) for g in getters]


def _constant_type(t: torch.Tensor):
    from minicomp.dynamo.importer import tensor_type

    return tensor_type(t)


def _args_builder(n: ExternOp, reads: list[int]) -> Callable:
    def conv(a: Any, slots: list, env: dict) -> Any:
        if isinstance(a, ArgRef):
            return slots[reads[a.index]]
        if isinstance(a, Expr):
            return dims_fn([a])(env)[0]
        if isinstance(a, tuple):
            return [conv(x, slots, env) for x in a]
        return a

    def build(slots: list, env: dict) -> tuple:
        args = tuple(conv(a, slots, env) for a in n.args)
        kwargs = {k: conv(v, slots, env) for k, v in n.kwargs}
        return args, kwargs

    return build


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


def _schedule(
    graph: Graph,
    target: str,
    layouts: dict,
    choose: Callable,
    options: Options,
    unfused: Graph,
) -> list[Function]:
    """One kernel per fused group of `graph`. Where scheduling fails, raises KernelsFailed
    naming the ATen ops of the groups that fail on their own (the error itself with
    options.fallback "error", or when no group does)."""
    try:
        return [
            simplify_indices(k) for k in schedule_graph(graph, target, layouts, choose, options)
        ]
    except Exception as e:
        if options.fallback == "error":
            raise
        cause = e

    def schedules(g: FusedOp) -> bool:
        try:
            simplify_indices(schedule_group(g, target, layouts, choose, options))
        except Exception:
            return False
        return True

    bad = [g for g in graph.nodes if isinstance(g, FusedOp) and not schedules(g)]
    if not bad:
        raise cause
    raise failed(bad, unfused, cause) from cause


def _build_failure(
    groups: list[FusedOp],
    kernels: list[Function],
    unfused: Graph,
    cause: Exception,
    target: str,
    options: Options,
    device_index: int | None,
) -> Exception:
    """What to raise when building the graph's kernels raised `cause`: KernelsFailed naming
    the ATen ops of the kernels that fail to build on their own, else `cause`."""

    def builds(some: Sequence[Function]) -> bool:
        try:
            build_kernels(list(some), target, options, device_index)
        except Exception:
            return False
        return True

    bad = {k.name for k in failing_subset(kernels, builds)} if kernels else set()
    if not bad:
        return cause
    return failed([g for g, k in zip(groups, kernels) if k.name in bad], unfused, cause)


def compile_graph(
    graph: Graph,
    options: Options,
    record: CompileRecord,
    *,
    device_index: int | None = None,
    static_inputs: Sequence[int] = (),
) -> Callable:
    """The plan running `graph`: passes and fusion, one kernel per group, built and linked.

    `device_index` is the CUDA device the graph's tensors are on; `static_inputs` are the
    positions of inputs with stable addresses (parameters, buffers), which CUDA graphs capture
    in place.
    """
    from minicomp.passes.graph.attention import lower_attention
    from minicomp.dynamo.importer import has_script_ops, lower_script_ops
    from minicomp.passes.graph.fusion import fuse
    from minicomp.passes.graph.layout import contiguous_kernel_inputs
    from minicomp.passes.pipeline import passes_for, run_passes

    t0 = time.perf_counter()
    target = resolve_target(options.target, graph)
    record.target = target
    record.options = options
    trace = record.passes if record.trace else None
    passes = passes_for(target)
    if target in ("cuda", "cuda-emu"):
        # Front-door lowerings that launch script templates: after the graph passes, so
        # views read by attention are aliases and every layout is final.
        passes.append(lower_attention)
    pipeline = passes + [fuse]
    if target in ("cuda", "cuda-emu") and has_script_ops(graph):
        pipeline = [lower_script_ops, *passes, contiguous_kernel_inputs, fuse]
    graph = unfused = run_passes(graph, pipeline[:-1], trace=trace)
    graph = run_passes(graph, pipeline[-1:], trace=trace)
    graph = place_constants(graph, target)
    record.graph = graph
    layouts = layouts_for(graph)
    t1 = time.perf_counter()
    if target != "cuda" and options.search_space > 0:
        from minicomp.tune.tuner import notice_untuned

        notice_untuned(target, options.search_space)
    choose = make_chooser(options, target, layouts, device_index)
    if target in ("cuda", "cuda-emu"):
        from minicomp.passes.graph.aten_contraction import tune_contractions
        from minicomp.passes.graph.attention import tune_attention

        graph = record.graph = tune_attention(graph, choose)
        tuned = tune_contractions(
            graph, choose, layouts, options=options, target=target, device_index=device_index
        )
        if tuned is not graph:
            # The GEMMs' results are new values.
            graph = record.graph = tuned
            layouts = layouts_for(graph)
    groups = [n for n in graph.nodes if isinstance(n, FusedOp)]
    kernels = _schedule(graph, target, layouts, choose, options, unfused)
    launched, device_functions = _script_functions(graph)
    record.kernels = kernels + launched
    t2 = time.perf_counter()
    try:
        fns, record.source = build_kernels(
            kernels + launched, target, options, device_index, device_functions
        )
    except Exception as e:
        if options.fallback == "error":
            raise
        raise _build_failure(groups, kernels, unfused, e, target, options, device_index) from e
    t3 = time.perf_counter()
    record.times.update(passes=t1 - t0, schedule=t2 - t1, build=t3 - t2)
    symbols = {
        k.name: [p.name for p in k.params if isinstance(p.type, T.DataType)] for k in kernels
    }
    builder = PlanBuilder(graph, layouts, fns, symbols)
    plan = builder.build()
    if target == "cuda" and options.cuda_graphs and not builder.late:
        # A graph whose sizes depend on data it computes cannot replay: it runs step by step.
        from minicomp.runtime.cuda_graphs import GraphedPlan

        return GraphedPlan(plan, static_inputs)
    return plan
