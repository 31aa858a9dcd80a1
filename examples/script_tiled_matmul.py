"""A tiled shared-memory matmul written as a script template, with task mappings.

`make_tiled_matmul(bm, bn, bk, tm, tn)` is an ordinary Python function: its arguments are
compile-time constants of the kernel it returns. Each block computes a bm x bn tile of C; its
threads copy a bm x bk tile of A and a bk x bn tile of B into shared memory together (the
composed task mappings `repeat(r, 1) * spatial(rows, cols)` give every thread its elements),
then each thread accumulates a tm x tn register tile: `spatial(bm // tm, bn // tn)` places the
threads, `repeat(tm, tn)` walks a thread's tile. Guards make any M, N, K work. On a GPU it is
timed against torch.matmul; on CPU it runs in the emulator (slowly, so at a small size).

    python examples/script_tiled_matmul.py --size 100 72 90 --tiles 64 64 8 4 4
"""

import argparse

import torch

import minicomp
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

TILES = (128, 128, 8, 8, 8)  # bm, bn, bk, tm, tn: 256 threads, 64 accumulators each


def make_tiled_matmul(bm: int, bn: int, bk: int, tm: int, tn: int):
    """A kernel computing C = A @ B (f32) with bm x bn tiles, bk-deep steps, tm x tn per thread."""
    # Each thread owns a tm x tn block of the tile: `threads_grid * register_tile`, iterated as
    # two loops so that the register tile is indexed by the repeat loops' own variables
    # (constants once unrolled, which keeps `acc` in registers).
    threads_grid, register_tile = spatial(bm // tm, bn // tn), repeat(tm, tn)
    threads = threads_grid.num_workers
    # Consecutive threads read consecutive columns of a tile: coalesced global loads.
    load_a = repeat(bm * bk // threads, 1) * spatial(threads // bk, bk)
    load_b = repeat(bk * bn // threads, 1) * spatial(threads // bn, bn)
    if load_a.task_shape != (bm, bk) or load_b.task_shape != (bk, bn):
        raise ValueError(f"{threads} threads cannot share {bm}x{bk} and {bk}x{bn} tiles evenly")

    @minicomp.script
    def tiled_matmul(
        a: f32[dim.m, dim.k], b: f32[dim.k, dim.n], c: f32[dim.m, dim.n], m: i32, n: i32, k: i32
    ):
        attrs.grid_dim = ((n + bn - 1) // bn, (m + bm - 1) // bm)
        attrs.block_dim = threads
        sa = shared_tensor(f32, (bm, bk))
        sb = shared_tensor(f32, (bk, bn))
        acc = register_tensor(f32, (tm, tn))
        for i, j in register_tile.on(0):
            acc[i, j] = 0.0
        t = threadIdx.x
        m0 = blockIdx.y * bm
        n0 = blockIdx.x * bn
        for k0 in range(0, k, bk):
            for i, j in load_a.on(t):
                inside = m0 + i < m and k0 + j < k
                sa[i, j] = a[m0 + i, k0 + j] if inside else 0.0
            for i, j in load_b.on(t):
                inside = k0 + i < k and n0 + j < n
                sb[i, j] = b[k0 + i, n0 + j] if inside else 0.0
            syncthreads()
            for kk in unroll(range(bk)):
                for i0, j0 in threads_grid.on(t):
                    for i, j in register_tile.on(0):
                        acc[i, j] += sa[i0 * tm + i, kk] * sb[kk, j0 * tn + j]
            syncthreads()
        for i0, j0 in threads_grid.on(t):
            for i, j in register_tile.on(0):
                row, col = m0 + i0 * tm + i, n0 + j0 * tn + j
                if row < m and col < n:
                    c[row, col] = acc[i, j]

    return tiled_matmul


def median_ms(fn, repeat: int = 50) -> float:
    """The median time of `fn` on the GPU in milliseconds (CUDA events, after a warm-up)."""
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeat):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[repeat // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, nargs=3, metavar=("M", "K", "N"))
    parser.add_argument("--tiles", type=int, nargs=5, default=TILES, help="BM BN BK TM TN")
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default, help="cuda, or cpu for the emulator")
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    m, k, n = args.size or ((2048, 2048, 2048) if gpu else (100, 72, 90))

    torch.manual_seed(0)
    a = torch.randn(m, k, device=args.device)
    b = torch.randn(k, n, device=args.device)
    c = torch.full((m, n), float("nan"), device=args.device)
    kernel = make_tiled_matmul(*args.tiles)
    kernel(a, b, c)
    expected = torch.matmul(a, b)
    error = (c - expected).abs().max().item()
    where = "on the GPU" if gpu else "emulated on the CPU (cuda-emu; no timing)"
    print(f"tiled matmul {m}x{k} @ {k}x{n} {where}; max error vs torch.matmul: {error:.2e}")
    torch.testing.assert_close(c, expected, rtol=1e-4, atol=1e-3 * k**0.5)
    if gpu:
        ours, torchs = median_ms(lambda: kernel(a, b, c)), median_ms(lambda: torch.matmul(a, b))
        print(f"script {ours:.3f} ms, torch.matmul {torchs:.3f} ms, ratio {ours / torchs:.2f}x")


if __name__ == "__main__":
    main()
