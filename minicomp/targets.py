"""The places minicomp compiles for, one object each.

A target decides everything that differs between them: the graph passes it runs before
fusion, how it schedules a fused group into a kernel, how it builds kernels (C compiler,
emulator, NVRTC), whether it can time kernels to tune them, what runs the finished plan, and
how a script kernel launched from Python builds on it. The compiler (minicomp/compiler.py)
and the script launcher ask the target; nothing else branches on a target's name.

Adding a target is one class here, one line in TARGETS, and its name among the `target`
option's choices in config.py (which sits below and cannot import this; a test checks that
the two agree).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minicomp.backends.cpu import module as cpu_module
from minicomp.backends.cuda import module as cuda_module
from minicomp.backends.cuda.arch import device_build_arch
from minicomp.backends.cuda.codegen import render_module
from minicomp.backends.cuda.emu import build_emulated, default_sample
from minicomp.backends.cuda.sm_count import device_sm_count
from minicomp.config import Options
from minicomp.ir.func import Function, Module
from minicomp.ir.graph import FusedOp, Graph
from minicomp.ir.symbols import launch_dims
from minicomp.lens import session as lens_session
from minicomp.lens.devices import get_device
from minicomp.passes.graph.anchors import lower_anchors
from minicomp.passes.graph.aten_contraction import tune_contractions
from minicomp.passes.graph.attention import lower_attention, tune_attention
from minicomp.passes.graph.attention_backward import lower_attention_backward
from minicomp.passes.graph.fold_constants import constant_operand_layouts
from minicomp.passes.graph.int8_weight_products import int8_weight_products
from minicomp.passes.graph.layout import contiguous_kernel_inputs
from minicomp.passes.graph.library_calls import name_library_calls
from minicomp.passes.graph.onednn_convolution import onednn_convolutions
from minicomp.passes.graph.onednn_linear import onednn_linears
from minicomp.passes.graph.small_channels import pad_small_channels
from minicomp.passes.graph.split_k import split_k
from minicomp.passes.graph.split_reductions import split_reductions
from minicomp.passes.kernel.count_ops import count_ops
from minicomp.passes.pipeline import DEFAULT_PASSES, FIRST_PASSES, GraphPass, configured
from minicomp.runtime.cuda_graphs import GraphedPlan
from minicomp.runtime.plan import Plan
from minicomp.schedule.cpu import schedule_cpu
from minicomp.schedule.cuda import schedule_cuda
from minicomp.script.custom_op import has_script_ops, lower_script_ops
from minicomp.tune.chooser import RunnerFactory
from minicomp.tune.cuda_runner import CudaRunner
from minicomp.tune.lens_runner import LensRunner

# A built kernel: called with its parameters (buffer addresses, then scalars).
Kernels = dict[str, Callable]
# A built script kernel: called with its IR-ordered arguments (tensors as tensors), the grid,
# the block and the dynamic shared memory bytes.
ScriptLauncher = Callable[[Sequence, tuple, tuple, int], None]


class Target:
    """What compiling for one place decides (this base class: a host target)."""

    name: str = ""
    # The device type of the tensors its kernels read and write.
    device: str = "cpu"
    # Whether it compiles CUDA C: the CUDA templates and script kernels run on it.
    runs_cuda: bool = False
    # Whether it runs CUDA C on the host (the emu_checks option then checks its accesses).
    emulated: bool = False
    # The graph passes it runs before fusion (script-op graphs: passes_for).
    passes: tuple[GraphPass, ...] = ()

    def __repr__(self) -> str:
        return f"<target {self.name}>"

    def check_devices(self, devices: set[str]) -> None:
        """Raise ValueError when this target cannot run kernels on a graph whose tensors are on
        `devices`."""
        if "cuda" in devices:
            raise ValueError(
                f"target {self.name!r} runs kernels on CPU tensors, but this graph has tensors "
                "on cuda; use target='cuda' (or 'auto')"
            )

    def passes_for(self, graph: Graph, options: Options | None = None) -> list[GraphPass]:
        """The graph passes run before fusion when compiling `graph` with `options` (the
        passes that size for the GPU take `options.sm_count` when it is set)."""
        return list(self.passes)

    def sm_count(self, options: Options, device_index: int | None) -> int:
        """The SMs of the GPU the graph compiles for, which the schedulers and graph passes
        size grids by (the `sm_count` option when unset). This base class's: the lens's
        described GPU (`lens_device`), since no GPU runs its kernels: a host target's kernels
        never read it, and the count stays one every target can give."""
        return get_device(options.lens_device).sms

    def arch(self, options: Options, device_index: int | None) -> str:
        """The CUDA architecture the graph's kernels compile for, which decides what the
        templates may use (the `arch` option when unset). This base class's: the lens's
        described GPU's (`lens_device`), as for `sm_count`."""
        return get_device(options.lens_device).arch

    def schedule(
        self, op: FusedOp, layouts: dict, choose: Callable | None, options: Options | None
    ) -> Function:
        """The kernel function of one fused group."""
        raise NotImplementedError

    def build(
        self,
        kernels: Sequence[Function],
        options: Options,
        device_index: int | None = None,
        device_functions: Sequence[Function] = (),
    ) -> tuple[Kernels, str]:
        """Compile the kernels (and the device functions they call) into one binary; callables
        by kernel name, and the source. A callable takes the kernel's parameters."""
        raise NotImplementedError

    def runner_factory(
        self, layouts: dict, options: Options, device_index: int | None
    ) -> RunnerFactory | None:
        """What times a group's candidate kernels for the tuner; None where kernels cannot be
        timed."""
        return None

    def tune_graph(
        self,
        graph: Graph,
        choose: Callable,
        layouts: dict,
        options: Options,
        device_index: int | None,
    ) -> Graph:
        """`graph` after the tuning decisions that rewrite it (a template or ATen's kernel)."""
        return graph

    def finish(
        self, plan: Plan, options: Options, static_inputs: Sequence[int], replayable: bool
    ) -> Callable:
        """What runs the plan: the plan itself, or a wrapper around it. `replayable`: no size
        of the plan depends on data it computes; `static_inputs` are the positions of inputs
        with stable addresses (parameters, buffers)."""
        return plan

    def build_script(
        self, module: Module, function: Function, options: Options, device: Any, checks: bool
    ) -> ScriptLauncher:
        """A script kernel `function` of `module` built to launch from Python."""
        raise ValueError(f"the {self.name} target does not run script kernels")


