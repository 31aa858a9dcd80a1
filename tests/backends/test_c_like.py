"""Tests of the shared C-like renderer and the C renderer's pragmas, on the rendered text."""

import re

import pytest

from minicomp.backends.c_like import CLikeRenderer
from minicomp.backends.cpu.codegen import CRenderer, render_module
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function, Module
from minicomp.ir.types import PointerType, bf16, boolean, f16, f32, f64, i8, i32, i64, u8

a, b, c = E.Var("a", f32), E.Var("b", f32), E.Var("c", f32)
i, j, n = E.Var("i", i64), E.Var("j", i64), E.Var("n", i64)
x_ptr, out_ptr = E.Var("x", PointerType(f32)), E.Var("out", PointerType(f32))


def text(e: E.Expr, renderer=None) -> str:
    return (renderer or CLikeRenderer()).expr(e)


@pytest.mark.parametrize(
    "e, expected",
    [
        ((a + b) * c, "(a + b) * c"),
        (a * b + c, "a * b + c"),
        (a - (b - c), "a - (b - c)"),
        (a - b - c, "a - b - c"),
        (a / (b * c), "a / (b * c)"),
        (-(a + b), "-(a + b)"),
        (E.Unary("neg", E.Unary("neg", a)), "-(-a)"),
        (E.select(a < b, a, b) + c, "(a < b ? a : b) + c"),
        (E.select(a < b, a + c, b), "a < b ? a + c : b"),
        ((a < b) & (b < c), "(a < b) && (b < c)"),
        (E.Binary("shl", i, E.const(3)) + j, "(i << 3LL) + j"),
        (E.Binary("bitor", E.Binary("bitand", i, j), n), "(i & j) | n"),
        (E.Binary("bitand", i, E.Binary("bitand", j, n)), "i & j & n"),
        (E.Binary("shl", i, E.Binary("shl", j, n)), "i << (j << n)"),
        (E.Binary("shl", i, j + n), "i << (j + n)"),
        (E.Binary("shr", E.Binary("shr", i, j), n), "i >> j >> n"),
        ((a < b) | ((b < c) & (a < c)), "(a < b) || ((b < c) && (a < c))"),
        (E.Load(x_ptr, i * 4 + j), "x[i * 4LL + j]"),
    ],
)
def test_expressions_parenthesise_by_precedence(e, expected):
    assert text(e) == expected


@pytest.mark.parametrize(
    "value, dt, expected",
    [
        (5, i64, "5LL"),
        (-5, i64, "-5LL"),
        (-(2**63), i64, "(-9223372036854775807LL - 1)"),
        (2**63 - 1, i64, "9223372036854775807LL"),
        (-(2**31), i32, "(-2147483647 - 1)"),
        (7, i32, "7"),
        (200, u8, "200"),
        (0.1, f32, "0.1f"),
        (1.0, f32, "1.0f"),
        (-2.5, f32, "-2.5f"),
        (1e10, f32, "1e+10f"),
        (3.4028234663852886e38, f32, "3.4028235e+38f"),
        (1e39, f32, "INFINITY"),
        (float("inf"), f32, "INFINITY"),
        (float("-inf"), f32, "-INFINITY"),
        (float("nan"), f32, "NAN"),
        (0.1, f64, "0.1"),
        (2.0, f64, "2.0"),
        (float("inf"), f64, "(double)INFINITY"),
        (float("-inf"), f64, "-(double)INFINITY"),
        (float("nan"), f64, "(double)NAN"),
        (True, boolean, "1"),
        (False, boolean, "0"),
        (1.0, f16, "0x3c00"),
        (-2.0, bf16, "0xc000"),
    ],
)
def test_literals(value, dt, expected):
    assert text(E.Const(value, dt)) == expected


def test_negative_literal_is_parenthesised_after_a_minus():
    assert text(a - E.const(-1.5)) == "a - -1.5f"
    assert text(E.Unary("neg", E.Const(-3, i64))) == "-(-3LL)"
    assert text(E.Binary("mul", E.Const(float("-inf"), f64), E.Var("d", f64))) == (
        "-(double)INFINITY * d"
    )


