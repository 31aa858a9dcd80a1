"""GPU benchmark: scaled_dot_product_attention compiled by minicomp (the fused attention
template) at search space 0 and 2 against torch.nn.functional.scaled_dot_product_attention
(PyTorch's flash / memory-efficient / cuDNN kernels), in TFLOP/s.

    python benchmarks/attention.py [--dtypes f16,bf16] [--shapes 1x32x1024x128,...]
                                   [--causal both] [--levels 0,2] [--repeat 20]
                                   [--out benchmarks/results/attention-DATE.json]

Shapes are B x H x S x D (batch, heads, sequence length, head dim; Sq = Sk = S), by default
(1, 32, 1024, 128), (8, 16, 2048, 64) and (4, 32, 4096, 128), each causal and not. FLOPs
count the two products, 4 B H S^2 D, halved when causal (the masked half is skipped). Each
function is captured, with every backend alike, in one CUDA graph of `--inner` calls rotating
through input copies that together exceed twice the L2 cache, and the graph's replays are
timed with CUDA events (median of `--repeat`). minicomp compiles with cuda_graphs off (the
benchmark's own graph replaces its) into a fresh cache directory, so search space 2 really
tunes (at most `--tune-budget` seconds a kernel); "tune s" is the first call's extra time
over search space 0. "fused" says whether the attention ran as minicomp's kernel (a tuned
graph keeps PyTorch's call where it measured faster). Errors are against PyTorch's output.
On a machine without CUDA it says so and exits 0.
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

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
SHAPES = [(1, 32, 1024, 128), (8, 16, 2048, 64), (4, 32, 4096, 128)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", default="f16,bf16")
    p.add_argument("--shapes", default=None, help="BxHxSxD items (default: the three above)")
    p.add_argument("--causal", default="both", choices=("both", "yes", "no"))
    p.add_argument("--levels", default="0,2", help="minicomp search spaces to compare")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--inner", type=int, default=10, help="calls per timed graph replay")
    p.add_argument(
        "--tune-budget", type=int, default=120, help="seconds of tuning per kernel (0: no limit)"
    )
    p.add_argument("--cache-dir", default=None, help="minicomp cache (default: a fresh one)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def shapes_from(text: str | None) -> list[tuple[int, int, int, int]]:
    if not text:
        return list(SHAPES)
    out = []
    for item in text.split(","):
        b, h, s, d = (int(x) for x in item.lower().split("x"))
        out.append((b, h, s, d))
    return list(dict.fromkeys(out))


def input_copies(b: int, h: int, s: int, d: int, dtype: torch.dtype) -> list[tuple]:
    """(Q, K, V) triples to rotate through, together beyond twice the L2 cache."""
    triple = 3 * b * h * s * d * torch.empty((), dtype=dtype).element_size()

    def make() -> tuple:
        return tuple(torch.randn(b, h, s, d, device="cuda", dtype=dtype) for _ in range(3))

    return copies_beyond_l2(make, triple)


def attention(causal: bool):
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def fused_in(records: list) -> bool:
    """Whether the compiled graphs launch minicomp's attention template."""
    from minicomp.ir.graph import KernelOp

    return any(
        isinstance(n, KernelOp) and n.function.attr("template", "").startswith("attention")
        for r in records
        if r.graph is not None
        for n in r.graph.nodes
    )


def bench_one(shape, dtype, causal, levels, args, cache_dir) -> dict:
    b, h, s, d = shape
    copies = input_copies(b, h, s, d, dtype)
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    row = {"b": b, "h": h, "s": s, "d": d, "causal": causal}
    row["dtype"] = str(dtype).removeprefix("torch.")
    fn = attention(causal)
    row["torch_s"] = time_graph(fn, copies, args.inner, args.repeat)
    q, k, v = copies[0]
    expected = fn(q, k, v).float()
    measure_levels(
        row, fn, copies, expected, flops, levels, args, cache_dir, lambda r: {"fused": fused_in(r)}
    )
    return row


def print_row(row: dict, levels: list[int]) -> None:
    shape = f"{row['b']}x{row['h']}x{row['s']}x{row['d']}"
    cells = [f"{shape:>16}", f"{row['dtype']:>8}", f"{'yes' if row['causal'] else 'no':>6}"]
    cells.append(f"{row['torch_s'] * 1e3:9.3f}")
    cells.append(f"{row['torch_tflops']:7.1f}")
    for level in levels:
        tflops = row.get(f"mc{level}_tflops")
        ratio = tflops / row["torch_tflops"] if tflops else None
        cells.append(f"{row[f'mc{level}_s'] * 1e3:9.3f}" if tflops else f"{'error':>9}")
        cells.append(f"{tflops:7.1f}" if tflops else f"{'-':>7}")
        cells.append(f"{ratio:6.2f}x" if ratio else f"{'-':>7}")
        cells.append(f"{'yes' if row.get(f'mc{level}_fused') else 'no':>5}")
    for level in levels:
        if level:
            tune = row.get(f"mc{level}_tune_s")
            cells.append(f"{tune:8.1f}" if tune is not None else f"{'-':>8}")
    bad = [lv for lv in levels if row.get(f"mc{lv}_max_rel_err", 0) > 3e-2]
    cells.append("WRONG: search space " + ",".join(map(str, bad)) if bad else "")
    print("  ".join(cells), flush=True)
    for level in levels:
        if f"mc{level}_error" in row:
            print(f"    search space {level}: {row[f'mc{level}_error']}", flush=True)


def header(levels: list[int]) -> str:
    cells = [f"{'B x H x S x D':>16}", f"{'dtype':>8}", f"{'causal':>6}"]
    cells += [f"{'torch ms':>9}", f"{'TFLOP/s':>7}"]
    for level in levels:
        cells += [f"{'mc' + str(level) + ' ms':>9}", f"{'TFLOP/s':>7}", f"{'ratio':>7}"]
        cells += [f"{'fused':>5}"]
    cells += [f"{'tune s':>8}" for level in levels if level]
    return "  ".join(cells) + "\n" + "ratio = minicomp / F.scaled_dot_product_attention"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/attention.py needs a CUDA GPU; none is available here, nothing measured.")
        return 0
    import minicomp  # noqa: F401  (registers the backend; fails early when not installed)

    levels = [int(x) for x in args.levels.split(",")]
    dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    info = device_info()
    print(f"{info['device']}, torch {info['torch']}, commit {info['commit'][:10]}, {info['date']}")
    print(header(levels), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="minicomp-attention-") as fresh:
        cache_dir = args.cache_dir or fresh
        for dtype in dtypes:
            for shape in shapes_from(args.shapes):
                for causal in causals:
                    row = bench_one(shape, dtype, causal, levels, args, cache_dir)
                    rows.append(row)
                    print_row(row, levels)
                    torch.cuda.empty_cache()
    report_geomeans(rows, levels, "PyTorch")
    write_json(args.out, info, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
