"""GPU benchmark: ResNet-50's convolutions compiled by minicomp (implicit GEMM on the matmul
templates) at search space 0 and 2 against torch's conv2d (cuDNN), in TFLOP/s.

    python benchmarks/conv.py [--dtypes f16,bf16,f32] [--batch 32] [--levels 0,2]
                              [--out benchmarks/results/conv-DATE.json]

Every distinct convolution of torchvision's ResNet-50 (stride on the 3x3, as in v1.5), on
channels-last inputs, which is how one serves it. FLOPs are 2 N K P Q C R S. Timing is as in
benchmarks/matmul.py: one CUDA graph of `--inner` calls over inputs that together exceed
twice the L2 cache, median of `--repeat` replays; "tune s" is search space 2's extra first
call over search space 0's. On a machine without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch
import torch.nn.functional as F
from gpu_timing import (
    copies_beyond_l2,
    device_info,
    measure_levels,
    report_geomeans,
    time_graph,
    write_json,
)

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
# (in channels, out channels, input size, kernel, stride, padding)
RESNET50 = [
    (3, 64, 224, 7, 2, 3),
    (64, 64, 56, 1, 1, 0),
    (64, 64, 56, 3, 1, 1),
    (64, 256, 56, 1, 1, 0),
    (256, 64, 56, 1, 1, 0),
    (256, 128, 56, 1, 1, 0),
    (128, 128, 56, 3, 2, 1),
    (128, 512, 28, 1, 1, 0),
    (256, 512, 56, 1, 2, 0),
    (512, 128, 28, 1, 1, 0),
    (128, 128, 28, 3, 1, 1),
    (512, 256, 28, 1, 1, 0),
    (256, 256, 28, 3, 2, 1),
    (256, 1024, 14, 1, 1, 0),
    (512, 1024, 28, 1, 2, 0),
    (1024, 256, 14, 1, 1, 0),
    (256, 256, 14, 3, 1, 1),
    (1024, 512, 14, 1, 1, 0),
    (512, 512, 14, 3, 2, 1),
    (512, 2048, 7, 1, 1, 0),
    (1024, 2048, 14, 1, 2, 0),
    (2048, 512, 7, 1, 1, 0),
    (512, 512, 7, 3, 1, 1),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", default="f16,bf16,f32")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--levels", default="0,2", help="minicomp search spaces to compare")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--inner", type=int, default=10, help="calls per timed graph replay")
    p.add_argument("--tune-budget", type=int, default=60, help="seconds of tuning per kernel")
    p.add_argument("--cache-dir", default=None, help="minicomp cache (default: a fresh one)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def bench_one(layer: tuple, batch: int, dtype, levels, args, cache_dir) -> dict:
    c, k, size, r, stride, pad = layer
    out_size = (size + 2 * pad - r) // stride + 1
    flops = 2 * batch * k * out_size * out_size * c * r * r
    nbytes = (batch * c * size * size + k * c * r * r) * torch.empty((), dtype=dtype).itemsize

    def make() -> tuple:
        x = torch.randn(batch, c, size, size, device="cuda", dtype=dtype)
        w = torch.randn(k, c, r, r, device="cuda", dtype=dtype) / (c * r * r) ** 0.5
        cl = torch.channels_last
        return x.to(memory_format=cl), w.to(memory_format=cl)

    copies = copies_beyond_l2(make, nbytes)

    def conv(x, w):
        return F.conv2d(x, w, stride=stride, padding=pad)

    row = {"layer": f"{c}->{k} {size}x{size} k{r} s{stride}", "dtype": str(dtype)[6:]}
    row["torch_s"] = time_graph(conv, copies, args.inner, args.repeat)
    x, w = copies[0]
    expected = conv(x.double(), w.double()).float()
    measure_levels(row, conv, copies, expected, flops, levels, args, cache_dir)
    return row


def print_row(row: dict, levels: list[int]) -> None:
    cells = [f"{row['layer']:>28}", f"{row['dtype']:>9}", f"{row['torch_tflops']:8.1f}"]
    for level in levels:
        tflops = row.get(f"mc{level}_tflops")
        cells.append(f"{tflops:8.1f}" if tflops else f"{'error':>8}")
        cells.append(f"{tflops / row['torch_tflops']:6.2f}x" if tflops else f"{'-':>7}")
    for level in levels:
        if level:
            tune = row.get(f"mc{level}_tune_s")
            cells.append(f"{tune:8.1f}" if tune is not None else f"{'-':>8}")
    print("  ".join(cells), flush=True)
    for level in levels:
        if f"mc{level}_error" in row:
            print(f"    search space {level}: {row[f'mc{level}_error']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/conv.py needs a CUDA GPU; none is available here, nothing measured.")
        return 0
    import minicomp  # noqa: F401  (registers the backend; fails early when not installed)

    levels = [int(x) for x in args.levels.split(",")]
    info = device_info()
    print(f"{info['device']}, torch {info['torch']}, commit {info['commit'][:10]}, {info['date']}")
    cells = [f"{'layer':>28}", f"{'dtype':>9}", f"{'cuDNN':>8}"]
    for level in levels:
        cells += [f"{'mc' + str(level):>8}", f"{'ratio':>7}"]
    cells += [f"{'tune s':>8}" for level in levels if level]
    print("  ".join(cells) + "\nTFLOP/s; ratio = minicomp / cuDNN", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="minicomp-conv-") as fresh:
        for name in args.dtypes.split(","):
            for layer in RESNET50:
                row = bench_one(
                    layer, args.batch, DTYPES[name], levels, args, args.cache_dir or fresh
                )
                rows.append(row)
                print_row(row, levels)
                torch.cuda.empty_cache()
    report_geomeans(rows, levels, "cuDNN")
    write_json(args.out, info, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
