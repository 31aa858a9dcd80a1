"""The cuda-emu target: CUDA C source compiled by the host C++ compiler and run on the CPU.

The generated source is compiled unchanged after ``emu.h`` (the host implementation of the
CUDA names the device header uses), together with one small launch wrapper per kernel; the
prelude is included from the build cache, precompiled once per compiler and flags, and the
launches run in the emulator's runtime library, also built once per compiler and flags, which
every kernel library links to. Each
CUDA block runs on one OS thread; its threads are fibers when the kernel has barriers or warp
collectives (or mbarrier waits and bulk copies, which ``emu_async.h`` runs: copies land when
their barrier's phase is waited for, a barrier that can never complete is a reported
deadlock), else iterations of a plain loop. A launch's dynamic shared memory
(``shared_bytes``, at most :data:`MAX_DYNAMIC_SHARED`) is a buffer per block; device
``printf`` writes to the process's stdout, flushed before the launch returns.

Checked builds (``checks=True``, the ``emu_checks`` option for script kernels) check every
access of a kernel against its tensor arguments, which a launch copies between guards
(``emu_checks.h`` says how): an access outside them raises :class:`OutOfBoundsError`, naming
the kernel, the tensor, the element index and the thread, and the process goes on. A launch
checks the arguments given as tensors, not those given as addresses.

Counted builds (``lens=True``, the performance lens) record, for a sample of a launch's
blocks, each warp instruction's global sectors and shared-memory wavefronts, and count mma,
ldmatrix, cp.async, barriers, atomics and the kernel's own operation counts
(:meth:`EmuModule.launch_counted`; ``emu_lens.h`` says how).

ASan builds (``asan=True``) need the ASan runtime loaded before anything else in the process:
run them in a subprocess started with :func:`asan_environment` (``LD_PRELOAD`` of libasan).
With ``halt_on_error=0`` (set there) an invalid access makes the launch raise
:class:`EmulatorError` carrying ASan's report; otherwise ASan aborts the process after printing
it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minicomp.backends.cpu import compiler
from minicomp.backends.ctypes_params import TensorMapBytes
from minicomp.backends.cuda.arch import LARGEST
from minicomp.backends.cuda.intrinsics_async import BLOCKING_INTRINSICS
from minicomp.backends.cuda.intrinsics_async import HELPER_TOKENS as ASYNC_TOKENS
from minicomp.backends.cuda.intrinsics_cluster import BLOCKING_INTRINSICS as CLUSTER_BLOCKING
from minicomp.backends.cuda.intrinsics_cluster import HELPER_TOKENS as CLUSTER_TOKENS
from minicomp.backends.cuda.intrinsics_mma import EMU_HEADER_PATH, WARP_COLLECTIVE_INTRINSICS
from minicomp.backends.cuda.intrinsics_tma import HELPER_TOKENS as TMA_TOKENS
from minicomp.backends.cuda.intrinsics_tma import TENSOR_MAP_CTYPE, TMA_INTRINSICS
from minicomp.backends.cuda.intrinsics_wgmma import EMU_HEADER_PATH as WGMMA_HEADER_PATH
from minicomp.backends.cuda.intrinsics_wgmma import HELPER_TOKENS as WGMMA_TOKENS
from minicomp.backends.cuda.intrinsics_wgmma import WGMMA_INTRINSICS
from minicomp.backends.cuda.tensor_map import EmulatorMap
from minicomp.ir import c_names
from minicomp.ir.expr import Call
from minicomp.ir.func import Function
from minicomp.ir.functor import Visitor
from minicomp.ir.types import PointerType, TensorMapType

HEADER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "emu.h")
CHECKS_HEADER_PATH = os.path.join(os.path.dirname(HEADER_PATH), "emu_checks.h")
CLUSTER_HEADER_PATH = os.path.join(os.path.dirname(HEADER_PATH), "emu_cluster.h")
LENS_HEADER_PATH = os.path.join(os.path.dirname(HEADER_PATH), "emu_lens.h")
ASYNC_HEADER_PATH = os.path.join(os.path.dirname(HEADER_PATH), "emu_async.h")
TMA_HEADER_PATH = os.path.join(os.path.dirname(HEADER_PATH), "emu_tma.h")
SWIZZLE_HEADER_PATH = os.path.join(os.path.dirname(HEADER_PATH), "swizzle.h")
DEFAULT_CXXFLAGS = "-O2 -std=c++17 -fPIC -shared -pthread -fno-strict-aliasing"
_ASAN_FLAGS = "-fsanitize=address -fsanitize-recover=address -fno-omit-frame-pointer -g"
# The kernel-address instrumentation as a call before every load and store (emu_checks.h
# defines the functions), and none of ASan's stack, globals or shadow memory.
_CHECK_FLAGS = {
    "gcc": "-DMC_EMU_CHECKS=1 -fsanitize=kernel-address -fno-sanitize-address-use-after-scope "
    "--param asan-instrumentation-with-call-threshold=0 --param asan-stack=0 "
    "--param asan-globals=0",
    "clang": "-DMC_EMU_CHECKS=1 -fsanitize=kernel-address "
    "-mllvm -asan-instrumentation-with-call-threshold=0 -mllvm -asan-stack=0 "
    "-mllvm -asan-globals=0",
}
# A counted build: the same instrumentation, its hooks recording instead of checking.
_LENS_FLAGS = {k: v.replace("MC_EMU_CHECKS", "MC_EMU_LENS") for k, v in _CHECK_FLAGS.items()}
_CHECKED_LAUNCH = threading.Lock()  # a checked launch replaces the SIGSEGV handler meanwhile
_COUNTED_LAUNCH = threading.Lock()  # the hooks read one counted launch at a time
LENS_COUNTERS = (
    "global_loads",
    "global_load_sectors",
    "global_load_bytes",
    "global_stores",
    "global_store_sectors",
    "global_store_bytes",
    "shared_loads",
    "shared_stores",
    "shared_wavefronts",
    "shared_ideal_wavefronts",
    "ldmatrix",
    "cp_async",
    "mma",
    "barriers",
    "atomics",
    "flops",
    "fp_instructions",
    "int_instructions",
    "int64_instructions",
    "int_divides",
    "special",
    "conversions",
    "address_instructions",
    "wgmma",
    "wgmma_instructions",
    "threads",
    "blocks",
)
"""emu_lens.h's counters, in its order (that file says what each counts)."""
SAMPLED_BLOCKS = 8
"""How many blocks of a launch a counted launch counts by default (all of a smaller grid)."""
_ERROR_BYTES = 16384
MAX_DYNAMIC_SHARED = LARGEST.shared_per_block_optin
"""The most dynamic shared memory an emulated block may have (the largest opt-in limit of the
architecture table: an H100's 227 KiB)."""

