"""Tests of the cpu runtime's own f32 exp-based tanh and erf, sin, cos, log, pow and gelu:
accuracy, edge values, vectorisation, and a compiled PyTorch function using them. sin, cos and
erf also have near versions (runtime.h), which a vector loop runs where it can run again with
the exact ones: both are tested, the exact ones through kernels that cannot run twice."""

import itertools
import math
import os
import shlex
import subprocess

import pytest
import torch
from helpers import assert_same, build_cpu, compile_minicomp

from minicomp import config
from minicomp.backends.cpu import render_module
from minicomp.dynamo.backend import recording
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function, Module
from minicomp.ir.types import PointerType, f32, f64, i64

i, n = E.Var("i", i64), E.Var("n", i64)
NAMES = ("tanh", "erf")
TRIG = ("sin", "cos")
# Every function the runtime computes itself in float32 instead of calling libm.
FAST = (*NAMES, *TRIG, "log", "pow", "gelu")
# Those with near versions, and where they stop: above 2^18 for sin and cos, below 2^-100 (but
# not 0) for erf.
NEAR = ("sin", "cos", "erf")
TRIG_NEAR = 2.0**18
ERF_NEAR = 2.0**-100
# Where each function switches from its polynomial to its exp-based branch, and above which
# its float32 value is 1.
SPLITS = {"tanh": (0.875, 9.0110), "erf": (1.0, 3.92)}


def compiler_has_fma() -> bool:
    """Whether the cpu target's compiler and flags give a hardware fused multiply-add, without
    which the runtime's near versions are the exact ones."""
    cmd = [config.get("cc"), *shlex.split(config.get("cflags")), "-dM", "-E", "-x", "c", "-"]
    macros = subprocess.run(cmd, input="", capture_output=True, text=True, check=True).stdout
    return "__FMA__" in macros or "__FP_FAST_FMAF" in macros


needs_fma = pytest.mark.skipif(not compiler_has_fma(), reason="no near versions without FMA")


def unary_kernel(name: str, dt=f32) -> Function:
    """`out[i] = name(x[i])` over i < n in a `#pragma omp simd` loop."""
    x, out = E.Var("x", PointerType(dt)), E.Var("out", PointerType(dt))
    body = S.For(i, n, S.Store(out, i, E.call(name, E.Load(x, i))), kind="vectorize")
    return Function(f"k_{name}", (x, out, n), body)


def pow_kernel(dt=f32) -> Function:
    """`out[i] = x[i] ** y[i]` (the IR's binary pow) in a `#pragma omp simd` loop."""
    x, y, out = (E.Var(v, PointerType(dt)) for v in ("x", "y", "out"))
    value = E.binary("pow", E.Load(x, i), E.Load(y, i))
    return Function("k_pow", (x, y, out, n), S.For(i, n, S.Store(out, i, value), kind="vectorize"))


def fast_kernels(dt=f32) -> tuple[Function, ...]:
    return (*(unary_kernel(nm, dt) for nm in FAST if nm != "pow"), pow_kernel(dt))


def in_place_kernel(name: str) -> Function:
    """`x[i] = name(x[i])`: a loop that reads what it writes cannot run twice, so it calls the
    exact versions only."""
    x = E.Var("x", PointerType(f32))
    body = S.For(i, n, S.Store(x, i, E.call(name, E.Load(x, i))), kind="vectorize")
    return Function(f"k_{name}_exact", (x, n), body)


@pytest.fixture(scope="module")
def math_mod(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("math-cache"))
    exact = tuple(in_place_kernel(nm) for nm in NEAR)
    return build_cpu(Module("fast_math", fast_kernels() + exact), cache_dir=cache)


def apply(mod, name: str, x: torch.Tensor) -> torch.Tensor:
    """name(x) by a vector loop: near versions where every element allows them."""
    out = torch.full_like(x, float("nan"))
    mod.kernel(f"k_{name}")(x.data_ptr(), out.data_ptr(), x.numel())
    return out


