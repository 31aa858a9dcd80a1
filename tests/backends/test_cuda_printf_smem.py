"""Device printf, dynamic shared memory and launch bounds on hand-built kernel IR: the CUDA
text, NVRTC builds for sm_80 and sm_90, runs in the emulator, and the driver's launch path
against the stand-in driver of tests/runtime."""

import ctypes
import os
import subprocess
import sys
import threading

import pytest
import torch

from minicomp.backends.cpu.codegen import render_module as render_c
from minicomp.backends.cuda import driver, emu, nvrtc
from minicomp.backends.cuda import module as cuda_module
from minicomp.backends.cuda.codegen import c_string_literal, render_module
from minicomp.backends.cuda.emu import EmulatorError, build_emulated
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function, LaunchAttrs, Module
from minicomp.ir.printer import expr_str
from minicomp.ir.symbols import launch_dims
from minicomp.ir.types import PointerType, bf16, f16, f32, i8, i32, i64

ARCHS = ("sm_80", "sm_90")
# Quotes, backslashes, a tab, a trigraph, %%, a control byte followed by a digit (an octal
# escape must not swallow it), and UTF-8 text.
TRICKY = 'say "hi" \\ back\\slash\ttab %% ??= ??/ \x01' + "7 caf\u00e9 \u2713 \U0001f600 end\n"


def _tid() -> E.Expr:
    return E.Call("thread_idx_x", (), i32)


def _printf(fmt: str, *values: E.Expr) -> S.Stmt:
    return S.Evaluate(E.Call("printf", (E.StringLiteral(fmt), *values), i32))


def printf_kernel() -> Function:
    """Thread 1 prints an element of each input type, a 64-bit scalar and a bool; thread 0
    prints TRICKY."""
    x, h, b, q = (E.Var(v, PointerType(t)) for v, t in zip("xhbq", (f32, f16, bf16, i8)))
    big = E.Var("big", i64)
    t = E.Var("t", i64)
    fmt = "t=%d x=%.3f h=%g b=%g q=%d big=%lld flag=%d\n"
    values = (_tid(), E.Load(x, t), E.Load(h, t), E.Load(b, t), E.Load(q, t), big)
    body = S.seq(
        S.Declare(t, E.cast(_tid(), i64)),
        S.If(E.eq(t, 1), _printf(fmt, *values, E.eq(t, 1))),
        S.If(E.eq(t, 0), _printf(TRICKY)),
    )
    attrs = LaunchAttrs(grid_dim=(1, 1, 1), block_dim=(4, 1, 1))
    return Function("k_printf", (x, h, b, q, big), body, attrs=attrs)


