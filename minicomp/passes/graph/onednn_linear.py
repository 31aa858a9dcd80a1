"""CPU matrix products as oneDNN's linear (over a prepacked constant weight, or over the
weight the graph holds) or, on Intel CPUs, as MKL's over a weight MKL prepacked.

A linear layer is an ATen `addmm(bias, x, W)` or `mm(x, W)`, W [K, N] the parameter read
transposed (nn.Linear's [N, K] weight), the parameter as it is (GPT-2's Conv1D) or, with
frozen weights, the concatenated weights of fused projections (horizontal.py). Here each
becomes `mkldnn._linear_pointwise`:

- With a constant W (options.freeze), over W reordered once by
  `mkldnn._reorder_linear_weight` for the product's row count (PackedLinear, onednn_calls.py).
- With W a graph value (a parameter passed as an input, a training backward's saved
  activation; or a constant, when the row count is symbolic), over W.t() as it is
  (onednn_calls.linear), when W is row-major or column-major, so that W.t() is a free view
  (oneDNN reorders any other layout on every call, a thousand times slower than MKL), and
  the product is large enough to pay for the call: rows x K x N at least MIN_UNPACKED_WORK
  (with a symbolic row count, K x N alone). This holds in every graph, training ones too.

Why oneDNN and not MKL: measured on this machine's AMD EPYC (one thread, process time,
GPT-2's shapes, M = 128 and 1024 rows), ATen's `addmm` (MKL's sgemm) and Inductor's
`mkl._mkl_linear` over an MKL-packed weight take the same time, while oneDNN's f32 linear
takes 0.45 of it (768 -> 3072 at M = 128: 6.27 ms, MKL-packed 6.21, oneDNN 2.76), at float32
accuracy (largest error 9e-7 of the largest output, MKL's 3e-7). MKL's packing gives
nothing; oneDNN's kernel is the win. Unpacked, oneDNN reorders the weight on each call and
still takes 0.42 to 0.54 of MKL's time at the shapes of GPT-2, BERT, ViT and TinyLlama (128
to 1576 rows), either weight layout, and 0.46 to 0.56 at a training backward's products
(the gradient of the input, and of the weight with the activation read transposed). Its
fixed cost (about 10 us) loses on small products: 16 x 256 x 256 takes 1.14 of MKL's time,
4 x 768 x 768 0.92, and one row of 768 x 3072 0.83.

Not on Intel CPUs: on an Intel Xeon with AVX-512 (2026-12-08, one thread, process time) oneDNN's
unpacked linear takes 0.96 to 1.10 of MKL's time over an nn.Linear weight and 1.16 to 1.52 over
a Conv1D one (GPT-2's block went from 0.96x Inductor's speed to 0.73x), and over prepacked
weights MKL's own packing (`mkl._mkl_linear`, what Inductor's freezing calls) takes 0.80 to
0.98 of the plain product's time where oneDNN's takes 0.88 to 1.07. So the library is the
`cpu_gemm` option's: `auto` (the default) is `mkl` on Intel CPUs with an MKL build of PyTorch,
`onednn` elsewhere; `mkl` leaves products over weight values to ATen (MKL's sgemm) and packs
constant weights with MKL (`MklPackedLinear`).
"""

from __future__ import annotations

import functools
import platform
from typing import NamedTuple

import torch

from minicomp.ir import types as T
from minicomp.ir.graph import ArgRef, ExternOp, Graph, Op, Value
from minicomp.passes.graph.layout import is_row_major, layouts_for
from minicomp.passes.graph.onednn_calls import MklPackedLinear, PackedLinear, linear

aten = torch.ops.aten
mkldnn = torch.ops.mkldnn

MIN_UNPACKED_WORK = 1 << 21
"""Multiply-adds (rows x K x N) from which oneDNN's unpacked linear beats MKL's sgemm on one
thread (measured crossover: about 1M to 2M)."""


def host_gemm_library() -> str:
    """What `cpu_gemm="auto"` means on this machine: "mkl" on an Intel CPU with an MKL build
    of PyTorch, else "onednn" (see the module docstring)."""
    return "mkl" if torch.backends.mkl.is_available() and _intel_cpu() else "onednn"


@functools.cache
def _intel_cpu() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
    except OSError:
        return "intel" in platform.processor().lower()


class Product(NamedTuple):
    """An ATen `mm`/`addmm` that oneDNN's linear computes: x [M, K] @ w [K, N] (+ bias)."""

    op: ExternOp
    x: Value
    w: Value
    bias: Value | None