# Intrinsic names (kernel IR) and CUDA spellings (source) that need the threads as fibers.
_SYNC_INTRINSICS = (
    frozenset(
        ("syncthreads", "syncwarp", "shfl_down_sync", "shfl_xor_sync", "shfl_sync", "shfl_up_sync")
    )
    | WARP_COLLECTIVE_INTRINSICS
    | BLOCKING_INTRINSICS
    | TMA_INTRINSICS
    | WGMMA_INTRINSICS
    | CLUSTER_BLOCKING
)
_SYNC_TOKENS = re.compile(
    r"\b(__syncthreads|__syncwarp|__shfl\w*|mc_mma_\w+|mc_ldmatrix_\w+|"
    rf"{ASYNC_TOKENS}|{TMA_TOKENS}|{WGMMA_TOKENS}|{CLUSTER_TOKENS})\b"
)

# The names emu_async.h, emu_mma.h and emu_wgmma.h define (the spellings of async.h's, tma.h's,
# mma.h's and wgmma.h's helpers): a kernel library whose code calls none of a part's is built
# without it, whose template instantiations were most of a small kernel's build.
_ASYNC_TOKENS = re.compile(rf"\b({ASYNC_TOKENS}|{TMA_TOKENS}|{CLUSTER_TOKENS})\b")
_MMA_TOKENS = re.compile(r"\bmc_(mma|ldmatrix|cp_async)_\w+")
_WGMMA_TOKENS = re.compile(rf"\b({WGMMA_TOKENS})\b")
# The device headers a generated source carries (device.h, mma.h...), guards and all: their
# names are only declared there, or defined for the GPU alone.
_DEVICE_HEADERS = re.compile(r"#ifndef (MINICOMP_\w+_H)\n.*?#endif /\* \1 \*/", re.S)

_C_SCALARS = {
    "float": ctypes.c_float,
    "double": ctypes.c_double,
    "bool": ctypes.c_bool,
    "char": ctypes.c_char,
    "int8_t": ctypes.c_int8,
    "int16_t": ctypes.c_int16,
    "int": ctypes.c_int32,
    "int32_t": ctypes.c_int32,
    "long": ctypes.c_int64,
    "long long": ctypes.c_int64,
    "int64_t": ctypes.c_int64,
    "uint8_t": ctypes.c_uint8,
    "uint16_t": ctypes.c_uint16,
    "unsigned": ctypes.c_uint32,
    "unsigned int": ctypes.c_uint32,
    "uint32_t": ctypes.c_uint32,
    "unsigned long": ctypes.c_uint64,
    "unsigned long long": ctypes.c_uint64,
    "uint64_t": ctypes.c_uint64,
}
_IR_SCALARS = c_names.C_TYPES  # the C spelling of each IR scalar type


class EmulatorError(RuntimeError):
    """A kernel failed in the emulator (barrier deadlock, bad launch, ASan report...)."""

    def __init__(self, message: str, *, kernel: str | None = None) -> None:
        super().__init__(message)
        self.kernel = kernel


