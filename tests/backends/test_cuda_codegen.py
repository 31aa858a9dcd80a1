"""Tests of the CUDA renderer on hand-built kernel IR: the rendered text, intrinsic by intrinsic.

The kernels built here are compiled with NVRTC by test_nvrtc.py, which loads this file.
"""

import re

import pytest

from minicomp.backends.cuda import codegen
from minicomp.backends.cuda.codegen import CudaRenderer, render_module
from minicomp.backends.headers import inline_includes
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.error_flag import ERROR_FLAG, checked_index
from minicomp.ir.func import Function, LaunchAttrs, Module
from minicomp.ir.types import (
    ALL_TYPES,
    FLOAT8_TYPES,
    PointerType,
    bf16,
    boolean,
    f16,
    f32,
    f64,
    i32,
    i64,
    u8,
    u32,
)

n = E.Var("n", i64)


def _idx(name: str) -> E.Expr:
    return E.Call(name, (), i32)


def _global_index() -> E.Expr:
    return E.cast(_idx("block_idx_x"), i64) * E.cast(_idx("block_dim_x"), i64) + E.cast(
        _idx("thread_idx_x"), i64
    )


def elementwise_kernel() -> Function:
    """out[i] = sigmoid(x[i]) * y[i] + floordiv(x[i], 2) over a 1-D grid of 256-thread blocks."""
    x, y, out = (E.Var(v, PointerType(f32)) for v in ("x", "y", "out"))
    i = E.Var("i", i64)
    xi = E.Load(x, i)
    value = E.call("sigmoid", xi) * E.Load(y, i) + E.Binary("floordiv", xi, E.const(2.0, f32))
    body = S.seq(
        S.Declare(i, _global_index()),
        S.If(E.binary("lt", i, n), S.Store(out, i, value)),
    )
    grid = ((n + 255) // 256, 1, 1)
    attrs = LaunchAttrs(grid_dim=grid, block_dim=(256, 1, 1))
    return Function("ew_sigmoid_mul", (x, y, out, n), body, attrs=attrs)


def block_reduce_kernel() -> Function:
    """out[row] = sum(x[row, :]) with one 256-thread block a row: strided partial sums, a warp
    reduction by shfl_down, per-warp partials in shared memory, then a second warp pass."""
    x, out = E.Var("x", PointerType(f32)), E.Var("out", PointerType(f32))
    part = E.Var("partials", PointerType(f32, "shared"))
    acc, k = E.Var("acc", f32), E.Var("k", i64)
    tid = E.Var("tid", i32)
    row = E.cast(_idx("block_idx_x"), i64)
    lane, warp = tid % 32, tid // 32
    strided = S.For(
        k,
        (n - E.cast(tid, i64) + 255) // 256,
        S.Assign(acc, acc + E.Load(x, row * n + k * 256 + E.cast(tid, i64))),
    )

    def warp_sum():
        # The offsets 16, 8, 4, 2, 1 as a loop of 5 unrolled steps.
        step = E.Var("step", i32)
        shift = E.Binary("shr", E.const(16, i32), step)
        shuffled = E.Call("shfl_down_sync", (acc, shift), f32)
        return S.For(step, E.const(5, i32), S.Assign(acc, acc + shuffled), kind="unroll")

    sync = S.Evaluate(E.Call("syncthreads", (), i32))
    body = S.seq(
        S.DeclareArray(part, f32, 8, "shared"),
        S.Declare(tid, _idx("thread_idx_x")),
        S.Declare(acc, E.const(0.0, f32)),
        strided,
        warp_sum(),
        S.If(E.eq(lane, 0), S.Store(part, warp, acc)),
        sync,
        S.If(
            E.binary("lt", tid, E.const(32, i32)),
            S.seq(
                S.Assign(acc, E.select(E.binary("lt", tid, 8), E.Load(part, lane), 0.0)),
                warp_sum(),
                S.If(E.eq(tid, 0), S.Store(out, row, acc)),
            ),
        ),
    )
    attrs = LaunchAttrs(grid_dim=(n, 1, 1), block_dim=(256, 1, 1))
    return Function("row_sum", (x, out, n), body, attrs=attrs)


def half_kernel() -> Function:
    """f16 in, f32 math, bf16 and f16 out; an f16 value crosses lanes by shfl_xor."""
    h = E.Var("h", PointerType(f16))
    ob, oh = E.Var("ob", PointerType(bf16)), E.Var("oh", PointerType(f16))
    i, v = E.Var("i", i64), E.Var("v", f16)
    swapped = E.Call("shfl_xor_sync", (v, E.const(1, i32)), f16)
    body = S.seq(
        S.Declare(i, _global_index()),
        S.Declare(v, E.select(E.binary("lt", i, n), E.Load(h, i), E.const(0.0, f16))),
        S.If(
            E.binary("lt", i, n),
            S.seq(
                S.Store(ob, i, E.cast(E.call("exp", E.cast(v, f32)) + 1.0, bf16)),
                S.Store(oh, i, v + swapped),
            ),
        ),
    )
    attrs = LaunchAttrs(grid_dim=((n + 127) // 128, 1, 1), block_dim=(128, 1, 1))
    return Function("half_io", (h, ob, oh, n), body, attrs=attrs)


def atomics_kernel() -> Function:
    """Scatter-adds and maxima of every supported type into small bins."""
    src = E.Var("src", PointerType(f32))
    sums, counts = E.Var("sums", PointerType(f32)), E.Var("counts", PointerType(i64))
    hsum, peak = E.Var("hsum", PointerType(f16)), E.Var("peak", PointerType(i32))
    fpeak, dsum = E.Var("fpeak", PointerType(f32)), E.Var("dsum", PointerType(f64))
    i, v = E.Var("i", i64), E.Var("v", f32)
    b = i % 16

    def atomic(name, buf, value):
        return S.Evaluate(E.Call(name, (buf, b, value), value.dtype))

    body = S.seq(
        S.Declare(i, _global_index()),
        S.If(
            E.binary("lt", i, n),
            S.seq(
                S.Declare(v, E.Load(src, i)),
                atomic("atomic_add", sums, v),
                atomic("atomic_add", counts, E.const(1, i64)),
                atomic("atomic_add", hsum, E.cast(v, f16)),
                atomic("atomic_add", dsum, E.cast(v, f64)),
                atomic("atomic_max", peak, E.cast(v, i32)),
                atomic("atomic_max", fpeak, v),
            ),
        ),
    )
    # A block size given as an expression: no __launch_bounds__.
    threads = E.minimum(n, E.const(64))
    attrs = LaunchAttrs(grid_dim=((n + 63) // 64, 1, 1), block_dim=(threads, 1, 1))
    params = (src, sums, counts, hsum, peak, fpeak, dsum, n)
    return Function("scatter", params, body, attrs=attrs)


def device_call_kernel() -> Function:
    """A kernel calling a device function, with 2-D launch indices and a shared-name clash."""
    a = E.Var("a", f32)
    twice = Function("twice", (a,), S.Return(a * 2.0 + E.call("rsqrt", a)), "device", ret=f32)
    x = E.Var("x", PointerType(f32))
    clash = E.Var("threadIdx", i64)  # a variable must not hide CUDA's threadIdx
    idx = E.cast(_idx("block_idx_y"), i64) * E.cast(_idx("grid_dim_x"), i64) + E.cast(
        _idx("thread_idx_y"), i64
    )
    body = S.seq(
        S.Declare(clash, idx),
        S.If(
            E.binary("lt", clash, n),
            S.Store(x, clash, E.Call("twice", (E.Load(x, clash),), f32)),
        ),
    )
    attrs = LaunchAttrs(grid_dim=(1, n, 1), block_dim=(32, 4, 1))
    return Function("apply_twice", (x, n), body, attrs=attrs), twice


def sample_modules() -> dict[str, Module]:
    """Every sample kernel as its own module, by name."""
    apply, twice = device_call_kernel()
    mods = [
        Module("ew", (elementwise_kernel(),)),
        Module("reduce", (block_reduce_kernel(),)),
        Module("half", (half_kernel(),)),
        Module("atomics", (atomics_kernel(),)),
        Module("device_call", (twice, apply)),
    ]
    return {m.name: m for m in mods}


def _kernel_text(module: Module) -> str:
    """The rendered source after the device header."""
    return render_module(module).split("#endif /* MINICOMP_MMA_H */")[1]


def test_source_starts_with_device_header_and_is_deterministic():
    for module in sample_modules().values():
        src = render_module(module)
        assert src == render_module(module) == CudaRenderer().render_module(module)
        assert src.startswith(f"// minicomp module {module.name}")
        assert src.index("#ifndef MINICOMP_DEVICE_H") < src.index('extern "C" __global__')
        assert codegen.device_header().strip() in src


def test_elementwise_kernel():
    text = _kernel_text(sample_modules()["ew"])
    assert (
        'extern "C" __global__ __launch_bounds__(256) void ew_sigmoid_mul('
        "const float* __restrict__ x, const float* __restrict__ y, float* __restrict__ out, "
        "int64_t n) {"
    ) in text
    assert (
        "int64_t i = (int64_t)(int32_t)blockIdx.x * (int64_t)(int32_t)blockDim.x"
        " + (int64_t)(int32_t)threadIdx.x;"
    ) in text
    assert "out[i] = mc_sigmoid_f32(x[i]) * y[i] + mc_floordiv_f32(x[i], 2.0f);" in text


def test_block_reduction_kernel():
    text = _kernel_text(sample_modules()["reduce"])
    assert "__launch_bounds__(256) void row_sum(" in text
    assert "    alignas(16) __shared__ float partials[8];" in text
    assert "__syncthreads();" in text
    assert text.count("#pragma unroll") == 2
    assert "acc = acc + __shfl_down_sync(0xffffffffu, acc, 16 >> step);" in text
    assert "int32_t tid = (int32_t)threadIdx.x;" in text


def test_half_kernel():
    text = _kernel_text(sample_modules()["half"])
    assert "const uint16_t* __restrict__ h, uint16_t* __restrict__ ob" in text
    assert "ob[i] = mc_f32_to_bf16(expf(mc_f16_to_f32(v)) + 1.0f);" in text
    assert "mc_shfl_xor_u16(v, 1)" in text
    assert "oh[i] = mc_f32_to_f16(mc_f16_to_f32(v) + mc_f16_to_f32(mc_shfl_xor_u16(v, 1)));" in (
        text
    )


def test_atomics_kernel():
    text = _kernel_text(sample_modules()["atomics"])
    assert 'extern "C" __global__ void scatter(' in text  # non-constant block: no bounds
    assert "atomicAdd(&sums[i % 16LL], v);" in text
    wide = "(int64_t)atomicAdd((unsigned long long*)&counts[i % 16LL], (unsigned long long)1LL);"
    assert wide in text
    assert "mc_atomic_add_f16(&hsum[i % 16LL], mc_f16_to_f32(mc_f32_to_f16(v)));" in text
    assert "atomicAdd(&dsum[i % 16LL], (double)v);" in text
    assert "atomicMax(&peak[i % 16LL], (int32_t)v);" in text
    assert "mc_atomic_max_f32(&fpeak[i % 16LL], v);" in text
    # Atomic targets are written: never const.
    assert "int64_t* __restrict__ counts" in text and "const int64_t" not in text


def test_device_function_and_reserved_names():
    text = _kernel_text(sample_modules()["device_call"])
    assert "static __device__ __forceinline__ float twice(float a);" in text
    assert "static __device__ __forceinline__ float twice(float a) {" in text
    assert "return a * 2.0f + mc_rsqrt_f32(a);" in text
    assert "__launch_bounds__(128) void apply_twice(" in text
    assert "int64_t threadIdx_ = (int64_t)(int32_t)blockIdx.y * (int64_t)(int32_t)gridDim.x" in (
        text
    )
    assert "(int64_t)(int32_t)threadIdx.y;" in text


def test_loop_kinds():
    i, x = E.Var("i", i64), E.Var("x", PointerType(f32))
    renderer = CudaRenderer()
    for kind, pragma in (("serial", None), ("parallel", None), ("vectorize", None)):
        loop = S.For(i, n, S.Store(x, i, E.const(0.0, f32)), kind=kind)
        lines = renderer.stmt(loop)
        assert lines[0] == "for (int64_t i = 0; i < n; ++i) {", (kind, lines)
        assert not any(line.startswith("#pragma") for line in lines) or pragma
    unrolled = renderer.stmt(S.For(i, E.const(4), S.Store(x, i, E.const(0.0, f32)), "unroll"))
    assert unrolled[0] == "#pragma unroll"


@pytest.mark.parametrize(
    "dt, expected",
    [
        (f32, "__shfl_down_sync(0xffffffffu, v, 4)"),
        (f64, "__shfl_down_sync(0xffffffffu, v, 4)"),
        (i64, "__shfl_down_sync(0xffffffffu, v, 4)"),
        (bf16, "mc_shfl_down_u16(v, 4)"),
        (boolean, "(bool)__shfl_down_sync(0xffffffffu, (int32_t)v, 4)"),
    ],
)
def test_shuffle_spellings(dt, expected):
    v = E.Var("v", dt)
    assert CudaRenderer().expr(E.Call("shfl_down_sync", (v, E.const(4, i32)), dt)) == expected


def test_refusals():
    r = CudaRenderer()
    buf = E.Var("buf", PointerType(u32))
    with pytest.raises(ValueError, match="atomic_max is not available"):
        dbuf = buf.replace(type=PointerType(f64))
        r.expr(E.Call("atomic_max", (dbuf, n, E.const(1.0, f64)), f64))
    with pytest.raises(ValueError, match="into a"):
        r.expr(E.Call("atomic_add", (buf, n, E.const(1.0, f32)), f32))
    host = Function("h", (), S.Seq(()), kind="host")
    with pytest.raises(ValueError, match="no host functions"):
        render_module(Module("m", (host,)))
    big = Function("k", (), S.Seq(()), attrs=LaunchAttrs(block_dim=(64, 32, 1)))
    with pytest.raises(ValueError, match="1-1024"):
        render_module(Module("m", (big,)))
    with pytest.raises(ValueError, match="C identifier"):
        render_module(Module("m", (Function("atomicAdd", (), S.Seq(())),)))


# ---- a module that calls every helper of device.h (compiled by test_nvrtc.py) ----

_HALF_FREE = [t for t in ALL_TYPES if t not in (f16, bf16)]


def helper_module() -> Module:
    """One kernel per group of helpers, whose rendering calls every helper of device.h that
    the renderer can emit; `helper_names_called` adds the few it never emits."""
    kernels = []
    for dt in _HALF_FREE:
        a, b = E.Var("a", dt), E.Var("b", dt)
        out = E.Var("out", PointerType(dt))
        ops = ["max", "min"] + ([] if dt.is_bool else ["floordiv", "mod"])
        values = [E.Binary(op, a, b) for op in ops]
        if dt.is_integer:
            values += [E.Binary("pow", a, b), E.Call("abs", (a,), dt)]
            values += [E.Binary("div", a, b), E.Call("fmod", (a, b), dt)]
        body = S.seq(*(S.Store(out, E.const(k), v) for k, v in enumerate(values)))
        kernels.append(Function(f"ops_{dt.short}", (a, b, out), body))
        if dt.is_integer:
            # Divisions by loaded values, reporting a zero divisor to the error flag.
            src = E.Var("src", PointerType(dt))
            d = E.Load(src, E.const(0))
            checked = [E.Binary(op, a, d) for op in ("div", "floordiv", "mod")]
            checked.append(E.Call("fmod", (a, d), dt))
            checked.append(E.cast(checked_index(E.cast(d, i64), 7), dt))
            body = S.seq(*(S.Store(out, E.const(k), v) for k, v in enumerate(checked)))
            params = (a, src, out, ERROR_FLAG)
            kernels.append(Function(f"checked_{dt.short}", params, body))
    for dt in (f32, f64):
        args = [E.Var(f"x{k}", dt) for k in range(2)]
        out = E.Var("out", PointerType(dt))
        stores = []
        for k, name in enumerate(sorted(E.MATH_FUNCTIONS)):
            arity = E.MATH_FUNCTIONS[name]
            pred = name in ("isnan", "isinf", "signbit")
            call = E.Call(name, tuple(args[:arity]), boolean if pred else dt)
            stores.append(S.Store(out, E.const(k), E.cast(call, dt)))
        kernels.append(Function(f"math_{dt.short}", (*args, out), S.seq(*stores)))
    for dt in (f16, bf16):
        p, q = E.Var("p", PointerType(dt)), E.Var("q", PointerType(f32))
        v = E.Load(p, E.const(0))
        body = S.seq(
            S.Store(q, E.const(0), E.cast(v, f32)),
            S.Store(p, E.const(1), E.Call("shfl_down_sync", (v, E.const(1, i32)), dt)),
            S.Store(p, E.const(2), E.Call("shfl_xor_sync", (v, E.const(2, i32)), dt)),
            S.Store(p, E.const(3), E.Call("shfl_sync", (v, E.const(0, i32)), dt)),
            S.Evaluate(E.Call("atomic_add", (p, E.const(4), v), dt)),
            S.Store(p, E.const(5), E.cast(E.Load(q, E.const(1)), dt)),
        )
        kernels.append(Function(f"half_{dt.short}", (p, q), body))
    for dt in FLOAT8_TYPES:
        p, q = E.Var("p", PointerType(dt)), E.Var("q", PointerType(f32))
        v = E.Load(p, E.const(0))
        body = S.seq(
            S.Store(q, E.const(0), E.cast(v, f32)),
            S.Store(p, E.const(1), E.Call("shfl_down_sync", (v, E.const(1, i32)), dt)),
            S.Store(p, E.const(2), E.Call("shfl_xor_sync", (v, E.const(2, i32)), dt)),
            S.Store(p, E.const(3), E.Call("shfl_sync", (v, E.const(0, i32)), dt)),
            S.Store(p, E.const(4), E.cast(E.Load(q, E.const(1)), dt)),
        )
        kernels.append(Function(f"float8_{dt.short}", (p, q), body))
    fp = E.Var("fp", PointerType(f32))
    atomic = S.Evaluate(E.Call("atomic_max", (fp, E.const(0), E.Load(fp, E.const(1))), f32))
    kernels.append(Function("atomic_f32", (fp,), atomic))
    # Vector copies of 2, 4, 8, 16 and 32 bytes through a register array.
    for dt, lanes in ((u8, 2), (f16, 2), (f32, 2), (f32, 4), (f32, 8)):
        src, dst = E.Var("src", PointerType(dt)), E.Var("dst", PointerType(dt))
        reg = E.Var("reg", PointerType(dt, "local"))
        count, first = E.const(lanes, i32), E.Load(src, E.const(0))
        aligned = E.Call("is_aligned", (first, E.const(min(16, lanes * dt.nbytes), i32)), boolean)
        copy = S.seq(
            S.Evaluate(E.Call("load_vec", (reg, first, count), i32)),
            S.Evaluate(E.Call("store_vec", (dst, E.const(0), reg, count), i32)),
        )
        body = S.seq(S.DeclareArray(reg, dt, lanes), S.If(aligned, copy))
        kernels.append(Function(f"vector_{lanes * dt.nbytes}", (src, dst), body))
    return Module("helpers", tuple(kernels))


# Helpers the renderer never emits, called by hand after the rendered module.
_EXTRA_CALLS = """
extern "C" __global__ void direct_helpers(float* f, double* d) {
    f[0] = mc_exp_f32(f[1]) + mc_tanh_f32(f[2]) + mc_erf_f32(f[3]) + mc_lgamma_f32(f[4]);
    d[0] = mc_exp_f64(d[1]) + mc_tanh_f64(d[2]) + mc_erf_f64(d[3]) + mc_lgamma_f64(d[4]);
    f[5] = mc_from_bits_f32(mc_bits_f32(f[6]));
    d[5] = mc_digamma_positive(d[6]);
    mc_flag_zero_division(0);
    /* The float8 conversions' parts, and older PyTorch's e4m3fn conversion. */
    f[7] = mc_from_bits_f32(mc_select_u32(1u, mc_f8_round(0u, 3u, 7u), mc_f8_widen(0u, 3u, 7u)));
    f[8] = (float)mc_f32_to_f8e4m3fn_nonsat(f[9]);
}
"""


def helper_source() -> str:
    """The CUDA source calling every helper of device.h."""
    return render_module(helper_module()) + _EXTRA_CALLS


def defined_helpers(header: str) -> set[str]:
    """The mc_* functions and function-like macros device.h defines for NVRTC, macro families
    expanded."""
    macros: dict[str, tuple[list[str], str]] = {}
    text = header.replace("\\\n", " ")
    # The emulator-only branches (#ifndef MC_EMULATE ... #else <these> #endif) are not NVRTC's.
    text = re.sub(r"^#else\n.*?^#endif", "", text, flags=re.MULTILINE | re.DOTALL)
    for m in re.finditer(r"^#define (MC_\w+)\(([^)]*)\)(.*)$", text, re.MULTILINE):
        macros[m[1]] = ([p.strip() for p in m[2].split(",")], m[3])

    def expand(body: str, env: dict[str, str]) -> set[str]:
        names = set()
        for m in re.finditer(r"\b(mc_\w*?)(?:##(\w+))?\s*\(", body):
            names.add(m[1] + env.get(m[2], "") if m[2] else m[1])
        for m in re.finditer(r"\b(MC_\w+)\(([^()]*)\)", body):
            if m[1] in macros:
                params, inner = macros[m[1]]
                values = [env.get(a.strip(), a.strip()) for a in m[2].split(",")]
                names |= expand(inner, dict(zip(params, values)))
        return names

    outside = re.sub(r"^#define .*$", "", text, flags=re.MULTILINE)
    defined = set()
    for m in re.finditer(
        r"^(?:MC_DEVICE|MC_FN|MC_FN_PLAIN) [\w ]+?\b(mc_\w+)\(", outside, re.MULTILINE
    ):
        defined.add(m[1])
    for m in re.finditer(r"^(MC_\w+)\(([^()]*)\)\s*$", outside, re.MULTILINE):
        defined |= expand(f"{m[1]}({m[2]})", {})
    defined |= {m[1] for m in re.finditer(r"^#define (mc_\w+)\(", text, re.MULTILINE)}
    return defined


def test_helper_module_calls_every_helper():
    # mma.h's helpers have their own test (test_cuda_mma.py).
    header = inline_includes(codegen.HEADER_PATH)
    defined = defined_helpers(header)
    # The family macros must have been found and expanded.
    assert {"mc_pow_i8", "mc_floordiv_u64", "mc_max_bool", "mc_mod_f64", "mc_isnan"} <= defined
    assert {"mc_atomic_add_bf16", "mc_shfl_xor_u16", "mc_f32_to_f16"} <= defined
    src = helper_source()
    body = src.split("#endif /* MINICOMP_MMA_H */")[1]
    called = set(re.findall(r"\b(mc_\w+)\(", body))
    # mc_digamma_positive is also called by mc_digamma_f64; calling it directly keeps the
    # check simple.
    assert defined - called == set()
