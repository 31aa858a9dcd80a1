"""Tests of the cpu runtime's own f32 tanh and erf: accuracy, edge values, vectorisation."""

import os
import subprocess

import pytest
import torch
from helpers import build_cpu

from minicomp.backends.cpu import render_module
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function, Module
from minicomp.ir.types import PointerType, f32, f64, i64

i, n = E.Var("i", i64), E.Var("n", i64)
NAMES = ("tanh", "erf")
# Where each function switches from its polynomial to its exp-based branch, and above which
# its float32 value is 1.
SPLITS = {"tanh": (0.875, 9.0110), "erf": (1.0, 3.92)}


def unary_kernel(name: str, dt=f32) -> Function:
    """`out[i] = name(x[i])` over i < n in a `#pragma omp simd` loop."""
    x, out = E.Var("x", PointerType(dt)), E.Var("out", PointerType(dt))
    body = S.For(i, n, S.Store(out, i, E.call(name, E.Load(x, i))), kind="vectorize")
    return Function(f"k_{name}", (x, out, n), body)


@pytest.fixture(scope="module")
def math_mod(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("math-cache"))
    return build_cpu(Module("fast_math", tuple(unary_kernel(nm) for nm in NAMES)), cache_dir=cache)


def apply(mod, name: str, x: torch.Tensor) -> torch.Tensor:
    out = torch.full_like(x, float("nan"))
    mod.kernel(f"k_{name}")(x.data_ptr(), out.data_ptr(), x.numel())
    return out


def ulps(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """|actual - expected| in float32 ulps at `expected` (float64)."""
    info = torch.finfo(torch.float32)
    mag = expected.abs().clamp_min(info.smallest_normal)
    ulp = torch.exp2(torch.floor(torch.log2(mag))) * info.eps
    diff = (actual.double() - expected).abs()
    same = (actual.double() == expected) | (actual.isnan() & expected.isnan())
    return torch.where(same, torch.zeros_like(diff), diff / ulp)


def sweep(name: str, gen: torch.Generator) -> torch.Tensor:
    """About 2M float32 values of both signs: a stride through every positive bit pattern,
    dense runs of consecutive floats around 0 and the branch splits, and random values."""
    split, saturation = SPLITS[name]
    stride = torch.arange(1, 0x7F800000, 2003, dtype=torch.int32).view(torch.float32)
    runs = [
        torch.arange(lo, lo + 100_000, dtype=torch.int32).view(torch.float32)
        for v in (split, saturation, 0.5, 1e-4)
        for lo in [int(torch.tensor(v).view(torch.int32)) - 50_000]
    ]
    near = [torch.linspace(v * 0.9, v * 1.1, 200_000) for v in (split, saturation)]
    uniform = torch.rand(400_000, generator=gen) * 2 * saturation
    x = torch.cat([stride, *runs, *near, uniform, torch.linspace(0, 1, 200_000)])
    signs = torch.randint(0, 2, x.shape, generator=gen) * 2 - 1
    return x * signs


@pytest.mark.parametrize("name", NAMES)
def test_within_two_ulps(math_mod, name):
    gen = torch.Generator().manual_seed(len(name))
    x = sweep(name, gen)
    assert x.numel() > 1_900_000
    out = apply(math_mod, name, x)
    expected = getattr(torch, name)(x.double())
    err = ulps(out, expected)
    worst = int(err.argmax())
    assert err.max() <= 2.0, f"{name}({x[worst].item()!r}) off by {err.max().item():.3f} ulp"
    # Odd, bit for bit.
    assert torch.equal(apply(math_mod, name, -x), -out)


@pytest.mark.parametrize("name", NAMES)
def test_edge_values(math_mod, name):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([0.0, -0.0, inf, -inf, nan, -nan])
    out = apply(math_mod, name, x)
    assert out[:4].tolist() == [0.0, -0.0, 1.0, -1.0]
    assert torch.equal(out[:2].signbit(), torch.tensor([False, True]))
    assert out[4:].isnan().all()
    # Large inputs saturate at exactly +-1, up to the largest float.
    big = torch.logspace(0.0, 38.5, 10_000) * SPLITS[name][1]
    big = torch.cat([big[big.isfinite()], torch.tensor([torch.finfo(torch.float32).max])])
    assert (apply(math_mod, name, big) == 1).all()
    assert (apply(math_mod, name, -big) == -1).all()


@pytest.mark.parametrize("name", NAMES)
def test_tiny_inputs_are_correctly_rounded(math_mod, name):
    # Every 7th subnormal and every 7th float up to 2^-20: tanh(x) is x there, erf(x) is
    # x * 2/sqrt(pi); both must round exactly like the float64 value does.
    top = int(torch.tensor(2.0**-20).view(torch.int32))
    bits = torch.arange(1, top, 7, dtype=torch.int32)
    x = torch.cat([bits.view(torch.float32), -bits.view(torch.float32)])
    out = apply(math_mod, name, x)
    expected = getattr(torch, name)(x.double()).float()
    mismatch = (out != expected).nonzero()
    assert mismatch.numel() == 0, f"{name}({x[mismatch[0]].item()!r}) = {out[mismatch[0]]}"


def test_f64_keeps_libm():
    src = render_module(Module("m64", tuple(unary_kernel(nm, f64) for nm in NAMES)))
    assert "tanh(x[i])" in src and "erf(x[i])" in src
    src32 = render_module(Module("m32", tuple(unary_kernel(nm) for nm in NAMES)))
    assert "mc_tanh_f32(x[i])" in src32 and "mc_erf_f32(x[i])" in src32


def test_tanh_erf_loops_vectorise(tmp_path):
    kernels = tuple(unary_kernel(nm) for nm in NAMES)
    src = render_module(Module("vec_math", kernels))
    path = tmp_path / "vec_math.c"
    path.write_text(src)
    flags = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fopt-info-vec-optimized"]
    proc = subprocess.run(
        ["cc", *flags, "-S", "-o", os.devnull, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    vectorized = {
        int(line.split(":")[1]) for line in proc.stderr.splitlines() if "loop vectorized" in line
    }
    lines = src.splitlines()
    for k in kernels:
        start = next(m for m, line in enumerate(lines) if line.startswith(f"void {k.name}("))
        loop_line = next(m for m in range(start, len(lines)) if "for (" in lines[m]) + 1
        # GCC reports the loop's line or its body's.
        assert {loop_line, loop_line + 1} & vectorized, k.name
