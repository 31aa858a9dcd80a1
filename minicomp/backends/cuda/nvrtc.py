"""The NVRTC driver: CUDA source to a cached cubin for one architecture, with ptxas's report.

NVRTC is reached through cuda-python (`cuda.bindings.nvrtc`), loaded on first use. Cubins are
cached under `<cache_dir>/cubins/<key[:2]>/<key>/` (`kernel.cubin`, `meta.json` holding the
log, resource usage and the files' hashes, and the `source.cu` it came from), keyed by a hash
of the source, NVRTC's version, the options, the architecture and CODEGEN_VERSION; a cached
cubin is checked against its hash before it is used (backends/cache.py).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from minicomp.backends import cache
from minicomp.backends.errors import CompileError, source_excerpts

CODEGEN_VERSION = "2"
"""Part of every cache key: bump it when a build changes in a way the other key parts miss."""

# ptxas -v prints registers, shared memory and spills per kernel into the program log.
BASE_FLAGS = ("--std=c++17", "--ptxas-options=-v")
_CUBIN_NAME = "kernel.cubin"
_SOURCE_NAME = "source.cu"
_MAX_LOG_LINES = 200
_ARCH = re.compile(r"sm_(?P<number>\d+)(?P<suffix>[af]?)\Z")


class NvrtcUnavailableError(RuntimeError):
    """NVRTC could not be loaded (cuda-python or the NVRTC library is missing)."""


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reported for one kernel: registers a thread, static shared memory bytes a
    block, bytes spilled to local memory and back, and the stack frame in bytes."""

    registers: int = 0
    shared_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    barriers: int = 0


@dataclass(frozen=True)
class CudaBinary:
    """A compiled module: the cubin, its architecture, NVRTC's log and each kernel's usage."""

    cubin: bytes = field(repr=False)
    arch: str
    log: str = field(repr=False)
    resources: Mapping[str, KernelResources]
    key: str = ""


@dataclass
class _Stats:
    memory_hits: int = 0
    disk_hits: int = 0
    compiles: int = 0
    compile_seconds: float = 0.0


_lock = threading.Lock()
_stats = _Stats()
# (source, arch, flags, cache_dir) -> binary: a repeated compile skips hashing and the disk.
_built: dict[tuple[str, str, tuple[str, ...], str], CudaBinary] = {}


def compile_stats() -> dict[str, float]:
    """Counters since the process started (or the last reset): memory_hits, disk_hits,
    compiles (NVRTC runs, failed ones included) and compile_seconds."""
    with _lock:
        return asdict(_stats)


def reset_compile_stats() -> None:
    """Set every counter of :func:`compile_stats` back to zero."""
    global _stats
    with _lock:
        _stats = _Stats()


def clear_memory_cache() -> None:
    """Forget the binaries built in this process, so the next compile looks on disk."""
    with _lock:
        _built.clear()


# The wheels that bring NVRTC and its bindings, by CUDA major version: NVIDIA names the CUDA 12
# wheel with a -cu12 suffix and the CUDA 13 one without.
INSTALL_HINTS = {
    12: 'pip install "cuda-python>=12.6" nvidia-cuda-nvrtc-cu12',
    13: 'pip install "cuda-python>=13" "nvidia-cuda-nvrtc>=13,<14"',
}


def cuda_major() -> int:
    """The CUDA major version minicomp's NVRTC should match: the one PyTorch was built with,
    else the driver's, else 12."""
    import torch

    if torch.version.cuda:
        return int(torch.version.cuda.split(".")[0])
    try:
        from minicomp.backends.cuda import driver

        return driver.driver_version()[0]
    except Exception:  # no driver on this machine: the emulator needs only a cubin compiler
        return 12


def install_hint(major: int | None = None) -> str:
    """The command that installs NVRTC for CUDA `major` (default: the one in use here)."""
    major = cuda_major() if major is None else major
    hint = INSTALL_HINTS.get(major)
    if hint is None:
        return f"install NVRTC for CUDA {major} (a CUDA toolkit's, or NVIDIA's pip wheel)"
    return f"`{hint}` (CUDA {major}, as PyTorch here), or a CUDA toolkit's NVRTC"


