"""The numpy reference evaluator of compute definitions against numpy and PyTorch."""

import numpy as np
import pytest
import torch

from minicomp.ir import types as T
from minicomp.ir.compute import compute, reduce, tensor_input
from minicomp.ir.evaluate import evaluate
from minicomp.ir.expr import MATH_FUNCTIONS, Load, Var, binary, call, cast, const, select, size_var
from minicomp.ir.types import PointerType

rng = np.random.default_rng()


def _floats(*shape, dtype=np.float32):
    x = rng.standard_normal(shape).astype(dtype)
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf] if x.size >= 3 else x.reshape(-1)[:3]
    return x


def test_broadcast_add_and_cast():
    a = tensor_input("a", (3, 4), T.f32)
    b = tensor_input("b", (4,), T.i32)
    c = compute("c", (3, 4), lambda i, j: a[i, j] + cast(b[j], T.f32) * 2.0)
    x, y = _floats(3, 4), rng.integers(-5, 5, 4).astype(np.int32)
    out = evaluate(c, {"a": x, "b": y})
    assert out.dtype == np.float32 and out.shape == (3, 4)
    np.testing.assert_array_equal(out, x + y.astype(np.float32) * 2)


def test_reductions_match_torch():
    a = tensor_input("a", (4, 5, 6), T.f32)
    x = _floats(4, 5, 6)
    t = torch.from_numpy(x)
    for kind, ref in [
        ("sum", lambda: t.sum(1)),
        ("prod", lambda: t.prod(1)),
        ("max", lambda: t.amax(1)),
        ("min", lambda: t.amin(1)),
        ("argmax", lambda: t.argmax(1)),
        ("argmin", lambda: t.argmin(1)),
    ]:
        c = compute("c", (4, 6), lambda i, k, kind=kind: reduce(kind, (5,), lambda r: a[i, r, k]))
        got = torch.from_numpy(evaluate(c, {"a": x}))
        torch.testing.assert_close(got, ref(), equal_nan=True, msg=kind)


def test_argmax_flat_index_and_ties():
    a = tensor_input("a", (3, 2, 4), T.i64)
    x = rng.integers(0, 3, (3, 2, 4))
    c = compute("c", (3,), lambda i: reduce("argmax", (2, 4), lambda r, s: a[i, r, s]))
    np.testing.assert_array_equal(evaluate(c, {"a": x}), x.reshape(3, 8).argmax(1))
    assert evaluate(c, {"a": x}).dtype == np.int64


def test_any_all_and_nested_reduce():
    a = tensor_input("a", (3, 4), T.f32)
    x = np.where(rng.random((3, 4)) < 0.5, 0.0, 1.0).astype(np.float32)
    anyc = compute("c", (3,), lambda i: reduce("any", (4,), lambda r: a[i, r]))
    allc = compute("c", (3,), lambda i: reduce("all", (4,), lambda r: a[i, r]))
    np.testing.assert_array_equal(evaluate(anyc, {"a": x}), x.any(1))
    np.testing.assert_array_equal(evaluate(allc, {"a": x}), x.all(1))
    # A reduction inside another reduction's body: sum_r (a[i, r] - max_s a[i, s]).
    nested = compute(
        "n",
        (3,),
        lambda i: reduce("sum", (4,), lambda r: a[i, r] - reduce("max", (4,), lambda s: a[i, s])),
    )
    np.testing.assert_allclose(evaluate(nested, {"a": x}), (x - x.max(1, keepdims=True)).sum(1))


def test_referenced_computes_and_symbolic_sizes():
    n = size_var("s0")
    a = tensor_input("a", (n, 3), T.f64)
    m = compute("m", (n,), lambda i: reduce("sum", (3,), lambda r: a[i, r]))
    out = compute("o", (n, 3), lambda i, j: a[i, j] - m[i] / cast(n, T.f64))
    x = rng.standard_normal((5, 3))
    np.testing.assert_allclose(evaluate(out, {"a": x}, {"s0": 5}), x - x.sum(1)[:, None] / 5)
    with pytest.raises(ValueError):
        evaluate(out, {"a": x}, {"s0": 4})


def test_out_of_range_gather_raises():
    a = tensor_input("a", (4,), T.f32)
    x = np.zeros(4, np.float32)
    with pytest.raises(IndexError):
        evaluate(compute("c", (4,), lambda i: a[i + 1]), {"a": x})
    with pytest.raises(IndexError):
        evaluate(compute("c", (4,), lambda i: a[i - 1]), {"a": x})
    with pytest.raises(IndexError):  # the guard lets an out-of-range read through
        evaluate(compute("c", (5,), lambda i: select(i < 5, a[i], const(0.0))), {"a": x})


