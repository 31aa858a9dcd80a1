"""The script DSL: CUDA kernels written as typed Python functions, parsed into kernel IR.

    import minicomp
    from minicomp.script import attrs, blockIdx, dim, f32, i32, threadIdx

    @minicomp.script
    def add(a: f32[dim.n], b: f32[dim.n], out: f32[dim.n], n: i32):
        attrs.grid_dim = (n + 255) // 256
        attrs.block_dim = 256
        i = blockIdx.x * 256 + threadIdx.x
        if i < n:
            out[i] = a[i] + b[i]

    add(x, y, z)  # CUDA tensors run on the GPU, CPU tensors in the emulator

`minicomp.script` is both this package and the decorator (`@minicomp.script` or
`@minicomp.script(target="cuda-emu")`). A function that sets `attrs.grid_dim` and
`attrs.block_dim` is a kernel; one that does not is a device function, callable from other
script functions. `kernel.ir`, `kernel.module` and `kernel.source` (CUDA C) show what it
became; `kernel.with_target("cuda-emu")` forces a target. `custom_op("lib::name", kernel,
outputs=("y",))` registers a kernel as a PyTorch operator (eager, fake and optional backward
implementations) that graphs compiled by minicomp for cuda or cuda-emu launch natively.

Parameters: `f32[m, k]` is a contiguous row-major tensor; ints are static sizes, and
`dim.m` (or the string "m", or the bare name under `from __future__ import annotations`)
names an int parameter of the same function, a runtime size that binds from the tensors'
shapes at launch (`dim.m` is the spelling linters accept). `ptr(f32)` is a raw pointer,
`i32`, `f32`... a scalar. Names resolve to parameters and locals,
then to the function's closure and globals: ints, floats, bools and tuples there are
compile-time constants, so a template is a Python function returning a script kernel. A local
assigned once with a compile-time value is itself a constant; `if` on a compile-time
condition keeps only the branch taken; `for x in (a, b)` over a compile-time tuple repeats
its body.

Statements: assignment (the first declares a variable of the value's type; later ones must
convert implicitly), augmented assignment, `x: f16 = ...`, tensor elements `a[i, j]` (a
partial index gives a view), `if/elif/else`, `while`, `for i in range(...)` (1 to 3
arguments, a compile-time step; `for i in unroll(range(4))` asks for full unrolling),
`break`, `continue`, `return` (device functions, with a return annotation), and
`for i, j in mapping.on(threadIdx.x)` over task mappings (minicomp.script.mapping).

Types and conversions (minicomp.script.conversions has the details): literals take the type
of the value they meet (alone: i32, f32, bool); arithmetic promotes like C (floats beat
ints, wider beats narrower) and wraps; `/` needs a float operand; `//` and `%` are integer
operators that truncate toward zero like C (-7 // 2 == -3, also in compile-time arithmetic);
implicit conversions only widen (i32 to i64, f16 to f32...); everything else needs a cast
such as `f16(x)` or `i32(x)`. The float8 formats are `float8_e4m3fn`, `float8_e5m2` and
their fnuz variants (or `f8e4m3fn`... as the printer writes them): one byte each, loaded,
stored and converted bit for bit as PyTorch does (`f32(x)`, `float8_e4m3fn(y)`; they widen
implicitly to f16, bf16, f32), their arithmetic rounded to float8 like f16's to f16 (widen
first to compute in f32). Comparisons chain; `and`/`or`/`not` are logical; `a if c else
b` selects.

Primitives: `threadIdx`, `blockIdx`, `blockDim`, `gridDim` (.x .y .z, i32), `syncthreads()`,
`shfl_down_sync(v, delta)`, `shfl_xor_sync(v, mask)`, `shfl_sync(v, lane)`,
`atomic_add(t[i], v)` and `atomic_max(t[i], v)` (they return the old value), `threadfence()`
(CUDA's `__threadfence()`: this thread's writes before it are seen by every thread of the
grid before its writes after it),
`shared_tensor(dtype, shape)`, `register_tensor(dtype, shape)`,
`dynamic_shared_tensor(dtype, shape)` (laid out one after the other in the dynamic shared
memory, whose size `attrs.dynamic_smem` defaults to; `at=bytes` places one at that offset
instead), `load_vec(reg, t[i])`,
`store_vec(t[i], reg)` and `is_aligned(t[i], bytes)` (vector access of a whole register
tensor), `printf(fmt, *values)` (C's format; f16/bf16 values print as doubles with %f, bools
and narrow ints as ints with %d, i64 needs %lld), `comment(text)` (a comment in the CUDA
source), the math functions of
minicomp.ir.expr.MATH_FUNCTIONS plus `max`, `min`, `abs`, `pow` (and `**`), and `attrs`
(`grid_dim`, `block_dim`: ints or expressions over scalar parameters; `dynamic_smem` bytes;
`launch_bounds`: the most threads a block may have; `min_blocks`: the blocks per SM the
register budget must leave room for; `template`: a name for reports), the fields of the
kernel IR's minicomp.ir.func.LaunchAttrs. Tensor cores and async copies (sm_80+,
fragment layouts in minicomp.backends.cuda.intrinsics_mma): `mma_sync_m16n8k16(d, a, b, c)`
(one warp's D = A * B + C; each operand a register tensor, a view `acc[i, j]` or its first
element: 8 f16 or bf16 of A, 4 of B, 4 f32 of C and D), `mma_sync_m16n8k32(d, a, b, c)`
(the same for 8-bit integers: 16 i8 or u8 of A, 8 of B, 4 i32 of C and D, sums wrapping;
or for float8 on sm_89+: 16 float8_e4m3fn or float8_e5m2 of A, 8 of B, 4 f32 of C and D),
`ldmatrix_x1|x2|x4[_trans](frag, smem[r, c])` (the 16-byte shared row this lane names; 8-bit
elements without _trans), `cp_async(smem[i], t[j], nbytes,
src_bytes=None)` (4, 8 or 16 bytes from a global to a shared tensor, zero-filled past the
runtime `src_bytes`), `cp_async_commit()`, `cp_async_wait(n)`, `cp_async_wait_all()`.
Hopper barriers and bulk copies (minicomp.script.hopper has their meaning): `mbarrier_init`,
`mbarrier_arrive`, `mbarrier_arrive_expect_tx`, `mbarrier_try_wait_parity`, `mbarrier_wait`,
`fence_proxy_async`, `bulk_copy_g2s`. TMA (minicomp.script.tma): the parameter annotation
`tensor_map(f16[dim.m, dim.k], box=(64, 64), swizzle=128)`, `tma_load`, `tma_store`,
`bulk_commit_group`, `bulk_wait_group`, `bulk_wait_group_read`. Hopper warpgroup MMA
(minicomp.script.wgmma, sm_90a): `wgmma_fence`, `wgmma_mma_async`, `wgmma_commit_group`,
`wgmma_wait_group`. Clusters and register reallocation (minicomp.script.cluster; sm_90, setmaxnreg
sm_90a): `cluster_ctarank`, `cluster_nctarank`, `cluster_sync`, `cluster_arrive`,
`cluster_wait`, `fence_mbarrier_init`, `mbarrier_arrive_cluster`, `cluster_load`,
`cluster_store`, `setmaxnreg_inc`,
`setmaxnreg_dec`; `attrs.cluster_dim`.

Kernel IR prints as this language (minicomp.ir.printer.function_str), and
minicomp.script.text.parse_function reads such text back into the same IR.

Not (yet) in the language: slices, strings other than printf's format, bounds checks (an
index outside a tensor is undefined behaviour, as in CUDA), Python's negative indices, and
views passed to device functions.

Templates: `minicomp.script.lang.macro` marks a Python function a script calls at parse time
(it gets IR expressions, returns an IR expression or statements), IR expressions in scope are
runtime values, and `script(fn, params=(...))` appends IR parameters: the way minicomp's own
matmul templates compute a fused group's prologue at their loads and its epilogue at their
stores (minicomp.schedule.templates). docs/script.md is the full language reference.
"""

