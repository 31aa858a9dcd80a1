"""Task mappings: their index arithmetic against Hidet's definitions, and kernels iterating
them with `for i, j in m.on(threadIdx.x)` (a tiled shared-memory matmul among them)."""

import itertools
import math

import pytest
import torch

import minicomp
from minicomp.ir import stmt as S
from minicomp.ir import types as T
from minicomp.ir.expr import Var
from minicomp.ir.functor import collect
from minicomp.ir.symbols import compile_dims
from minicomp.script import (
    attrs,
    blockIdx,
    dim,
    f32,
    i32,
    register_tensor,
    repeat,
    shared_tensor,
    spatial,
    syncthreads,
    threadIdx,
    unroll,
)


def tasks_of(m, worker: int) -> list[tuple[int, ...]]:
    """The tasks `worker` performs, in loop order, by evaluating the mapping's expressions."""
    w = Var("w", T.i32)
    loops = m.on(w)
    evaluate = compile_dims(list(loops.indices))
    out = []
    for values in itertools.product(*(range(extent) for _, extent in loops.loops)):
        env = {"w": worker} | {v.name: x for (v, _), x in zip(loops.loops, values)}
        out.append(tuple(evaluate(env)))
    return out


def reference(kind: str, shape: tuple, worker: int) -> list[tuple]:
    """Hidet's definitions: spatial gives worker w its row-major task; repeat gives every
    task to worker 0."""
    if kind == "spatial":
        return [tuple(int(x) for x in _unravel(worker, shape))]
    return list(itertools.product(*(range(d) for d in shape)))


def _unravel(w: int, shape: tuple) -> list[int]:
    out = []
    for d in reversed(shape):
        out.append(w % d)
        w //= d
    return out[::-1]


@pytest.mark.parametrize("kind,shape", [("spatial", (4, 8)), ("spatial", (6,)), ("repeat", (2, 3))])
def test_basic_mappings_follow_their_definition(kind, shape):
    m = spatial(*shape) if kind == "spatial" else repeat(*shape)
    assert m.task_shape == shape
    assert m.num_workers == (math.prod(shape) if kind == "spatial" else 1)
    for w in range(m.num_workers):
        assert tasks_of(m, w) == reference(kind, shape, w)


COMPOSED = [
    spatial(2, 2) * repeat(2, 3),
    repeat(2, 1) * spatial(4, 8),
    spatial(2, 1) * repeat(1, 2) * spatial(2, 4),
    spatial(3) * repeat(2) * spatial(5),
]


@pytest.mark.parametrize("m", COMPOSED, ids=repr)
def test_composition_covers_every_task_once(m):
    done = [t for w in range(m.num_workers) for t in tasks_of(m, w)]
    assert sorted(done) == list(itertools.product(*(range(d) for d in m.task_shape)))