_load_lock = threading.Lock()
# The bindings once NVRTC is loaded: a process compiles with one NVRTC, the first it loads.
_loaded: list = []


def load(library: str | None = None) -> None:
    """Load NVRTC in this process: `library` (a libnvrtc file, the nvrtc_library option), or
    the one cuda-python finds when None. Only the first load of a process picks the library;
    later calls keep it. Raises NvrtcUnavailableError when NVRTC cannot be loaded."""
    _nvrtc(library)


def _nvrtc(library: str | None = None):
    """The cuda.bindings.nvrtc module, loaded on first use (see :func:`load`)."""
    if not _loaded:
        with _load_lock:
            if not _loaded:
                _loaded.append(_load_bindings(library))
    return _loaded[0]


def _load_bindings(library: str | None):
    """cuda.bindings.nvrtc, checked to reach a loadable NVRTC library. A `library` (a CUDA
    toolkit's, or another wheel's) is loaded first, and cuda-python binds to it."""
    if library:
        # libnvrtc opens its builtins library by bare name at the first compile: load the one
        # beside it first, so it need not be on the loader's path.
        folder = os.path.dirname(library)
        builtins = sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so.*")))
        try:
            for path in [b for b in builtins if ".alt." not in b] + [library]:
                ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
        except OSError as err:
            raise NvrtcUnavailableError(
                f"the NVRTC library {library} (the nvrtc_library option, MINICOMP_NVRTC_LIBRARY) "
                f"cannot be loaded: {err}; point it at a libnvrtc of CUDA {cuda_major()} or "
                f"unset it and {install_hint()}"
            ) from err
    try:
        from cuda.bindings import nvrtc
    except ImportError as err:
        raise NvrtcUnavailableError(
            f"cuda-python is not installed ({err}); the cuda target needs {install_hint()}"
        ) from err
    try:
        result, *_ = nvrtc.nvrtcVersion()
    except Exception as err:  # the loader's error types differ between cuda-python versions
        raise NvrtcUnavailableError(
            f"the NVRTC library could not be loaded: {err}; install it so that cuda-python finds "
            f"libnvrtc: {install_hint()}"
        ) from err
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcUnavailableError(f"nvrtcVersion failed: {result}")
    return nvrtc


_LIBRARY_FILE = re.compile(r"/libnvrtc\.so(\.\d+)*$")


def library_path(library: str | None = None) -> str | None:
    """The file of the NVRTC library this process compiles with (loading it first, as
    :func:`load` does `library`), or None when NVRTC cannot be loaded. Which one cuda-python
    finds can depend on what the process loaded before (PyTorch preloads CUDA libraries), so
    compile workers are given this one: every process then builds with the same NVRTC, under
    the same cache keys."""
    try:
        nvrtc_version(library=library)
    except NvrtcUnavailableError:
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                path = line.split()[-1]
                if _LIBRARY_FILE.search(path):
                    return path
    except OSError:  # no /proc: the workers find NVRTC on their own
        pass
    return None