def dynamic_kernel() -> Function:
    """One block of n threads reverses x (f32, times 2) and y (i32, plus 1) through two
    dynamic shared arrays; the second starts at the first 16-byte boundary after the first,
    and the dynamic memory size is an expression over n."""
    x, y, out = (
        E.Var("x", PointerType(f32)),
        E.Var("y", PointerType(i32)),
        E.Var("out", PointerType(f32)),
    )
    n = E.Var("n", i64)
    a, c = E.Var("a", PointerType(f32, "shared")), E.Var("c", PointerType(i32, "shared"))
    t, off = E.Var("t", i64), E.Var("off", i64)
    rev = n - 1 - t
    sync = S.Evaluate(E.Call("syncthreads", (), i32))
    body = S.seq(
        S.DeclareArray(a, f32, 1024, "dynamic"),
        S.DeclareArray(c, i32, 2048, "dynamic"),
        S.Declare(t, E.cast(_tid(), i64)),
        S.Declare(off, (n + 3) // 4 * 4),
        S.Store(a, t, E.Load(x, t) * E.const(2.0, f32)),
        S.Store(c, off + t, E.Load(y, t) + E.const(1, i32)),
        sync,
        S.Store(out, t, E.Load(a, rev) + E.cast(E.Load(c, off + rev), f32)),
    )
    smem = (n * 4 + 15) // 16 * 16 + n * 4
    attrs = LaunchAttrs(grid_dim=(1, 1, 1), block_dim=(n, 1, 1), dynamic_smem=smem)
    return Function("k_dynamic", (x, y, out, n), body, attrs=attrs)


BIG = 200 * 1024  # over the 48 KiB a kernel gets without opting in
BIG_FLOATS = BIG // 4


def big_dynamic_kernel(sync: bool) -> Function:
    """Each block of 256 threads fills 200 KiB of dynamic shared memory with values of its own,
    then every thread reads one back (through a barrier, or its own slots when `sync` is
    false, which runs the threads as a plain loop in the emulator)."""
    x, out = E.Var("x", PointerType(f32)), E.Var("out", PointerType(f32))
    buf = E.Var("buf", PointerType(f32, "shared"))
    t, k = E.Var("t", i64), E.Var("k", i64)
    block = E.cast(E.Call("block_idx_x", (), i32), i64)
    slot = k * 256 + t
    fill = S.Store(buf, slot, E.Load(x, block) * E.cast(slot, f32))
    read = (t * 37 + block) % BIG_FLOATS if sync else ((t + block) % (BIG_FLOATS // 256)) * 256 + t
    stmts = [
        S.DeclareArray(buf, f32, BIG_FLOATS, "dynamic"),
        S.Declare(t, E.cast(_tid(), i64)),
        S.For(k, E.const(BIG_FLOATS // 256, i64), fill),
    ]
    if sync:
        stmts.append(S.Evaluate(E.Call("syncthreads", (), i32)))
    stmts.append(S.Store(out, block * 256 + t, E.Load(buf, read)))
    attrs = LaunchAttrs(grid_dim=(8, 1, 1), block_dim=(256, 1, 1), dynamic_smem=BIG)
    name = "k_big_sync" if sync else "k_big_plain"
    return Function(name, (x, out), S.seq(*stmts), attrs=attrs)


def _bounded(block, bound, name="k_bounded") -> Function:
    out = E.Var("out", PointerType(f32))
    body = S.Store(out, E.cast(_tid(), i64), E.const(1.0, f32))
    attrs = LaunchAttrs(grid_dim=(1, 1, 1), block_dim=block, launch_bounds=bound)
    n = E.Var("n", i64)
    return Function(name, (out, n), body, attrs=attrs)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("printf_smem"))


# ---- rendering ----


@pytest.mark.parametrize(
    "text, literal",
    [
        ("plain %d\n", '"plain %d\\n"'),
        ('a "quoted" \\ word', '"a \\"quoted\\" \\\\ word"'),
        ("tab\there\r", '"tab\\there\\r"'),
        ("??=", '"\\?\\?="'),
        ("\x01" + "7", '"\\0017"'),
        ("\x00", '"\\000"'),
        ("caf\u00e9", '"caf\\303\\251"'),
        ("\x7f", '"\\177"'),
    ],
)
def test_c_string_literal(text, literal):
    assert c_string_literal(text) == literal


def test_printf_renders_escaped_and_converts_narrow_values():
    src = render_module(Module("m", (printf_kernel(),)))
    line = next(t.strip() for t in src.splitlines() if 'printf("t=' in t)
    assert line.startswith('printf("t=%d x=%.3f h=%g b=%g q=%d big=%lld flag=%d\\n", ')
    # f16/bf16 bit patterns print as floats, i8 and bool as ints.
    assert "mc_f16_to_f32(h[t])" in line and "mc_bf16_to_f32(b[t])" in line
    assert "(int32_t)q[t]" in line and "(int32_t)(t == 1LL)" in line
    assert c_string_literal(TRICKY) in src


def test_string_literal_node():
    s = E.StringLiteral('x "%d"\n')
    assert s == E.StringLiteral('x "%d"\n') and s != E.StringLiteral("x")
    assert s.type == PointerType(i8, "constant")
    with pytest.raises(TypeError, match="string literal"):
        s.dtype  # noqa: B018
    assert expr_str(E.Call("printf", (s, E.const(1, i32)), i32)) == "printf('x \"%d\"\\n', i32(1))"


def test_cpu_backend_refuses_printf():
    body = _printf("hi\n")
    f = Function("say", (), body, kind="host")
    with pytest.raises(ValueError, match="printf"):
        render_c(Module("m", (f,)))


def test_dynamic_arrays_are_pointers_into_the_dynamic_shared_memory():
    src = render_module(Module("m", (dynamic_kernel(),)))
    # 1024-byte aligned: a wgmma operand with a 128-byte swizzle may start there.
    assert "extern __shared__ __align__(1024) unsigned char mc_dynamic_smem[];" in src
    assert "float* a = (float*)mc_dynamic_smem;" in src
    assert "int32_t* c = (int32_t*)mc_dynamic_smem;" in src
    assert src.count("mc_dynamic_smem[]") == 1


def test_launch_bounds():
    n = E.Var("n", i64)
    text = render_module(Module("m", (_bounded((256, 1, 1), 512),)))
    assert "__global__ __launch_bounds__(512) void k_bounded(" in text
    text = render_module(Module("m", (_bounded((n, 1, 1), 128),)))
    assert "__global__ __launch_bounds__(128) void k_bounded(" in text
    text = render_module(Module("m", (_bounded((n, 1, 1), None),)))
    assert "__launch_bounds__" not in text.split("k_bounded(")[0].splitlines()[-1]
    text = render_module(Module("m", (_bounded((64, 2, 1), None),)))
    assert "__global__ __launch_bounds__(128) void k_bounded(" in text
    with pytest.raises(ValueError, match="kernel k_bounded has 256 threads.*launch bounds 128"):
        render_module(Module("m", (_bounded((256, 1, 1), 128),)))
    with pytest.raises(ValueError, match="kernel k_bounded has launch bounds 2000"):
        render_module(Module("m", (_bounded((n, 1, 1), 2000),)))


# ---- NVRTC ----


def _kernels():
    return [printf_kernel(), dynamic_kernel(), big_dynamic_kernel(True), _bounded((256, 1, 1), 512)]


@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_with_nvrtc(arch, tmp_path):
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    kernels = _kernels()
    binary = nvrtc.compile_cuda(
        render_module(Module("m", tuple(kernels))), arch=arch, name="m", cache_dir=str(tmp_path)
    )
    for k in kernels:
        usage = binary.resources[k.name]
        # Dynamic shared memory is not static: ptxas reports none.
        assert usage.shared_bytes == 0 and usage.spill_stores == 0, (k.name, usage)


# ---- the emulator ----


def _emulated(kernels, cache_dir):
    return build_emulated(render_module(Module("m", tuple(kernels))), kernels, cache_dir=cache_dir)


def test_printf_in_the_emulator(cache_dir, capfd):
    m = _emulated([printf_kernel()], cache_dir)
    x = torch.randn(4)
    h, b = torch.randn(4).half(), torch.randn(4).bfloat16()
    q = torch.randint(-128, 128, (4,), dtype=torch.int8)
    big = -(2**40) - 3
    print("before", flush=True)
    m.launch("k_printf", 1, 4, [x, h, b, q, big])
    print("after", flush=True)
    out = capfd.readouterr().out
    line = (
        f"t=1 x={x[1].item():.3f} h={h[1].item():g} b={b[1].item():g} q={q[1].item()} "
        f"big={big} flag=1\n"
    )
    assert out in (
        f"before\n{line}{TRICKY.replace('%%', '%')}after\n",
        f"before\n{TRICKY.replace('%%', '%')}{line}after\n",
    )


def test_dynamic_shared_memory_in_the_emulator(cache_dir):
    f = dynamic_kernel()
    m = _emulated([f], cache_dir)
    shared = cuda_module.dynamic_shared_bytes(f)
    dims = launch_dims(f)
    for n in (1, 5, 96, 1024):
        x, y = torch.randn(n), torch.randint(-1000, 1000, (n,), dtype=torch.int32)
        out = torch.full((n,), float("nan"))
        args = [x, y, out, n]
        grid, block = dims(args)
        assert shared(args) == -(-4 * n // 16) * 16 + 4 * n
        m.launch(f.name, grid, block, args, shared_bytes=shared(args))
        assert torch.equal(out, (x * 2 + (y + 1).float()).flip(0))


@pytest.mark.parametrize("sync", [True, False], ids=["fibers", "plain"])
def test_large_dynamic_shared_memory_per_block(cache_dir, sync):
    f = big_dynamic_kernel(sync)
    m = _emulated([f], cache_dir)
    x = torch.randn(8)
    out = torch.full((8 * 256,), float("nan"))
    m.launch(f.name, 8, 256, [x, out], shared_bytes=BIG)
    block = torch.arange(8).repeat_interleave(256)
    t = torch.arange(256).repeat(8)
    slot = (t * 37 + block) % BIG_FLOATS if sync else ((t + block) % (BIG_FLOATS // 256)) * 256 + t
    torch.testing.assert_close(out, x[block] * slot.float(), rtol=0, atol=0)


def test_emulator_refuses_too_much_dynamic_shared_memory(cache_dir):
    f = big_dynamic_kernel(False)
    m = _emulated([f], cache_dir)
    x, out = torch.randn(8), torch.zeros(8 * 256)
    too_much = emu.MAX_DYNAMIC_SHARED + 16
    with pytest.raises(EmulatorError, match=f"kernel {f.name}: {too_much} bytes"):
        m.launch(f.name, 8, 256, [x, out], shared_bytes=too_much)
    with pytest.raises(EmulatorError, match=f"kernel {f.name}: -1 bytes"):
        m.launch(f.name, 8, 256, [x, out], shared_bytes=-1)


_ASAN_SCRIPT = """
import sys, torch
from minicomp.backends.cuda.emu import build_emulated, EmulatorError
source = r\"\"\"
extern "C" __global__ void k_past(float* out, long long n) {
    float* buf = (float*)mc_dynamic_smem;
    buf[threadIdx.x] = 1.0f;
    out[threadIdx.x] = buf[threadIdx.x] + (float)n;
}
\"\"\"
m = build_emulated(source, [("k_past", "float*, long long")], cache_dir=sys.argv[1], asan=True)
out = torch.zeros(64)
m.launch("k_past", 1, 64, [out, 1], shared_bytes=256)
print("in bounds ok", out.sum().item(), flush=True)
try:
    m.launch("k_past", 1, 64, [out, 1], shared_bytes=128)  # 32 floats for 64 threads
except EmulatorError as e:
    print("caught:", e)
"""


def test_asan_sees_dynamic_shared_memory_overruns(cache_dir):
    if emu.asan_runtime() is None:
        pytest.skip("the C++ compiler has no libasan")
    proc = subprocess.run(
        [sys.executable, "-c", _ASAN_SCRIPT, cache_dir],
        env=emu.asan_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "in bounds ok 128.0" in proc.stdout, proc.stderr[-3000:]
    assert "caught: kernel 'k_past'" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "heap-buffer-overflow" in proc.stdout


# ---- the driver's launch path, against the stand-in driver ----

FAKE_SOURCE = os.path.join(os.path.dirname(__file__), "..", "runtime", "fake_libcuda.c")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    path = str(tmp_path / "libfakecuda.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", path, FAKE_SOURCE], check=True)
    lib = driver.load_driver(path)
    monkeypatch.setattr(driver, "libcuda", lambda: lib)
    monkeypatch.setattr(driver, "_retained", {})
    monkeypatch.setattr(driver, "_optin", {})
    monkeypatch.setattr(driver, "_thread", threading.local())
    monkeypatch.setattr(driver.torch.cuda, "init", lambda: None)
    monkeypatch.setattr(driver, "_stream_reader", lambda: lambda index: 0x5000)
    probe = ctypes.CDLL(path)
    probe.fake_dim.restype = ctypes.c_uint
    return probe


def test_driver_launch_passes_the_dynamic_shared_memory(fake, tmp_path):
    pytest.importorskip("cuda.bindings.nvrtc")
    small, big = dynamic_kernel(), big_dynamic_kernel(True)
    too_big = big.replace(
        name="k_too_big",
        attrs=big.attrs.replace(dynamic_smem=driver.MAX_DYNAMIC_SHARED + 1),
    )
    built = cuda_module.build(
        Module("m", (small, big, too_big)), device_index=0, cache_dir=str(tmp_path), arch="sm_90"
    )
    launch = built.kernel(small.name, launch_dims(small))
    for n in (10, 300):
        launch(0x1000, 0x2000, 0x3000, n)
        assert fake.fake_dim(3) == n and fake.fake_dim(6) == -(-4 * n // 16) * 16 + 4 * n
    built.kernel(big.name, launch_dims(big))(0x1000, 0x2000)
    assert fake.fake_dim(6) == BIG
    with pytest.raises(
        driver.CudaDriverError,
        match=f"kernel k_too_big needs {driver.MAX_DYNAMIC_SHARED + 1} bytes",
    ):
        built.kernel("k_too_big", launch_dims(too_big))
