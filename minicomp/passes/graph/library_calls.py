"""ATen calls the cpu target leaves to a vendor library on purpose say so, not "no lowering".

The importer has no lowering for matrix products (`_int_mm`'s int8 one and `_scaled_mm`'s
float8 one too) and convolutions: the CUDA targets compute them with templates (anchors.py
rewrites them there), while on the cpu target ATen's BLAS GEMM (MKL or OpenBLAS), its int8
GEMM (and float8's, dequantized to a BLAS GEMM) and oneDNN's convolution beat a generated loop
nest, so they stay ATen calls. Those calls carried the importer's reason, "no
lowering", which reads as a gap in the compiler; this pass gives them the reason they really
have, `ATen by design on cpu: <library>`, which `minicomp explain` groups apart from the ops
minicomp cannot compute.

It runs first among the cpu target's passes, so the reasons later passes build on (a folded
batch norm, products fused horizontally) start from it.
"""

from __future__ import annotations

import torch

from minicomp.ir.graph import ExternOp, Graph
from minicomp.ops.registry import NO_LOWERING

aten = torch.ops.aten

# What every reason given here starts with; explain groups calls by it.
BY_DESIGN = "ATen by design"

# ATen op -> the library ATen runs it with on the CPU.
CPU_LIBRARIES = {
    aten.mm.default: "BLAS GEMM",
    aten.addmm.default: "BLAS GEMM",
    aten.bmm.default: "BLAS batched GEMM",
    aten.baddbmm.default: "BLAS batched GEMM",
    aten._int_mm.default: "int8 GEMM",
    aten._scaled_mm.default: "float8 GEMM (dequantized to a BLAS GEMM)",
    aten.convolution.default: "convolution (oneDNN)",
    aten._scaled_dot_product_flash_attention_for_cpu.default: "fused attention (flash, for CPU)",
}


def by_design(device: str, library: str) -> str:
    """The reason of an ATen call left on `device` to `library` on purpose."""
    return f"{BY_DESIGN} on {device}: {library}"


def name_library_calls(graph: Graph) -> Graph:
    """`graph` with each ATen call of CPU_LIBRARIES that has no lowering given the reason
    `by_design("cpu", library)`; the same graph when there is none."""
    nodes = []
    changed = False
    for n in graph.nodes:
        library = CPU_LIBRARIES.get(n.target) if isinstance(n, ExternOp) else None
        if library is not None and n.reason == NO_LOWERING:
            n = n.replace(reason=by_design("cpu", library))
            changed = True
        nodes.append(n)
    return graph.replace(nodes=tuple(nodes)) if changed else graph