def apply_exact(mod, name: str, x: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    mod.kernel(f"k_{name}_exact")(out.data_ptr(), out.numel())
    return out


def apply_pow(mod, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x, y = torch.broadcast_tensors(x, y)
    x, y = x.contiguous(), y.contiguous()
    out = torch.full_like(x, float("nan"))
    mod.kernel("k_pow")(x.data_ptr(), y.data_ptr(), out.data_ptr(), x.numel())
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
    # With tiny values among them, erf's loop runs again with the exact version: this tests it.
    assert x.numel() > 1_900_000 and ((x != 0) & (x.abs() < ERF_NEAR)).any()
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
    src = render_module(Module("m64", fast_kernels(f64)))
    for name in FAST:
        # gelu's float64 is the shared header's x/2 (1 + erf(x/sqrt 2)), with libm's erf.
        call = {"pow": "pow(x[i], y[i])", "gelu": "mc_gelu_f64(x[i])"}.get(name, f"{name}(x[i])")
        assert f"= {call};" in src, name
    src32 = render_module(Module("m32", fast_kernels()))
    for name in FAST:
        args = "x[i], y[i]" if name == "pow" else "x[i]"
        assert f"= mc_{name}_f32({args});" in src32, name


def gcc_vectorised(tmp_path, src: str) -> list[bool]:
    """For each `#pragma omp simd` loop of `src`, whether GCC reports it vectorised."""
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
    # The `for` is on the line after the pragma (1-based: index + 2); GCC reports the loop's
    # line or its body's.
    lines = src.splitlines()
    loops = [k + 2 for k, line in enumerate(lines) if line.lstrip().startswith("#pragma omp simd")]
    return [bool({k, k + 1} & vectorized) for k in loops]


def test_fast_math_loops_vectorise(tmp_path):
    # Fails if any of them goes back to libm (a call GCC does not vectorise) or stops being
    # branch-free; sin, cos and erf have two loops each (near versions, then exact ones).
    kernels = fast_kernels()
    done = gcc_vectorised(tmp_path, render_module(Module("vec_math", kernels)))
    assert len(done) == len(kernels) + len(NEAR) and all(done), done


# sin, cos, log, pow ---------------------------------------------------------------------------


def float_runs(centres, width: int) -> list[torch.Tensor]:
    """`2 width` consecutive floats around each (positive) centre."""
    return [
        torch.arange(lo, lo + 2 * width, dtype=torch.int32).view(torch.float32)
        for c in centres
        for lo in [int(torch.tensor(c, dtype=torch.float32).view(torch.int32)) - width]
    ]


def assert_within(label: str, x: torch.Tensor, out: torch.Tensor, err: torch.Tensor, bound=2.0):
    worst = int(err.argmax())
    assert err.max() <= bound, (
        f"{label}({x[worst].item()!r}) = {out[worst].item()!r}, off by {err.max().item():.3f} ulp"
    )


# Floats whose reduced argument is smallest relative to them (by an exhaustive search): the
# least, at 16367173 * 2^72, is 2^-29.9 quarter turns from a multiple of pi/2.
HARD_REDUCTIONS = (16367173 * 2.0**72, 10741887 * 2.0**11, 16573937 * 2.0**-16)


def trig_sweep(gen: torch.Generator) -> torch.Tensor:
    """About 2.5M floats of both signs: a stride through every positive bit pattern (up to the
    largest float), runs around the hardest reductions and around multiples of pi/4, random
    values up to 1e4 and up to 2^127."""
    stride = torch.arange(1, 0x7F800000, 2003, dtype=torch.int32).view(torch.float32)
    hard = float_runs(HARD_REDUCTIONS, 20_000)
    eighths = float_runs([k * math.pi / 4 for k in range(1, 64)], 2_000)
    uniform = torch.rand(600_000, generator=gen) * 1e4
    big = torch.exp2(torch.rand(200_000, generator=gen) * 127)
    x = torch.cat([stride, *hard, *eighths, uniform, big, torch.linspace(0, 10, 200_000)])
    signs = torch.randint(0, 2, x.shape, generator=gen) * 2 - 1
    return x * signs


@pytest.mark.parametrize("name", TRIG)
def test_sin_cos_within_two_ulps(math_mod, name):
    x = trig_sweep(torch.Generator().manual_seed(3))
    # With values beyond 2^18 among them, the loop runs again with the exact versions.
    assert x.numel() > 2_000_000 and x.abs().max() > 1e38
    out = apply(math_mod, name, x)
    assert_within(name, x, out, ulps(out, getattr(torch, name)(x.double())))
    # sin is odd, cos even, bit for bit.
    mirrored = apply(math_mod, name, -x)
    assert torch.equal(mirrored, -out if name == "sin" else out)


def test_sin_cos_edge_values(math_mod):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([0.0, -0.0, inf, -inf, nan])
    sin, cos = apply(math_mod, "sin", x), apply(math_mod, "cos", x)
    assert sin[:2].tolist() == [0.0, -0.0] and cos[:2].tolist() == [1.0, 1.0]
    assert torch.equal(sin[:2].signbit(), torch.tensor([False, True]))
    assert sin[2:].isnan().all() and cos[2:].isnan().all()
    # Below 2^-12, sin(x) rounds to x and cos(x) to 1: every 7th float there, subnormals too.
    top = int(torch.tensor(2.0**-12).view(torch.int32))
    tiny = torch.arange(0, top, 7, dtype=torch.int32).view(torch.float32)
    tiny = torch.cat([tiny, -tiny])
    assert torch.equal(apply(math_mod, "sin", tiny).view(torch.int32), tiny.view(torch.int32))
    assert (apply(math_mod, "cos", tiny) == 1).all()


# The near versions --------------------------------------------------------------------------


def near_trig_sweep(gen: torch.Generator) -> torch.Tensor:
    """About 2M floats of both signs up to 2^18: a stride through the bit patterns, runs around
    the hardest reduction below 2^18 and around multiples of pi/4 (small and near 2^18), random
    values, and 2^18 itself."""
    top = int(torch.tensor(TRIG_NEAR).view(torch.int32))
    stride = torch.arange(1, top, 1009, dtype=torch.int32).view(torch.float32)
    quarters = [k * math.pi / 4 for k in (*range(1, 64), 333_333, 333_334)]
    runs = float_runs([HARD_REDUCTIONS[2], *quarters], 2_000)
    uniform = torch.rand(300_000, generator=gen) * TRIG_NEAR
    x = torch.cat([stride, *runs, uniform, torch.tensor([TRIG_NEAR])])
    signs = torch.randint(0, 2, x.shape, generator=gen) * 2 - 1
    return x * signs


@needs_fma
@pytest.mark.parametrize("name", TRIG)
def test_near_sin_cos_within_bound(math_mod, name):
    x = near_trig_sweep(torch.Generator().manual_seed(6))
    assert x.numel() > 1_400_000 and x.abs().max() == TRIG_NEAR
    out = apply(math_mod, name, x)
    # The near versions ran: the exact ones round some results differently.
    assert not torch.equal(out, apply_exact(math_mod, name, x))
    # An exhaustive test over the floats up to 2^18 finds 1.54 ulp (the exact versions' 0.99).
    assert_within(name, x, out, ulps(out, getattr(torch, name)(x.double())), bound=1.6)
    mirrored = apply(math_mod, name, -x)
    assert torch.equal(mirrored, -out if name == "sin" else out)


@needs_fma
def test_near_erf_within_bound(math_mod):
    gen = torch.Generator().manual_seed(7)
    x = sweep("erf", gen)
    x = x[(x == 0) | (x.abs() >= ERF_NEAR)]
    out = apply(math_mod, "erf", x)
    assert not torch.equal(out, apply_exact(math_mod, "erf", x))
    # The exact version's bound is 1.11 ulp, the near one's 1.29 (the fma formula below 1).
    assert_within("erf", x, out, ulps(out, torch.erf(x.double())), bound=1.4)
    assert torch.equal(apply(math_mod, "erf", -x), -out)
    # From 2^-100 up, a * 2/sqrt(pi) is still correctly rounded: every 101st float to 2^-20.
    lo, hi = (int(torch.tensor(v).view(torch.int32)) for v in (ERF_NEAR, 2.0**-20))
    tiny = torch.arange(lo, hi, 101, dtype=torch.int32).view(torch.float32)
    out = apply(math_mod, "erf", tiny)
    expected = torch.erf(tiny.double()).float()
    assert torch.equal(out, expected), f"misrounded: {tiny[out != expected][:5].tolist()}"


@pytest.mark.parametrize("name", NEAR)
def test_one_far_argument_runs_the_loop_again_exactly(math_mod, name):
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(8)) * 3
    for far in (1e30, float("inf"), -3e5) if name != "erf" else (1e-35, -(2.0**-149)):
        y = x.clone()
        y[4321] = far
        out = apply(math_mod, name, y).view(torch.int32)
        # Bit for bit the exact versions' results, the far argument's included.
        assert torch.equal(out, apply_exact(math_mod, name, y).view(torch.int32)), far
    assert apply(math_mod, name, torch.tensor([float("nan")])).isnan().all()


def test_far_argument_in_a_reduction_restores_the_accumulator():
    # The loop adds into an OpenMP reduction: running it again starts from the saved value.
    def fn(x):
        return (torch.sin(x) + torch.erf(x)).sum()

    compiled = compile_minicomp(fn, "cpu")
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(9))
    for far in (None, 1e30, 1e-35):
        y = x.clone()
        if far is not None:
            y[17] = far
        expected = (torch.sin(y.double()) + torch.erf(y.double())).sum().float()
        assert_same(compiled(y), expected, rtol=1e-5, atol=1e-3)


