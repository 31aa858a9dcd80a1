"""The performance lens on the templates: each matrix product, attention and convolution of the
GPU benchmark's lists (LLM and ResNet-50 shapes) at its level-0 choice, estimated on an H100
(or another described device) on this machine, without a GPU.

    python benchmarks/lens.py [--families matmul,attention,conv] [--tiers 1] [--dtypes f16]
                              [--device h100] [--out benchmarks/results/lens-h100.json]
                              [--hopper [--hopper-configs 0,1]]

Prints a row per case: the estimated time, the roofline time of its kernels and their ratio,
the bound, and the worst sector efficiency, bank-conflict factor, occupancy, registers and
spills of its kernels; then the geometric mean and the cases under 70% of roofline. --out
writes the rows as JSON, which the GPU validation's kernels stage puts beside what it measures.
--hopper adds, after each 16-bit matrix product, a row for the Hopper matmul
(minicomp/schedule/templates/matmul_hopper.py) at the fastest of its configs (or of those
--hopper-configs lists, by index), launched directly: its problem % is against the wgmma peak;
and after each 16-bit attention a row compiled for sm_90a, where the compiler picks the Hopper
attention (minicomp/schedule/templates/attention_hopper.py) for what it takes, its problem %
against the wgmma peak too.
"""

import argparse
import subprocess
import sys
import time

from minicomp.bench.kernels.cases import SHORT
from minicomp.bench.lens import (
    LENS_FAMILIES,
    cases,
    estimate_case,
    estimate_hopper,
    estimate_hopper_attention,
    summary,
    table,
    write,
)
from minicomp.schedule.templates.matmul_hopper import CONFIGS

HOPPER_DTYPES = ("float16", "bfloat16")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(LENS_FAMILIES))
    parser.add_argument("--tiers", default="1")
    parser.add_argument("--dtypes", default="f16", help="f16, bf16, f32, i8, f8 (comma separated)")
    parser.add_argument("--device", default="h100")
    parser.add_argument("--match", default="", help="only cases whose label contains this")
    parser.add_argument("--out", default="")
    parser.add_argument("--hopper", action="store_true", help="add the Hopper matmul's rows")
    parser.add_argument("--hopper-configs", default="", help="its configs by index (0,1)")
    args = parser.parse_args(argv)
    picked = [int(i) for i in args.hopper_configs.split(",") if i]
    hopper_configs = [CONFIGS[i] for i in picked] or None
    tiers = tuple(int(t) for t in args.tiers.split(","))
    dtypes = tuple(SHORT[d] for d in args.dtypes.split(","))
    selected = [c for c in cases(args.families.split(","), tiers, dtypes) if args.match in c.label]
    rows = []
    for case in selected:
        rows.append(estimate_case(case, args.device))
        print(f"{case.label}: {rows[-1].time_us:.1f} us ({rows[-1].seconds:.0f}s)", flush=True)
        if args.hopper and case.family == "matmul" and case.fields["dtype"] in HOPPER_DTYPES:
            rows.append(estimate_hopper(case, args.device, hopper_configs))
            r = rows[-1]
            print(f"{case.label} hopper: {r.time_us:.1f} us ({r.seconds:.0f}s)", flush=True)
        if args.hopper and case.family == "attention" and case.fields["dtype"] in HOPPER_DTYPES:
            rows.append(estimate_hopper_attention(case, args.device))
            r = rows[-1]
            print(f"{case.label} hopper: {r.time_us:.1f} us ({r.seconds:.0f}s)", flush=True)
    print()
    print(table(rows))
    print()
    print(summary(rows))
    if args.out:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        meta = {"device": args.device, "commit": commit, "date": time.strftime("%Y-%m-%d")}
        write(rows, args.out, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
