"""GPU benchmark: one family of kernels (matmul, attention, conv, memory) compiled by minicomp
against the library PyTorch calls (cuBLAS, SDPA, cuDNN, eager) and Inductor.

    python benchmarks/kernel_bench.py FAMILY [--dtypes f16,bf16] [--tiers 1] [--levels 0,1]
                                        [--inductor MODE|none] [--out FAMILY.jsonl]

minicomp/bench/kernels/FAMILY.py has the cases, cases.py what a row holds. Each row is printed
and appended to --out the moment it is measured. The staged GPU run (bash
benchmarks/gpu_run.sh kernels) runs every family within a time budget. On a machine without
CUDA it says so and exits 0.
"""

import sys

from minicomp.bench.kernels.cli import main
from minicomp.bench.kernels.families import FAMILIES

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in FAMILIES:
        sys.exit(f"usage: python benchmarks/kernel_bench.py {{{','.join(FAMILIES)}}} [options]")
    sys.exit(main(sys.argv[1], sys.argv[2:]))
