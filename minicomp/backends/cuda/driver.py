"""The CUDA driver API through ctypes: PyTorch's primary context, modules and kernel launches.

libcuda is called directly rather than through cuda-python's driver bindings: a launch is one
foreign call with argument buffers prepared once, which keeps the host cost per kernel low,
and the handful of entry points used here are stable across CUDA 12 and 13 drivers.

Every calling thread needs the device's primary context current (autograd runs backward on a
thread of its own); `ensure_context` makes it so, once per thread and device. Kernels launch
on PyTorch's current stream, read at every launch.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from minicomp.backends.cuda.arch import LARGEST, PORTABLE

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
DEFAULT_DYNAMIC_SHARED = PORTABLE.shared_per_block
"""Dynamic shared memory a kernel may use without opting in (cuFuncSetAttribute)."""
MAX_DYNAMIC_SHARED = LARGEST.shared_per_block_optin
"""The opt-in limit assumed when the driver cannot say (the largest of the architecture table,
an H100's; an A100 has 163 KiB)."""


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


_void_p = ctypes.c_void_p
_uint = ctypes.c_uint
_int = ctypes.c_int

# name: (argument types); every entry point returns a CUresult (an int).
_SIGNATURES: dict[str, tuple] = {
    "cuInit": (_uint,),
    "cuDriverGetVersion": (ctypes.POINTER(_int),),
    "cuDeviceGet": (ctypes.POINTER(_int), _int),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(_void_p), _int),
    "cuCtxGetCurrent": (ctypes.POINTER(_void_p),),
    "cuCtxSetCurrent": (_void_p,),
    "cuModuleLoadData": (ctypes.POINTER(_void_p), ctypes.c_char_p),
    "cuModuleGetFunction": (ctypes.POINTER(_void_p), _void_p, ctypes.c_char_p),
    "cuModuleUnload": (_void_p,),
    "cuFuncGetAttribute": (ctypes.POINTER(_int), _int, _void_p),
    "cuFuncSetAttribute": (_void_p, _int, _int),
    "cuLaunchKernel": (
        _void_p,
        _uint,
        _uint,
        _uint,
        _uint,
        _uint,
        _uint,
        _uint,
        _void_p,
        ctypes.POINTER(_void_p),
        ctypes.POINTER(_void_p),
    ),
    "cuGetErrorName": (_int, ctypes.POINTER(ctypes.c_char_p)),
    "cuGetErrorString": (_int, ctypes.POINTER(ctypes.c_char_p)),
}


@functools.lru_cache(maxsize=1)
def libcuda() -> ctypes.CDLL:
    """The driver library with typed entry points, initialised; raises CudaDriverError."""
    return load_driver("libcuda.so.1")


def load_driver(path: str) -> ctypes.CDLL:
    """The driver library at `path` (a name the loader finds, or a file), typed and
    initialised."""
    global _lib
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise CudaDriverError(
            f"the CUDA driver ({path}) cannot be loaded: {e}; the cuda target needs an "
            "NVIDIA GPU and driver (options={'target': 'cuda-emu'} runs CUDA kernels on the CPU)"
        ) from None
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = list(argtypes)
        fn.restype = _int
    _lib = lib
    check(lib.cuInit(0), "cuInit")
    return lib


_lib: ctypes.CDLL | None = None  # set once loaded, so errors of cuInit itself get described


def error_text(code: int) -> str:
    """The driver's name and description of a CUresult, like "CUDA_ERROR_INVALID_VALUE: ..."."""
    lib = _lib
    if lib is None:
        return f"CUresult {code}"
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    lib.cuGetErrorName(code, ctypes.byref(name))
    lib.cuGetErrorString(code, ctypes.byref(text))
    parts = [p.value.decode() for p in (name, text) if p.value]
    return ": ".join(parts) if parts else f"CUresult {code}"


def check(code: int, what: str) -> None:
    """Raise CudaDriverError naming `what` when a driver call did not succeed."""
    if code != 0:
        raise CudaDriverError(f"{what} failed: {error_text(code)}")