@pytest.mark.parametrize(
    "e, expected",
    [
        (E.cast(a, boolean), "a != 0"),
        (E.cast(a + b, boolean), "a + b != 0"),
        (E.cast(a + b, i64), "(int64_t)(a + b)"),
        (E.cast(E.Var("h", f16), f32), "mc_f16_to_f32(h)"),
        (E.cast(E.Var("h", f16), f64), "(double)mc_f16_to_f32(h)"),
        (E.cast(E.Var("h", f16), bf16), "mc_f32_to_bf16(mc_f16_to_f32(h))"),
        (E.cast(E.Var("h", bf16), boolean), "mc_bf16_to_f32(h) != 0"),
        (E.cast(E.Var("d", f64), f16), "mc_f32_to_f16((float)d)"),
        (E.cast(a, bf16), "mc_f32_to_bf16(a)"),
    ],
)
def test_casts(e, expected):
    assert text(e) == expected


def test_half_arithmetic_computes_in_float32():
    h, g = E.Var("h", f16), E.Var("g", f16)
    assert text(h + g) == "mc_f32_to_f16(mc_f16_to_f32(h) + mc_f16_to_f32(g))"
    assert text(h < g) == "mc_f16_to_f32(h) < mc_f16_to_f32(g)"
    assert text(E.call("exp", E.Var("k", bf16))) == "mc_f32_to_bf16(expf(mc_bf16_to_f32(k)))"
    assert text(E.call("isnan", h, dtype=boolean)) == "mc_isnan(mc_f16_to_f32(h))"


def test_narrow_integers_wrap_like_pytorch():
    v = E.Var("v", i8)
    assert text(v + v) == "(int8_t)(v + v)"
    assert text(E.Unary("bitnot", E.Var("w", u8))) == "(uint8_t)(~w)"
    assert text(E.Var("k", i32) + E.Var("k", i32)) == "k + k"


def test_helpers_by_type():
    k = E.Var("k", i64)
    assert text(E.maximum(a, b)) == "mc_max_f32(a, b)"
    assert text(E.minimum(k, k)) == "mc_min_i64(k, k)"
    assert text(E.Binary("floordiv", k, k)) == "mc_floordiv_i64(k, k)"
    assert text(E.Binary("mod", a, b)) == "mc_mod_f32(a, b)"
    assert text(E.Binary("idiv", k, k)) == "k / k"
    assert text(E.Binary("imod", k, k)) == "k % k"
    assert text(E.Binary("pow", a, b)) == "powf(a, b)"
    assert text(E.Binary("pow", k, k)) == "mc_pow_i64(k, k)"
    assert text(E.Binary("shr", k, k)) == "k >> k"


@pytest.mark.parametrize("dt", [f32, f64])
@pytest.mark.parametrize("name", sorted(E.MATH_FUNCTIONS))
def test_every_math_function_renders(name, dt):
    args = [E.Var(f"x{k}", dt) for k in range(E.MATH_FUNCTIONS[name])]
    out_dt = boolean if name in ("isnan", "isinf", "signbit") else dt
    rendered = text(E.Call(name, tuple(args), out_dt), CRenderer())
    assert re.fullmatch(r"[a-z_0-9]+\(x0(, x1)?\)", rendered), rendered


def test_math_function_spellings():
    r = CRenderer()
    d = E.Var("d", f64)
    assert text(E.call("exp", a), r) == "mc_exp_f32(a)"
    assert text(E.call("exp", d), r) == "exp(d)"
    assert text(E.call("sin", a), r) == "mc_sin_f32(a)"
    assert text(E.call("atan", a), r) == "atanf(a)"  # libm where the runtime has no own
    assert text(E.call("abs", d), r) == "fabs(d)"
    assert text(E.call("rsqrt", a), r) == "mc_rsqrt_f32(a)"
    assert text(E.call("abs", i), r) == "mc_abs_i64(i)"
    assert text(E.call("floor", i), r) == "i"


def test_unknown_call_and_threads_are_refused():
    with pytest.raises(ValueError, match="frobnicate"):
        text(E.Call("frobnicate", (a,), f32))
    with pytest.raises(NotImplementedError, match="thread"):
        text(E.Call("thread_idx_x", (), i32), CRenderer())


def _render(body: S.Stmt, params=(x_ptr, out_ptr, n), kind="kernel", ret=None) -> str:
    return CRenderer().render_function(Function("k", params, body, kind=kind, ret=ret))


