"""The naive matmul of Hidet's announcement, written in minicomp's script DSL.

One thread computes one element of C = A @ B in f32, summing over k in a loop. The sizes are
runtime parameters bound from the tensors' shapes. CUDA tensors run on the GPU; CPU tensors
run the same CUDA C in the cuda-emu emulator, so this example needs no GPU.

    python examples/script_naive_matmul.py --size 96 80 112 --show-cuda
"""

import argparse

import torch

import minicomp
from minicomp.script import attrs, blockDim, blockIdx, dim, f32, i32, threadIdx


@minicomp.script
def matmul(
    a: f32[dim.m, dim.k], b: f32[dim.k, dim.n], c: f32[dim.m, dim.n], m: i32, n: i32, k: i32
):
    attrs.grid_dim = ((m + 15) // 16, (n + 15) // 16)
    attrs.block_dim = (16, 16)
    i = threadIdx.x + blockIdx.x * blockDim.x
    j = threadIdx.y + blockIdx.y * blockDim.y
    if i < m and j < n:
        acc = 0.0  # a register: the post's version adds into c[i, j] in memory
        for kk in range(k):
            acc += a[i, kk] * b[kk, j]
        c[i, j] = acc


def naive_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A @ B by the script kernel (on the GPU for CUDA tensors, emulated for CPU ones)."""
    c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    matmul(a, b, c)  # m, n and k bind from the shapes
    return c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, nargs=3, default=(96, 80, 112), metavar=("M", "K", "N"))
    default = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument("--device", default=default, help="cuda, or cpu for the emulator")
    parser.add_argument("--show-cuda", action="store_true", help="print the kernel's CUDA C")
    args = parser.parse_args()

    torch.manual_seed(0)
    m, k, n = args.size
    a = torch.randn(m, k, device=args.device)
    b = torch.randn(k, n, device=args.device)
    c = naive_matmul(a, b)
    error = (c - torch.matmul(a, b)).abs().max().item()
    where = "on the GPU" if c.is_cuda else "in the cuda-emu emulator"
    print(f"naive matmul {m}x{k} @ {k}x{n} ran {where}; max error vs torch.matmul: {error:.2e}")
    torch.testing.assert_close(c, torch.matmul(a, b), rtol=1e-4, atol=1e-4)
    if args.show_cuda:
        source = matmul.source
        print(source[source.rindex('extern "C"') :])


if __name__ == "__main__":
    main()