class CpuTarget(Target):
    """Kernels as C functions compiled by the host C compiler, on CPU tensors."""

    name = "cpu"
    # Convolutions become oneDNN calls on channels-last values last, when every view and
    # alias is decided: a value an ATen call or an alias reads keeps eager's layout. Products
    # become oneDNN's linear, prepacked over constant weights (after the default passes fold
    # the weights' transposes into constants), else over weights whose layouts are final.
    # Products and convolutions left to ATen say so by design first, before passes that
    # build on them.
    passes = (
        name_library_calls,
        *FIRST_PASSES,
        *DEFAULT_PASSES,
        onednn_convolutions,
        int8_weight_products,
        onednn_linears,
    )

    def passes_for(self, graph, options=None):
        passes = list(self.passes)
        if options is None:
            return passes
        # The library computing float32 products: the cpu_gemm option's (auto: by the CPU).
        return [
            configured(p, library=options.cpu_gemm) if p is onednn_linears else p for p in passes
        ]

    def schedule(self, op, layouts, choose, options):
        return schedule_cpu(op, layouts)

    def build(self, kernels, options, device_index=None, device_functions=()):
        if not kernels:
            return {}, ""
        module = Module("graph", (*device_functions, *kernels))
        cflags = options.cflags + (" -g" if options.debug else "")
        lib = cpu_module.build(module, cc=options.cc, cflags=cflags, cache_dir=options.cache_dir)
        return {k.name: lib.kernel(k.name) for k in kernels}, lib.source


def _configured_for(p, options):
    """Pass `p` with what it needs of the compile bound: the GPU's SM count for the passes
    that fill its SMs (split_k, lower_attention and its backward), the architecture for those
    whose choice depends on it (lower_anchors: _scaled_mm needs sm_89 on CUDA;
    lower_attention and lower_attention_backward: the Hopper attention needs sm_90a;
    split_k: the Hopper matmul's model weighs splits on sm_90a)."""
    settings = {}
    attention = (lower_attention, lower_attention_backward)
    if options.sm_count is not None and p in (split_k, *attention):
        settings["sms"] = options.sm_count
    if options.arch is not None and p in (lower_anchors, split_k, *attention):
        settings["arch"] = options.arch
    return configured(p, **settings) if settings else p