def test_signature_marks_read_only_pointers_const():
    src = _render(S.For(i, n, S.Store(out_ptr, i, E.Load(x_ptr, i))))
    # (After the cpu target's MC_WIDE_VECTORS: n is symbolic, so the loop may be long.)
    assert src.splitlines()[0].endswith(
        " void k(const float* __restrict__ x, float* __restrict__ out, int64_t n) {"
    )


def test_names_are_sanitised_and_distinct():
    weird = E.Var("a.b", f32)
    keyword = E.Var("for", f32)
    twin = E.Var("n", f32)  # same name as the i64 parameter n, another variable
    body = S.seq(
        S.Declare(weird, E.const(1.0)),
        S.Declare(keyword, weird),
        S.Declare(twin, keyword),
        S.Store(out_ptr, n, twin),
    )
    src = _render(body)
    assert "float a_b = 1.0f;" in src
    assert "float for_ = a_b;" in src
    assert "float n_1 = for_;" in src
    assert "out[n] = n_1;" in src


def test_statements():
    flag = E.Var("flag", boolean)
    body = S.seq(
        S.Comment("two lines\nsecond \\"),
        S.Declare(flag),
        S.While(
            E.const(True),
            S.If(
                i < 0,
                S.Break(),
                S.If(i < 1, S.Continue(), S.If(i < 2, S.Assign(flag, E.const(True)), S.Break())),
            ),
        ),
    )
    lines = [line.strip() for line in _render(body, params=(i,)).splitlines()]
    assert lines[1:] == [
        "// two lines",
        "// second",
        "bool flag;",
        "while (1) {",
        "if (i < 0LL) {",
        "break;",
        "} else if (i < 1LL) {",
        "continue;",
        "} else if (i < 2LL) {",
        "flag = 1;",
        "} else {",
        "break;",
        "}",
        "}",
        "}",
    ]


def test_device_function_is_static_inline_and_returns():
    src = _render(S.Return(a * b), params=(a, b), kind="device", ret=f32)
    assert src.splitlines() == [
        "static inline float k(float a, float b) {",
        "    return a * b;",
        "}",
    ]


def test_parallel_vectorize_unroll_pragmas():
    inner = S.For(j, E.const(8), S.Store(out_ptr, i * 8 + j, E.Load(x_ptr, j)), kind="vectorize")
    src = _render(S.For(i, n, inner, kind="parallel"))
    assert "#pragma omp parallel for\n" in src
    assert "#pragma omp simd\n" in src
    src = _render(S.For(i, n, S.Store(out_ptr, i, a), kind="unroll"))
    assert "#pragma GCC unroll 8" in src


def test_directly_nested_parallel_loops_collapse():
    store = S.Store(out_ptr, i * n + j, E.Load(x_ptr, j))
    src = _render(S.For(i, n, S.For(j, n, store, kind="parallel"), kind="parallel"))
    assert "#pragma omp parallel for collapse(2)" in src
    assert src.count("#pragma") == 1
    # A triangular nest cannot collapse; the inner loop runs serially inside the region.
    src = _render(S.For(i, n, S.For(j, i + 1, store, kind="parallel"), kind="parallel"))
    assert src.count("#pragma omp parallel for\n") == 1
    assert "collapse" not in src


def test_parallel_loop_inside_parallel_region_is_serial():
    acc = E.Var("acc", f32)
    inner = S.For(
        j, n, S.Assign(acc, acc + E.Load(x_ptr, j)), kind="parallel", reductions=(("add", acc),)
    )
    body = S.For(
        i, n, S.seq(S.Declare(acc, E.const(0.0)), inner, S.Store(out_ptr, i, acc)), kind="parallel"
    )
    src = _render(body)
    assert src.count("#pragma") == 1
    assert "reduction" not in src


