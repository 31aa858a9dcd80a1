"""Building a kernel-IR module for the cuda target: CUDA C, NVRTC cubin, loaded and launchable."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from minicomp.backends.ctypes_params import param_ctype
from minicomp.backends.cuda import driver
from minicomp.backends.cuda.codegen import render_module
from minicomp.backends.cuda.intrinsics_wgmma import feature_arch
from minicomp.backends.cuda.nvrtc import CudaBinary, compile_cuda, supported_archs
from minicomp.ir import expr as E
from minicomp.ir.func import Function, Module
from minicomp.ir.symbols import compile_dims
from minicomp.ir.types import DataType


def pick_arch(device_index: int, *, library: str | None = None) -> str:
    """The architecture to compile for on device `device_index`: its own when NVRTC supports it,
    else the newest supported one of the same major version (cubins run on later minors).
    `library` is the libnvrtc to load if NVRTC is not loaded yet (nvrtc.load)."""
    arch = driver.device_arch(device_index)
    supported = supported_archs(library=library)
    if arch in supported:
        return arch
    major, minor = int(arch[3:-1]), int(arch[-1])
    same_major = [
        a for a in supported if int(a[3:-1]) == major and int(a[-1]) <= minor and a[-1].isdigit()
    ]
    if not same_major:
        raise driver.CudaDriverError(
            f"NVRTC cannot compile for this device ({arch}); it supports {', '.join(supported)}"
        )
    return max(same_major)


class CudaModule:
    """A compiled, loaded module: its CUDA `source`, the `binary`, and launchable kernels."""

    def __init__(self, module: Module, source: str, binary: CudaBinary, device_index: int):
        self.module = module
        self.source = source
        self.binary = binary
        self.loaded = driver.LoadedModule(binary.cubin, device_index)

    def kernel(self, name: str, dims: Callable[[Sequence[Any]], tuple]) -> driver.Launcher:
        """Kernel `name` as a callable: integer addresses for pointers, then numbers; it launches
        on PyTorch's current stream with (grid, block) = `dims(args)`."""
        f = self.module.function(name)
        ctypes_ = [param_ctype(p) for p in f.params]
        return driver.Launcher(self.loaded, name, ctypes_, dims, dynamic_shared_bytes(f))

    def __repr__(self) -> str:
        return f"CudaModule({self.module.name!r}, arch={self.binary.arch!r})"


def dynamic_shared_bytes(kernel: Function) -> int | Callable[[Sequence[Any]], int]:
    """The dynamic shared memory of a launch of `kernel` (its attrs.dynamic_smem bytes): an
    int, or a function of the kernel's arguments when the size is an expression over its
    scalar parameters."""
    size = kernel.attrs.dynamic_smem
    if not isinstance(size, E.Expr):
        return int(size)
    if isinstance(size, E.Const):
        return int(size.value)
    evaluate = compile_dims([size])
    scalars = [i for i, p in enumerate(kernel.params) if isinstance(p.type, DataType)]
    names = [kernel.params[i].name for i in scalars]
    return lambda args: evaluate(dict(zip(names, (args[i] for i in scalars))))[0]


def build(
    module: Module,
    *,
    device_index: int,
    cache_dir: str,
    arch: str | None = None,
    library: str | None = None,
) -> CudaModule:
    """Render `module` to CUDA C, compile it with NVRTC (cached; `library` as for nvrtc.load)
    and load it on the device: for `arch`, else the device's (sm_90a on an sm_90 device for a
    module using wgmma)."""
    source = render_module(module)
    arch = arch or feature_arch(pick_arch(device_index, library=library), module)
    binary = compile_cuda(source, arch=arch, name=module.name, cache_dir=cache_dir, library=library)
    return CudaModule(module, source, binary, device_index)
