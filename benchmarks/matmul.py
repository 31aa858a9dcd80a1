"""GPU benchmark: matrix products compiled by minicomp at search space 0 and 2 against
torch.matmul (cuBLAS), in TFLOP/s, with the time tuning took per kernel.

    python benchmarks/matmul.py [--dtypes f16,bf16,f32] [--shapes square,llm,splitk]
                                [--levels 0,2] [--repeat 20]
                                [--out benchmarks/results/matmul-DATE.json]

Shapes are M x N x K (C[M, N] = A[M, K] @ B[K, N]): squares from 1024 to 8192 and the
products of a 7B LLM's layers (4096 x 11008 x 4096 up/gate, 4096 x 4096 x 11008 down) at
batch-token counts 1, 16, 128 and 4096, and products with few output tiles over a long K
that minicomp splits along K ("splitk": 16 x 4096 x 11008 ... 64 x 64 x 65536). Each
function is captured, with every backend alike, in one CUDA graph of `--inner` calls
rotating through input copies that together exceed twice the L2 cache, and the graph's
replays are timed with CUDA events (median of `--repeat`), so neither launch overhead nor a
warm L2 flatters anyone. minicomp compiles with cuda_graphs off (the benchmark's own graph
replaces its) into a fresh cache directory, so search space 2 really tunes (at most
`--tune-budget` seconds a kernel); "tune s" is the first call's extra time over search
space 0.
On a machine without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch
from gpu_timing import (
    copies_beyond_l2,
    device_info,
    measure_levels,
    report_geomeans,
    time_graph,
    write_json,
)

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
SQUARE = [(n, n, n) for n in (1024, 2048, 4096, 8192)]
LLM = [
    (tokens, n, k)
    for tokens in (1, 16, 128, 4096)
    for n, k in ((11008, 4096), (4096, 11008), (4096, 4096))
]
# Few output tiles over a long K, which minicomp computes split-K (passes/graph/split_k.py):
# decode-sized products of LLM down projections and long-K reductions with a small output.
SPLIT_K = [(16, 4096, 11008), (32, 4096, 14336), (16, 1024, 16384), (64, 64, 65536)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", default="f16,bf16,f32")
    p.add_argument(
        "--shapes", default="square,llm,splitk", help="square, llm, splitk, or MxNxK items"
    )
    p.add_argument("--levels", default="0,2", help="minicomp search spaces to compare")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--inner", type=int, default=10, help="calls per timed graph replay")
    p.add_argument(
        "--tune-budget", type=int, default=60, help="seconds of tuning per kernel (0: no limit)"
    )
    p.add_argument("--tf32", action="store_true", help="let torch.matmul use TF32 for f32")
    p.add_argument("--cache-dir", default=None, help="minicomp cache (default: a fresh one)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def shapes_from(text: str) -> list[tuple[int, int, int]]:
    out = []
    for item in text.split(","):
        if item == "square":
            out += SQUARE
        elif item == "llm":
            out += LLM
        elif item == "splitk":
            out += SPLIT_K
        else:
            m, n, k = (int(x) for x in item.lower().split("x"))
            out.append((m, n, k))
    return list(dict.fromkeys(out))


def input_copies(m: int, n: int, k: int, dtype: torch.dtype) -> list[tuple]:
    """(A, B) pairs to rotate through, together beyond twice the L2 cache."""
    pair = (m * k + k * n) * torch.empty((), dtype=dtype).element_size()

    def make() -> tuple:
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        return a, torch.randn(k, n, device="cuda", dtype=dtype)

    return copies_beyond_l2(make, pair)


def bench_one(m, n, k, dtype, levels, args, cache_dir) -> dict:
    copies = input_copies(m, n, k, dtype)
    flops = 2 * m * n * k
    row = {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch.")}
    row["torch_s"] = time_graph(torch.matmul, copies, args.inner, args.repeat)
    a, b = copies[0]
    expected = (a.double() @ b.double()).float()
    measure_levels(row, torch.matmul, copies, expected, flops, levels, args, cache_dir)
    return row


def print_row(row: dict, levels: list[int]) -> None:
    shape = f"{row['m']}x{row['n']}x{row['k']}"
    cells = [f"{shape:>18}", f"{row['dtype']:>8}", f"{row['torch_tflops']:8.1f}"]
    for level in levels:
        tflops = row.get(f"mc{level}_tflops")
        ratio = tflops / row["torch_tflops"] if tflops else None
        cells.append(f"{tflops:8.1f}" if tflops else f"{'error':>8}")
        cells.append(f"{ratio:6.2f}x" if ratio else f"{'-':>7}")
    for level in levels:
        if level:
            tune = row.get(f"mc{level}_tune_s")
            cells.append(f"{tune:8.1f}" if tune is not None else f"{'-':>8}")
    bad = [
        lv
        for lv in levels
        if row.get(f"mc{lv}_max_rel_err", 0) > (5e-3 if "f32" in row["dtype"] else 3e-2)
    ]
    cells.append("WRONG: search space " + ",".join(map(str, bad)) if bad else "")
    print("  ".join(cells), flush=True)
    for level in levels:
        if f"mc{level}_error" in row:
            print(f"    search space {level}: {row[f'mc{level}_error']}", flush=True)


def header(levels: list[int]) -> str:
    cells = [f"{'M x N x K':>18}", f"{'dtype':>8}", f"{'torch':>8}"]
    for level in levels:
        cells += [f"{'mc' + str(level):>8}", f"{'ratio':>7}"]
    cells += [f"{'tune s':>8}" for level in levels if level]
    return "  ".join(cells) + "\n" + "TFLOP/s; ratio = minicomp / torch.matmul"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/matmul.py needs a CUDA GPU; none is available here, nothing measured.")
        return 0
    import minicomp  # noqa: F401  (registers nothing, but fails early when not installed)

    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    levels = [int(x) for x in args.levels.split(",")]
    dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    info = device_info()
    print(f"{info['device']}, torch {info['torch']}, commit {info['commit'][:10]}, {info['date']}")
    print(header(levels), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="minicomp-matmul-") as fresh:
        cache_dir = args.cache_dir or fresh
        for dtype in dtypes:
            for m, n, k in shapes_from(args.shapes):
                row = bench_one(m, n, k, dtype, levels, args, cache_dir)
                rows.append(row)
                print_row(row, levels)
                torch.cuda.empty_cache()
    report_geomeans(rows, levels, "torch.matmul")
    write_json(args.out, info, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