class CudaSourceTarget(Target):
    """What the targets compiling CUDA C share: the CUDA scheduler and its templates, fused
    attention, ATen's GEMM as a tuning candidate, script kernels."""

    runs_cuda = True
    # Ops computed whole (anchors) are lowered first, so the default passes see them as
    # compute ops; fused attention and its backward become kernel launches last, when views
    # they read are zero-copy aliases and every layout is final. Constant operands of
    # products take the layout the templates read before split_k rewrites the products'
    # indices; split_k precedes split_reductions, which would split a long-K product with few
    # outputs as a row reduction that no matmul template computes.
    passes = (
        *FIRST_PASSES,
        pad_small_channels,
        lower_anchors,
        *DEFAULT_PASSES,
        constant_operand_layouts,
        split_k,
        split_reductions,
        lower_attention,
        lower_attention_backward,
    )

    def passes_for(self, graph, options=None):
        passes = list(self.passes)
        if options is not None:
            passes = [_configured_for(p, options) for p in passes]
        if not has_script_ops(graph):
            return passes
        # Script-kernel ops launch first, so the default passes see their tensors; their
        # launches read row-major inputs.
        return [lower_script_ops, *passes, contiguous_kernel_inputs]

    def schedule(self, op, layouts, choose, options):
        return schedule_cuda(op, layouts, choose, options)

    def tune_graph(self, graph, choose, layouts, options, device_index):
        graph = tune_attention(graph, choose)
        return tune_contractions(
            graph, choose, layouts, options=options, target=self, device_index=device_index
        )


class CudaEmuTarget(CudaSourceTarget):
    """The CUDA C kernels run by the emulator on the host, on CPU tensors: how CUDA kernels
    are checked without a GPU. They are scheduled for the lens's described GPU (`lens_device`,
    an H100 by default): its SM count is that device's (Target.sm_count)."""

    name = "cuda-emu"
    emulated = True

    def build(self, kernels, options, device_index=None, device_functions=()):
        if not kernels:
            return {}, ""
        source = render_module(Module("graph", (*device_functions, *kernels)))
        if options.lens:  # a counted build: the kernels with their operation counts
            counted = [count_ops(k) for k in kernels]
            unit = render_module(Module("graph", (*device_functions, *counted)))
            emu = build_emulated(unit, counted, cache_dir=options.cache_dir, lens=True)
        else:
            emu = build_emulated(source, kernels, cache_dir=options.cache_dir)
        return {k.name: _emulated_launcher(emu, k, source) for k in kernels}, source

    def runner_factory(self, layouts, options, device_index):
        if options.cost_model == "measure":
            return None  # nothing here can time a kernel
        return _lens_runner_factory(layouts, options)

    def build_script(self, module, function, options, device, checks):
        name = function.name
        source = render_module(module)
        if options.lens:
            # A counted build, as for a graph's kernels (unchecked: the lens instruments the
            # same accesses): each launch goes to the open lens sessions
            # (minicomp.lens.session) with the source NVRTC would compile.
            counted = count_ops(function)
            functions = tuple(counted if f.name == name else f for f in module.functions)
            unit = render_module(Module(module.name, functions))
            emu = build_emulated(unit, [counted], cache_dir=options.cache_dir, lens=True)

            def counted_launch(args, grid, block, shared):
                sample = default_sample(math.prod(grid), group=function.attrs.block_group)
                only = lens_session.sample_only()
                lens_session.record(
                    function,
                    source,
                    emu.launch_counted(
                        name, grid, block, args, shared, sample=sample, sample_only=only
                    ),
                )

            return counted_launch
        emu = build_emulated(source, [function], cache_dir=options.cache_dir, checks=checks)
        # The emulator flushes the kernels' printf output before a launch returns.
        return lambda args, grid, block, shared: emu.launch(name, grid, block, args, shared)


class CudaTarget(CudaSourceTarget):
    """CUDA C compiled by NVRTC, launched on the GPU, the plan replayed as CUDA graphs."""

    name = "cuda"
    device = "cuda"

    def check_devices(self, devices):
        if devices and "cuda" not in devices:
            raise ValueError(
                f"target 'cuda' needs tensors on a CUDA device; this graph's are on "
                f"{', '.join(sorted(devices))}; use target='cpu' or 'cuda-emu' (or 'auto')"
            )

    def sm_count(self, options, device_index, *, get_properties=None):
        """CUDA device `device_index`'s SMs (the current device when None); `get_properties`
        stands in for torch.cuda.get_device_properties."""
        return device_sm_count(device_index, get_properties=get_properties)

    def arch(self, options, device_index):
        """What NVRTC compiles for on CUDA device `device_index` (the current one when None):
        the device's own architecture, or the newest NVRTC has of the same major version; an
        sm_90 device's as sm_90a, its architecture-specific features (wgmma: the Hopper
        matmul template), since the graph's binary runs on that device only."""
        index = torch.cuda.current_device() if device_index is None else device_index
        return device_build_arch(cuda_module.pick_arch(index, library=options.nvrtc_library))

    def build(self, kernels, options, device_index=None, device_functions=()):
        if not kernels:
            return {}, ""
        cuda = _load(Module("graph", (*device_functions, *kernels)), options, device_index)
        return {k.name: cuda.kernel(k.name, launch_dims(k)) for k in kernels}, cuda.source

    def runner_factory(self, layouts, options, device_index):
        if options.cost_model == "lens":
            return _lens_runner_factory(layouts, options)

        def runner_for(op: FusedOp, aten: Callable | None) -> CudaRunner | None:
            if not CudaRunner.can_measure(op, layouts):
                return None
            return CudaRunner(op, layouts, options, device_index, aten)

        return runner_for

    def finish(self, plan, options, static_inputs, replayable):
        if options.cuda_graphs and replayable:
            return GraphedPlan(plan, static_inputs)
        return plan

    def build_script(self, module, function, options, device, checks):
        cuda = _load(module, options, device.index if device is not None else None)
        # The launcher evaluates the dynamic shared memory size itself.
        launcher = cuda.kernel(function.name, launch_dims(function))
        return lambda args, grid, block, shared: launcher(*map(_address, args))


