"""Building a kernel-IR module for the cpu target and calling its kernels through ctypes."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from minicomp.backends.cpu import compiler
from minicomp.backends.cpu.codegen import render_module, runtime_header
from minicomp.backends.ctypes_params import SCALAR_CTYPES, param_ctype
from minicomp.ir.func import Function, Module


def _checked(cfunc: Callable, f: Function) -> Callable:
    n = len(f.params)
    signature = f"{f.name}({', '.join(p.name for p in f.params)})"

    # ctypes accepts surplus arguments silently: count them here, and nothing else.
    def call(*args):
        if len(args) != n:
            raise TypeError(f"kernel {signature} takes {n} arguments, {len(args)} given")
        cfunc(*args)

    call.__name__ = call.__qualname__ = f.name
    call.__doc__ = f"Kernel {signature}; pointers are integer addresses."
    call.cfunc = cfunc  # type: ignore[attr-defined]
    return call


class CpuModule:
    """A compiled module: its C `source`, the shared library's `path`, and its kernels.

    The library stays loaded while the module or a kernel taken from it is referenced."""

    def __init__(self, module: Module, source: str, path: str, library: ctypes.CDLL):
        self.module = module
        self.source = source
        self.path = path
        self.library = library
        self._kernels: dict[str, Callable] = {}

    def kernel(self, name: str) -> Callable:
        """The kernel (or host function) `name` as a Python callable taking its arguments
        positionally: integer addresses (`tensor.data_ptr()`) for pointers, numbers else."""
        fn = self._kernels.get(name)
        if fn is None:
            f = self.module.function(name)
            if f.kind == "device":
                raise ValueError(f"{name} is a device function, not callable from Python")
            cfunc = self.library[name]  # not getattr: that caches it, a cycle delaying unloading
            cfunc.argtypes = [param_ctype(p) for p in f.params]
            cfunc.restype = None if f.ret is None else SCALAR_CTYPES[f.ret.name]
            fn = self._kernels[name] = _checked(cfunc, f)
        return fn

    def __repr__(self) -> str:
        return f"CpuModule({self.module.name!r}, path={self.path!r})"


def build(module: Module, *, cc: str, cflags: str, cache_dir: str) -> CpuModule:
    """Render `module` to C, compile it with `cc` and `cflags` (cached under `cache_dir`) and
    load it.

    The runtime header the source carries inline is included first from the cache, where GCC
    keeps it precompiled for these flags; the inline copy's include guard then skips it.
    Parsing it (immintrin.h above all) was four fifths of a small kernel's build.
    """
    source = render_module(module)
    header = compiler.precompiled_header(
        runtime_header(), cc=cc, cflags=cflags, cache_dir=cache_dir, name="cpu_runtime"
    )
    unit = f'#include "{compiler.include_name(header)}"\n' + source
    library = compiler.compile_library(
        unit, cc=cc, cflags=cflags, cache_dir=cache_dir, name=module.name, headers=[header]
    )
    return CpuModule(module, source, library._name, library)