def test_composition_is_outer_block_times_inner_shape_plus_inner_task():
    outer, inner = spatial(2, 2), repeat(2, 3)
    m = outer * inner
    assert m.task_shape == (4, 6) and m.num_workers == 4
    for w in range(4):
        expected = [
            (a * 2 + b, c * 3 + d)
            for (a, c) in tasks_of(outer, w // inner.num_workers)
            for (b, d) in tasks_of(inner, w % inner.num_workers)
        ]
        assert tasks_of(m, w) == expected


def test_mapping_errors():
    with pytest.raises(ValueError, match="positive compile-time ints"):
        spatial(0, 4)
    with pytest.raises(ValueError, match="cannot compose"):
        spatial(2, 2) * repeat(2)


@minicomp.script
def tile_bias(x: f32[32, 64], y: f32[64], out: f32[32, 64]):
    attrs.grid_dim = (2, 2)
    attrs.block_dim = 128
    for i, j in (repeat(4, 1) * spatial(4, 32)).on(threadIdx.x):
        r = blockIdx.y * 16 + i
        c = blockIdx.x * 32 + j
        out[r, c] = x[r, c] * 2.0 + y[c]


def test_tiles_of_a_composed_mapping(script_target):
    x, y = torch.randn(32, 64), torch.randn(64)
    out = torch.full((32, 64), math.nan)
    tile_bias.with_target(script_target)(x, y, out)
    assert torch.equal(out, x * 2 + y)
    # The block has as many threads as the mapping has workers: no guard.
    assert not collect(tile_bias.ir.body, S.If)


@minicomp.script
def partial(out: f32[128, 6]):
    attrs.grid_dim = 1
    attrs.block_dim = 128
    for (t,) in spatial(96).on(threadIdx.x):
        for a in repeat(2).on(0):
            for b in repeat(3).on(0):
                out[t, a * 3 + b] = f32(t * 10 + a * 3 + b)


def test_extra_workers_do_nothing(script_target):
    out = torch.full((128, 6), math.nan)
    partial.with_target(script_target)(out)
    expected = (torch.arange(96)[:, None] * 10 + torch.arange(6)).float()
    assert torch.equal(out[:96], expected)
    assert out[96:].isnan().all()
    (guard,) = collect(partial.ir.body, S.If)
    assert "96" in repr(guard.cond)
    loops = collect(partial.ir.body, S.For)
    assert len({loop.var for loop in loops}) == 2  # nested repeats get distinct variables


def make_tiled_matmul(bm: int, bn: int, bk: int):
    """A shared-memory tiled matmul: 256 threads load an A and a B tile with spatial mappings
    and each computes a 2x2 block of the output tile."""
    compute = spatial(bm // 2, bn // 2) * repeat(2, 2)
    assert compute.num_workers == 256 and bm * bk == 256 and bk * bn == 256

    @minicomp.script
    def tiled_matmul(
        a: f32[dim.m, dim.k], b: f32[dim.k, dim.n], c: f32[dim.m, dim.n], m: i32, n: i32, k: i32
    ):
        attrs.grid_dim = ((n + bn - 1) // bn, (m + bm - 1) // bm)
        attrs.block_dim = 256
        sa = shared_tensor(f32, (bm, bk))
        sb = shared_tensor(f32, (bk, bn))
        acc = register_tensor(f32, (2, 2))
        for i, j in repeat(2, 2).on(0):
            acc[i, j] = 0.0
        t = threadIdx.x
        m0 = blockIdx.y * bm
        n0 = blockIdx.x * bn
        for k0 in range(0, k, bk):
            for i, j in spatial(bm, bk).on(t):
                sa[i, j] = a[m0 + i, k0 + j] if m0 + i < m and k0 + j < k else 0.0
            for i, j in spatial(bk, bn).on(t):
                sb[i, j] = b[k0 + i, n0 + j] if k0 + i < k and n0 + j < n else 0.0
            syncthreads()
            for kk in unroll(range(bk)):
                for i, j in compute.on(t):
                    acc[i % 2, j % 2] += sa[i, kk] * sb[kk, j]
            syncthreads()
        for i, j in compute.on(t):
            if m0 + i < m and n0 + j < n:
                c[m0 + i, n0 + j] = acc[i % 2, j % 2]

    return tiled_matmul


TILED = make_tiled_matmul(32, 32, 8)


@pytest.mark.parametrize("shape", [(64, 48, 32), (37, 50, 21)])
def test_tiled_matmul_with_task_mappings(script_target, shape):
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    c = torch.full((m, n), math.nan)
    TILED.with_target(script_target)(a, b, c)
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-4)
    # `t = threadIdx.x` and 256 threads: the mappings need no guard; one If is the bounds check.
    assert len(collect(TILED.ir.body, S.If)) == 1


def test_composed_mapping_indices_fold_for_register_tiles(script_target):
    """`acc[i % 4, j % 4]` of a spatial * repeat mapping indexes by the repeat loops alone, so
    the register tile stays in registers (no stack frame under NVRTC)."""
    m = spatial(16, 16) * repeat(4, 4)

    @minicomp.script
    def tile(out: f32[64, 64]):
        attrs.grid_dim = 1
        attrs.block_dim = 256
        acc = register_tensor(f32, (4, 4))
        for i, j in m.on(threadIdx.x):
            acc[i % 4, j % 4] = f32(i * 64 + j)
        for i, j in m.on(threadIdx.x):
            out[i, j] = acc[i % 4, j % 4]

    stores = [s for s in collect(tile.ir.body, S.Store) if s.buf.name == "acc"]
    assert stores and all("thread_idx" not in str(s.index) for s in stores)
    out = torch.full((64, 64), float("nan"))
    tile.with_target(script_target)(out)
    assert torch.equal(out.cpu(), torch.arange(4096.0).view(64, 64))