def _check(result, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(result)
        raise RuntimeError(f"{what} failed: {text.decode(errors='replace')}")


def nvrtc_version(*, library: str | None = None) -> tuple[int, int]:
    """NVRTC's (major, minor) version (loading NVRTC, or `library`, first: see :func:`load`)."""
    result, major, minor = _nvrtc(library).nvrtcVersion()
    _check(result, "nvrtcVersion")
    return major, minor


def supported_archs(*, library: str | None = None) -> tuple[str, ...]:
    """The architectures this NVRTC compiles for, as "sm_80"... (suffixed variants such as
    sm_90a are accepted for every listed number); `library` as for :func:`load`."""
    _nvrtc(library)
    return _supported_archs()


@functools.lru_cache(maxsize=1)
def _supported_archs() -> tuple[str, ...]:
    result, numbers = _nvrtc().nvrtcGetSupportedArchs()
    _check(result, "nvrtcGetSupportedArchs")
    return tuple(f"sm_{n}" for n in numbers)


def check_arch(arch: str) -> str:
    """`arch` itself when NVRTC can compile for it; raises ValueError otherwise."""
    match = _ARCH.match(arch)
    if match is None:
        raise ValueError(f"bad CUDA architecture {arch!r}; expected sm_<number>, like sm_90")
    if f"sm_{match['number']}" not in supported_archs():
        major, minor = nvrtc_version()
        raise ValueError(
            f"NVRTC {major}.{minor} cannot compile for {arch}; it supports "
            + ", ".join(supported_archs())
        )
    return arch


def _options(arch: str, extra_flags: Sequence[str]) -> tuple[str, ...]:
    return (f"--gpu-architecture={arch}", *BASE_FLAGS, *extra_flags)


def cache_key(source: str, *, arch: str, extra_flags: Sequence[str] = ()) -> str:
    """Return the content hash under which :func:`compile_cuda` stores this build."""
    major, minor = nvrtc_version()
    options = _options(arch, extra_flags)
    parts = [CODEGEN_VERSION, f"nvrtc {major}.{minor}", arch, "\0".join(options), source]
    return cache.digest(parts)


def compile_cuda(
    source: str,
    *,
    arch: str,
    name: str = "kernels",
    cache_dir: str,
    extra_flags: Sequence[str] = (),
    library: str | None = None,
) -> CudaBinary:
    """Compile CUDA `source` with NVRTC into a cubin for `arch` (such as "sm_90").

    Results are cached in memory and under `<cache_dir>/cubins/`, shared safely between
    concurrent processes; a damaged cache entry is built again, with a CacheIntegrityWarning.
    `name` labels the program in NVRTC's messages and temporary files. `library` is the
    libnvrtc to load when this process has not loaded NVRTC yet (see :func:`load`).
    Raises :class:`CompileError` when NVRTC rejects the source, with its log and the numbered
    source lines it points at, and :class:`NvrtcUnavailableError` when NVRTC cannot be loaded.
    """
    cache_dir = os.path.abspath(os.path.expanduser(cache_dir))
    extra = tuple(extra_flags)
    memo_key = (source, arch, extra, cache_dir)
    with _lock:
        binary = _built.get(memo_key)
        if binary is not None:
            _stats.memory_hits += 1
    if binary is not None:
        cache.note_found(cache.entry_dir(cache_dir, "cubins", binary.key))
        return binary
    _nvrtc(library)
    check_arch(arch)
    key = cache_key(source, arch=arch, extra_flags=extra)
    cache.trusted_root(cache_dir)
    final_dir = cache.entry_dir(cache_dir, "cubins", key)
    binary = _load(cache_dir, final_dir, key)
    if binary is None:
        # Processes sharing the cache (a job's ranks) compile it once: the others wait.
        with cache.build_lock(cache_dir, final_dir):
            binary = _load(cache_dir, final_dir, key)
            if binary is None:
                binary = _build(source, arch, _options(arch, extra), name, key)
                _store(binary, source, cache_dir, final_dir, name)
            else:
                with _lock:
                    _stats.disk_hits += 1
    else:
        with _lock:
            _stats.disk_hits += 1
    with _lock:
        _built[memo_key] = binary
    return binary


def _load(cache_dir: str, final_dir: str, key: str) -> CudaBinary | None:
    """The verified cached binary in `final_dir`, or None when there is none."""
    meta = cache.lookup(cache_dir, final_dir, _CUBIN_NAME)
    if meta is None:
        return None
    try:
        with open(os.path.join(final_dir, _CUBIN_NAME), "rb") as f:
            cubin = f.read()
        resources = {k: KernelResources(**v) for k, v in meta["resources"].items()}
        return CudaBinary(cubin, meta["arch"], meta["log"], resources, key)
    except OSError:
        return None  # removed by a clean-up since it was checked
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        cache.quarantine(cache_dir, final_dir, f"bad {cache.META_NAME}: {err!r}")
        return None


def _store(binary: CudaBinary, source: str, cache_dir: str, final_dir: str, name: str) -> None:
    with cache.build_dir(cache_dir, name) as tmp_dir:
        with open(os.path.join(tmp_dir, _SOURCE_NAME), "w", encoding="utf-8") as f:
            f.write(source)
        with open(os.path.join(tmp_dir, _CUBIN_NAME), "wb") as f:
            f.write(binary.cubin)
        meta = {
            "arch": binary.arch,
            "log": binary.log,
            "resources": {k: asdict(v) for k, v in binary.resources.items()},
        }
        cache.publish(tmp_dir, final_dir, meta)


def _build(source: str, arch: str, options: tuple[str, ...], name: str, key: str) -> CudaBinary:
    nvrtc = _nvrtc()
    filename = re.sub(r"[^\w.-]", "_", name) + ".cu"
    result, prog = nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], [])
    _check(result, "nvrtcCreateProgram")
    try:
        start = time.perf_counter()
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        seconds = time.perf_counter() - start
        with _lock:
            _stats.compiles += 1
            _stats.compile_seconds += seconds
        log = _program_log(nvrtc, prog)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            message = _failure_message(name, filename, arch, options, result, log, source)
            raise CompileError(message, source=source, log=log)
        result, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(result, "nvrtcGetCUBINSize")
        cubin = bytearray(size)
        (result,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
        _check(result, "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return CudaBinary(bytes(cubin), arch, log, parse_resources(log), key)


def _program_log(nvrtc, prog) -> str:
    result, size = nvrtc.nvrtcGetProgramLogSize(prog)
    _check(result, "nvrtcGetProgramLogSize")
    buffer = bytearray(size)
    (result,) = nvrtc.nvrtcGetProgramLog(prog, buffer)
    _check(result, "nvrtcGetProgramLog")
    return bytes(buffer).rstrip(b"\0").decode(errors="replace").strip()


_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_PROPERTIES = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
    r"(?P<loads>\d+) bytes spill loads"
)
_USED = re.compile(r"Used (?P<registers>\d+) registers")
_SMEM = re.compile(r"(?P<bytes>\d+) bytes smem")
_BARRIERS = re.compile(r"used (?P<count>\d+) barriers")


def parse_resources(log: str) -> dict[str, KernelResources]:
    """Each kernel's resource usage from a ptxas -v report, by kernel name (sorted).

    ptxas reports a kernel as "Compiling entry function 'k'", then its stack frame and spills
    under "Function properties for k", then "Used N registers, ... M bytes smem".
    """
    fields: dict[str, dict[str, int]] = {}
    entry = properties = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m["name"]
            fields.setdefault(entry, {})
        elif m := _PROPERTIES.search(line):
            properties = m["name"]
        elif (m := _FRAME.search(line)) and properties in fields:
            fields[properties].update(
                stack_bytes=int(m["stack"]),
                spill_stores=int(m["stores"]),
                spill_loads=int(m["loads"]),
            )
        elif (m := _USED.search(line)) and entry is not None:
            usage = fields[entry]
            usage["registers"] = int(m["registers"])
            if s := _SMEM.search(line):
                usage["shared_bytes"] = int(s["bytes"])
            if b := _BARRIERS.search(line):
                usage["barriers"] = int(b["count"])
    return {k: KernelResources(**fields[k]) for k in sorted(fields)}


def _failure_message(name, filename, arch, options, result, log, source) -> str:
    log_lines = log.splitlines()
    if len(log_lines) > _MAX_LOG_LINES:
        omitted = len(log_lines) - _MAX_LOG_LINES
        log_lines = log_lines[:_MAX_LOG_LINES] + [f"... ({omitted} more lines)"]
    parts = [
        f"NVRTC compilation of {name!r} for {arch} failed ({getattr(result, 'name', result)})",
        f"options: {' '.join(options)}",
        "NVRTC log:",
        *("  " + line for line in log_lines),
    ]
    excerpts = _source_excerpts(log, source, filename)
    if excerpts:
        parts += ["source around the reported lines:", excerpts]
    return "\n".join(parts)


def _source_excerpts(log: str, source: str, filename: str) -> str:
    """Numbered source lines around each error NVRTC reports as `file(LINE): ... error`."""
    location = re.compile(rf"^{re.escape(filename)}\((\d+)\): [^:\n]*error", re.MULTILINE)
    numbers: list[int] = []
    for match in location.finditer(log):
        if int(match[1]) not in numbers:
            numbers.append(int(match[1]))
    return source_excerpts(source, filename, numbers)
