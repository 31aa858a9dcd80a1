"""A fused row softmax in the script DSL: one block per row, reductions by warp shuffles.

Each block of 4 warps reads its row three times: for the maximum, for the sum of
exp(x - max) and to write the result, so nothing overflows however large x is (the inputs
here are around 100, where exp(x) alone overflows f32). A warp reduces its threads' values
with `shfl_xor_sync` (device functions `warp_max` and `warp_sum`), and the warps combine
theirs through shared memory. Module-level ints are compile-time constants of the kernel.

    python examples/script_softmax.py --size 64 1000
"""

import argparse

import torch

import minicomp
from minicomp.script import (
    attrs,
    blockIdx,
    dim,
    exp,
    f32,
    i32,
    max,
    shared_tensor,
    shfl_xor_sync,
    syncthreads,
    threadIdx,
)

WARPS = 4
THREADS = 32 * WARPS
NEG_INF = float("-inf")


@minicomp.script
def warp_max(v: f32) -> f32:
    for delta in (16, 8, 4, 2, 1):  # a compile-time tuple: the body is repeated
        v = max(v, shfl_xor_sync(v, delta))
    return v  # every lane ends with the warp's maximum


@minicomp.script
def warp_sum(v: f32) -> f32:
    for delta in (16, 8, 4, 2, 1):
        v += shfl_xor_sync(v, delta)
    return v


@minicomp.script
def softmax(x: f32[dim.rows, dim.n], y: f32[dim.rows, dim.n], rows: i32, n: i32):
    attrs.grid_dim = rows
    attrs.block_dim = THREADS
    partial = shared_tensor(f32, WARPS)  # one value per warp
    r = blockIdx.x
    t = threadIdx.x
    warp = t // 32

    v = NEG_INF
    for c in range(t, n, THREADS):
        v = max(v, x[r, c])
    v = warp_max(v)
    if t % 32 == 0:
        partial[warp] = v
    syncthreads()
    row_max = partial[0]
    for w in range(1, WARPS):
        row_max = max(row_max, partial[w])
    syncthreads()  # every warp has read `partial` before it is reused

    s = 0.0
    for c in range(t, n, THREADS):
        s += exp(x[r, c] - row_max)
    s = warp_sum(s)
    if t % 32 == 0:
        partial[warp] = s
    syncthreads()
    total = 0.0
    for w in range(WARPS):
        total += partial[w]

    scale = 1.0 / total
    for c in range(t, n, THREADS):
        y[r, c] = exp(x[r, c] - row_max) * scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, nargs=2, default=(64, 1000), metavar=("ROWS", "COLS"))
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default, help="cuda, or cpu for the emulator")
    args = parser.parse_args()

    torch.manual_seed(0)
    rows, cols = args.size
    x = torch.randn(rows, cols, device=args.device) * 5 + 100
    y = torch.full_like(x, float("nan"))
    softmax(x, y)
    expected = torch.softmax(x, dim=-1)
    error = (y - expected).abs().max().item()
    where = "on the GPU" if y.is_cuda else "in the cuda-emu emulator"
    print(f"softmax of {rows}x{cols} ran {where}; max error vs torch.softmax: {error:.2e}")
    torch.testing.assert_close(y, expected)


if __name__ == "__main__":
    main()
