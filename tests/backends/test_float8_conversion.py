"""The float8 conversions of common.h, rendered from kernel IR casts, on the cpu target (C,
vectorised) and in the CUDA emulator, bit for bit against PyTorch's `.to(torch.float8_*)`:
every float8 pattern widened, and float32 values at every rounding boundary narrowed; the
CUDA source compiles with NVRTC for sm_80, sm_89 and sm_90 without spills."""

import numpy as np
import pytest
import torch
from helpers import build_cpu
from helpers_float8 import all_patterns, bits, boundary_floats, float8_params

from minicomp.backends import c_like
from minicomp.backends.cuda import emu
from minicomp.backends.cuda import render_module as render_cuda
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.float8 import to_float8_bits
from minicomp.ir.func import Function, LaunchAttrs, Module
from minicomp.ir.types import (
    FLOAT8_TYPES,
    PointerType,
    bf16,
    f8e4m3fn,
    f16,
    f32,
    f64,
    from_torch,
    i32,
    i64,
)

TARGETS = ("cpu", "cuda-emu")
BLOCK = 256
n = E.Var("n", i64)
i = E.Var("i", i64)
WIDE = (f32, f64, f16, bf16)


def _cast_kernel(target: str, src, dst) -> Function:
    """out[i] = (dst) x[i] for i < n: a vectorised loop (cpu) or one thread an element."""
    x, out = E.Var("x", PointerType(src)), E.Var("out", PointerType(dst))
    store = S.Store(out, i, E.cast(E.Load(x, i), dst))
    name = f"cast_{src.short}_to_{dst.short}"
    if target == "cpu":
        return Function(name, (x, out, n), S.For(i, n, store, kind="vectorize"))
    block, thread = (E.cast(E.Call(v, (), i32), i64) for v in ("block_idx_x", "thread_idx_x"))
    body = S.seq(S.Declare(i, block * BLOCK + thread), S.If(E.binary("lt", i, n), store))
    attrs = LaunchAttrs(grid_dim=((n + BLOCK - 1) // BLOCK, 1, 1), block_dim=(BLOCK, 1, 1))
    return Function(name, (x, out, n), body, attrs=attrs)


def _module(target: str) -> Module:
    """Every conversion to and from each float8 type: from and to f32, f64, f16 and bf16, and
    to each other float8 type."""
    pairs = [(w, f8) for f8 in FLOAT8_TYPES for w in WIDE]
    pairs += [(f8, w) for f8 in FLOAT8_TYPES for w in WIDE]
    pairs += [(a, b) for a in FLOAT8_TYPES for b in FLOAT8_TYPES if a != b]
    return Module("float8", tuple(_cast_kernel(target, a, b) for a, b in pairs))


class _Runner:
    """Runs a cast kernel of one target on a 1-D tensor."""

    def __init__(self, target: str, cache_dir: str):
        self.target = target
        module = _module(target)
        if target == "cpu":
            self.built = build_cpu(module, cache_dir=cache_dir)
        else:
            self.source = render_cuda(module)
            self.built = emu.build_emulated(self.source, module.functions, cache_dir=cache_dir)

    def __call__(self, x: torch.Tensor, dst: torch.dtype) -> torch.Tensor:
        src = from_torch(x.dtype)
        name = f"cast_{src.short}_to_{from_torch(dst).short}"
        # Poisoned, so that an unwritten element shows.
        out = torch.full((x.numel() * dst.itemsize,), 0x5A, dtype=torch.uint8).view(dst)
        if self.target == "cpu":
            self.built.kernel(name)(x.data_ptr(), out.data_ptr(), x.numel())
        else:
            self.built.launch(name, (x.numel() + BLOCK - 1) // BLOCK, BLOCK, [x, out, x.numel()])
        return out


@pytest.fixture(scope="module", params=TARGETS)
def convert(request, tmp_path_factory):
    return _Runner(request.param, str(tmp_path_factory.mktemp("float8")))


@pytest.mark.parametrize("dt", float8_params())
def test_every_float8_pattern_widens_like_pytorch(convert, dt):
    q = all_patterns(dt)
    got = convert(q, torch.float32)
    assert torch.equal(bits(got), bits(q.float()))  # NaNs bit for bit too
    got64 = convert(q, torch.float64)
    assert torch.equal(bits(got64), bits(q.double()))


@pytest.mark.parametrize("dt", float8_params())
def test_float32_narrows_like_pytorch_at_every_boundary(convert, dt):
    x = boundary_floats(dt)
    got = convert(x, dt)
    expected = x.to(dt)
    mismatch = bits(got) != bits(expected)
    assert not mismatch.any(), (
        f"{int(mismatch.sum())} of {x.numel()} differ, first "
        f"{x[mismatch][:4].tolist()}: {bits(got)[mismatch][:4].tolist()} != "
        f"{bits(expected)[mismatch][:4].tolist()}"
    )


@pytest.mark.parametrize("dt", float8_params())
@pytest.mark.parametrize("wide", [torch.float64, torch.float16, torch.bfloat16])
def test_other_floats_narrow_like_pytorch(convert, dt, wide):
    """float64 rounds to float32 first (twice, as PyTorch does); the halves widen exactly."""
    x = boundary_floats(dt).to(wide)
    if wide == torch.float64:  # doubles between the float32 values
        x = torch.cat([x, x + x.abs() * 2.0**-30, x - x.abs() * 2.0**-40])
    assert torch.equal(bits(convert(x, dt)), bits(x.to(dt)))


@pytest.mark.parametrize("dt", float8_params())
@pytest.mark.parametrize("other", [*float8_params(), torch.float16, torch.bfloat16])
def test_float8_converts_to_halves_and_other_float8_like_pytorch(convert, dt, other):
    if other == dt:
        pytest.skip("no conversion")
    q = all_patterns(dt)
    got, expected = convert(q, other), q.to(other)
    # PyTorch has no one 16-bit NaN (its vectorised and scalar conversions differ): a NaN
    # only needs to be a NaN there.
    nan = expected.float().isnan()
    assert torch.equal(got.float().isnan(), nan)
    assert torch.equal(bits(got)[~nan], bits(expected)[~nan])
    if other.itemsize == 1:
        assert torch.equal(bits(got), bits(expected))


def test_older_pytorch_e4m3fn_overflow_is_nan(monkeypatch, tmp_path):
    """PyTorch before 2.12 gives NaN where newer ones saturate at 448: with the installed
    PyTorch taken for an older one, the cpu kernel follows the numpy reference's NaN."""
    monkeypatch.setattr(c_like, "e4m3fn_saturates", lambda: False)
    kernel = _cast_kernel("cpu", f32, f8e4m3fn)
    module = build_cpu(Module("nonsat", (kernel,)), cache_dir=str(tmp_path))
    assert "mc_f32_to_f8e4m3fn_nonsat" in module.source
    x = boundary_floats(torch.float8_e4m3fn)
    out = torch.zeros(x.numel(), dtype=torch.uint8)
    module.kernel(kernel.name)(x.data_ptr(), out.data_ptr(), x.numel())
    expected = to_float8_bits(x.numpy(), f8e4m3fn, saturate=False)
    assert np.array_equal(out.numpy(), expected)
    assert np.all(expected[np.abs(x.numpy()) >= 480] & 0x7F == 0x7F)  # NaN, sign kept


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
def test_conversions_compile_with_nvrtc_without_spills(arch, tmp_path):
    from minicomp.backends.cuda import nvrtc

    source = render_cuda(_module("cuda-emu"))
    try:
        binary = nvrtc.compile_cuda(source, arch=arch, cache_dir=str(tmp_path))
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    assert len(binary.resources) == len(_module("cuda-emu").functions)
    for kernel, res in binary.resources.items():
        assert res.spill_stores == res.spill_loads == res.stack_bytes == 0, (kernel, res)