_retained: dict[int, int] = {}
_retain_lock = threading.Lock()
_thread = threading.local()


def _primary_context(index: int) -> int:
    """Device `index`'s primary context (the one PyTorch's runtime uses), retained once."""
    with _retain_lock:
        ctx = _retained.get(index)
        if ctx is None:
            lib = libcuda()
            # PyTorch initialises CUDA first, so its and our view of the device agree.
            torch.cuda.init()
            dev, handle = _int(), _void_p()
            check(lib.cuDeviceGet(ctypes.byref(dev), index), f"cuDeviceGet({index})")
            check(
                lib.cuDevicePrimaryCtxRetain(ctypes.byref(handle), dev), "cuDevicePrimaryCtxRetain"
            )
            ctx = _retained[index] = handle.value
        return ctx


def ensure_context(index: int) -> None:
    """Make device `index`'s primary context current on the calling thread."""
    current = getattr(_thread, "device", None)
    if current == index:
        return
    ctx = _primary_context(index)
    lib = libcuda()
    have = _void_p()
    check(lib.cuCtxGetCurrent(ctypes.byref(have)), "cuCtxGetCurrent")
    if have.value != ctx:
        check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    _thread.device = index


_optin: dict[tuple[int, int], int] = {}


def max_dynamic_shared(index: int) -> int:
    """The most shared memory a block of device `index` may opt in to, in bytes."""
    lib = libcuda()
    key = (id(lib), index)
    limit = _optin.get(key)
    if limit is None:
        limit = MAX_DYNAMIC_SHARED
        query = getattr(lib, "cuDeviceGetAttribute", None)  # stand-in drivers may lack it
        if query is not None:
            query.argtypes = [ctypes.POINTER(_int), _int, _int]
            query.restype = _int
            dev, value = _int(), _int()
            check(lib.cuDeviceGet(ctypes.byref(dev), index), f"cuDeviceGet({index})")
            attribute = CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
            check(query(ctypes.byref(value), attribute, dev), "cuDeviceGetAttribute")
            limit = value.value
        _optin[key] = limit
    return limit


