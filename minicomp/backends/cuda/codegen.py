"""CUDA C code generation: kernel IR to a self-contained CUDA source for NVRTC or the emulator.

The source starts with the text of device.h (our device header: stdint typedefs under NVRTC,
the `mc_*` helpers, 16-bit shuffles and compare-and-swap atomics), then device functions
(`static __device__ __forceinline__`), then kernels (`extern "C" __global__`, with
`__launch_bounds__(n)`: n is the kernel's attrs.launch_bounds when it has one, else its
block size when that is a constant; attrs.min_blocks = m adds m, the blocks per SM ptxas
must leave room for: m = 1 keeps it from spilling to reach a higher occupancy). Launch
indices render as int32 casts of `threadIdx.x`..., since the IR types them i32 and unsigned
arithmetic would change the meaning of a subtraction or comparison. Loops of kind `parallel`
and `vectorize` render as plain loops (a schedule maps parallelism onto threads before
codegen); `unroll` gives `#pragma unroll`.

Vector memory access is three intrinsics over a local register array (declared
`alignas(16)`), each rendered through a device-header helper named by its byte count:
`load_vec(reg, buf[i], lanes)` → `mc_load_vec<bytes>(reg, &buf[i])` (the Load names the
first element; the buffer is only read), `store_vec(buf, i, reg, lanes)` →
`mc_store_vec<bytes>(&buf[i], reg)`, and `is_aligned(buf[i], bytes)` →
`mc_is_aligned(&buf[i], bytes)`. A vector is 2, 4, 8, 16 or 32 bytes (two 16-byte accesses)
and its address must be aligned to its size, 16 at most.

`printf(fmt, values...)` (its first argument a StringLiteral) renders as CUDA's device printf
with the format spelled as an escaped C string literal; f16/bf16/float8 values print as floats
and bools as ints. Arrays of scope "dynamic" live in the launch's dynamic shared memory, the
device header's `mc_dynamic_smem` (16-byte aligned): each such DeclareArray is a typed
pointer to its start (the script front-end addresses later tensors through an element
offset, so its size counts the elements before it), and the kernel's attrs.dynamic_smem
says how many bytes a launch gives.
"""

from __future__ import annotations

import functools
import os

from minicomp.backends.c_like import PREC_UNARY, CLikeRenderer, is_half
from minicomp.backends.cuda.intrinsics_async import HEADER_PATH as ASYNC_HEADER_PATH
from minicomp.backends.cuda.intrinsics_async import AsyncIntrinsics
from minicomp.backends.cuda.intrinsics_cluster import HEADER_PATH as CLUSTER_HEADER_PATH
from minicomp.backends.cuda.intrinsics_cluster import ClusterIntrinsics
from minicomp.backends.cuda.intrinsics_mma import HEADER_PATH as MMA_HEADER_PATH
from minicomp.backends.cuda.intrinsics_mma import MmaIntrinsics
from minicomp.backends.cuda.intrinsics_tma import HEADER_PATH as TMA_HEADER_PATH
from minicomp.backends.cuda.intrinsics_tma import TmaIntrinsics
from minicomp.backends.cuda.intrinsics_wgmma import HEADER_PATH as WGMMA_HEADER_PATH
from minicomp.backends.cuda.intrinsics_wgmma import WgmmaIntrinsics
from minicomp.backends.headers import inline_includes
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function, Module
from minicomp.ir.types import (
    DataType,
    PointerType,
    boolean,
    f32,
    f64,
    i32,
    i64,
    is_float8,
    is_narrow_float,
    u32,
    u64,
)

HEADER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "device.h")
FULL_MASK = "0xffffffffu"

