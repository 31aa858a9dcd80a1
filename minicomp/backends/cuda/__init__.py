"""The cuda target: CUDA C rendering (device.h inlined) and NVRTC compilation to cubins."""

from minicomp.backends.cuda.codegen import CudaRenderer, device_header, render_module
from minicomp.backends.cuda.nvrtc import (
    CudaBinary,
    KernelResources,
    NvrtcUnavailableError,
    compile_cuda,
)

__all__ = [
    "CudaBinary",
    "CudaRenderer",
    "KernelResources",
    "NvrtcUnavailableError",
    "compile_cuda",
    "device_header",
    "render_module",
]