import sys
import types as _types

from minicomp.script.cluster import (
    cluster_arrive,
    cluster_ctarank,
    cluster_load,
    cluster_nctarank,
    cluster_store,
    cluster_sync,
    cluster_wait,
    fence_mbarrier_init,
    mbarrier_arrive_cluster,
    setmaxnreg_dec,
    setmaxnreg_inc,
)
from minicomp.script.custom_op import custom_op
from minicomp.script.errors import ScriptError
from minicomp.script.function import ScriptFunction, script
from minicomp.script.hopper import (
    bulk_copy_g2s,
    fence_proxy_async,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_try_wait_parity,
    mbarrier_wait,
)
from minicomp.script.lang import (
    MATH,
    abs,
    atomic_add,
    atomic_max,
    attrs,
    blockDim,
    blockIdx,
    comment,
    cp_async,
    cp_async_commit,
    cp_async_wait,
    cp_async_wait_all,
    dim,
    dynamic_shared_tensor,
    gridDim,
    is_aligned,
    ldmatrix_x1,
    ldmatrix_x1_trans,
    ldmatrix_x2,
    ldmatrix_x2_trans,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    load_vec,
    max,
    min,
    mma_sync_m16n8k16,
    mma_sync_m16n8k32,
    pow,
    printf,
    register_tensor,
    shared_tensor,
    shfl_down_sync,
    shfl_sync,
    shfl_xor_sync,
    store_vec,
    syncthreads,
    threadfence,
    threadIdx,
    unroll,
)
from minicomp.script.mapping import TaskMapping, repeat, spatial
from minicomp.script.tma import (
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    tma_load,
    tma_store,
)
from minicomp.script.types import (
    bf16,
    boolean,
    f8e4m3fn,
    f8e4m3fnuz,
    f8e5m2,
    f8e5m2fnuz,
    f16,
    f32,
    f64,
    float8_e4m3fn,
    float8_e4m3fnuz,
    float8_e5m2,
    float8_e5m2fnuz,
    i8,
    i16,
    i32,
    i64,
    ptr,
    tensor_map,
    u8,
    u16,
    u32,
    u64,
)
from minicomp.script.wgmma import (
    wgmma_commit_group,
    wgmma_fence,
    wgmma_mma_async,
    wgmma_wait_group,
)