# Names CUDA declares in every translation unit: a kernel or variable so named would clash
# with them or hide them.
CUDA_RESERVED = frozenset(
    (
        "threadIdx",
        "blockIdx",
        "blockDim",
        "gridDim",
        "warpSize",
        "dim3",
        "atomicAdd",
        "atomicSub",
        "atomicMax",
        "atomicMin",
        "atomicCAS",
        "atomicExch",
        "atomicAnd",
        "atomicOr",
        "atomicXor",
        "atomicInc",
        "atomicDec",
        "min",
        "max",
        "umin",
        "umax",
        "llmin",
        "llmax",
        "ullmin",
        "ullmax",
        "rsqrt",
        "rsqrtf",
        "rcbrt",
        "rcbrtf",
        "erfinv",
        "erfinvf",
        "erfcinv",
        "erfcinvf",
        "erfcx",
        "erfcxf",
        "normcdf",
        "normcdff",
        "normcdfinv",
        "normcdfinvf",
        "sinpi",
        "sinpif",
        "cospi",
        "cospif",
        "sincospi",
        "sincospif",
        "saturate",
        "clock64",
        "printf",
        "assert",
    )
)
# The sizes of the device header's vector access helpers.
VECTOR_BYTES = (2, 4, 8, 16, 32)
# The most threads a CUDA block may have.
MAX_BLOCK_THREADS = 1024
# The device header's name for the dynamic shared memory of a launch.
DYNAMIC_SMEM = "mc_dynamic_smem"
_C_ESCAPES = {ord("\\"): "\\\\", ord('"'): '\\"', ord("?"): "\\?", 10: "\\n", 9: "\\t", 13: "\\r"}
# Shuffles move 32- or 64-bit registers; narrower integers travel as int32.
_SHUFFLE_NATIVE = ("f32", "f64", "i32", "u32", "i64", "u64")


@functools.lru_cache(maxsize=1)
def device_header() -> str:
    """The text of device.h (common.h inlined), mma.h, async.h, tma.h, wgmma.h then cluster.h,
    which every generated CUDA source carries inline."""
    paths = (
        HEADER_PATH,
        MMA_HEADER_PATH,
        ASYNC_HEADER_PATH,
        TMA_HEADER_PATH,
        WGMMA_HEADER_PATH,
        CLUSTER_HEADER_PATH,
    )
    return "\n".join(inline_includes(path) for path in paths)


def block_threads(f: Function) -> int | None:
    """The number of threads of a block of kernel `f`, when its block_dim is constant."""
    dims = f.attrs.block_dim
    if dims is None:
        return None
    total = 1
    for d in dims:
        if isinstance(d, E.Const):
            d = d.value
        if not isinstance(d, int):
            return None
        total *= d
    return total


def c_string_literal(text: str) -> str:
    """`text` as a C string literal: its UTF-8 bytes, printable ASCII kept, quotes,
    backslashes, `?` (trigraphs) and control characters escaped, other bytes as 3-digit
    octal escapes (which, unlike hex ones, never swallow a following digit)."""
    out = []
    for b in text.encode("utf-8"):
        if b in _C_ESCAPES:
            out.append(_C_ESCAPES[b])
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


