"""The tuner's Runner for the cuda target: candidate kernels of one fused group, built with
NVRTC and timed on random inputs on the GPU."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from minicomp.backends.cuda.codegen import render_module
from minicomp.backends.cuda.module import build, pick_arch
from minicomp.backends.cuda.nvrtc import compile_cuda, library_path
from minicomp.backends.cuda.tensor_map import encoded_maps, tensor_map_arguments
from minicomp.config import Options
from minicomp.ir.func import Function, Module
from minicomp.ir.graph import FusedOp
from minicomp.ir.scratch import scratch_tensors
from minicomp.ir.symbols import launch_dims
from minicomp.tune.tuner import Workload
from minicomp.tune.workloads import random_workload, runnable


class CudaRunner:
    """Builds candidate kernels of one fused group and runs them on random inputs on the GPU:
    the tuner's tune.tuner.Runner for the cuda target.

    A kernel takes the group's input buffers, then its outputs, then its scratch memory (the
    order KernelStep passes).
    """

    def __init__(
        self,
        op: FusedOp,
        layouts: dict,
        options: Options,
        device_index: int | None = None,
        aten: Callable | None = None,
    ):
        self.op = op
        self.layouts = layouts
        self.options = options
        self.index = torch.cuda.current_device() if device_index is None else device_index
        self.arch = options.arch or pick_arch(self.index, library=options.nvrtc_library)
        self.l2_bytes = torch.cuda.get_device_properties(self.index).L2_cache_size
        # Compile workers build with the NVRTC file this process loaded: which one cuda-python
        # finds can differ between processes, and with it the cache keys.
        self.compile_job = functools.partial(
            compile_cuda,
            arch=self.arch,
            cache_dir=options.cache_dir,
            library=library_path(options.nvrtc_library),
        )
        self.aten = aten
        self.timer = None

    can_measure = staticmethod(runnable)

    def render(self, kernel: Function) -> str:
        return render_module(Module(kernel.name, (kernel,)))

    def load(self, kernel: Function, source: str) -> Callable:
        module = build(
            Module(kernel.name, (kernel,)),
            device_index=self.index,
            cache_dir=self.options.cache_dir,
            arch=self.arch,
            library=self.options.nvrtc_library,
        )
        launcher = module.kernel(kernel.name, launch_dims(kernel))
        # One set for every launch: zeroed scratch stays zero between launches.
        scratch = scratch_tensors(kernel, torch.device("cuda", self.index))
        maps = tensor_map_arguments(kernel)

        def launch(w) -> None:
            tensors = (*w.inputs, *w.outputs, *scratch)
            encoded = encoded_maps(maps, tensors, w.scalars)
            launcher(*encoded, *(t.data_ptr() for t in tensors), *w.scalars)

        return launch

    def workload(self, seed: int) -> Workload:
        return random_workload(self.op, self.layouts, seed, torch.device("cuda", self.index))