globals().update(MATH)

__all__ = [
    "ScriptError",
    "ScriptFunction",
    "custom_op",
    "TaskMapping",
    "script",
    "spatial",
    "repeat",
    "ptr",
    "f16",
    "bf16",
    "f32",
    "f64",
    "i8",
    "i16",
    "i32",
    "i64",
    "u8",
    "u16",
    "u32",
    "u64",
    "boolean",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "f8e4m3fn",
    "f8e5m2",
    "f8e4m3fnuz",
    "f8e5m2fnuz",
    "dim",
    "threadIdx",
    "blockIdx",
    "blockDim",
    "gridDim",
    "attrs",
    "syncthreads",
    "threadfence",
    "shfl_down_sync",
    "shfl_xor_sync",
    "shfl_sync",
    "atomic_add",
    "atomic_max",
    "shared_tensor",
    "register_tensor",
    "dynamic_shared_tensor",
    "printf",
    "comment",
    "unroll",
    "load_vec",
    "store_vec",
    "is_aligned",
    "mma_sync_m16n8k16",
    "mma_sync_m16n8k32",
    "ldmatrix_x1",
    "ldmatrix_x2",
    "ldmatrix_x4",
    "ldmatrix_x1_trans",
    "ldmatrix_x2_trans",
    "ldmatrix_x4_trans",
    "cp_async",
    "cp_async_commit",
    "cp_async_wait",
    "cp_async_wait_all",
    "mbarrier_init",
    "mbarrier_arrive",
    "mbarrier_arrive_expect_tx",
    "mbarrier_try_wait_parity",
    "mbarrier_wait",
    "fence_proxy_async",
    "bulk_copy_g2s",
    "tensor_map",
    "tma_load",
    "tma_store",
    "bulk_commit_group",
    "bulk_wait_group",
    "bulk_wait_group_read",
    "wgmma_fence",
    "wgmma_mma_async",
    "wgmma_commit_group",
    "wgmma_wait_group",
    "cluster_ctarank",
    "cluster_nctarank",
    "cluster_sync",
    "cluster_arrive",
    "cluster_wait",
    "fence_mbarrier_init",
    "mbarrier_arrive_cluster",
    "cluster_load",
    "cluster_store",
    "setmaxnreg_inc",
    "setmaxnreg_dec",
    "max",
    "min",
    "abs",
    "pow",
]
__all__ += sorted(n for n in MATH if n not in __all__)


class _ScriptModule(_types.ModuleType):
    """This package, callable as the `@minicomp.script` decorator."""

    def __call__(self, fn=None, **options):
        return script(fn, **options)


sys.modules[__name__].__class__ = _ScriptModule

# Last: launching builds through minicomp.targets, which imports templates written with the
# names above. Importing the launcher registers it with ScriptFunction.
from minicomp.script import launch as _launch  # noqa: E402, F401