@pytest.mark.parametrize(
    "op, dt, clause",
    [
        ("add", f32, "reduction(+:acc)"),
        ("mul", f64, "reduction(*:acc)"),
        ("max", i64, "reduction(max:acc)"),
        ("min", i32, "reduction(min:acc)"),
        ("max", f32, "reduction(mc_max_f32:acc)"),
        ("min", f64, "reduction(mc_min_f64:acc)"),
    ],
)
@pytest.mark.parametrize(
    "kind, pragma", [("parallel", "omp parallel for"), ("vectorize", "omp simd")]
)
def test_reduction_clauses(op, dt, clause, kind, pragma):
    acc = E.Var("acc", dt)
    loop = S.For(
        i, n, S.Assign(acc, E.binary(op, acc, E.cast(i, dt))), kind=kind, reductions=((op, acc),)
    )
    src = _render(S.seq(S.Declare(acc, E.const(1, dt)), loop), params=(n,))
    assert f"#pragma {pragma} {clause}\n" in src


def test_half_accumulator_keeps_its_loop_serial():
    acc = E.Var("acc", f16)
    loop = S.For(
        i, n, S.Assign(acc, acc + E.const(1.0, f16)), kind="parallel", reductions=(("add", acc),)
    )
    src = _render(S.seq(S.Declare(acc, E.const(0.0, f16)), loop), params=(n,))
    assert "#pragma omp" not in src
    assert "// serial" in src


class _ToyGpuRenderer(CLikeRenderer):
    """What a CUDA renderer overrides, in miniature."""

    def function_qualifier(self, f):
        return 'extern "C" __global__' if f.kind == "kernel" else "__device__"

    def thread_index(self, axis):
        return f"threadIdx.{axis}"

    def block_index(self, axis):
        return f"blockIdx.{axis}"

    def block_dim(self, axis):
        return f"blockDim.{axis}"

    def barrier(self):
        return "__syncthreads()"

    def array_decl(self, s):
        prefix = "__shared__ " if s.scope == "shared" else ""
        return prefix + super().array_decl(s)


def test_hooks_give_a_gpu_dialect():
    tile = E.Var("tile", PointerType(f32, "shared"))
    t = E.cast(E.Call("thread_idx_x", (), i32), i64)
    gid = (
        E.cast(E.Call("block_idx_x", (), i32), i64) * E.cast(E.Call("block_dim_x", (), i32), i64)
        + t
    )
    body = S.seq(
        S.DeclareArray(tile, f32, 128, "shared"),
        S.Store(tile, t, E.Load(x_ptr, gid)),
        S.Evaluate(E.Call("syncthreads", (), boolean)),
        S.Store(out_ptr, gid, E.Load(tile, E.const(127) - t)),
    )
    src = _ToyGpuRenderer().render_function(Function("rev", (x_ptr, out_ptr), body))
    assert src.splitlines() == [
        'extern "C" __global__ void rev(const float* __restrict__ x, float* __restrict__ out) {',
        "    __shared__ float tile[128];",
        (
            "    tile[(int64_t)threadIdx.x] = x[(int64_t)blockIdx.x * (int64_t)blockDim.x"
            " + (int64_t)threadIdx.x];"
        ),
        "    __syncthreads();",
        (
            "    out[(int64_t)blockIdx.x * (int64_t)blockDim.x + (int64_t)threadIdx.x]"
            " = tile[127LL - (int64_t)threadIdx.x];"
        ),
        "}",
    ]


def test_module_layout_and_determinism():
    dev = Function("twice", (a,), S.Return(a * 2.0), kind="device", ret=f32)
    call = E.Call("twice", (E.Load(x_ptr, i),), f32)
    kern = Function("k", (x_ptr, out_ptr, n), S.For(i, n, S.Store(out_ptr, i, call)))
    module = Module("m", (dev, kern))
    src = render_module(module)
    assert src == render_module(Module("m", (dev, kern)))
    assert src.startswith("// minicomp module m")
    assert "#ifndef MINICOMP_RUNTIME_H" in src
    body = src.split("#endif /* MINICOMP_RUNTIME_H */")[1]
    assert (
        body.index("static inline float twice(float a);")
        < body.index("static inline float twice(float a) {")
        < body.index("void k(")
    )
    assert "out[i] = twice(x[i]);" in body


def test_bad_function_names_are_refused():
    with pytest.raises(ValueError, match="C identifier"):
        render_module(Module("m", (Function("not-a-name", (), S.Seq(())),)))
    with pytest.raises(ValueError, match="two functions"):
        f = Function("k", (), S.Seq(()))
        render_module(Module("m", (f, f)))