def test_fused_chain_vectorises(tmp_path):
    # The benchmark's chain (sin cos, log, erf, pow in one loop), as the cpu target builds it:
    # the near loop and the exact one both vectorise (a scalar call or a branch would stop it).
    def chain(x):
        return torch.sin(x) * torch.cos(x) + torch.log(x.abs() + 1.0) + torch.erf(x)

    records: list = []
    with recording(records):
        compile_minicomp(chain, "cpu")(torch.randn(100_000))
    (src,) = [r.source for r in records if r.source]
    assert "mc_sin_near_f32" in src and "mc_erf_f32" in src
    assert gcc_vectorised(tmp_path, src) == [True, True]


def test_log_within_two_ulps(math_mod):
    gen = torch.Generator().manual_seed(4)
    # Every 1009th positive float (subnormals to the largest), runs around 1 and the ends of
    # the mantissa's range [sqrt(1/2), sqrt(2)), around subnormals and huge values.
    stride = torch.arange(1, 0x7F800000, 1009, dtype=torch.int32).view(torch.float32)
    centres = (1.0, math.sqrt(2), math.sqrt(0.5), 2.0, 0.5, 1e-40, 1e-30, 3e38)
    x = torch.cat([stride, *float_runs(centres, 50_000), torch.rand(400_000, generator=gen) * 4])
    assert x.numel() > 2_500_000 and (x < torch.finfo(torch.float32).tiny).sum() > 100_000
    out = apply(math_mod, "log", x)
    assert_within("log", x, out, ulps(out, torch.log(x.double())))


