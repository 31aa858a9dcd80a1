"""The tuner's Runner that ranks candidates by the performance lens instead of timing them: how
search spaces 1 and 2 tune on a machine without a GPU (cuda-emu, or the cost_model option).

Each candidate is built twice: NVRTC compiles it for the described device's architecture (its
registers and shared memory set the occupancy), and the emulator builds it with its operation
counts; a launch on random host inputs that runs only the sampled blocks gives the counts, and
lens/estimate.py the time. Nothing is timed, so the candidates are not checked against each
other on large problems (running a whole grid in the emulator takes minutes): they are checked
only where the whole problem is small enough to emulate quickly (VERIFY_BYTES).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch

from minicomp.backends.cuda.codegen import render_module
from minicomp.backends.cuda.emu import build_emulated, default_sample
from minicomp.backends.cuda.intrinsics_wgmma import feature_arch
from minicomp.backends.cuda.module import dynamic_shared_bytes
from minicomp.backends.cuda.nvrtc import compile_cuda
from minicomp.backends.cuda.tensor_map import encoded_maps, tensor_map_arguments
from minicomp.config import Options
from minicomp.ir import types as T
from minicomp.ir.func import Function, Module
from minicomp.ir.graph import FusedOp
from minicomp.ir.scratch import scratch_tensors
from minicomp.ir.symbols import launch_dims
from minicomp.lens.counts import KernelCounts, scratch_positions
from minicomp.lens.devices import Device
from minicomp.lens.estimate import estimate
from minicomp.passes.kernel.count_ops import count_ops
from minicomp.tune.tuner import Workload
from minicomp.tune.workloads import random_workload, runnable, storage_elements

VERIFY_BYTES = 1 << 18
"""Candidates of a group whose tensors take at most this many bytes are run whole and checked
against the heuristic config's kernel; larger ones are only estimated."""


class LensRunner:
    """Builds a fused group's candidate kernels for the emulator with counts, and "times" each
    one by its lens estimate on `device`: a tune.tuner.Runner for cuda-emu (or any CUDA target
    with the cost_model option "lens")."""

    l2_bytes = 0  # one workload: nothing is timed, so no L2 cache to defeat
    compile_job = None
    aten = None

    def __init__(self, op: FusedOp, layouts: dict, options: Options, device: Device):
        self.op = op
        self.layouts = layouts
        self.options = options
        self.device = device
        self.arch = f"lens-{device.key}"  # the database keeps estimates apart from timings
        self.verifies = _nbytes(op, layouts) <= VERIFY_BYTES
        self.timer = _estimated_seconds
        self.model = f"the lens's estimate on {device.name}"

    can_estimate = staticmethod(runnable)

    def render(self, kernel: Function) -> str:
        return render_module(Module(kernel.name, (kernel,)))

    def load(self, kernel: Function, source: str) -> Callable:
        cache = self.options.cache_dir
        arch = feature_arch(self.device.arch, Module(kernel.name, (kernel,)))
        resources = _resources(source, arch, cache).get(kernel.name)
        counted = count_ops(kernel)
        unit = render_module(Module(kernel.name, (counted,)))
        emu = build_emulated(unit, [counted], cache_dir=cache, lens=True)
        dims, shared = launch_dims(kernel), dynamic_shared_bytes(kernel)
        name, device = kernel.name, self.device
        maps = tensor_map_arguments(kernel)

        def run(w: Workload, sample_only: bool):
            buffers = (*w.inputs, *w.outputs, *scratch_tensors(kernel, "cpu"))
            args = (*encoded_maps(maps, buffers, w.scalars), *buffers, *w.scalars)
            grid, block = dims(args)
            nbytes = shared(args) if callable(shared) else shared
            sample = default_sample(math.prod(grid), group=kernel.attrs.block_group)
            return emu.launch_counted(
                name, grid, block, args, nbytes, sample=sample, sample_only=sample_only
            )

        def launch(w: Workload) -> None:
            run(w, False)

        def seconds(w: Workload) -> float:
            counts = KernelCounts.from_sample(run(w, True), scratch=scratch_positions(kernel))
            return estimate(counts, device, resources).time

        launch.estimate = seconds
        return launch

    def workload(self, seed: int) -> Workload:
        return random_workload(self.op, self.layouts, seed, torch.device("cpu"))


def _estimated_seconds(launch: Callable, workloads: Sequence[Workload]) -> float:
    """The timer of a LensRunner: the estimate of one launch on the first workload."""
    return launch.estimate(workloads[0])


def _nbytes(op: FusedOp, layouts: dict) -> int:
    """The bytes of the group's tensors (the caller checked they are static)."""
    return sum(
        storage_elements(v.shape, layouts[v.name]) * T.to_torch(v.dtype).itemsize
        for v in (*op.inputs, *op.outputs)
    )


@functools.lru_cache(maxsize=256)
def _resources(source: str, arch: str, cache_dir: str) -> dict:
    """ptxas's registers, shared memory and spills of each kernel of `source` on `arch`."""
    return dict(compile_cuda(source, arch=arch, cache_dir=cache_dir).resources)
