"""Tests of the cuda-emu runtime: hand-written CUDA kernels run on the CPU against torch."""

import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from minicomp.backends.cuda import emu
from minicomp.backends.cuda.emu import EmulatorError, build_emulated, kernels_needing_fibers

VADD = r"""
extern "C" __global__ void __launch_bounds__(256) vadd(const float* __restrict__ a,
    const float* __restrict__ b, float* __restrict__ c, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

# A tree reduction: each step reads a neighbour's write of the step before, so leaving out the
# barrier (BARRIER empty) reads stale values in the emulator exactly as on a GPU.
BLOCK_SUM = r"""
extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ out) {
    __shared__ float s[1024];
    unsigned t = threadIdx.x;
    s[t] = x[blockIdx.x * blockDim.x + t];
    BARRIER;
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
        if (t < k) s[t] += s[t + k];
        BARRIER;
    }
    if (t == 0) out[blockIdx.x] = s[0];
}
"""

WARP_SUM = r"""
template <class T>
static __device__ __forceinline__ T warp_sum(T v) {
    for (int d = 16; d > 0; d >>= 1) v += __shfl_down_sync(0xffffffffu, v, DELTA);
    return v;
}
extern "C" __global__ void warp_sum_f32(const float* x, float* out) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = warp_sum(x[i]);
    if (threadIdx.x % 32 == 0) out[i / 32] = v;
}
extern "C" __global__ void warp_sum_f64(const double* x, double* out) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    double v = warp_sum(x[i]);
    if (threadIdx.x % 32 == 0) out[i / 32] = v;
}
extern "C" __global__ void warp_sum_i64(const long long* x, long long* out) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    long long v = warp_sum(x[i]);
    if (threadIdx.x % 32 == 0) out[i / 32] = v;
}
"""

BUTTERFLY = r"""
extern "C" __global__ void butterfly(const int* x, int* out, float* fout, unsigned* uout) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = x[i];
    float f = (float)x[i];
    unsigned u = (unsigned)x[i];
    for (int m = 1; m < 32; m <<= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, m);
        f = fmaxf(f, __shfl_xor_sync(0xffffffffu, f, m));
        u = min(u, __shfl_xor_sync(0xffffffffu, u, m));
    }
    out[i] = v;
    fout[i] = f;
    uout[i] = u + (unsigned)__shfl_sync(0xffffffffu, v, 3) * 0u;
}
"""

ATOMICS = r"""
extern "C" __global__ void atomics(const float* x, float* sum, int* count, int* biggest,
                                   unsigned long long* usum, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(sum, x[i]);
    atomicAdd(count, 1);
    atomicMax(biggest, (int)(x[i] * 1000.0f));
    atomicAdd(usum, (unsigned long long)i);
    int old = 0;
    while ((old = atomicCAS(count + 1, 0, 1)) != 0) {}  // a spin lock around a plain update
    count[2] += 1;
    atomicExch(count + 1, 0);
}
"""

WRITE = r"""
extern "C" __global__ void write_some(float* out, int64_t n, int64_t skip) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && i != skip) out[i] = (float)i * 0.5f;
}
"""

DIVERGENT = r"""
extern "C" __global__ void divergent(float* x) {
    if (threadIdx.x < 16) __syncthreads();
    x[threadIdx.x] = 1.0f;
}
extern "C" __global__ void two_barriers(float* x) {
    if (threadIdx.x < 16) {
        x[threadIdx.x] = 1.0f;
        __syncthreads();
    } else {
        __syncthreads();
    }
}
extern "C" __global__ void warp_vs_block(float* x) {
    float v = x[threadIdx.x];
    if (threadIdx.x < 16) v = __shfl_down_sync(0xffffffffu, v, 1);
    else __syncthreads();
    x[threadIdx.x] = v;
}
"""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("emu_cache"))


def _block_sum(cache_dir, barrier="__syncthreads()", **kw):
    source = BLOCK_SUM.replace("BARRIER", barrier)
    return build_emulated(
        source, [("block_sum", "const float*, float*", True)], cache_dir=cache_dir, **kw
    )


def test_vector_add_over_several_blocks(cache_dir):
    m = build_emulated(
        VADD, [("vadd", "const float*, const float*, float*, int64_t")], cache_dir=cache_dir
    )
    assert not m.specs["vadd"].sync  # no barrier: the threads run as a plain loop
    n = 1000
    a, b = torch.randn(n), torch.randn(n)
    c = torch.full((n,), float("nan"))
    m.launch("vadd", (n + 255) // 256, 256, [a, b, c, n])
    torch.testing.assert_close(c, a + b, rtol=0, atol=0)


@pytest.mark.parametrize("ucontext", [False, True])
def test_block_sum_with_shared_memory(cache_dir, ucontext):
    m = _block_sum(cache_dir, ucontext=ucontext)
    x = torch.randn(64, 256)
    out = torch.full((64,), float("nan"))
    m.launch("block_sum", 64, 256, [x, out])
    torch.testing.assert_close(out, x.sum(1), rtol=1e-5, atol=1e-4)


def _mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")
def test_launches_leave_no_fiber_stacks_mapped(cache_dir):
    # Every fiber stack has a guard page, a mapping of its own; kept after the launch by each
    # loaded kernel library, they once exhausted vm.max_map_count in a long test session.
    x = torch.randn(4, 1024)
    before = _mappings()
    for k in range(4):
        m = _block_sum(cache_dir, barrier=f"__syncthreads(); (void){k}")
        out = torch.full((4,), float("nan"))
        m.launch("block_sum", 4, 1024, [x, out])
        torch.testing.assert_close(out, x.sum(1), rtol=1e-5, atol=1e-3)
    # Four libraries map a few segments each; kept stacks would add 2 x 1024 per library.
    assert _mappings() - before < 200


def test_missing_barrier_gives_a_wrong_sum(cache_dir):
    m = _block_sum(cache_dir, barrier="(void)0")
    x = torch.rand(8, 256) + 1.0
    out = torch.full((8,), float("nan"))
    m.launch("block_sum", 8, 256, [x, out])
    assert not torch.allclose(out, x.sum(1), rtol=1e-3)


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("warp_sum_f32", torch.float32),
        ("warp_sum_f64", torch.float64),
        ("warp_sum_i64", torch.int64),
    ],
)
def test_warp_sum_with_shfl_down(cache_dir, name, dtype):
    m = build_emulated(
        WARP_SUM.replace("DELTA", "d"),
        [(name, f"const {_c(dtype)}*, {_c(dtype)}*")],
        cache_dir=cache_dir,
    )
    assert m.specs[name].sync
    x = (torch.randn(4 * 128) * 100).to(dtype)
    out = torch.full((4 * 128 // 32,), -7, dtype=dtype)
    m.launch(name, 4, 128, [x, out])
    rows = x.view(-1, 32)
    if dtype.is_floating_point:
        # The tree adds in another order than torch: bound the error by the magnitudes summed.
        bound = 32 * torch.finfo(dtype).eps * rows.abs().sum(1).double()
        assert ((out.double() - rows.double().sum(1)).abs() <= bound).all()
    else:
        assert torch.equal(out, rows.sum(1))


def test_wrong_shuffle_delta_gives_a_wrong_sum(cache_dir):
    m = build_emulated(
        WARP_SUM.replace("DELTA", "(d + 1) % 32"),
        [("warp_sum_f32", "const float*, float*")],
        cache_dir=cache_dir,
    )
    x = torch.rand(128) + 1.0
    out = torch.zeros(4)
    m.launch("warp_sum_f32", 1, 128, [x, out])
    assert not torch.allclose(out, x.view(-1, 32).sum(1))


def test_xor_butterfly(cache_dir):
    m = build_emulated(
        BUTTERFLY, [("butterfly", "const int*, int*, float*, unsigned*")], cache_dir=cache_dir
    )
    x = torch.randint(0, 1000, (96,), dtype=torch.int32)
    out = torch.zeros(96, dtype=torch.int32)
    fout = torch.zeros(96)
    uout = torch.zeros(96, dtype=torch.int32)
    m.launch("butterfly", 1, 96, [x, out, fout, uout])
    warps = x.view(3, 32)
    assert torch.equal(out.view(3, 32), warps.sum(1, keepdim=True).expand(3, 32))
    assert torch.equal(fout.view(3, 32), warps.amax(1, keepdim=True).float().expand(3, 32))
    assert torch.equal(uout.view(3, 32), warps.amin(1, keepdim=True).expand(3, 32))


def test_partial_warp_reads_its_own_value_past_the_block(cache_dir):
    m = build_emulated(
        WARP_SUM.replace("DELTA", "d"),
        [("warp_sum_i64", "const long long*, long long*")],
        cache_dir=cache_dir,
    )
    x = torch.arange(1, 21, dtype=torch.int64)
    out = torch.zeros(1, dtype=torch.int64)
    m.launch("warp_sum_i64", 1, 20, [x, out])
    assert out.item() > 0  # defined in the emulator only: lanes 20..31 do not exist


def test_atomics_across_blocks(cache_dir):
    m = build_emulated(
        ATOMICS,
        [("atomics", "const float*, float*, int*, int*, unsigned long long*, int")],
        cache_dir=cache_dir,
    )
    m.configure(workers=4)
    n = 5000
    x = torch.rand(n)
    total = torch.zeros(1)
    count = torch.zeros(3, dtype=torch.int32)
    biggest = torch.full((1,), -1, dtype=torch.int32)
    usum = torch.zeros(1, dtype=torch.int64)
    m.launch("atomics", (n + 127) // 128, 128, [x, total, count, biggest, usum, n])
    torch.testing.assert_close(total, x.sum(0, keepdim=True), rtol=1e-4, atol=1e-3)
    assert count.tolist() == [n, 0, n]
    assert biggest.item() == int((x * 1000.0).to(torch.int32).max())
    assert usum.item() == n * (n - 1) // 2


def test_unwritten_output_is_caught_by_nan_poison(cache_dir):
    m = build_emulated(WRITE, [("write_some", "float*, int64_t, int64_t")], cache_dir=cache_dir)
    n = 300
    expected = torch.arange(n, dtype=torch.float32) * 0.5
    out = torch.full((n,), float("nan"))
    m.launch("write_some", 3, 128, [out, n, -1])
    torch.testing.assert_close(out, expected)
    out = torch.full((n,), float("nan"))
    m.launch("write_some", 3, 128, [out, n, 123])  # the planted bug: element 123 is skipped
    assert torch.isnan(out[123]) and not torch.allclose(out, expected, equal_nan=False)


@pytest.mark.parametrize(
    "name, block, message",
    [
        ("divergent", 32, "16 of 32 threads wait at __syncthreads"),
        ("two_barriers", 32, "different __syncthreads() calls"),
        ("warp_vs_block", 32, "16 wait at a warp shuffle"),
    ],
)
def test_divergent_barrier_raises(cache_dir, name, block, message):
    m = build_emulated(DIVERGENT, [(name, "float*")], cache_dir=cache_dir)
    x = torch.zeros(64)
    start = time.perf_counter()
    with pytest.raises(EmulatorError, match=f"kernel '{name}'.*{re.escape(message)}") as info:
        m.launch(name, 4, block, [x])
    assert info.value.kernel == name
    assert time.perf_counter() - start < 1.0


def test_wrong_sync_flag_is_an_error_not_a_wrong_answer(cache_dir):
    m = build_emulated(
        BLOCK_SUM.replace("BARRIER", "__syncthreads()"),
        [("block_sum", "const float*, float*", False)],
        cache_dir=cache_dir,
    )
    with pytest.raises(EmulatorError, match="without fibers"):
        m.launch("block_sum", 1, 32, [torch.zeros(32), torch.zeros(1)])


def test_bad_launches(cache_dir):
    m = build_emulated(
        VADD, [("vadd", "const float*, const float*, float*, int64_t")], cache_dir=cache_dir
    )
    a = torch.zeros(4)
    with pytest.raises(EmulatorError, match="more threads"):
        m.launch("vadd", 1, 2048, [a, a, a, 4])
    with pytest.raises(TypeError, match="takes 4 arguments"):
        m.launch("vadd", 1, 4, [a, a, a])


_OVERFLOW_SCRIPT = r'''
import sys, torch
from minicomp.backends.cuda.emu import build_emulated
source = """
extern "C" __global__ void deep(float* x) {
    volatile float big[8192];
    for (int i = 0; i < 8192; i++) big[i] = x[0];
    __syncthreads();
    x[threadIdx.x] = big[threadIdx.x];
}
"""
m = build_emulated(source, [("deep", "float*")], cache_dir=sys.argv[1])
m.configure(stack_bytes=8192)
m.launch("deep", 1, 4, [torch.zeros(4)])
print("returned")
'''


def test_stack_overflow_hits_a_guard_page(cache_dir):
    """An overflowing fiber stack crashes the process (SIGSEGV) instead of corrupting memory."""
    proc = subprocess.run(
        [sys.executable, "-c", _OVERFLOW_SCRIPT, cache_dir],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -11 and "returned" not in proc.stdout, proc.stderr[-2000:]


def test_source_scan_follows_calls():
    source = WARP_SUM + VADD + "\n__device__ int helper() { return 1; }\n"
    found = kernels_needing_fibers(source, ["warp_sum_f32", "vadd", "missing"])
    assert found == {"warp_sum_f32", "missing"}


def test_device_header_compiles_and_runs(cache_dir):
    from minicomp.backends.cuda.codegen import device_header

    source = (
        device_header()
        + r"""
    extern "C" __global__ void halves(const float* x, uint16_t* h, float* back, float* mx) {
        unsigned i = threadIdx.x;
        uint16_t v = mc_f32_to_f16(x[i]);
        h[i] = v;
        back[i] = mc_f16_to_f32(mc_shfl_xor_u16(v, 1));
        mx[i] = mc_max_f32(x[i], mc_from_bits_f32(mc_bits_f32(x[i] * 2.0f)));
    }
    """
    )
    m = build_emulated(
        source, [("halves", "const float*, uint16_t*, float*, float*")], cache_dir=cache_dir
    )
    assert m.specs["halves"].sync  # found through mc_shfl_xor_u16
    x = torch.randn(64)
    h = torch.zeros(64, dtype=torch.int16)
    back, mx = torch.zeros(64), torch.zeros(64)
    m.launch("halves", 1, 64, [x, h, back, mx])
    f16 = x.half()
    assert torch.equal(h, f16.view(torch.int16))
    assert torch.equal(back.view(32, 2).flip(1).reshape(-1), f16.float())
    assert torch.equal(mx, torch.maximum(x, x * 2))


_ASAN_SCRIPT = """
import sys, torch
from minicomp.backends.cuda.emu import build_emulated, EmulatorError
m = build_emulated(sys.argv[2], [("write_some", "float*, int64_t, int64_t")],
                   cache_dir=sys.argv[1], asan=True)