class CudaRenderer(
    MmaIntrinsics,
    TmaIntrinsics,
    AsyncIntrinsics,
    WgmmaIntrinsics,
    ClusterIntrinsics,
    CLikeRenderer,
):
    """Renders kernel IR as CUDA C++ for NVRTC (and for the host emulator, unchanged)."""

    reserved_names = CUDA_RESERVED

    def header(self) -> str:
        return device_header()

    def function_qualifier(self, f: Function) -> str:
        if f.kind == "device":
            return "static __device__ __forceinline__"
        if f.kind != "kernel":
            raise ValueError(f"the cuda target has no {f.kind} functions: {f.name}")
        if f.ret is not None:
            raise ValueError(f"kernel {f.name} returns {f.ret}; kernels return nothing")
        threads = block_threads(f)
        if threads is not None and not 1 <= threads <= MAX_BLOCK_THREADS:
            raise ValueError(
                f"kernel {f.name} has {threads} threads a block; CUDA allows 1-{MAX_BLOCK_THREADS}"
            )
        bound = f.attrs.launch_bounds
        if bound is not None:
            if not 1 <= bound <= MAX_BLOCK_THREADS:
                raise ValueError(
                    f"kernel {f.name} has launch bounds {bound!r}; a bound is an int from 1 to "
                    f"{MAX_BLOCK_THREADS}"
                )
            if threads is not None and threads > bound:
                raise ValueError(
                    f"kernel {f.name} has {threads} threads a block, over its launch bounds {bound}"
                )
            threads = bound
        min_blocks = f.attrs.min_blocks
        prefix = 'extern "C" __global__'
        if f.attrs.cluster_dim is not None:
            prefix += " __cluster_dims__({}, {}, {})".format(*f.attrs.cluster_dim)
        if threads is None:
            if min_blocks is not None:
                raise ValueError(f"kernel {f.name} has min_blocks but no constant thread count")
            return prefix
        if min_blocks is not None:
            return f"{prefix} __launch_bounds__({threads}, {min_blocks})"
        return f"{prefix} __launch_bounds__({threads})"

    def array_decl(self, s: S.DeclareArray) -> str:
        if s.scope == "dynamic":
            # Every dynamic array starts the dynamic shared memory; `size` is only a bound.
            t = self.type_name(s.dtype)
            return f"{t}* {self.name_of(s.var)} = ({t}*){DYNAMIC_SMEM};"
        local = super().array_decl(s)
        if s.scope == "shared":
            # ldmatrix rows, cp.async and vector accesses need 16-byte aligned shared arrays,
            # TMA copies more (TmaIntrinsics).
            return f"alignas({self.shared_alignment(s)}) __shared__ " + local
        if s.scope != "local":
            raise ValueError(f"unknown memory scope {s.scope!r} of array {s.var.name}")
        # Vector accesses copy whole register arrays as 16-byte words.
        return "alignas(16) " + local

    def loop_pragmas(self, loops: list[S.For]) -> list[str]:
        return ["#pragma unroll"] if loops[0].kind == "unroll" else []

    def thread_index(self, axis: str) -> str:
        return f"(int32_t)threadIdx.{axis}"

    def block_index(self, axis: str) -> str:
        return f"(int32_t)blockIdx.{axis}"

    def block_dim(self, axis: str) -> str:
        return f"(int32_t)blockDim.{axis}"

    def grid_dim(self, axis: str) -> str:
        return f"(int32_t)gridDim.{axis}"

    def barrier(self) -> str:
        return "__syncthreads()"

    # ---- intrinsics ----

    def intrinsic_threadfence(self, e: E.Call) -> str:
        return "__threadfence()"

    def intrinsic_lens_ops(self, e: E.Call) -> str:
        """The operation counts passes/kernel/count_ops.py inserts: only a counted emulator
        build (emu_lens.h) defines mc_lens_ops."""
        return f"mc_lens_ops({', '.join(f'{int(a.value)}ull' for a in e.args)})"

    def _shuffle(self, e: E.Call, builtin: str, helper: str) -> str:
        if len(e.args) != 2:
            raise ValueError(f"{e.name} takes (value, lane): {e}")
        value, lane = e.args
        dt = value.dtype
        if is_half(dt):
            return f"{helper}({self.expr(value)}, {self.expr(lane)})"
        if is_float8(dt):  # the bits travel, not the value
            bits = f"(unsigned int){self.operand(value, PREC_UNARY)}"
            return f"(uint8_t){builtin}({FULL_MASK}, {bits}, {self.expr(lane)})"
        if dt.short in _SHUFFLE_NATIVE:
            return f"{builtin}({FULL_MASK}, {self.expr(value)}, {self.expr(lane)})"
        if dt.nbytes < 4 or dt.is_bool:
            wide = self.expr(E.Cast(value, i32))
            return f"({self.type_name(dt)}){builtin}({FULL_MASK}, {wide}, {self.expr(lane)})"
        raise ValueError(f"{e.name} cannot move a {dt} value")

    def intrinsic_shfl_down_sync(self, e: E.Call) -> str:
        return self._shuffle(e, "__shfl_down_sync", "mc_shfl_down_u16")

    def intrinsic_shfl_xor_sync(self, e: E.Call) -> str:
        return self._shuffle(e, "__shfl_xor_sync", "mc_shfl_xor_u16")

    def intrinsic_shfl_sync(self, e: E.Call) -> str:
        return self._shuffle(e, "__shfl_sync", "mc_shfl_u16")

    def _atomic_operands(self, e: E.Call) -> tuple[str, DataType, E.Expr]:
        if len(e.args) != 3:
            raise ValueError(f"{e.name} takes (buffer, index, value): {e}")
        buf, index, value = e.args
        if not isinstance(buf, E.Var) or not isinstance(buf.type, PointerType):
            raise ValueError(f"{e.name} needs a pointer variable as its buffer: {e}")
        if buf.type.elem != value.dtype:
            raise ValueError(f"{e.name} of a {value.dtype} value into a {buf.type.elem} buffer")
        return f"&{self.name_of(buf)}[{self.expr(index)}]", value.dtype, value

    def intrinsic_atomic_add(self, e: E.Call) -> str:
        address, dt, value = self._atomic_operands(e)
        if dt in (f32, f64, i32, u32, u64):
            return f"atomicAdd({address}, {self.expr(value)})"
        if dt == i64:
            # Two's complement addition is the same on unsigned bits; CUDA has only that one.
            wide = f"(unsigned long long){self.operand(value, PREC_UNARY)}"
            return f"(int64_t)atomicAdd((unsigned long long*){address}, {wide})"
        if is_half(dt):
            helper = f"mc_atomic_add_{dt.short}"
            return f"{helper}({address}, {self.expr(E.Cast(value, f32))})"
        raise ValueError(f"atomic_add is not available on {dt}")

    def intrinsic_atomic_max(self, e: E.Call) -> str:
        address, dt, value = self._atomic_operands(e)
        if dt in (i32, u32):
            return f"atomicMax({address}, {self.expr(value)})"
        if dt == f32:
            return f"mc_atomic_max_f32({address}, {self.expr(value)})"
        raise ValueError(f"atomic_max is not available on {dt}")

    def intrinsic_printf(self, e: E.Call) -> str:
        if not e.args or not isinstance(e.args[0], E.StringLiteral):
            raise ValueError(f"printf takes a string literal format first: {e}")
        args = [c_string_literal(e.args[0].value)]
        for a in e.args[1:]:
            # Varargs promote float to double and narrow ints to int; our f16/bf16/float8 bit
            # patterns and bools need converting first to print as numbers.
            if is_narrow_float(a.dtype):
                a = E.Cast(a, f32)
            elif a.dtype == boolean or a.dtype.nbytes < 4:
                a = E.Cast(a, i32)
            args.append(self.expr(a))
        return f"printf({', '.join(args)})"

    # ---- vector memory access ----

    def _address(self, first: E.Expr, what: str) -> str:
        if not isinstance(first, E.Load):
            raise ValueError(f"{what} takes the load of the first element: {first}")
        return f"&{self.name_of(first.buf)}[{self.expr(first.index)}]"

    def _vector_bytes(self, reg: E.Expr, elem: DataType, lanes: E.Expr, what: str) -> int:
        if not isinstance(reg, E.Var) or not isinstance(reg.type, PointerType):
            raise ValueError(f"{what} needs a register array, not {reg}")
        if reg.type.elem != elem:
            raise ValueError(f"{what} between a {reg.type.elem} array and a {elem} buffer")
        if not isinstance(lanes, E.Const) or lanes.value * elem.nbytes not in VECTOR_BYTES:
            raise ValueError(f"{what} of {lanes} {elem} lanes: not a vector size")
        return lanes.value * elem.nbytes

    def intrinsic_load_vec(self, e: E.Call) -> str:
        if len(e.args) != 3:
            raise ValueError(f"load_vec takes (register array, first element, lanes): {e}")
        reg, first, lanes = e.args
        address = self._address(first, "load_vec")
        nbytes = self._vector_bytes(reg, first.dtype, lanes, "load_vec")
        return f"mc_load_vec{nbytes}({self.name_of(reg)}, {address})"

    def intrinsic_store_vec(self, e: E.Call) -> str:
        if len(e.args) != 4:
            raise ValueError(f"store_vec takes (buffer, index, register array, lanes): {e}")
        buf, index, reg, lanes = e.args
        if not isinstance(buf, E.Var) or not isinstance(buf.type, PointerType):
            raise ValueError(f"store_vec needs a pointer variable as its buffer: {e}")
        nbytes = self._vector_bytes(reg, buf.type.elem, lanes, "store_vec")
        address = f"&{self.name_of(buf)}[{self.expr(index)}]"
        return f"mc_store_vec{nbytes}({address}, {self.name_of(reg)})"

    def intrinsic_is_aligned(self, e: E.Call) -> str:
        if len(e.args) != 2 or not isinstance(e.args[1], E.Const):
            raise ValueError(f"is_aligned takes (first element, constant bytes): {e}")
        first, nbytes = e.args
        return f"mc_is_aligned({self._address(first, 'is_aligned')}, {nbytes.value})"


def render_module(module: Module) -> str:
    """The complete CUDA source of a module: device.h, device functions, then kernels, in
    module order. The same module gives the same text."""
    return CudaRenderer().render_module(module)