def onednn_linears(graph: Graph, *, library: str = "onednn") -> Graph:
    """`graph` with each float32 `mm` or `addmm` (1-D bias, alpha = beta = 1) a call of oneDNN's
    linear (`library` "onednn"): prepacked over a constant weight (with a static row count),
    unpacked over a weight value laid out row- or column-major when the product is large
    enough; with `library` "mkl", MKL's product over a constant weight it prepacked, the
    others left to ATen; "auto" is `host_gemm_library()`."""
    if library == "auto":
        library = host_gemm_library()
    if library == "mkl":
        return _mkl_packed_linears(graph)
    if not torch.backends.mkldnn.is_available():
        return graph
    products = [p for n in graph.nodes if (p := _product(n)) is not None]
    if not products:
        return graph
    layouts = layouts_for(graph)
    calls: dict[Op, ExternOp] = {}
    packed: dict[tuple, PackedLinear] = {}  # a weight products share is packed once
    for p in products:
        w = graph.constants.get(p.w.name)
        rows = p.x.shape[0]
        if w is not None and isinstance(rows, int) and w.dtype == torch.float32:
            key = _weight_key(w, rows)
            if key not in packed:
                weight = mkldnn._reorder_linear_weight(w.t().contiguous(), rows)
                packed[key] = PackedLinear(weight)
            calls[p.op] = _packed_call(p, packed[key])
        elif _unpacked_pays(p, layouts[p.w.name]):
            calls[p.op] = _unpacked_call(p)
    if not calls:
        return graph
    return graph.replace(nodes=tuple(calls.get(n, n) for n in graph.nodes))


def _mkl_packed_linears(graph: Graph) -> Graph:
    """`graph` with each float32 product over a constant weight (static row count) a call of
    MKL's linear over the weight it packed once (`MklPackedLinear`)."""
    if not torch.backends.mkl.is_available():
        return graph
    calls: dict[Op, ExternOp] = {}
    packed: dict[tuple, MklPackedLinear] = {}
    for n in graph.nodes:
        p = _product(n)
        w = graph.constants.get(p.w.name) if p is not None else None
        rows = p.x.shape[0] if p is not None else None
        if w is None or not isinstance(rows, int) or w.dtype != torch.float32:
            continue
        key = _weight_key(w, rows)
        if key not in packed:
            packed[key] = MklPackedLinear(w.t().contiguous(), rows)
        calls[p.op] = _packed_call(p, packed[key], "MKL linear, weight prepacked")
    if not calls:
        return graph
    return graph.replace(nodes=tuple(calls.get(n, n) for n in graph.nodes))


def _weight_key(w: torch.Tensor, rows: int) -> tuple:
    """What identifies a packed weight: a weight products share (at one row count) packs once."""
    return (w.untyped_storage().data_ptr(), w.storage_offset(), w.stride(), rows)


def _product(n: Op) -> Product | None:
    """`n` as a Product when it is one oneDNN's linear computes; else None."""
    if not isinstance(n, ExternOp) or len(n.outputs) != 1:
        return None
    refs = n.args
    if n.target is aten.mm.default:
        bias_ok = not n.kwargs
    elif n.target is aten.addmm.default:
        extra = dict(n.kwargs)
        bias_ok = len(refs) == 3 and extra.get("beta", 1) == 1 and extra.get("alpha", 1) == 1
        bias_ok = (
            bias_ok and isinstance(refs[0], ArgRef) and len(n.inputs[refs[0].index].shape) == 1
        )
        refs = refs[1:]
    else:
        return None
    if not bias_ok or len(refs) != 2 or not all(isinstance(r, ArgRef) for r in refs):
        return None
    x, w = (n.inputs[r.index] for r in refs)
    if x.type.device != "cpu" or len(x.shape) != 2 or len(w.shape) != 2:
        return None
    if {v.dtype for v in (*n.inputs, *n.outputs)} != {T.f32}:
        return None
    bias = n.inputs[n.args[0].index] if n.target is aten.addmm.default else None
    return Product(n, x, w, bias)


def _unpacked_pays(p: Product, w_strides: tuple) -> bool:
    """Whether oneDNN's linear over `p`'s weight as it is beats ATen's product: the weight is
    row-major [K, N] or the transpose of a row-major [N, K], and the product is large enough
    (see the module's docstring)."""
    k, n = p.w.shape
    if not isinstance(k, int) or not isinstance(n, int):
        return False
    transposed = is_row_major((n, k), tuple(reversed(w_strides)))
    if not (transposed or is_row_major((k, n), w_strides)):
        return False
    rows = p.x.shape[0]
    work = k * n * (rows if isinstance(rows, int) else 1)
    return work >= MIN_UNPACKED_WORK


def _packed_call(
    p: Product,
    target: PackedLinear | MklPackedLinear,
    reason: str = "oneDNN linear, weight prepacked",
) -> ExternOp:
    """The prepacked call computing product `p`."""
    inputs = (p.x,) if p.bias is None else (p.x, p.bias)
    args = (ArgRef(0), None if p.bias is None else ArgRef(1))
    return ExternOp(p.op.name, inputs, p.op.outputs, target, args, (), ((),), reason)


def _unpacked_call(p: Product) -> ExternOp:
    """The oneDNN call computing product `p` over its weight as it is."""
    inputs = (p.x, p.w) if p.bias is None else (p.x, p.w, p.bias)
    args = (ArgRef(0), ArgRef(1), None if p.bias is None else ArgRef(2))
    reason = "oneDNN linear"
    return ExternOp(p.op.name, inputs, p.op.outputs, linear, args, (), ((),), reason)