def test_reads_and_divisions_count_only_where_taken():
    # cat([a, b]) as generated code computes it: each branch runs only where it is selected.
    a, b = tensor_input("a", (3,), T.f32), tensor_input("b", (2,), T.f32)
    x, y = np.arange(3, dtype=np.float32), np.arange(2, dtype=np.float32) + 10
    cat = compute("cat", (5,), lambda i: select(i < 3, a[i], b[i - 3]))
    np.testing.assert_array_equal(evaluate(cat, {"a": x, "b": y}), np.concatenate([x, y]))
    n = tensor_input("n", (4,), T.i32)
    d = rng.integers(-3, 3, 4).astype(np.int32)
    safe = compute("q", (4,), lambda i: select(binary("ne", n[i], 0), 12 // n[i], n[i]))
    expected = np.where(d != 0, np.fix(12 / np.where(d == 0, 1, d)), d)
    np.testing.assert_array_equal(evaluate(safe, {"n": d}), expected)
    unguarded = compute("g", (5,), lambda i: (i < 5) & (a[i] > 0))
    with pytest.raises(IndexError):
        evaluate(unguarded, {"a": x})
    ok = compute("g", (5,), lambda i: (i < 3) & (a[i] > 0))
    np.testing.assert_array_equal(evaluate(ok, {"a": x}), np.array([0, 1, 1, 0, 0], bool))


def _int_binary(op, x, y):
    a, b = tensor_input("a", x.shape, T.i32), tensor_input("b", y.shape, T.i32)
    c = compute("c", x.shape, lambda i: binary(op, a[i], b[i]))
    return evaluate(c, {"a": x, "b": y})


def test_integer_division_semantics():
    x = rng.integers(-20, 20, 64).astype(np.int32)
    y = rng.integers(1, 7, 64).astype(np.int32) * rng.choice([-1, 1], 64).astype(np.int32)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    trunc = torch.div(tx, ty, rounding_mode="trunc")
    np.testing.assert_array_equal(_int_binary("idiv", x, y), trunc)
    np.testing.assert_array_equal(_int_binary("div", x, y), trunc)
    np.testing.assert_array_equal(_int_binary("imod", x, y), torch.fmod(tx, ty))
    np.testing.assert_array_equal(_int_binary("floordiv", x, y), torch.floor_divide(tx, ty))
    np.testing.assert_array_equal(_int_binary("mod", x, y), torch.remainder(tx, ty))
    with pytest.raises(ZeroDivisionError):
        _int_binary("div", x, np.zeros_like(y))


def test_shifts_and_integer_pow_match_torch():
    x = rng.integers(-50, 50, 64).astype(np.int32)
    s = rng.integers(-3, 40, 64).astype(np.int32)
    tx, ts = torch.from_numpy(x), torch.from_numpy(s)
    np.testing.assert_array_equal(_int_binary("shl", x, s), tx << ts)
    np.testing.assert_array_equal(_int_binary("shr", x, s), tx >> ts)
    b = rng.integers(-3, 4, 64).astype(np.int32)
    e = rng.integers(-3, 5, 64).astype(np.int32)
    np.testing.assert_array_equal(
        _int_binary("pow", b, e), torch.pow(torch.from_numpy(b), torch.from_numpy(e))
    )


def test_float_floor_mod_match_torch():
    x, y = _floats(64, dtype=np.float64), _floats(64, dtype=np.float64)[::-1].copy()
    y[5] = 0.0
    a, b = tensor_input("a", (64,), T.f64), tensor_input("b", (64,), T.f64)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    for op, ref in [
        ("floordiv", torch.floor_divide(tx, ty)),
        ("mod", torch.remainder(tx, ty)),
        ("max", torch.maximum(tx, ty)),
        ("min", torch.minimum(tx, ty)),
    ]:
        got = evaluate(
            compute("c", (64,), lambda i, op=op: binary(op, a[i], b[i])), {"a": x, "b": y}
        )
        torch.testing.assert_close(torch.from_numpy(got), ref, equal_nan=True, msg=op)


@pytest.mark.parametrize("dst", [T.i32, T.i8, T.u8, T.boolean, T.f16, T.bf16])
def test_casts_match_torch(dst):
    x = (rng.standard_normal(256) * 100).astype(np.float32)
    if not dst.is_float:
        x[:3] = [0.0, -0.0, 0.3]
    a = tensor_input("a", (256,), T.f32)
    got = evaluate(compute("c", (256,), lambda i: cast(a[i], dst)), {"a": x})
    ref = torch.from_numpy(x).to(T.to_torch(dst))
    if dst == T.bf16:
        ref = ref.float()
    np.testing.assert_array_equal(got, ref.numpy())


def test_select_const_and_load():
    a = tensor_input("a", (2, 3), T.f32)
    x = _floats(2, 3)
    c = compute("c", (2, 3), lambda i, j: select(a[i, j] > 0, a[i, j], const(-1.0)))
    np.testing.assert_array_equal(evaluate(c, {"a": x}), np.where(x > 0, x, -1.0))
    buf = Var("buf", PointerType(T.f32))
    flat = compute("f", (6,), lambda i: Load(buf, i))
    np.testing.assert_array_equal(evaluate(flat, {"buf": x}), x.reshape(-1))


@pytest.mark.parametrize("name", sorted(MATH_FUNCTIONS))
def test_every_math_function(name):
    x = _floats(32, dtype=np.float64)
    y = _floats(32, dtype=np.float64)[::-1].copy()
    a, b = tensor_input("a", (32,), T.f64), tensor_input("b", (32,), T.f64)
    args = (a, b)[: MATH_FUNCTIONS[name]]
    dt = T.boolean if name in ("isnan", "isinf", "signbit") else None
    c = compute("c", (32,), lambda i: call(name, *(t[i] for t in args), dtype=dt))
    got = torch.from_numpy(evaluate(c, {"a": x, "b": y}))
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    special = {"rint": torch.round, "gelu": torch.nn.functional.gelu}
    fn = special.get(name) or getattr(torch, name, None) or getattr(np, name)
    ref = fn(*(tx, ty)[: MATH_FUNCTIONS[name]])
    torch.testing.assert_close(got, torch.as_tensor(ref), equal_nan=True)