out = torch.zeros(100)
m.launch("write_some", 1, 100, [out, 100, -1])
print("in bounds ok", flush=True)
try:
    m.launch("write_some", 1, 128, [out, 101, -1])  # one element past the end
except EmulatorError as e:
    print("caught:", e)
"""


def test_asan_catches_an_out_of_bounds_write(cache_dir):
    if emu.asan_runtime() is None:
        pytest.skip("the C++ compiler has no libasan")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_ASAN_SCRIPT), cache_dir, WRITE],
        env=emu.asan_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "in bounds ok" in proc.stdout, proc.stderr[-3000:]
    assert "caught: kernel 'write_some'" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "heap-buffer-overflow" in proc.stdout


def test_asan_build_refuses_to_load_without_the_runtime(cache_dir):
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        pytest.skip("this process has the ASan runtime")
    with pytest.raises(EmulatorError, match="asan_environment"):
        build_emulated(
            WRITE, [("write_some", "float*, int64_t, int64_t")], cache_dir=cache_dir, asan=True
        )


def test_reduction_timing(cache_dir, capsys):
    """A 2^20-element block reduction, 1024 threads x 1024 blocks: fiber switch cost."""
    x = torch.randn(1024 * 1024)
    times = {}
    for ucontext in (False, True):
        m = _block_sum(cache_dir, ucontext=ucontext)
        blocks = 1024 if not ucontext else 64  # swapcontext is too slow for the full size
        out = torch.zeros(blocks)
        start = time.perf_counter()
        m.launch("block_sum", blocks, 1024, [x, out])
        per_block = (time.perf_counter() - start) / blocks
        times["ucontext" if ucontext else "asm"] = per_block
        torch.testing.assert_close(out, x.view(1024, 1024)[:blocks].sum(1), rtol=1e-4, atol=1e-3)
    with capsys.disabled():
        print(
            f"\n2^20-element block reduction: {times['asm'] * 1024:.3f} s with the asm switch, "
            f"{times['ucontext'] * 1024:.3f} s (extrapolated) with swapcontext"
        )


def _c(dtype):
    return {torch.float32: "float", torch.float64: "double", torch.int64: "long long"}[dtype]


def _runtimes_needed(module) -> list[str]:
    from minicomp.backends.cpu.compiler import _needed_libraries

    return [n for n in _needed_libraries(module.path) if n.startswith("libmc_emu_")]


def test_kernel_libraries_link_to_one_runtime_built_once_per_flags(tmp_path):
    from minicomp.backends.cpu import compiler

    cache = str(tmp_path)
    compiler.reset_cache_stats()
    first = build_emulated(
        VADD, [("vadd", "const float*, const float*, float*, int64_t")], cache_dir=cache
    )
    assert compiler.cache_stats().misses == 2  # the runtime, then the kernel library
    second = build_emulated(
        VADD.replace("a[i] + b[i]", "a[i] - b[i]"),
        [("vadd", "const float*, const float*, float*, int64_t")],
        cache_dir=cache,
    )
    assert compiler.cache_stats().misses == 3  # the kernel library only
    checked = build_emulated(
        VADD,
        [("vadd", "const float*, const float*, float*, int64_t")],
        cache_dir=cache,
        checks=True,
    )
    assert len(_runtimes_needed(first)) == 1
    assert _runtimes_needed(first) == _runtimes_needed(second) != _runtimes_needed(checked)
    # Each library runs its own kernel through the runtime it links to.
    a, b = torch.randn(300), torch.randn(300)
    for module, want in ((first, a + b), (second, a - b), (checked, a + b)):
        c = torch.full((300,), float("nan"))
        module.launch("vadd", 2, 256, [a, b, c, 300])
        torch.testing.assert_close(c, want)
    with pytest.raises(emu.OutOfBoundsError):
        checked.launch("vadd", 2, 256, [a, b, torch.empty(299), 300])
    # The runtime has all of the emulator; these kernel libraries call no mbarrier, mma or
    # wgmma helper, so their precompiled prelude leaves those parts out.
    preludes = [p.read_text() for p in (tmp_path / "headers").rglob("prelude.h")]
    assert len(preludes) == 2
    assert all("MC_EMU_NO_ASYNC" in p and "MC_EMU_MMA_H" not in p for p in preludes)


def test_a_kernel_library_has_the_async_mma_and_wgmma_emulation_when_its_code_calls_them():
    from minicomp.backends.cuda.codegen import device_header

    calls = {
        "async_copies": "mc_mbarrier_init(bar, 1);",
        "mma": "mc_mma_m16n8k16_f16(d, a, b, d);",
        "wgmma": "mc_wgmma_fence();",
    }
    # The device header names them all, and a comment may: neither counts.
    plain = device_header() + f"/* {' '.join(calls.values())} */" + VADD
    none = dict.fromkeys(calls, False)
    assert emu.prelude_parts(plain) == none
    for part, call in calls.items():
        assert emu.prelude_parts(plain.replace("if (i < n)", call)) == {**none, part: True}
    tma = plain.replace("if (i < n)", "mc_tma_load_2d(dst, map, bar, 0, 0);")
    assert emu.prelude_parts(tma) == {**none, "async_copies": True}
    # emu_wgmma.h uses emu_async.h's errors and emu_mma.h's conversions: it brings both.
    full = emu.emulator_prelude()
    assert emu.emulator_prelude(async_copies=False, mma=False, wgmma=True) == full
    base = emu.emulator_prelude(async_copies=False, mma=False, wgmma=False)
    assert "#define MC_EMU_NO_ASYNC" in base and "#define MC_EMU_NO_ASYNC" not in full
    assert "MC_EMU_MMA_H" in emu.emulator_prelude(wgmma=False) and "MC_EMU_MMA_H" not in base
    assert "MC_EMU_WGMMA_H" in full and "MC_EMU_WGMMA_H" not in emu.emulator_prelude(wgmma=False)
