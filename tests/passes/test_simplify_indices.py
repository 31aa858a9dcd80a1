"""Index simplification of kernels under the bounds of their loops."""

from minicomp.ir import types as T
from minicomp.ir.expr import Load, Var, const
from minicomp.ir.func import Function
from minicomp.ir.stmt import For, Store
from minicomp.passes.kernel.simplify_indices import simplify_indices


def _copy_kernel(index_of):
    i, j = Var("i", T.i64), Var("j", T.i64)
    src, dst = Var("src", T.PointerType(T.f32)), Var("dst", T.PointerType(T.f32))
    store = Store(dst, i * 16 + j, Load(src, index_of(i, j)))
    body = For(i, const(8), For(j, const(16), store, "vectorize"), "parallel")
    return Function("copy", (src, dst), body), i, j


def test_mod_and_div_by_the_loop_extent_vanish():
    fn, i, j = _copy_kernel(lambda i, j: ((i * 16 + j) // 16) * 16 + (i * 16 + j) % 16)
    out = simplify_indices(fn)
    store = out.body.body.body
    assert store.value.index == i * 16 + j


def test_mod_that_the_bounds_do_not_settle_stays():
    fn, i, j = _copy_kernel(lambda i, j: (i * 16 + j) % 12)
    out = simplify_indices(fn)
    assert "%" in str(out)


def test_unchanged_kernel_is_returned_as_is():
    fn, _, _ = _copy_kernel(lambda i, j: i * 16 + j)
    assert simplify_indices(fn) is fn
