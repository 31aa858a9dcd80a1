"""The command line of the kernel benchmarks (benchmarks/matmul.py, attention.py, conv.py,
memory.py): one family's GPU cases, each row printed and appended to a JSON Lines file as it is
measured.

    python benchmarks/FAMILY.py [--dtypes f16,bf16] [--tiers 1,2] [--levels 0,1]
                                [--inductor MODE|none] [--out results.jsonl] ...
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from minicomp.bench.kernels.cases import SHORT, Env, measure_case
from minicomp.bench.kernels.families import FAMILIES
from minicomp.bench.kernels.table import header, line, summary
from minicomp.bench.kernels.timing import clock_for
from minicomp.bench.rows import RowWriter
from minicomp.dynamo.backend import ensure_registered


def parse_args(family: str, argv: list[str] | None) -> argparse.Namespace:
    doc = FAMILIES[family].__doc__
    p = argparse.ArgumentParser(prog=f"benchmarks/{family}.py", description=doc)
    p.add_argument("--dtypes", help="comma list of f16, bf16, f32, i8, f8 (default: the family's)")
    p.add_argument("--tiers", help="comma list of tiers to run (default: all; 1 is the core)")
    p.add_argument("--levels", default="0,1", help="minicomp search spaces to compare")
    p.add_argument("--repeat", type=int, default=20, help="timed rounds (medians are reported)")
    p.add_argument("--inner", type=int, default=10, help="calls per timed graph replay")
    p.add_argument("--tune-budget", type=int, default=10, help="seconds of tuning per kernel")
    p.add_argument(
        "--inductor",
        default="max-autotune-no-cudagraphs",
        help="Inductor mode for the cases that compare with it ('none': never)",
    )
    p.add_argument("--cache-dir", help="minicomp cache (default: a fresh one)")
    p.add_argument("--out", help="append each row to this JSON Lines file")
    return p.parse_args(argv)


def main(family: str, argv: list[str] | None = None) -> int:
    """Run one family on the GPU; 0 when every case ran (a wrong result is still a result)."""
    args = parse_args(family, argv)
    if not torch.cuda.is_available():
        print(f"benchmarks/{family}.py needs a CUDA GPU; none is available here, nothing measured.")
        return 0
    ensure_registered()
    module = FAMILIES[family]
    dtypes = [SHORT[d] for d in args.dtypes.split(",")] if args.dtypes else None
    cases = module.gpu_cases(dtypes) if dtypes else module.gpu_cases()
    if args.tiers:
        tiers = {int(t) for t in args.tiers.split(",")}
        cases = [c for c in cases if c.tier in tiers]
    levels = tuple(int(x) for x in args.levels.split(","))
    writer = RowWriter(args.out)
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"minicomp-{family}-") as fresh:
        env = Env(
            device="cuda",
            target="cuda",
            clock=clock_for("cuda"),
            cache_dir=args.cache_dir or fresh,
            levels=levels,
            tune_budget=args.tune_budget,
            repeat=args.repeat,
            inner=args.inner,
            inductor_mode=None if args.inductor == "none" else args.inductor,
        )
        print(header(levels), flush=True)
        for case in cases:
            row = {"kind": "case", **measure_case(case, env)}
            writer.write(row)
            rows.append(row)
            print(line(row, levels), flush=True)
    print(summary(rows, levels))
    return 0