def test_log_edge_values(math_mod):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([0.0, -0.0, 1.0, inf, -inf, nan, -1.0, -1e-45, 2.0**-149])
    out = apply(math_mod, "log", x)
    assert out[:4].tolist() == [-inf, -inf, 0.0, inf]
    assert not out[2].signbit()  # log(1) is +0, exactly
    assert out[4:8].isnan().all()
    assert out[8].item() == torch.tensor(-149 * math.log(2)).float().item()


def pow_cases(gen: torch.Generator) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(label, x, y): every 4001st positive float to a few powers; random pairs whose result
    spans float's range and beyond (y log2 x in [-160, 140]); x near 1 to large powers;
    negative x to integer and other powers; subnormal x."""
    cases = []
    stride = torch.arange(0, 0x7F800000, 4001, dtype=torch.int32).view(torch.float32)
    for y in (1.7, -0.5, 3.0, 0.3333, -7.25, 100.0):
        cases.append((f"stride ** {y}", stride, torch.tensor(y)))
    m = 1_000_000
    x = torch.exp2((torch.rand(m, generator=gen, dtype=torch.float64) * 2 - 1) * 126).float()
    z = torch.rand(m, generator=gen, dtype=torch.float64) * 300 - 160
    cases.append(("random", x, (z / torch.log2(x.double())).float()))
    x = 1 + (torch.rand(m, generator=gen) - 0.5) * 1e-3
    cases.append(("near 1", x, (torch.rand(m, generator=gen) * 2 - 1) * 1e5))
    x = -torch.exp2((torch.rand(m, generator=gen) * 2 - 1) * 20)
    cases.append(("negative, integral y", x, torch.randint(-30, 30, (m,), generator=gen).float()))
    cases.append(("negative, real y", x, torch.rand(m, generator=gen) * 60 - 30))
    sub = torch.arange(1, 0x00800000, 97, dtype=torch.int32).view(torch.float32)
    cases += [("subnormal", sub, torch.tensor(0.9)), ("subnormal", sub, torch.tensor(-0.1))]
    return cases


def test_pow_within_two_ulps(math_mod):
    for label, x, y in pow_cases(torch.Generator().manual_seed(5)):
        out = apply_pow(math_mod, x, y)
        x, y = torch.broadcast_tensors(x, y)
        expected = torch.pow(x.double(), y.double())
        # Beyond float's range the float64 result rounds to inf or 0, as it should.
        err = torch.where(out == expected.float(), 0.0, ulps(out, expected))
        assert_within(f"{label}: pow(x, {y[int(err.argmax())].item()!r}) at x=", x, out, err)


def test_pow_special_values(math_mod):
    # C99's special cases, as eager PyTorch gives them, sign of zero and infinity included:
    # pow(x, +-0) = 1 and pow(1, y) = 1 even for NaN, negative x to an odd integer negated, to
    # a non-integer NaN (but not for -0 and -inf), zeros and infinities by the sign of y...
    inf, nan = float("inf"), float("nan")
    values = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0, 1.5, -1.5, inf, -inf, nan]
    values += [1e-45, -1e-45, 3e38, -3e38, 2.0**24, -(2.0**24), 2.0**24 + 2, -(2.0**23 + 1)]
    xs, ys = zip(*itertools.product(values, values), strict=True)
    x, y = torch.tensor(xs), torch.tensor(ys)
    out, expected = apply_pow(math_mod, x, y), torch.pow(x, y)
    same = (out == expected) & (out.signbit() == expected.signbit())
    same |= out.isnan() & expected.isnan()
    # Ordinary results need only be within 2 ulp.
    err = ulps(out, torch.pow(x.double(), y.double()))
    near = expected.isfinite() & (expected != 0) & (err <= 2)
    bad = (~(same | near)).nonzero().flatten().tolist()
    assert not bad, [(xs[k], ys[k], out[k].item(), expected[k].item()) for k in bad[:5]]


def test_compiled_function_matches_eager():
    def fn(x):
        return torch.sin(x) * torch.cos(x) + torch.log(x.abs() + 1) + torch.pow(x.abs(), 1.7)

    compiled = compile_minicomp(fn, "cpu")
    for seed in (0, 1):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(10_007, generator=gen) * torch.exp2(torch.randint(-10, 20, (10_007,)))
        assert_same(compiled(x), fn(x))


# gelu -----------------------------------------------------------------------------------------

# Where mc_gelu_f32 goes from its polynomial in x^2 to the one for erfc, and from which on it is
# x (or -0). Its bounds, from an exhaustive test over all floats: 1.24 ulp above zero, 4.95e-8 |x|
# below (1.43 ulp and 6.93e-8 |x| where the compiler contracts no a * b + c into an fma).
GELU_SPLITS = (2.4, 5.55)
GELU_BOUNDS = (1.25, 5e-8) if compiler_has_fma() else (1.45, 7e-8)


def gelu_sweep(gen: torch.Generator) -> torch.Tensor:
    """About 3M floats of both signs: a stride through every positive bit pattern, runs around
    the splits, 1 and tiny values, and random values where gelu is neither x nor 0."""
    stride = torch.arange(1, 0x7F800000, 2003, dtype=torch.int32).view(torch.float32)
    runs = float_runs((*GELU_SPLITS, 1.0, 1e-4, 1e-30), 50_000)
    x = torch.cat([stride, *runs, torch.rand(600_000, generator=gen) * 8])
    return torch.cat([x, -x])


def test_gelu_within_bounds(math_mod):
    x = gelu_sweep(torch.Generator().manual_seed(11))
    assert x.numel() > 2_500_000
    out = apply(math_mod, "gelu", x)
    ref = 0.5 * x.double() * torch.special.erfc(-x.double() * math.sqrt(0.5))
    ulp_bound, abs_bound = GELU_BOUNDS
    pos, neg = x > 0, x < 0
    assert_within("gelu", x[pos], out[pos], ulps(out[pos], ref[pos]), bound=ulp_bound)
    # Below zero 1 + erf cancels (in eager too), so the error is bounded by x's scale, not the
    # result's; half the least subnormal more where x/2 rounds.
    err = ((out[neg].double() - ref[neg]).abs() - 2.0**-150) / (abs_bound * x[neg].double().abs())
    assert_within("gelu", x[neg], out[neg], err, bound=1.0)
    # Every result has x's sign: gelu(x) >= 0 above zero, <= 0 below.
    assert torch.equal(out.signbit(), x.signbit())


def test_gelu_edge_values(math_mod):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([0.0, -0.0, inf, -inf, nan, 1e-45, -1e-45, 2.0**-126])
    out = apply(math_mod, "gelu", x)
    # gelu(-0) = -0 and gelu(-inf) = NaN, as eager's x/2 (1 + erf); gelu(inf) = inf (eager's
    # vectorised float32 loop gives NaN there, float64 and CUDA inf). Tiny x give x/2 rounded.
    assert out[:3].tolist() == [0.0, -0.0, inf]
    assert torch.equal(out[:2].signbit(), torch.tensor([False, True]))
    assert out[3:5].isnan().all()
    assert out[5:].tolist() == [0.0, -0.0, 2.0**-127]
    # From the saturation on: x itself above zero, -0 below, up to the largest float.
    big = torch.logspace(0.0, 38.5, 10_000) * GELU_SPLITS[1]
    big = torch.cat([big[big.isfinite()], torch.tensor([torch.finfo(torch.float32).max])])
    assert torch.equal(apply(math_mod, "gelu", big), big)
    below = apply(math_mod, "gelu", -big)
    assert (below == 0).all() and below.signbit().all()
