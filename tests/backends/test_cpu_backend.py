"""Tests of the cpu backend: hand-built kernel IR compiled to C, run on torch tensors."""

import math
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch
from helpers import build_cpu

from minicomp.backends.cpu import render_module
from minicomp.backends.errors import CompileError
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function, Module
from minicomp.ir.types import (
    PointerType,
    bf16,
    boolean,
    f16,
    f32,
    f64,
    from_torch,
    i32,
    i64,
    to_torch,
)

i, j, n = E.Var("i", i64), E.Var("j", i64), E.Var("n", i64)
PREDICATES = ("isnan", "isinf", "signbit")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("kernel-cache"))


def ptr(name: str, dt) -> E.Var:
    return E.Var(name, PointerType(dt))


def elementwise(name: str, in_dts, out_dt, fn, kind: str = "vectorize") -> Function:
    """A kernel `out[i] = fn(x0[i], x1[i], ...)` over i < n."""
    ins = [ptr(f"x{k}", dt) for k, dt in enumerate(in_dts)]
    out = ptr("out", out_dt)
    body = S.For(i, n, S.Store(out, i, fn(*(E.Load(x, i) for x in ins))), kind=kind)
    return Function(name, (*ins, out, n), body)


def run(kernel, *inputs: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Call an elementwise kernel on contiguous inputs, into an output poisoned first."""
    out = torch.empty(inputs[0].shape, dtype=out_dtype)
    if out_dtype.is_floating_point:
        out.fill_(float("nan"))
    else:
        out.fill_(True if out_dtype == torch.bool else 123)
    kernel(*(t.data_ptr() for t in inputs), out.data_ptr(), inputs[0].numel())
    return out


def test_vector_add_parallel_vectorized(cache_dir):
    a, b, out = ptr("a", f32), ptr("b", f32), ptr("out", f32)
    outer, inner = E.Var("io", i64), E.Var("ii", i64)
    idx = outer * 8 + inner
    body = S.If(idx < n, S.Store(out, idx, E.Load(a, idx) + E.Load(b, idx)))
    loop = S.For(
        outer,
        E.Binary("idiv", n + 7, E.const(8)),
        S.For(inner, E.const(8), body, kind="vectorize"),
        kind="parallel",
    )
    mod = build_cpu(Module("vadd", (Function("vadd", (a, b, out, n), loop),)), cache_dir=cache_dir)
    assert "#pragma omp parallel for" in mod.source and "#pragma omp simd" in mod.source
    assert os.path.isfile(mod.path)
    kernel = mod.kernel("vadd")
    assert mod.kernel("vadd") is kernel
    for size in (1, 7, 8, 1000, 100_003):
        x, y = torch.randn(size), torch.randn(size)
        out_t = torch.full((size + 5,), float("nan"))
        kernel(x.data_ptr(), y.data_ptr(), out_t.data_ptr(), size)
        assert torch.equal(out_t[:size], x + y)
        assert out_t[size:].isnan().all()  # nothing written past n


def test_the_runtime_header_comes_precompiled_and_the_source_keeps_its_copy(tmp_path):
    from minicomp.backends.cpu import compiler
    from minicomp.backends.cpu.codegen import runtime_header

    compiler.reset_cache_stats()
    module = Module("neg", (elementwise("negate", [f32], f32, lambda x: -x),))
    mod = build_cpu(module, cache_dir=str(tmp_path))
    assert mod.source.count(runtime_header()) == 1  # what explain shows: one whole file
    [header] = (tmp_path / "headers").glob("*/*/prelude.h")
    assert header.read_text() == runtime_header()
    built = (tmp_path / "kernels").glob("*/*/source.c")
    assert [p.read_text().splitlines()[0] for p in built] == [
        f'#include "{compiler.include_name(str(header))}"'
    ]
    assert compiler.cache_stats().header_builds == 1
    x, out = torch.randn(1000), torch.full((1000,), float("nan"))
    mod.kernel("negate")(x.data_ptr(), out.data_ptr(), 1000)
    assert torch.equal(out, -x)


def test_wrong_arity_names_the_kernel_and_its_params(cache_dir):
    mod = build_cpu(
        Module("neg", (elementwise("negate", [f32], f32, lambda x: -x),)), cache_dir=cache_dir
    )
    with pytest.raises(TypeError, match=r"negate\(x0, out, n\)"):
        mod.kernel("negate")(1, 2)
    with pytest.raises(TypeError, match="negate"):
        mod.kernel("negate")(1, 2, 3, 4)


def test_scalar_parameters(cache_dir):
    x, out = ptr("x", f64), ptr("out", f64)
    scale, shift = E.Var("scale", f32), E.Var("shift", f64)
    flip, step = E.Var("flip", boolean), E.Var("step", i32)
    value = E.Load(x, i) * E.cast(scale, f64) + shift + E.cast(step, f64)
    body = S.For(i, n, S.Store(out, i, E.select(flip, -value, value)))
    kern = Function("affine", (x, out, scale, shift, flip, step, n), body)
    mod = build_cpu(Module("affine", (kern,)), cache_dir=cache_dir)
    xs = torch.randn(100, dtype=torch.float64)
    for flip_value in (False, True):
        res = torch.full_like(xs, float("nan"))
        mod.kernel("affine")(xs.data_ptr(), res.data_ptr(), 0.5, -3.25, flip_value, -7, 100)
        expected = xs * 0.5 - 3.25 - 7
        torch.testing.assert_close(res, -expected if flip_value else expected)


def test_row_sum_with_reduction_clause(cache_dir):
    x, out, m = ptr("x", f32), ptr("out", f32), E.Var("m", i64)
    acc = E.Var("acc", f32)
    inner = S.For(
        j,
        m,
        S.Assign(acc, acc + E.Load(x, i * m + j)),
        kind="vectorize",
        reductions=(("add", acc),),
    )
    body = S.For(
        i, n, S.seq(S.Declare(acc, E.const(0.0)), inner, S.Store(out, i, acc)), kind="parallel"
    )
    mod = build_cpu(
        Module("rowsum", (Function("rowsum", (x, out, n, m), body),)), cache_dir=cache_dir
    )
    assert "reduction(+:acc)" in mod.source
    for rows, cols in ((1, 1), (3, 1000), (64, 33)):
        t = torch.randn(rows, cols)
        res = torch.full((rows,), float("nan"))
        mod.kernel("rowsum")(t.data_ptr(), res.data_ptr(), rows, cols)
        torch.testing.assert_close(res, t.double().sum(1).float(), rtol=1e-5, atol=1e-5)


def _global_reduce(name: str, op: str, dt) -> Function:
    """out[0] = reduce(op, x[0..n)) with the loop parallel, starting from x[0]."""
    x, out, acc = ptr("x", dt), ptr("out", dt), E.Var("acc", dt)
    loop = S.For(
        i,
        n - 1,
        S.Assign(acc, E.binary(op, acc, E.Load(x, i + 1))),
        kind="parallel",
        reductions=((op, acc),),
    )
    body = S.seq(S.Declare(acc, E.Load(x, E.const(0))), loop, S.Store(out, E.const(0), acc))
    return Function(name, (x, out, n), body)


def test_parallel_reductions_propagate_nan(cache_dir):
    funcs = [
        _global_reduce(f"{op}_{dt.short}", op, dt)
        for op in ("add", "max", "min")
        for dt in (f32, f64, i64)
    ]
    mod = build_cpu(Module("reduce", tuple(funcs)), cache_dir=cache_dir)
    gen = torch.Generator().manual_seed(0)
    for dt in (torch.float32, torch.float64, torch.int64):
        for trial in range(4):
            x = torch.randint(-1000, 1000, (50_000,), generator=gen).to(dt)
            if dt.is_floating_point and trial > 0:
                x[torch.randint(0, x.numel(), (trial,), generator=gen)] = float("nan")
            short = from_torch(dt).short
            for op, ref in (("add", x.sum()), ("max", x.max()), ("min", x.min())):
                out = torch.zeros(1, dtype=dt)
                mod.kernel(f"{op}_{short}")(x.data_ptr(), out.data_ptr(), x.numel())
                torch.testing.assert_close(out[0], ref, equal_nan=True)


# Inputs for each math function: a sampler of float64 values on its domain.
def _uniform(lo, hi):
    return lambda g, k: torch.rand(k, generator=g, dtype=torch.float64) * (hi - lo) + lo


_DOMAINS = {
    "exp": _uniform(-80, 80),
    "exp2": _uniform(-120, 120),
    "expm1": _uniform(-20, 20),
    "log": _uniform(0, 1e3),
    "log2": _uniform(0, 1e3),
    "log10": _uniform(0, 1e3),
    "log1p": _uniform(-1, 10),
    "sqrt": _uniform(0, 1e3),
    "rsqrt": _uniform(1e-3, 1e3),
    "cbrt": _uniform(-1e3, 1e3),
    "sin": _uniform(-10, 10),
    "cos": _uniform(-10, 10),
    "tan": _uniform(-1.5, 1.5),
    "asin": _uniform(-1, 1),
    "acos": _uniform(-1, 1),
    "atan": _uniform(-100, 100),
    "sinh": _uniform(-20, 20),
    "cosh": _uniform(-20, 20),
    "tanh": _uniform(-10, 10),
    "asinh": _uniform(-100, 100),
    "acosh": _uniform(1, 100),
    "atanh": _uniform(-0.999, 0.999),
    "erf": _uniform(-5, 5),
    "erfc": _uniform(-3, 9),
    "erfinv": _uniform(-1, 1),
    "gelu": _uniform(-10, 10),
    "lgamma": _uniform(0.01, 30),
    "digamma": _uniform(-9.9, 30),
    "floor": _uniform(-10, 10),
    "ceil": _uniform(-10, 10),
    "rint": _uniform(-10, 10),
    "trunc": _uniform(-10, 10),
    "abs": _uniform(-10, 10),
    "sigmoid": _uniform(-100, 100),
    "isnan": _uniform(-10, 10),
    "isinf": _uniform(-10, 10),
    "signbit": _uniform(-10, 10),
    "atan2": _uniform(-10, 10),
    "fmod": _uniform(-10, 10),
    "copysign": _uniform(-10, 10),
    "hypot": _uniform(-10, 10),
    "nextafter": _uniform(-10, 10),
}
_TORCH = {
    "rint": torch.round,
    "abs": torch.abs,
    "fmod": torch.fmod,
    "cbrt": lambda t: torch.from_numpy(np.cbrt(t.numpy())),  # torch has no cbrt
    "gelu": torch.nn.functional.gelu,
}
# Exact in any precision, so compared bit for bit with torch in the kernel's own dtype.
_EXACT = ("floor", "ceil", "rint", "trunc", "abs", "copysign", "fmod", "nextafter", *PREDICATES)
_SPECIAL = [
    0.0,
    -0.0,
    float("inf"),
    float("-inf"),
    float("nan"),
    0.5,
    -0.5,
    1.5,
    2.5,
    -2.5,
    1.0,
    -1.0,
    2.0,
    -3.0,
]


def _math_inputs(name: str, gen) -> list[torch.Tensor]:
    k = 2000
    args = [_DOMAINS[name](gen, k) for _ in range(E.MATH_FUNCTIONS[name])]
    if name in ("lgamma", "digamma"):
        args[0] = torch.cat([args[0], torch.tensor([-2.5, -0.5, -7.25, 1.0, 2.0])])
    special = torch.tensor(_SPECIAL, dtype=torch.float64)
    if len(args) == 1:
        return [torch.cat([args[0], special])]
    grid = torch.cartesian_prod(special, special)
    return [torch.cat([args[0], grid[:, 0]]), torch.cat([args[1], grid[:, 1]])]


def _ulps(actual: torch.Tensor, expected: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """|actual - expected| in units in the last place of `dt` at `expected` (float64)."""
    info = torch.finfo(dt)
    mag = expected.abs().clamp_min(info.smallest_normal)
    ulp = torch.exp2(torch.floor(torch.log2(mag))) * info.eps
    diff = (actual.double() - expected).abs()
    same = (actual.double() == expected) | (actual.isnan() & expected.isnan())
    return torch.where(same, torch.zeros_like(diff), diff / ulp)


@pytest.fixture(scope="module", params=[f32, f64], ids=["f32", "f64"])
def math_module(request, cache_dir):
    dt = request.param
    funcs = []
    for name, arity in sorted(E.MATH_FUNCTIONS.items()):
        out_dt = boolean if name in PREDICATES else dt
        funcs.append(
            elementwise(
                f"m_{name}",
                [dt] * arity,
                out_dt,
                lambda *xs, name=name, out_dt=out_dt: E.Call(name, tuple(xs), out_dt),
            )
        )
    return dt, build_cpu(Module(f"math_{dt.short}", tuple(funcs)), cache_dir=cache_dir)


# Allowed error in ulps of the kernel's type, against PyTorch in float64 for f32 kernels and
# against PyTorch's own float64 for f64 kernels (both sides round, hence the 2 - 4 ulps).
_MAX_ULPS = {"f32": 2.0, "f64": 4.0}
_HAS_ROOTS = ("lgamma", "digamma")
_LOOSE = {"lgamma": 16.0, "digamma": 16.0, "erfinv": 16.0, "erfc": 2.0, "tan": 4.0, "acosh": 4.0}


def _digamma64(t: torch.Tensor) -> torch.Tensor:
    # PyTorch's float64 digamma loses ~1e-12 relative next to its poles (it reflects with
    # tan(pi x) on the whole x); mpmath at high precision is the reference there.
    import mpmath

    with mpmath.workprec(128):
        return torch.tensor(
            [
                float(mpmath.digamma(v))
                if math.isfinite(v) and v != int(v)
                else torch.digamma(torch.tensor(v, dtype=torch.float64)).item()
                for v in t.tolist()
            ],
            dtype=torch.float64,
        )


@pytest.mark.parametrize("name", sorted(E.MATH_FUNCTIONS))
def test_math_functions_match_torch(math_module, name):
    dt, mod = math_module
    torch_dt = to_torch(dt)
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    inputs = [t.to(torch_dt) for t in _math_inputs(name, gen)]
    fn = _TORCH.get(name) or getattr(torch, name)
    if name == "digamma" and dt == f64:
        fn = _digamma64
    out_dtype = torch.bool if name in PREDICATES else torch_dt
    out = run(mod.kernel(f"m_{name}"), *inputs, out_dtype=out_dtype)
    if name in _EXACT:
        torch.testing.assert_close(out, fn(*inputs), rtol=0, atol=0, equal_nan=True)
        return
    expected = fn(*(t.double() for t in inputs))
    assert torch.equal(out.isnan(), expected.isnan()), name
    err = _ulps(out, expected, torch_dt)
    if name in _HAS_ROOTS:
        # Next to a root the result is a difference of O(1) terms: judge it absolutely.
        close = (out.double() - expected).abs() <= 4 * torch.finfo(torch_dt).eps
        err = torch.where(close, 0, err)
    if name == "gelu":
        # Below zero, x/2 (1 + erf) cancels (eager's too): judge it by x's scale.
        x = inputs[0].double()
        close = (out.double() - expected).abs() <= torch.finfo(torch_dt).eps * x.abs()
        err = torch.where(close & (x < 0), 0, err)
    limit = _LOOSE.get(name, 1.0) * _MAX_ULPS[dt.short]
    worst = int(err.argmax())
    assert err.max() <= limit, (
        f"{name}{[t[worst].item() for t in inputs]}: {out[worst].item()!r} vs "
        f"{expected[worst].item()!r} ({err.max().item():.2f} ulp)"
    )


def test_exp_f32_within_two_ulps_over_the_whole_range(cache_dir):
    kernel = elementwise("exp_k", [f32], f32, lambda x: E.call("exp", x))
    mod = build_cpu(Module("exp", (kernel,)), cache_dir=cache_dir)
    assert "mc_exp_f32(x0[i])" in mod.source
    gen = torch.Generator().manual_seed(0)
    stride = torch.arange(0, 2**32, 4099, dtype=torch.int64)  # every 4099th bit pattern
    stride = torch.where(stride >= 2**31, stride - 2**32, stride).to(torch.int32)
    edges = torch.tensor(
        [
            0.0,
            -0.0,
            float("inf"),
            float("-inf"),
            float("nan"),
            88.72283,
            88.72284,
            88.7229,
            -87.33654,
            -87.3366,
            -103.97,
            -103.972,
            1e-45,
            -1e-45,
            1e-30,
            -1e-7,
        ]
    )
    x = torch.cat(
        [
            torch.linspace(-105, 90, 700_000),
            stride.view(torch.float32),
            (torch.rand(50_000, generator=gen) * 2 - 1) * 1e-3,
            edges,
        ]
    )
    out = run(mod.kernel("exp_k"), x, out_dtype=torch.float32)
    expected = torch.exp(x.double())
    rounded = expected.float()
    finite = rounded.isfinite()
    assert torch.equal(out.isnan(), x.isnan())
    overflow = ~finite & ~x.isnan()
    assert torch.equal(out[overflow], rounded[overflow])
    err = _ulps(out[finite], expected[finite], torch.float32)
    assert err.max() <= 2.0, f"mc_exp_f32 max error {err.max().item():.3f} ulp"


def test_hot_helpers_vectorise(tmp_path):
    """exp, sigmoid, max and the half conversions must not keep a `#pragma omp simd` loop scalar."""
    kernels = (
        elementwise("v_exp", [f32], f32, lambda x: E.call("exp", x)),
        elementwise("v_sigmoid", [f32], f32, lambda x: E.call("sigmoid", x)),
        elementwise("v_relu", [f32], f32, lambda x: E.maximum(x, E.const(0.0))),
        elementwise("v_from_f16", [f16], f32, lambda x: E.cast(x, f32)),
        elementwise("v_to_f16", [f32], f16, lambda x: E.cast(x, f16)),
        elementwise("v_from_bf16", [bf16], f32, lambda x: E.cast(x, f32)),
        elementwise("v_to_bf16", [f32], bf16, lambda x: E.cast(x, bf16)),
    )
    src = render_module(Module("vec", kernels))
    path = tmp_path / "vec.c"
    path.write_text(src)
    proc = subprocess.run(
        [
            "cc",
            "-O3",
            "-march=native",
            "-fopenmp",
            "-fno-math-errno",
            "-fopt-info-vec-optimized",
            "-S",
            "-o",
            os.devnull,
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    vectorized = {
        int(line.split(":")[1]) for line in proc.stderr.splitlines() if "loop vectorized" in line
    }
    lines = src.splitlines()
    for k in kernels:
        start = next(n for n, line in enumerate(lines) if f"void {k.name}(" in line)
        loop_line = next(n for n in range(start, len(lines)) if "for (" in lines[n]) + 1
        # GCC reports the loop's line or its body's.
        assert {loop_line, loop_line + 1} & vectorized, k.name


def _all_halves(dt) -> torch.Tensor:
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dt)


@pytest.mark.parametrize("dt", [f16, bf16], ids=["f16", "bf16"])
def test_half_conversions_match_torch_bit_for_bit(cache_dir, dt):
    tdt = to_torch(dt)
    mod = build_cpu(
        Module(
            f"conv_{dt.short}",
            (
                elementwise("widen", [dt], f32, lambda x: E.cast(x, f32)),
                elementwise("narrow", [f32], dt, lambda x: E.cast(x, dt)),
                elementwise("narrow64", [f64], dt, lambda x: E.cast(x, dt)),
                elementwise("add", [dt, dt], dt, lambda x, y: x + y),
            ),
        ),
        cache_dir=cache_dir,
    )
    halves = _all_halves(tdt)
    wide = run(mod.kernel("widen"), halves, out_dtype=torch.float32)
    expected = halves.float()
    assert torch.equal(wide.isnan(), expected.isnan())
    assert torch.equal(
        wide.view(torch.int32)[~wide.isnan()], expected.view(torch.int32)[~expected.isnan()]
    )
    back = run(mod.kernel("narrow"), wide, out_dtype=tdt)
    assert torch.equal(
        back.view(torch.int16)[~halves.isnan()], halves.view(torch.int16)[~halves.isnan()]
    )
    assert back[halves.isnan()].isnan().all()
    # Rounding: random floats, the midpoints between neighbours, overflow and subnormals.
    gen = torch.Generator().manual_seed(1)
    finite = expected[expected.isfinite()].double()
    mids = (finite[:-1] + finite[1:]) / 2
    mids = mids[(finite[:-1] * finite[1:] >= 0)]  # same sign: the sorted order holds
    samples = torch.cat(
        [
            torch.randn(100_000, generator=gen)
            * torch.exp2(torch.randint(-30, 20, (100_000,), generator=gen).float()),
            mids.float(),
            torch.nextafter(mids.float(), torch.tensor(float("inf"))),
            torch.tensor([65504.0, 65519.99, 65520.0, 1e6, -1e6, 3e38, 6e-8, 3e-8, 2.9e-8]),
        ]
    )
    for kernel, src in (("narrow", samples), ("narrow64", samples.double())):
        out = run(mod.kernel(kernel), src, out_dtype=tdt)
        ref = src.to(tdt) if kernel == "narrow" else src.float().to(tdt)
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16)), kernel
    x, y = halves[::7].clone(), halves.flip(0)[::7].clone()
    summed = run(mod.kernel("add"), x, y, out_dtype=tdt)
    torch.testing.assert_close(summed, x + y, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dt", [i32, i64, f32, f64], ids=["i32", "i64", "f32", "f64"])
def test_floordiv_and_mod_follow_python(cache_dir, dt):
    mod = build_cpu(
        Module(
            f"divmod_{dt.short}",
            (
                elementwise("floordiv_k", [dt, dt], dt, lambda a, b: E.Binary("floordiv", a, b)),
                elementwise("mod_k", [dt, dt], dt, lambda a, b: E.Binary("mod", a, b)),
                elementwise("pow_k", [dt, dt], dt, lambda a, b: E.Binary("pow", a, b)),
            ),
        ),
        cache_dir=cache_dir,
    )
    tdt = to_torch(dt)
    gen = torch.Generator().manual_seed(2)
    if dt.is_integer:
        a = torch.randint(-1000, 1000, (5000,), generator=gen).to(tdt)
        b = torch.randint(-30, 30, (5000,), generator=gen).to(tdt)
        b[b == 0] = 7
        a[:3] = torch.iinfo(tdt).min
        b[:3] = torch.tensor([-1, 3, -7])
    else:
        a = (torch.randn(5000, generator=gen) * 100).to(tdt)
        b = (torch.randn(5000, generator=gen) * 10).to(tdt)
        a[:4], b[:4] = torch.tensor([-7.0, 7.0, -0.0, 5.0]), torch.tensor([2.0, -2.0, 3.0, 0.0])
    torch.testing.assert_close(
        run(mod.kernel("floordiv_k"), a, b, out_dtype=tdt),
        torch.floor_divide(a, b),
        rtol=0,
        atol=0,
        equal_nan=True,
    )
    expected_mod = torch.remainder(a.double(), b.double()).to(tdt)
    torch.testing.assert_close(
        run(mod.kernel("mod_k"), a, b, out_dtype=tdt),
        expected_mod,
        rtol=1e-6,
        atol=1e-4,
        equal_nan=True,
    )
    if dt.is_integer:
        base = torch.randint(-5, 6, (2000,), generator=gen).to(tdt)
        exp = torch.randint(0, 12, (2000,), generator=gen).to(tdt)
        torch.testing.assert_close(
            run(mod.kernel("pow_k"), base, exp, out_dtype=tdt), torch.pow(base, exp), rtol=0, atol=0
        )


@pytest.mark.parametrize("dt", [f32, f64, i64], ids=["f32", "f64", "i64"])
def test_max_min_propagate_nan(cache_dir, dt):
    mod = build_cpu(
        Module(
            f"maxmin_{dt.short}",
            (
                elementwise("vmax", [dt, dt], dt, E.maximum),
                elementwise("vmin", [dt, dt], dt, E.minimum),
            ),
        ),
        cache_dir=cache_dir,
    )
    tdt = to_torch(dt)
    values = torch.tensor([-2.0, 0.0, 3.0, float("nan"), float("inf"), float("-inf")])
    if not dt.is_float:
        values = torch.tensor([-2, 0, 3, -(2**63), 2**63 - 1])
    grid = torch.cartesian_prod(values, values).to(tdt)
    a, b = grid[:, 0].contiguous(), grid[:, 1].contiguous()
    for name, fn in (("vmax", torch.maximum), ("vmin", torch.minimum)):
        torch.testing.assert_close(
            run(mod.kernel(name), a, b, out_dtype=tdt), fn(a, b), rtol=0, atol=0, equal_nan=True
        )


def test_control_flow(cache_dir):
    """Collatz step counts: While, If/else, Break, Continue, Assign, integer division."""
    x, out = ptr("x", i64), ptr("out", i64)
    v, steps = E.Var("v", i64), E.Var("steps", i64)
    loop = S.While(
        E.const(True),
        S.seq(
            S.If(E.eq(v, 1), S.Break()),
            S.If(
                E.eq(E.Binary("imod", v, E.const(2)), 0),
                S.Assign(v, E.Binary("idiv", v, E.const(2))),
                S.Assign(v, v * 3 + 1),
            ),
            S.Assign(steps, steps + 1),
        ),
    )
    body = S.For(
        i,
        n,
        S.seq(
            S.Declare(v, E.Load(x, i)),
            S.If(v <= 0, S.seq(S.Store(out, i, E.const(-1)), S.Continue())),
            S.Declare(steps, E.const(0)),
            loop,
            S.Store(out, i, steps),
        ),
        kind="parallel",
    )
    mod = build_cpu(
        Module("collatz", (Function("collatz", (x, out, n), body),)), cache_dir=cache_dir
    )
    xs = torch.cat([torch.arange(-3, 200), torch.tensor([27, 97, 871])])

    def collatz(k: int) -> int:
        if k <= 0:
            return -1
        count = 0
        while k != 1:
            k = k // 2 if k % 2 == 0 else 3 * k + 1
            count += 1
        return count

    out_t = run(mod.kernel("collatz"), xs, out_dtype=torch.int64)
    assert out_t.tolist() == [collatz(k) for k in xs.tolist()]


def test_device_functions(cache_dir):
    a, xv, yv = E.Var("a", f32), E.Var("x", f32), E.Var("y", f32)
    axpy = Function("axpy", (a, xv, yv), S.Return(a * xv + yv), kind="device", ret=f32)
    # A device function with a loop and an early return: the first index holding `key`.
    buf, key, k = ptr("buf", i32), E.Var("key", i32), E.Var("k", i64)
    find = Function(
        "find",
        (buf, n, key),
        S.seq(
            S.For(k, n, S.If(E.eq(E.Load(buf, k), key), S.Return(k))),
            S.Return(E.const(-1)),
        ),
        kind="device",
        ret=i64,
    )
    x, y, out = ptr("xs", f32), ptr("ys", f32), ptr("out", f32)
    keys, found = ptr("keys", i32), ptr("found", i64)
    kern = Function(
        "saxpy",
        (x, y, out, n),
        S.For(
            i,
            n,
            S.Store(out, i, E.Call("axpy", (E.const(2.5), E.Load(x, i), E.Load(y, i)), f32)),
            kind="parallel",
        ),
    )
    search = Function(
        "search",
        (keys, found, n),
        S.For(i, n, S.Store(found, i, E.Call("find", (keys, n, E.cast(i, i32) * 3), i64))),
    )
    mod = build_cpu(Module("dev", (axpy, find, kern, search)), cache_dir=cache_dir)
    assert "static inline float axpy(float a, float x, float y) {" in mod.source
    xs, ys = torch.randn(999), torch.randn(999)
    torch.testing.assert_close(
        run(mod.kernel("saxpy"), xs, ys, out_dtype=torch.float32), 2.5 * xs + ys
    )
    table = torch.randperm(300, generator=torch.Generator().manual_seed(3)).to(torch.int32)
    got = run(mod.kernel("search"), table, out_dtype=torch.int64)
    expected = [table.tolist().index(3 * q) if 3 * q in table.tolist() else -1 for q in range(300)]
    assert got.tolist() == expected
    with pytest.raises(ValueError, match="device function"):
        mod.kernel("axpy")


def test_collapsed_parallel_loops_and_int64_min(cache_dir):
    x, out, m = ptr("x", i64), ptr("out", i64), E.Var("m", i64)
    store = S.Store(out, i * m + j, E.Load(x, i * m + j) + E.const(-(2**63)))
    body = S.For(i, n, S.For(j, m, store, kind="parallel"), kind="parallel")
    mod = build_cpu(Module("grid", (Function("grid", (x, out, n, m), body),)), cache_dir=cache_dir)
    assert "collapse(2)" in mod.source
    t = torch.randint(0, 2**40, (37, 53))
    res = torch.zeros_like(t)
    mod.kernel("grid")(t.data_ptr(), res.data_ptr(), 37, 53)
    assert torch.equal(res, t + torch.iinfo(torch.int64).min)


def test_source_is_deterministic_across_processes():
    script = (
        "from minicomp.backends.cpu import render_module\n"
        "import importlib.util, sys\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})\n"  # for helpers
        f"spec = importlib.util.spec_from_file_location('t', {__file__!r})\n"
        "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)\n"
        "sys.stdout.write(render_module(t.sample_module()))\n"
    )
    # Another string-hash seed than this process's: no set or dict order may leak into the text.
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = dict(os.environ, PYTHONHASHSEED=seed)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert proc.stdout == render_module(sample_module())


def sample_module() -> Module:
    """A module touching most of the renderer (used by the determinism test)."""
    names = [E.Var(f"t{k}", f32) for k in range(8)]
    acc = E.Var("acc", f32)
    funcs = [
        elementwise(
            f"m_{name}", [f32] * arity, f32, lambda *xs, name=name: E.Call(name, tuple(xs), f32)
        )
        for name, arity in sorted(E.MATH_FUNCTIONS.items())
        if name not in PREDICATES
    ]
    x = ptr("x", f32)
    body = S.seq(
        *(S.Declare(v, E.Load(x, E.const(k))) for k, v in enumerate(names)),
        S.Declare(acc, E.const(0.0)),
        S.For(
            i,
            n,
            S.Assign(acc, E.maximum(acc, E.Load(x, i))),
            kind="parallel",
            reductions=(("max", acc),),
        ),
        S.Store(x, E.const(0), acc + names[3]),
    )
    return Module("sample", (*funcs, Function("misc", (x, n), body)))


def test_compile_error_names_the_source_line(cache_dir):
    ghost = E.Var("ghost", f32)  # never declared: the C compiler rejects it
    out = ptr("out", f32)
    kern = Function("broken", (out, n), S.For(i, n, S.Store(out, i, ghost)))
    with pytest.raises(CompileError) as info:
        build_cpu(Module("broken", (kern,)), cache_dir=cache_dir)
    message = str(info.value)
    assert "ghost" in message
    assert "out[i] = ghost;" in message