class OutOfBoundsError(EmulatorError):
    """A checked launch's kernel accessed a tensor argument out of its bounds.

    ``tensor`` is the parameter's name, ``index`` the element (negative before the start),
    ``thread`` and ``block`` the CUDA thread and block indices, ``write`` whether it was a
    store (None when unknown)."""

    def __init__(
        self,
        message: str,
        *,
        kernel: str,
        tensor: str,
        index: int,
        thread,
        block,
        write: bool | None,
    ) -> None:
        super().__init__(message, kernel=kernel)
        self.tensor = tensor
        self.index = index
        self.thread = thread
        self.block = block
        self.write = write


@dataclass(frozen=True)
class KernelSpec:
    """What the launcher needs of a kernel: its name, parameter C types, whether it syncs, its
    parameters' names (for messages), and its cluster's CTAs along x, y, z."""

    name: str
    params: tuple[str, ...]
    sync: bool
    names: tuple[str, ...] = ()
    cluster: tuple[int, int, int] = (1, 1, 1)


class _SyncFinder(Visitor):
    def __init__(self):
        super().__init__()
        self.found = False

    def visit_Call(self, c: Call) -> None:
        self.found |= c.name in _SYNC_INTRINSICS
        self.visit(c.args)


def _strip_comments(source: str) -> str:
    pattern = r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\''
    return re.sub(pattern, lambda m: " " if m.group().startswith("/") else '""', source, flags=re.S)


def _function_bodies(source: str) -> dict[str, str]:
    """Name -> body text of the top-level function definitions of C++ ``source``."""
    text = _strip_comments(source)
    bodies: dict[str, str] = {}
    depth, start, header_start = 0, 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                header = text[header_start:start].rstrip()
                name = _function_name(header)
                if name:
                    bodies[name] = bodies.get(name, "") + text[start : i + 1]
                header_start = i + 1
        elif ch == ";" and depth == 0:
            header_start = i + 1
    return bodies


