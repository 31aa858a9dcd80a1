"""The tuner's Runner for the cuda target: candidate kernels of one fused group, built with
NVRTC and timed on random inputs on the GPU."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from minicomp.backends.cuda.codegen import render_module
from minicomp.backends.cuda.module import build, pick_arch
from minicomp.backends.cuda.nvrtc import compile_cuda, library_path
from minicomp.config import Options
from minicomp.ir import types as T
from minicomp.ir.func import Function, Module
from minicomp.ir.graph import FusedOp, Value
from minicomp.ir.symbols import launch_dims
from minicomp.tune.tuner import Workload


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

        def launch(w) -> None:
            launcher(*(t.data_ptr() for t in (*w.inputs, *w.outputs)), *w.scalars)

        return launch

    def workload(self, seed: int):
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
