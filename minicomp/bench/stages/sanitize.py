"""One small run of every kind of kernel minicomp generates, for compute-sanitizer to watch.

    python -m minicomp.bench.stages.sanitize --target cuda --rows FILE [--kinds a,b]

Each workload is compiled with fallback=error, run once on fresh random inputs and compared
with a float64 eager reference, and must be computed the way it names (the matmul SIMT and
tensor-core templates, implicit-GEMM convolution, split-K, attention; depthwise convolution,
a row reduction and an elementwise chain as generated kernels, no ATen call among them). The
emulator does not model the timing of cp.async, so on a GPU under racecheck and synccheck is
where a missing wait or barrier shows. Exit status 0 when every workload is right.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minicomp.bench.measure import relative_error
from minicomp.bench.rows import RowWriter
from minicomp.dynamo.backend import ensure_registered, recording
from minicomp.ir.graph import ExternOp
from minicomp.targets import get_target


@dataclass(frozen=True)
class Workload:
    """A function, its inputs (made on a device), and how it must be computed."""

    kind: str
    fn: Callable
    make: Callable[[str], tuple]
    template: str | None  # a kernel of this template must run; None: generated kernels only
    min_kernels: int = 1
    tolerance: float = 2e-2


def _rand(*shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=dtype)


def _chain(x):
    y = x * 1.7 + 0.3
    return torch.sqrt(torch.abs(torch.relu(y) * y - x) + 1.0)


WORKLOADS = (
    Workload(
        "matmul_simt",
        torch.matmul,
        lambda d: (_rand(67, 45, device=d), _rand(45, 38, device=d)),
        "matmul_simt",
        tolerance=1e-4,
    ),
    Workload(
        "matmul_tc",
        lambda x, w, b: torch.relu(F.linear(x, w, b)),
        lambda d: tuple(
            _rand(*s, dtype=torch.float16, device=d) for s in ((70, 96), (40, 96), (40,))
        ),
        "matmul_tc",
    ),
    Workload(
        "conv",
        lambda x, w: F.conv2d(x, w, stride=2, padding=1),
        lambda d: (
            _rand(2, 16, 11, 11, dtype=torch.float16, device=d).to(
                memory_format=torch.channels_last
            ),
            _rand(24, 16, 3, 3, dtype=torch.float16, device=d) / 12,
        ),
        "matmul_tc",
    ),
    Workload(
        "depthwise",
        lambda x, w: F.conv2d(x, w, padding=1, groups=8),
        lambda d: (_rand(2, 8, 9, 9, device=d), _rand(8, 1, 3, 3, device=d)),
        None,
        tolerance=1e-4,
    ),
    Workload(
        "attention",
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda d: tuple(_rand(1, 2, 40, 32, dtype=torch.float16, device=d) for _ in range(3)),
        "attention",
    ),
    Workload(
        "split_k",
        torch.matmul,
        lambda d: (
            _rand(16, 8192, dtype=torch.float16, device=d) / 8,
            _rand(8192, 32, dtype=torch.float16, device=d) / 8,
        ),
        "matmul_tc",
        min_kernels=2,
    ),
    Workload(
        "reduction",
        lambda x: torch.softmax(x * 0.5, dim=-1),
        lambda d: (_rand(33, 1000, device=d),),
        None,
        tolerance=1e-4,
    ),
    Workload(
        "elementwise",
        _chain,
        lambda d: (_rand(300, 70, dtype=torch.float16, device=d).t(),),
        None,
    ),
)


def run_workload(work: Workload, target: str, device: str, cache_dir: str) -> dict:
    """Compile and run one workload; its row (ok, error, templates, kernels, seconds)."""
    row = {"kind": "workload", "workload": work.kind, "target": target, "ok": False}
    start = time.perf_counter()
    try:
        torch._dynamo.reset()
        inputs = work.make(device)
        expected = work.fn(*(t.double() for t in inputs)).float()
        options = {
            "target": target,
            "fallback": "error",
            "cuda_graphs": False,
            "cache_dir": cache_dir,
        }
        compiled = torch.compile(work.fn, backend="minicomp", options=options, dynamic=False)
        records: list = []
        with recording(records):
            out = compiled(*inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        kernels = [k for r in records for k in r.kernels]
        templates = sorted({(k.attrs.template or "").split("[")[0] for k in kernels} - {""})
        aten = [
            n.name for r in records if r.graph for n in r.graph.nodes if isinstance(n, ExternOp)
        ]
        row.update(templates=templates, kernels=len(kernels), aten_ops=aten)
        row["rel_err"] = relative_error(out.float(), expected)
        problems = []
        if row["rel_err"] > work.tolerance:
            problems.append(f"error {row['rel_err']:.2e} over {work.tolerance:.0e}")
        if work.template and work.template not in templates:
            problems.append(f"ran {templates or 'no template'}, not {work.template}")
        if len(kernels) < work.min_kernels:
            problems.append(f"{len(kernels)} kernels, expected at least {work.min_kernels}")
        if aten and work.template is None:
            problems.append(f"ATen calls {aten}")
        row["ok"] = not problems
        row["problems"] = problems
    except Exception as err:  # one broken workload must not hide the others
        row["error"] = f"{type(err).__name__}: {err}"[:600]
    row["seconds"] = round(time.perf_counter() - start, 2)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="cuda", choices=("cuda", "cuda-emu"))
    parser.add_argument("--rows", default=None, help="append each workload's row here")
    parser.add_argument("--kinds", default=None, help="comma list (default: every kind)")
    parser.add_argument("--cache-dir", default=None, help="minicomp cache (default: a fresh one)")
    parser.add_argument("--label", default="", help="added to each row (the sanitizer tool)")
    args = parser.parse_args(argv)
    kinds = set(args.kinds.split(",")) if args.kinds else {w.kind for w in WORKLOADS}
    unknown = kinds - {w.kind for w in WORKLOADS}
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}")
    device = get_target(args.target).device
    ensure_registered()
    rows = RowWriter(args.rows)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="minicomp-sanitize-") as fresh:
        for work in WORKLOADS:
            if work.kind not in kinds:
                continue
            row = run_workload(work, args.target, device, args.cache_dir or fresh)
            row["label"] = args.label
            rows.write(row)
            failed += not row["ok"]
            detail = row.get("error") or "; ".join(row.get("problems", [])) or "ok"
            print(f"  {work.kind:12} {row.get('templates', '')} {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