def driver_version() -> tuple[int, int]:
    """The CUDA version the installed driver supports, as (major, minor): (13, 0) for 13.0."""
    version = _int()
    check(libcuda().cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    return version.value // 1000, version.value % 1000 // 10


# CUDA_ERROR_INVALID_IMAGE, _NO_BINARY_FOR_GPU, _INVALID_PTX, _UNSUPPORTED_PTX_VERSION: what
# a driver says of a cubin from an NVRTC newer than itself.
_IMAGE_ERRORS = (200, 209, 218, 222)


def image_hint(code: int) -> str:
    """Why a driver may refuse a cubin NVRTC built, and what to install, for a CUresult of
    cuModuleLoadData ("" when the code is not about the image)."""
    if code not in _IMAGE_ERRORS:
        return ""
    from minicomp.backends.cuda import nvrtc

    try:
        built, supported = nvrtc.nvrtc_version(), driver_version()
    except Exception:
        return ""
    if built[0] <= supported[0]:
        return ""
    return (
        f"; the cubin was built by NVRTC {built[0]}.{built[1]}, newer than this driver's CUDA "
        f"{supported[0]}.{supported[1]}: install the NVRTC of CUDA {supported[0]}, "
        + nvrtc.install_hint(supported[0])
    )


def device_arch(index: int) -> str:
    """The architecture of device `index`, like "sm_90"."""
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def _stream_reader() -> Callable[[int], int]:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


class LoadedModule:
    """A cubin loaded into a device's primary context; `function(name)` gives kernel handles."""

    def __init__(self, cubin: bytes, device_index: int):
        ensure_context(device_index)
        handle = _void_p()
        code = libcuda().cuModuleLoadData(ctypes.byref(handle), cubin)
        if code != 0:
            raise CudaDriverError(f"cuModuleLoadData failed: {error_text(code)}{image_hint(code)}")
        self.handle = handle.value
        self.device_index = device_index
        self._functions: dict[str, int] = {}

    def function(self, name: str) -> int:
        """The CUfunction handle of kernel `name`."""
        fn = self._functions.get(name)
        if fn is None:
            handle = _void_p()
            check(
                libcuda().cuModuleGetFunction(ctypes.byref(handle), self.handle, name.encode()),
                f"cuModuleGetFunction({name})",
            )
            fn = self._functions[name] = handle.value
        return fn

    def set_max_dynamic_shared(self, name: str, nbytes: int) -> None:
        """Let kernel `name` use `nbytes` of dynamic shared memory (needed above 48 KiB)."""
        check(
            libcuda().cuFuncSetAttribute(
                self.function(name), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes
            ),
            f"cuFuncSetAttribute({name}, max dynamic shared memory {nbytes})",
        )

    # Modules live as long as the compiled graphs holding them; unloading at interpreter exit
    # races the driver's own teardown, so they are left to the process's end.


class Launcher:
    """Launches one kernel on PyTorch's current stream.

    Called with the kernel's arguments (integer addresses for pointers, then numbers);
    `dims(args)` gives (grid, block) for them. `shared_bytes` is the dynamic shared memory of
    a block: a number, or a function of the arguments. Above 48 KiB the kernel opts in to it
    (once per new maximum); more than the device allows is refused. The ctypes argument
    buffers are built once per calling thread and refilled in place at every launch.
    """

    def __init__(
        self,
        module: LoadedModule,
        name: str,
        ctypes_: Sequence[Any],
        dims: Callable[[Sequence[Any]], tuple[tuple, tuple]],
        shared_bytes: int | Callable[[Sequence[Any]], int] = 0,
    ):
        self.module = module
        self.name = name
        self.function = module.function(name)
        self.ctypes = tuple(ctypes_)
        self.dims = dims
        self._shared_fn = shared_bytes if callable(shared_bytes) else None
        self.shared_bytes = 0 if callable(shared_bytes) else int(shared_bytes)
        self.device_index = module.device_index
        self._stream = _stream_reader()
        self._launch = libcuda().cuLaunchKernel
        self._local = threading.local()
        self._allowed = DEFAULT_DYNAMIC_SHARED
        if self.shared_bytes > self._allowed:
            self.allow_shared(self.shared_bytes)

    def allow_shared(self, nbytes: int) -> None:
        """Let the kernel use `nbytes` of dynamic shared memory; refuse more than the device's
        opt-in limit."""
        limit = max_dynamic_shared(self.device_index)
        if nbytes > limit:
            raise CudaDriverError(
                f"kernel {self.name} needs {nbytes} bytes of dynamic shared memory; device "
                f"{self.device_index} allows a block at most {limit} ({limit // 1024} KiB)"
            )
        self.module.set_max_dynamic_shared(self.name, nbytes)
        self._allowed = nbytes

    def _buffers(self) -> tuple[list, Any]:
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            ensure_context(self.device_index)
            values = [t() for t in self.ctypes]
            params = (_void_p * max(len(values), 1))(*(ctypes.addressof(v) for v in values))
            buffers = self._local.buffers = (values, params)
        return buffers

    def __call__(self, *args: Any) -> None:
        if len(args) != len(self.ctypes):
            raise TypeError(
                f"kernel {self.name} takes {len(self.ctypes)} arguments, {len(args)} given"
            )
        values, params = self._buffers()
        for v, a in zip(values, args):
            v.value = a
        (gx, gy, gz), (bx, by, bz) = self.dims(args)
        shared = self.shared_bytes if self._shared_fn is None else self._shared_fn(args)
        if shared > self._allowed:
            self.allow_shared(shared)
        stream = self._stream(self.device_index)
        code = self._launch(self.function, gx, gy, gz, bx, by, bz, shared, stream, params, None)
        if code != 0:
            check(code, f"launching kernel {self.name} (grid {(gx, gy, gz)}, block {(bx, by, bz)})")