def _load(module: Module, options: Options, device_index: int | None) -> Any:
    """`module` compiled by NVRTC (cached) and loaded on CUDA device `device_index` (None: the
    current one)."""
    index = torch.cuda.current_device() if device_index is None else device_index
    return cuda_module.build(
        module,
        device_index=index,
        cache_dir=options.cache_dir,
        arch=options.arch,
        library=options.nvrtc_library,
    )


def _address(value: Any) -> Any:
    return value.data_ptr() if hasattr(value, "data_ptr") else value


def _lens_runner_factory(layouts: dict, options: Options) -> Callable:
    """The tuner's runners ranking a group's candidates by the lens's estimate."""
    device = get_device(options.lens_device)

    def runner_for(op: FusedOp, aten: Callable | None) -> LensRunner | None:
        if not LensRunner.can_estimate(op, layouts):
            return None
        return LensRunner(op, layouts, options, device)

    return runner_for


def _emulated_launcher(emu: Any, kernel: Function, source: str = "") -> Callable:
    """A callable launching `kernel` in the emulator, its grid (and dynamic shared memory)
    computed from the sizes. A counted module's launcher (the lens option) takes the plan's
    tensors (the lens needs their bytes) and gives each launch's counts to the open lens
    sessions with `source`, the kernels as NVRTC builds them (without their counters)."""
    name, dims = kernel.name, launch_dims(kernel)
    shared = cuda_module.dynamic_shared_bytes(kernel)

    def launch(*args: Any) -> None:
        grid, block = dims(args)
        nbytes = shared(args) if callable(shared) else shared
        if emu.lens:
            only = lens_session.sample_only()
            blocks = default_sample(math.prod(grid), group=kernel.attrs.block_group)
            sample = emu.launch_counted(
                name, grid, block, args, nbytes, sample=blocks, sample_only=only
            )
            lens_session.record(kernel, source, sample)
        else:
            emu.launch(name, grid, block, args, nbytes)

    launch.takes_tensors = emu.lens
    return launch


TARGETS: dict[str, Target] = {t.name: t for t in (CpuTarget(), CudaTarget(), CudaEmuTarget())}


def get_target(name: str) -> Target:
    """The target called `name`; ValueError naming the known ones for any other."""
    target = TARGETS.get(name)
    if target is None:
        raise ValueError(f"unknown target {name!r}; the targets are {', '.join(TARGETS)}")
    return target


def resolve_target(requested: str, devices: set[str]) -> Target:
    """The target that runs a graph whose tensors are on `devices`: `requested`, or for "auto"
    cuda when some tensor is on a CUDA device, else cpu. Raises ValueError when the target
    cannot run the graph's tensors where they are."""
    if requested == "auto":
        return TARGETS["cuda" if "cuda" in devices else "cpu"]
    target = get_target(requested)
    target.check_devices(devices)
    return target


def script_target(requested: str | None, device: Any, options: Options) -> Target:
    """The target a script kernel launches on: its own, the `target` option when that one
    runs script kernels, else by where its tensors are (CUDA tensors on the GPU, CPU tensors
    in the emulator; with no tensor, the GPU when there is one)."""
    if requested is None and options.target in TARGETS and TARGETS[options.target].runs_cuda:
        requested = options.target
    if requested is not None:
        target = get_target(requested)
        if not target.runs_cuda:
            runs = " or ".join(t.name for t in TARGETS.values() if t.runs_cuda)
            raise ValueError(f"a script kernel runs on {runs}, not {requested!r}")
        return target
    on_gpu = torch.cuda.is_available() if device is None else device.type == "cuda"
    return TARGETS["cuda" if on_gpu else "cuda-emu"]