def _function_name(header: str) -> str | None:
    """The name before the last balanced parameter list of a definition's header."""
    if not header.endswith(")"):
        match = re.search(r"\)\s*(const|noexcept|->\s*[\w:<>*& ]+)?\s*$", header)
        if match is None:
            return None
        header = header[: match.start() + 1]
    depth = 0
    for i in range(len(header) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(header[i], 0)
        if depth == 0:
            match = re.search(r"(\w+)\s*$", header[:i])
            return match.group(1) if match else None
    return None


def kernels_needing_fibers(source: str, names: Sequence[str]) -> set[str]:
    """Of ``names``, the kernels of ``source`` that reach a barrier or shuffle, calls included."""
    bodies = _function_bodies(source)
    syncing = {name for name, body in bodies.items() if _SYNC_TOKENS.search(body)}
    changed = True
    while changed:
        changed = False
        for name, body in bodies.items():
            if name in syncing:
                continue
            if any(re.search(rf"\b{re.escape(s)}\s*\(", body) for s in syncing):
                syncing.add(name)
                changed = True
    # A kernel whose definition we could not find is assumed to need fibers: always correct.
    return {n for n in names if n in syncing or n not in bodies}


def _param_names(source: str, kernel: str, count: int) -> tuple[str, ...]:
    """The names of the parameters of `kernel`'s definition in `source` ("argument i" when the
    definition cannot be read)."""
    text = _strip_comments(source)
    for match in re.finditer(rf"\b{re.escape(kernel)}\s*\(", text):
        depth, end = 1, match.end()
        while depth and end < len(text):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        if not re.match(r"\s*\{", text[end:]):
            continue  # a declaration or a call
        params = [p for p in text[match.end() : end - 1].split(",") if p.strip()]
        names = [re.search(r"(\w+)\s*$", p) for p in params]
        if len(names) == count and all(names):
            return tuple(n.group(1) for n in names)
    return tuple(f"argument {i}" for i in range(count))


def _cluster_dims(source: str, kernel: str) -> tuple[int, int, int]:
    """The `__cluster_dims__(x, y, z)` of `kernel`'s definition in `source`, else (1, 1, 1)."""
    text = _strip_comments(source)
    dims = r"__cluster_dims__\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)"
    pattern = dims + rf"[^;{{}}]*?\b{re.escape(kernel)}\s*\("
    match = re.search(pattern, text)
    return tuple(int(g) for g in match.groups()) if match else (1, 1, 1)


def _ir_type_name(t) -> str:
    if isinstance(t, TensorMapType):
        return TENSOR_MAP_CTYPE
    if isinstance(t, PointerType):
        return f"{_IR_SCALARS[t.elem.short]}*"
    return _IR_SCALARS[t.short]


def _specs(source: str, kernels: Sequence[Any]) -> list[KernelSpec]:
    names = [k.name if isinstance(k, Function) else k[0] for k in kernels]
    textual = kernels_needing_fibers(source, names)
    specs = []
    for k in kernels:
        if isinstance(k, Function):
            finder = _SyncFinder()
            finder.visit(k.body)
            params = tuple(_ir_type_name(p.type) for p in k.params)
            names = tuple(p.name for p in k.params)
            sync = finder.found or k.name in textual
            cluster = k.attrs.cluster_dim or (1, 1, 1)
            specs.append(KernelSpec(k.name, params, sync, names, cluster))
        else:
            name, params, *flag = k
            if isinstance(params, str):
                params = [p for p in (x.strip() for x in params.split(",")) if p]
            sync = bool(flag[0]) if flag else name in textual
            names = _param_names(source, name, len(params))
            specs.append(KernelSpec(name, tuple(params), sync, names, _cluster_dims(source, name)))
    return specs


def _clean_type(ctype: str) -> str:
    return " ".join(ctype.replace("__restrict__", " ").split())


def _unpack(ctype: str, i: int) -> str:
    if _clean_type(ctype) == TENSOR_MAP_CTYPE:
        return f"mc_emu_tensor_map(a[{i}])"  # tma.h: ctypes aligns its bytes to 8 only
    return f"*({_clean_type(ctype)}*)a[{i}]"


def _wrapper(spec: KernelSpec) -> str:
    cx, cy, cz = spec.cluster
    unpack = ", ".join(_unpack(t, i) for i, t in enumerate(spec.params))
    return (
        f"static void mc_emu_body_{spec.name}(void** a) {{ {spec.name}({unpack}); }}\n"
        f'extern "C" int mc_emu_launch_{spec.name}(unsigned gx, unsigned gy, unsigned gz,\n'
        "    unsigned bx, unsigned by, unsigned bz, unsigned long long shared, void** args,\n"
        "    mc_emu::Checks* checks, mc_emu::Lens* lens, char* err, int errlen) {\n"
        f'  return mc_emu::launch("{spec.name}", {str(spec.sync).lower()}, '
        f"mc_emu_body_{spec.name}, mc_emu_config,\n"
        "                        gx, gy, gz, bx, by, bz, shared, args, checks, lens, err, "
        f"errlen, {cx}, {cy}, {cz});\n"
        "}\n"
    )


@functools.cache
def emulator_prelude(
    *, ucontext: bool = False, async_copies: bool = True, mma: bool = True, wgmma: bool = True
) -> str:
    """What every emulated kernel starts with: the emulator's macros, emu.h (emu_checks.h,
    emu_lens.h, emu_async.h with emu_tma.h and swizzle.h in their places), then emu_mma.h and
    emu_wgmma.h, which uses both (each part left out when not asked for: `prelude_parts`)."""
    with open(HEADER_PATH, encoding="utf-8") as f:
        header = f.read()
    # emu_async.h includes emu_tma.h, which includes swizzle.h: replaced after them.
    for path in (
        CHECKS_HEADER_PATH,
        LENS_HEADER_PATH,
        ASYNC_HEADER_PATH,
        CLUSTER_HEADER_PATH,
        TMA_HEADER_PATH,
        SWIZZLE_HEADER_PATH,
    ):
        with open(path, encoding="utf-8") as f:
            # In the build cache, the prelude has no headers beside it to include.
            header = header.replace(f'#include "{os.path.basename(path)}"\n', f.read())
    for path in (EMU_HEADER_PATH,) * (mma or wgmma) + (WGMMA_HEADER_PATH,) * wgmma:
        with open(path, encoding="utf-8") as f:
            header += "\n" + f.read()
    prefix = "#define MC_EMULATE 1\n" + ("#define MC_EMU_UCONTEXT 1\n" if ucontext else "")
    if not (async_copies or wgmma):
        prefix += "#define MC_EMU_NO_ASYNC 1\n"  # emu.h then leaves emu_async.h out
    return prefix + header


def prelude_parts(source: str) -> dict[str, bool]:
    """Which optional parts of the prelude CUDA ``source`` calls, outside the device headers it
    carries: ``async_copies`` (emu_async.h: mbarriers, bulk copies, TMA), ``mma`` (emu_mma.h)
    and ``wgmma`` (emu_wgmma.h). The runtime library is built with all of them; a kernel
    library includes only what it calls (a name left out fails its build)."""
    code = _strip_comments(_DEVICE_HEADERS.sub("", source))
    return {
        "async_copies": bool(_ASYNC_TOKENS.search(code)),
        "mma": bool(_MMA_TOKENS.search(code)),
        "wgmma": bool(_WGMMA_TOKENS.search(code)),
    }


def _kernels_part(source: str, specs: Sequence[KernelSpec]) -> str:
    parts = ['\n#line 1 "kernel.cu"\n', source, '\n#line 1 "emu_wrappers"\n']
    return "".join(parts + [_wrapper(s) for s in specs])


def emulator_source(source: str, specs: Sequence[KernelSpec], *, ucontext: bool = False) -> str:
    """The C++ translation unit: the prelude, the generated ``source`` unchanged, the
    wrappers."""
    prelude = emulator_prelude(ucontext=ucontext, **prelude_parts(source))
    return prelude + _kernels_part(source, specs)


# The runtime libraries loaded in this process, by path: kept for good, as the kernel
# libraries linked to them need them loaded (the loader knows them by their soname only).
_RUNTIMES: dict[str, ctypes.CDLL] = {}


@functools.cache
def _runtime_soname(source: str, cxx: str, flags: str) -> str:
    """The runtime library's soname: its build's key (hashed once per process, not per kernel)."""
    return f"libmc_emu_{compiler.cache_key(source, cc=cxx, cflags=flags)[:24]}.so"


def _runtime(prelude: str, *, cxx: str, flags: str, cache_dir: str) -> tuple[str, str]:
    """Build (once per compiler, flags and prelude) and load the emulator's runtime library,
    which runs launches and holds the emulator's state; return its path and its soname."""
    source = "#define MC_EMU_RUNTIME 1\n" + prelude
    soname = _runtime_soname(source, cxx, flags)

    def build() -> ctypes.CDLL:
        return compiler.compile_library(
            source,
            cc=cxx,
            cflags=f"{flags} -Wl,-soname,{soname}",
            cache_dir=cache_dir,
            name="cuda_emu_runtime",
        )

    library = build()
    if not os.path.isfile(library._name):  # a clean-up removed it: the kernels link to the file
        compiler.forget_build(library._name)
        library = build()
    _RUNTIMES[library._name] = library
    return library._name, soname


def _compile(source, specs, *, ucontext, cxx, flags, cache_dir) -> ctypes.CDLL:
    """Build emulator_source into a library linked to the emulator's runtime library and
    load it. The launch machinery is compiled once, into the runtime (it was two thirds of
    every emulated kernel's build), and the prelude is included from the cache where GCC keeps
    it precompiled (parsing it was most of the rest). Both are named relative to the build, not
    by their path, so the library's key, and so the cache, does not depend on where the cache
    lives. The library's prelude leaves out what of emu_async.h, emu_mma.h and emu_wgmma.h its
    kernels do not call (`prelude_parts`)."""
    prelude = emulator_prelude(ucontext=ucontext, **prelude_parts(source))

    def build() -> ctypes.CDLL:
        runtime = _runtime(
            emulator_prelude(ucontext=ucontext), cxx=cxx, flags=flags, cache_dir=cache_dir
        )
        header = compiler.precompiled_header(
            prelude, cc=cxx, cflags=flags, cache_dir=cache_dir, name="cuda_emu_prelude"
        )
        unit = f'#include "{compiler.include_name(header)}"\n' + _kernels_part(source, specs)
        return compiler.compile_library(
            unit,
            cc=cxx,
            cflags=flags,
            cache_dir=cache_dir,
            name="cuda_emu",
            headers=[header],
            links=[runtime],
        )

    try:
        return build()
    except FileNotFoundError:
        return build()  # a clean-up removed the prelude between its check and its use


def _as_dims(value: int | Sequence[int]) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"a grid or block has 1 to 3 dimensions, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))  # type: ignore[return-value]


def _ctype(ctype: str):
    if _clean_type(ctype) == TENSOR_MAP_CTYPE:
        return TensorMapBytes
    if "*" in ctype:
        return ctypes.c_void_p
    words = [w for w in _clean_type(ctype).split() if w not in ("const", "volatile")]
    return _C_SCALARS[" ".join(words)]


class _Violation(ctypes.Structure):
    _fields_ = [
        ("found", ctypes.c_int),
        ("param", ctypes.c_int),
        ("write", ctypes.c_int),
        ("bytes", ctypes.c_uint),
        ("offset", ctypes.c_longlong),
        ("thread", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
    ]


class _CheckedArg(ctypes.Structure):
    _fields_ = [("param", ctypes.c_int), ("lo", ctypes.c_longlong), ("hi", ctypes.c_longlong)]


class _Checks(ctypes.Structure):
    """emu_checks.h's Checks: the tensor arguments of a checked launch, its first bad access."""

    _fields_ = [
        ("count", ctypes.c_int),
        ("args", ctypes.POINTER(_CheckedArg)),
        ("violation", _Violation),
    ]


class _LensSpan(ctypes.Structure):
    _fields_ = [("lo", ctypes.c_size_t), ("hi", ctypes.c_size_t)]


class _Lens(ctypes.Structure):
    """emu_lens.h's Lens: the blocks to count, the arguments' bytes, and the counts."""

    _fields_ = [
        ("nspans", ctypes.c_int),
        ("spans", ctypes.POINTER(_LensSpan)),
        ("nsample", ctypes.c_int),
        ("sample", ctypes.POINTER(ctypes.c_ulonglong)),
        ("sample_only", ctypes.c_int),
        ("counts", ctypes.c_ulonglong * len(LENS_COUNTERS)),
        ("read", ctypes.POINTER(ctypes.c_ubyte)),
        ("written", ctypes.POINTER(ctypes.c_ubyte)),
        ("read_sectors", ctypes.POINTER(ctypes.c_ulonglong)),
        ("written_sectors", ctypes.POINTER(ctypes.c_ulonglong)),
    ]


@dataclass(frozen=True)
class LaunchSample:
    """What a counted launch saw: emu_lens.h's counters summed over the `sampled` blocks (linear
    indices) of a grid of `blocks`, which tensor arguments (by position) they read and wrote,
    the bytes each argument spans (0 for a scalar), the distinct 32-byte sectors of each
    argument the sample read and wrote (by position, 0 for a scalar), and the address each
    argument's bytes start at (0 for a scalar: which launches of a graph share memory)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    blocks: int
    sampled: tuple[int, ...]
    counters: dict[str, int]
    read: tuple[int, ...]
    written: tuple[int, ...]
    arg_bytes: tuple[int, ...] = ()
    read_sectors: tuple[int, ...] = ()
    written_sectors: tuple[int, ...] = ()
    arg_addresses: tuple[int, ...] = ()

    def span(self, i: int) -> tuple[int, int]:
        """The bytes [start, end) of argument `i` (empty for a scalar)."""
        if i >= len(self.arg_addresses):
            return 0, 0
        return self.arg_addresses[i], self.arg_addresses[i] + self.arg_bytes[i]


def default_sample(blocks: int, most: int = SAMPLED_BLOCKS, group: int = 1) -> tuple[int, ...]:
    """The blocks a counted launch counts: all of a grid of `most` or fewer, else `most` spread
    evenly from the first to the last (the last is often a partial tile at the grid's edge).
    With `group` > 1, blocks finish their work in groups of `group` consecutive ones (the
    chunks of one tile of an in-kernel split-K) and the sample is made of whole groups, `most`
    of them chosen so: a group's work is done only when all its blocks have run, which a
    launch of the sampled blocks alone must see."""
    groups = -(-blocks // group)
    if groups <= most:
        chosen: Sequence[int] = range(groups)
    else:
        chosen = sorted({round(i * (groups - 1) / (most - 1)) for i in range(most)})
    return tuple(b for g in chosen for b in range(g * group, min((g + 1) * group, blocks)))


def _by_position(count: int, tensors: Sequence[int], values) -> tuple[int, ...]:
    out = [0] * count
    for k, i in enumerate(tensors):
        out[i] = int(values[k])
    return tuple(out)


class EmuModule:
    """A compiled emulator library: ``launch(name, grid, block, args)`` runs a kernel.

    The library stays loaded while the module is referenced."""

    def __init__(
        self,
        source: str,
        specs: Sequence[KernelSpec],
        path: str,
        library,
        checks: bool = False,
        lens: bool = False,
    ):
        self.source = source
        self.path = path
        self.library = library
        self.checks = checks
        self.lens = lens
        self.specs = {s.name: s for s in specs}
        self._entries = {}
        for s in specs:
            entry = library[f"mc_emu_launch_{s.name}"]  # not getattr: it caches, a cycle
            entry.restype = ctypes.c_int
            entry.argtypes = [ctypes.c_uint] * 6 + [
                ctypes.c_ulonglong,
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_char_p,
                ctypes.c_int,
            ]
            self._entries[s.name] = (entry, [_ctype(t) for t in s.params])
        self._configure = library["mc_emu_configure"]
        self._configure.argtypes = [ctypes.c_ulonglong, ctypes.c_uint]

    def configure(self, *, stack_bytes: int = 0, workers: int = 0) -> None:
        """Set the fiber stack size per CUDA thread and the OS threads running blocks (0: all)."""
        self._configure(stack_bytes, workers)

    def launch(self, name: str, grid, block, args: Sequence[Any], shared_bytes: int = 0) -> None:
        """Run kernel ``name`` with ``shared_bytes`` of dynamic shared memory a block; tensors
        pass their data pointer (they must be on the CPU). A checked module checks the accesses
        to the arguments given as tensors and raises :class:`OutOfBoundsError` for a bad one."""
        self._launch(name, grid, block, args, shared_bytes, None)

    def launch_counted(
        self,
        name: str,
        grid,
        block,
        args: Sequence[Any],
        shared_bytes: int = 0,
        *,
        sample: Sequence[int] | None = None,
        sample_only: bool = False,
    ) -> LaunchSample:
        """Run kernel ``name`` as :meth:`launch` does and count what the ``sample`` blocks
        (linear indices; :func:`default_sample` when None) ask of the GPU (emu_lens.h says how);
        with ``sample_only`` only those blocks run. Needs a module built with ``lens=True``."""
        if not self.lens:
            raise EmulatorError(f"kernel {name}: counting needs a module built with lens=True")
        grid3, block3 = _as_dims(grid), _as_dims(block)
        blocks = grid3[0] * grid3[1] * grid3[2]
        chosen = tuple(sorted(set(default_sample(blocks) if sample is None else sample)))
        if chosen and not 0 <= chosen[0] <= chosen[-1] < blocks:
            raise ValueError(f"kernel {name}: sampled blocks {chosen} outside a grid of {blocks}")
        # A tensor map's bytes stand for the tensor they describe (tensor_map.EmulatorMap):
        # the copies through it are that argument's traffic.
        memory = [a.described if isinstance(a, EmulatorMap) else a for a in args]
        tensors = [i for i, a in enumerate(memory) if hasattr(a, "data_ptr")]
        spans, arg_bytes, addresses = [], [0] * len(args), [0] * len(args)
        for i in tensors:
            lo, hi = _byte_span(memory[i])
            spans.append(_LensSpan(memory[i].data_ptr() + lo, memory[i].data_ptr() + hi))
            arg_bytes[i], addresses[i] = hi - lo, memory[i].data_ptr() + lo
        n = max(1, len(spans))
        lens = _Lens(
            len(spans),
            (_LensSpan * n)(*spans),
            len(chosen),
            (ctypes.c_ulonglong * max(1, len(chosen)))(*chosen),
            int(sample_only),
        )
        read, written = (ctypes.c_ubyte * n)(), (ctypes.c_ubyte * n)()
        read_sectors, written_sectors = (ctypes.c_ulonglong * n)(), (ctypes.c_ulonglong * n)()
        lens.read, lens.written = read, written
        lens.read_sectors, lens.written_sectors = read_sectors, written_sectors
        with _COUNTED_LAUNCH:
            self._launch(name, grid, block, args, shared_bytes, lens)
        counters = dict(zip(LENS_COUNTERS, (int(c) for c in lens.counts)))
        return LaunchSample(
            name,
            grid3,
            block3,
            shared_bytes,
            blocks,
            chosen,
            counters,
            tuple(tensors[k] for k in range(len(tensors)) if read[k]),
            tuple(tensors[k] for k in range(len(tensors)) if written[k]),
            tuple(arg_bytes),
            _by_position(len(args), tensors, read_sectors),
            _by_position(len(args), tensors, written_sectors),
            tuple(addresses),
        )

    def _launch(self, name, grid, block, args, shared_bytes, lens) -> None:
        entry, ctypes_ = self._entries[name]
        if len(args) != len(ctypes_):
            raise TypeError(f"kernel {name} takes {len(ctypes_)} arguments, {len(args)} given")
        if not 0 <= shared_bytes <= MAX_DYNAMIC_SHARED:
            raise EmulatorError(
                f"kernel {name}: {shared_bytes} bytes of dynamic shared memory; a block may have "
                f"0 to {MAX_DYNAMIC_SHARED} ({MAX_DYNAMIC_SHARED // 1024} KiB)",
                kernel=name,
            )
        values = [_argument(name, i, a, t) for i, (a, t) in enumerate(zip(args, ctypes_))]
        pointers = (ctypes.c_void_p * max(1, len(values)))(
            *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values]
        )
        checks = _checks(args, ctypes_) if self.checks else None
        err = ctypes.create_string_buffer(_ERROR_BYTES)
        with _CHECKED_LAUNCH if checks is not None else contextlib.nullcontext():
            status = entry(
                *_as_dims(grid),
                *_as_dims(block),
                shared_bytes,
                pointers,
                None if checks is None else ctypes.addressof(checks),
                None if lens is None else ctypes.addressof(lens),
                err,
                _ERROR_BYTES,
            )
        if status == 0:
            return
        if checks is not None and checks.violation.found:
            raise _out_of_bounds(self.specs[name], checks.violation, args)
        raise EmulatorError(err.value.decode(errors="replace"), kernel=name)

    def __repr__(self) -> str:
        kind = ", checked" if self.checks else ", counted" if self.lens else ""
        return f"EmuModule({', '.join(self.specs)}; {self.path}{kind})"


def _byte_span(t) -> tuple[int, int]:
    """The bytes a tensor's elements cover, from its data pointer: [lo, hi)."""
    if t.numel() == 0:
        return 0, 0
    steps = [(n - 1) * s for n, s in zip(t.shape, t.stride())]
    lo = sum(d for d in steps if d < 0)
    hi = sum(d for d in steps if d > 0) + 1
    return lo * t.element_size(), hi * t.element_size()


def _checks(args: Sequence[Any], ctypes_) -> _Checks:
    """The checked launch's description of the tensor arguments."""
    tensors = [
        _CheckedArg(i, *_byte_span(a))
        for i, (a, t) in enumerate(zip(args, ctypes_))
        if hasattr(a, "data_ptr") and t is ctypes.c_void_p
    ]
    array = (_CheckedArg * max(1, len(tensors)))(*tensors)
    return _Checks(len(tensors), array)  # the struct keeps the array alive


def _element_bytes(ctype: str, tensor) -> int:
    pointee = " ".join(w for w in _clean_type(ctype).replace("*", " ").split() if w != "const")
    scalar = _C_SCALARS.get(pointee)
    return ctypes.sizeof(scalar) if scalar is not None else tensor.element_size()


def _out_of_bounds(spec: KernelSpec, v: _Violation, args: Sequence[Any]) -> OutOfBoundsError:
    tensor = args[v.param]
    name = spec.names[v.param] if spec.names else f"argument {v.param}"
    size = _element_bytes(spec.params[v.param], tensor)
    index = v.offset // size
    thread, block = tuple(v.thread), tuple(v.block)
    verb = {1: "writes", 0: "reads"}.get(v.write, "accesses")
    message = (
        f"kernel {spec.name!r}: thread {thread} of block {block} {verb} {name}[{index}], out "
        f"of bounds: {name} has {tensor.numel()} elements"
    )
    if v.offset % size or v.bytes not in (0, size):  # 0: a fault, of a size nobody knows
        access = f"an access of {v.bytes} bytes" if v.bytes else "an access"
        message += f" ({access} at byte offset {v.offset})"
    return OutOfBoundsError(
        message,
        kernel=spec.name,
        tensor=name,
        index=index,
        thread=thread,
        block=block,
        write=None if v.write < 0 else bool(v.write),
    )


def _argument(kernel: str, i: int, value: Any, ctype):
    if hasattr(value, "data_ptr"):
        if ctype is not ctypes.c_void_p:
            raise TypeError(f"kernel {kernel}: argument {i} is a scalar, got a tensor")
        if value.device.type != "cpu":
            raise TypeError(
                f"kernel {kernel}: argument {i} is on {value.device}; cuda-emu runs on CPU tensors"
            )
        return ctypes.c_void_p(value.data_ptr())
    if ctype is TensorMapBytes:
        if not isinstance(value, bytes | bytearray) or len(value) != ctypes.sizeof(ctype):
            raise TypeError(
                f"kernel {kernel}: argument {i} is a tensor map, its {ctypes.sizeof(ctype)} "
                f"bytes encoded by minicomp.backends.cuda.tensor_map, got {type(value).__name__}"
            )
        return ctype(value)
    if ctype is ctypes.c_void_p and not isinstance(value, int):
        raise TypeError(f"kernel {kernel}: argument {i} is a pointer, got {type(value).__name__}")
    return ctype(value)


def asan_runtime(cxx: str = "c++") -> str | None:
    """The path of the compiler's ASan runtime library, or None when it has none."""
    try:
        proc = subprocess.run(
            [cxx, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    path = proc.stdout.strip()
    return os.path.realpath(path) if os.path.isabs(path) and os.path.exists(path) else None


def asan_environment(cxx: str = "c++") -> dict[str, str]:
    """Environment for a subprocess that loads ASan builds: libasan preloaded, recoverable."""
    path = asan_runtime(cxx)
    if path is None:
        raise EmulatorError(f"{cxx} has no ASan runtime (libasan.so)")
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [path, env.get("LD_PRELOAD", "")]))
    # Python and torch leak by design; a report should fail the launch, not kill the process.
    env["ASAN_OPTIONS"] = "detect_leaks=0:halt_on_error=0:" + env.get("ASAN_OPTIONS", "")
    return env


def _asan_loaded() -> bool:
    return hasattr(ctypes.CDLL(None), "__asan_init")


def _check_flags(cxx: str, table=_CHECK_FLAGS) -> str:
    ident = compiler._compiler_id(shutil.which(cxx) or cxx)
    return table["clang" if "clang" in ident.lower() else "gcc"]


def build_emulated(
    source: str,
    kernels: Sequence[Function] | Sequence[tuple],
    *,
    cache_dir: str,
    cxx: str = "c++",
    asan: bool = False,
    checks: bool = False,
    lens: bool = False,
    ucontext: bool = False,
    cxxflags: str = DEFAULT_CXXFLAGS,
) -> EmuModule:
    """Compile CUDA ``source`` for the emulator and load it.

    ``kernels`` are kernel-IR Functions, or ``(name, param C types[, sync])`` tuples whose types
    are a list or a comma-separated string; ``sync`` (whether the kernel reaches a barrier or a
    warp shuffle, so its threads need fibers) is otherwise found by scanning ``source``.
    ``checks`` builds it to check its accesses to tensor arguments (see the module's
    docstring); ``lens`` builds it to count them (:meth:`EmuModule.launch_counted`);
    ``ucontext`` selects the swapcontext fiber switch instead of the x86-64 routine.
    """
    specs = _specs(source, kernels)
    if asan + checks + lens > 1:
        raise EmulatorError("a build has one of ASan, checks and lens, not two")
    flags = cxxflags + (" " + _ASAN_FLAGS if asan else "")
    flags += " " + _check_flags(cxx) if checks else ""
    flags += " " + _check_flags(cxx, _LENS_FLAGS) if lens else ""
    if asan and not _asan_loaded():
        raise EmulatorError(
            "an ASan build needs the ASan runtime loaded first: run this in a process started "
            "with minicomp.backends.cuda.emu.asan_environment() (LD_PRELOAD of libasan)"
        )
    library = _compile(source, specs, ucontext=ucontext, cxx=cxx, flags=flags, cache_dir=cache_dir)
    return EmuModule(source, specs, library._name, library, checks=checks, lens=lens)
