"""Split-K (CUDA targets): which matrix products split, into what, and that split graphs and
compiled cuda-emu functions compute what unsplit ones and float64 PyTorch do."""

from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from graph_builder import GraphBuilder, evaluate_graph, random_inputs
from helpers import check_compiled
from helpers_graph import PassGraphBuilder, assert_graph_equal

import minicomp
from minicomp.backends.cuda.codegen import render_module
from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.compute import Compute, Reduce, reduce
from minicomp.ir.expr import Var, cast, const, minimum, select
from minicomp.ir.func import Module
from minicomp.ir.graph import ComputeOp, Graph
from minicomp.passes.graph import split_k as split_k_module
from minicomp.passes.graph.split_k import (
    KSplit,
    Product,
    estimated_time,
    hopper_time,
    in_kernel_time,
    plan,
    plan_balanced_split,
    plan_split,
    split_k,
)
from minicomp.passes.graph.split_reductions import split_reductions
from minicomp.schedule.templates import matmul_tc
from minicomp.targets import get_target

EMU = "cuda-emu"


@pytest.fixture
def small_thresholds(monkeypatch):
    """Thresholds that split an (8 x 16 x 2048) product into 8 chunks of 256, so that the
    emulator runs it in seconds."""
    monkeypatch.setattr(split_k_module, "MIN_K", 1024)
    monkeypatch.setattr(split_k_module, "MIN_CHUNK", 256)


@pytest.fixture
def free_launch(monkeypatch):
    """The second rule without the final kernel's launch price, so that a product small
    enough for the emulator can gain from a split."""
    monkeypatch.setattr(split_k_module, "LAUNCH_FLOPS", 0.0)


@pytest.fixture
def whole_template(monkeypatch):
    """The second rule weighing its split against a template that computes the product
    whole, without matmul_tc's in-kernel split: what it splits in the graph then."""

    def whole(p, sms=split_k_module.H100_SMS):
        return estimated_time(p, 1, sms)

    monkeypatch.setattr(split_k_module, "in_kernel_time", whole)


# --- graphs --------------------------------------------------------------------------------


def product(m, n, k, dtype=T.f32, batch=(), kind="sum") -> Graph:
    """`out[..., i, j] = kind over r of a[..., i, r] * b[..., r, j]`, accumulated in f32 or
    f64 and cast back to `dtype` (anchors.py's form of mm and bmm). Sizes may be symbols."""
    g = GraphBuilder()
    sizes = {}
    for name, d in zip("mnkB", (m, n, k, *batch)):
        sizes[name] = g.symbol(name) if d is None else d
    m, n, k = sizes["m"], sizes["n"], sizes["k"]
    lead = tuple(sizes[x] for x in "B"[: len(batch)])
    a = g.input("a", (*lead, m, k), dtype)
    b = g.input("b", (*lead, k, n), dtype)
    acc = T.f64 if dtype == T.f64 else T.f32

    def body(*idx):
        *bt, i, j = idx

        def term(r):
            return cast(a[(*bt, i, r)], acc) * cast(b[(*bt, r, j)], acc)

        return cast(reduce(kind, (k,), term), dtype)

    g.output(g.compute("out", (*lead, m, n), body))
    return g.build()


def computes(g: Graph) -> list[ComputeOp]:
    return [n for n in g.nodes if isinstance(n, ComputeOp)]


def assert_split_close(g: Graph, seed=0) -> Graph:
    """`split_k(g)` has one more op and evaluates like `g` (up to reassociation)."""
    s = split_k(g)
    assert len(computes(s)) == len(computes(g)) + 1
    inputs = random_inputs(g, seed)
    for a, e in zip(evaluate_graph(s, inputs), evaluate_graph(g, inputs)):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-4)
    return s


# --- when to split -------------------------------------------------------------------------


def test_chunking_rule():
    # LLM-decode shapes: 8 tiles of 16 x 1024 fill the GPU with 32 chunks of 512 ...
    assert plan_split(8, (16384,)) == KSplit(0, 32, 512, True)
    # ... one 64 x 64 tile can only reach 128 blocks with chunks of at least 512 ...
    assert plan_split(1, (65536,)) == KSplit(0, 128, 512, True)
    # ... and 16 x 4096 x 11008 (32 tiles) takes 8 exact chunks of 1376.
    assert plan_split(32, (11008,)) == KSplit(0, 8, 1376, True)
    # An exact chunk wins over a guarded one that launches a few more blocks.
    assert plan_split(1, (9000,)) == KSplit(0, 15, 600, True)
    # No exact chunk fills the GPU for a prime K: the last chunk is guarded.
    assert plan_split(8, (16411,)) == KSplit(0, 17, 966, False)
    # Several K axes: only the outermost is chunked, the taps stay whole in every chunk.
    assert plan_split(1, (1024, 3, 3)) == KSplit(0, 16, 64, True)
    assert plan_split(2, (1, 4, 8192)) == KSplit(1, 4, 1, True)
    assert plan_split(66, (65536,)) is None  # the grid keeps half an H100's 132 SMs busy
    assert plan_split(1, (split_k_module.MIN_K - 1,)) is None  # K is short


def test_which_products_split():
    splits = [
        product(16, 1024, 16384),  # 8 tiles
        product(64, 64, 65536, T.f16),
        product(16, 256, 16384, batch=(4,)),  # bmm: 4 x 2 tiles
        product(16, 4096, 11008, T.bf16),  # 32 skinny tiles, K < 4 * N
    ]
    for g in splits:
        assert len(computes(split_k(g))) == 2
    whole = [
        product(2048, 1024, 16384),  # 128 tiles
        product(128, 128, 8192, batch=(66,)),  # 66 tiles across the batch
        product(16, 1024, 4096),  # K too short
        product(None, 64, 16384),  # symbolic M
        product(64, 64, None),  # symbolic K
        product(64, 64, 16384, batch=(None,)),  # symbolic batch
        product(64, 1, 16384),  # matrix-vector: a row reduction, not a contraction
        product(1, 64, 16384),  # a unit M: fusion drops it, the same row reduction
        product(64, 64, 16384, kind="max"),  # not a sum
    ]
    for g in whole:
        assert split_k(g) is g
    gb = GraphBuilder()
    x = gb.input("x", (64, 16384))
    gb.output(gb.compute("s", (64, 64), lambda i, j: reduce("sum", (16384,), lambda r: x[i, r])))
    g = gb.build()
    assert split_k(g) is g  # a sum, but of no product


def _conv(n, c, k, size, taps=9, out_size=None):
    """The product of a channels-last convolution: (n * size^2) x k over K = c x taps, reading
    an f16 input and weight (what the pass sees of conv2d)."""
    out = out_size or size
    operands = 2 * (n * c * size**2 + k * c * taps)
    return Product(1, n * out * out, k, (c, taps), operand_bytes=operands)


def test_balanced_rule_leaves_to_the_template_what_it_splits_inside_the_kernel():
    # ResNet-50's late 3x3 convolutions: 1568 x 512 over K = 512 x 9 is 52 tiles; whole, the
    # template runs 104 half tiles (step cost 1.4), split in 2 it runs 104 full ones, best in
    # one kernel (no final sum's launch and round trip through L2).
    late_3x3 = _conv(32, 512, 512, 7)
    assert plan(late_3x3) is None
    assert in_kernel_time(late_3x3) < estimated_time(late_3x3, 2) < estimated_time(late_3x3, 1)
    k, operands = 512 * 9, late_3x3.operand_bytes
    assert matmul_tc.level0_splits(1, 1568, 512, k, 132, operands, 2) == 2


def test_balanced_rule_splits_compute_bound_products_that_leave_sms_idle(whole_template):
    # The same convolutions, for a template that would compute them whole: split in 2 in the
    # graph.
    late_3x3 = _conv(32, 512, 512, 7)
    assert plan_balanced_split(late_3x3) == KSplit(0, 2, 256, True)
    assert plan(late_3x3) == KSplit(0, 2, 256, True)
    assert estimated_time(late_3x3, 2) < estimated_time(late_3x3, 1)
    # Four chunks cost twice the partial traffic for no fewer rounds of blocks.
    assert estimated_time(late_3x3, 2) < estimated_time(late_3x3, 4)
    # The strided one reads a larger input: the same product, the same split.
    assert plan(_conv(32, 512, 512, 14, out_size=7)) == KSplit(0, 2, 256, True)


def test_balanced_rule_keeps_what_a_split_would_not_speed_up():
    # 1024^3 (64 tiles, K = 1024), the 1 x 1 beside the late 3 x 3s (K = 2048), 128 rows of
    # a 4096 x 4096 weight: a final sum's launch and round trip cost more than matmul_tc's
    # split inside the kernel (test_matmul_tc_split.py).
    mm = Product(1, 1024, 1024, (1024,), operand_bytes=4 * 2**20)
    weights = 2 * (128 * 4096 + 4096 * 4096)
    for p in (
        mm,
        _conv(32, 2048, 512, 7, taps=1),
        Product(1, 128, 4096, (4096,), operand_bytes=weights),
    ):
        assert plan(p) is None
        assert in_kernel_time(p) < min(estimated_time(p, 1), estimated_time(p, 2))
    late_3x3 = _conv(32, 512, 512, 7)
    # As many tiles as SMs, f32 (SIMT) products, unknown operand sizes: not this rule's.
    assert plan_balanced_split(late_3x3, sms=52) is None
    assert plan_balanced_split(replace(late_3x3, tensor_cores=False)) is None
    assert plan_balanced_split(replace(late_3x3, operand_bytes=None)) is None
    # Only exact chunks that keep cp.async sources aligned: 7 channels do not halve.
    assert plan_balanced_split(_conv(32, 7, 512, 7, taps=9 * 73)) is None


def test_on_sm_90a_the_hopper_matmuls_model_decides():
    # 128 rows of an 11008 x 4096 weight: the grid rule splits it in 8 for matmul_tc; the
    # Hopper matmul computes it whole in 64 x 128 tiles at DRAM speed, which the final sum's
    # round trip would only slow down (the lens: 29.0 us whole, 34.6 split).
    weights = 2 * (128 * 11008 + 11008 * 4096)
    ffn = Product(1, 128, 4096, (11008,), operand_bytes=weights)
    assert plan(ffn) == KSplit(0, 8, 1376, True)
    assert plan(ffn, arch="sm_90a") is None
    assert hopper_time(ffn, 1) < min(hopper_time(ffn, s) for s in (2, 4, 8))
    # One 64 x 64 tile over K = 8192 leaves 131 SMs idle: split, chunks the model prices.
    one_tile = Product(1, 64, 64, (8192,), operand_bytes=2 * 128 * 8192)
    split = plan(one_tile, arch="sm_90a")
    assert split is not None and split.exact and split.chunks * split.length == 8192
    assert hopper_time(one_tile, split.chunks) < hopper_time(one_tile, 1) / 4
    # Products the Hopper matmul does not compute (f32: SIMT) keep the rules.
    f32 = replace(one_tile, tensor_cores=False, out_size=4, in_size=4)
    assert plan(f32, arch="sm_90a") == plan(f32)


def test_a_convolution_splits_with_its_partial_in_the_products_order(whole_template):
    # A 1 x 1 convolution over logical (n, c, h, w) at full scale: 1568 x 512 over K = 512 x 9
    # taps stands in for the 3 x 3 (the taps as an inner K axis, as the pass sees them).
    b = GraphBuilder()
    x, w = b.input("x", (32, 512, 9, 7, 7), T.f16), b.input("w", (512, 512, 9), T.f16)

    def conv(n, c, h, ww):
        def term(ci, t):
            return cast(x[n, ci, t, h, ww], T.f32) * cast(w[c, ci, t], T.f32)

        return cast(reduce("sum", (512, 9), term), T.f16)

    b.output(b.compute("y", (32, 512, 7, 7), conv))
    g = b.build()

    # 2 chunks of 256 channels; the partial's axes are (s, n, h, w, c), rows of M = (n, h, w)
    # and c along them, and the final sum reads them back in that order.
    e = PassGraphBuilder()
    x, w = e.input("x", (32, 512, 9, 7, 7), T.f16), e.input("w", (512, 512, 9), T.f16)
    i3, r1 = Var("i3", T.i64), Var("r1", T.i64)
    ci = s * 256 + kk
    term = cast(x[i0, ci, r1, i2, i3], T.f32) * cast(w[i1, ci, r1], T.f32)
    partial = Compute(
        "y_splitk",
        (2, 32, 7, 7, 512),
        (s, i0, i2, i3, i1),
        Reduce("sum", (kk, r1), (256, 9), term),
    )
    partial = e.add(partial, op="y")
    total = Reduce("sum", (j,), (2,), partial[j, i0, i2, i3, i1])
    e.output(e.add(Compute("y", (32, 512, 7, 7), (i0, i1, i2, i3), cast(total, T.f16))))
    assert_graph_equal(split_k(g), e.build())


def test_interleaved_output_axes_store_partials_in_the_products_order(small_thresholds):
    # out[l, j, i] = sum over r of a[i, l, r] * b[r, j]: M = (l, i) around N = j in the
    # output. The partial holds (s, l, i, j): a row-major M x N matrix per chunk.
    b = GraphBuilder()
    a_in, b_in = b.input("a", (4, 3, 2048)), b.input("b", (2048, 8))
    y = b.compute(
        "y",
        (3, 8, 4),
        lambda l_, j_, i_: reduce("sum", (2048,), lambda r: a_in[i_, l_, r] * b_in[r, j_]),
    )
    b.output(y)
    g = b.build()
    (partial, _) = computes(assert_split_close(g))
    assert partial.definition.shape == (8, 3, 4, 8)
    assert [v.name for v in partial.definition.axes] == ["s", "i0", "i2", "i1"]


def test_the_pass_runs_for_the_cuda_targets_before_split_reductions():
    for target in ("cuda", "cuda-emu"):
        passes = get_target(target).passes
        assert passes.index(split_k) < passes.index(split_reductions)
    assert split_k not in get_target("cpu").passes


# --- what the split looks like --------------------------------------------------------------


# The variables the pass adds: the chunk (s), the position in it (kk), the chunk the final
# sum runs over (j); i0, i1 (i2) are the product's axes, as compute() names them.
s, kk, j = (Var(name, T.i64) for name in ("s", "kk", "j"))
i0, i1, i2 = (Var(f"i{q}", T.i64) for q in range(3))


def test_partial_and_final_ops_of_a_half_product():
    # 16 x 1024 x 16384: 8 tiles, so K goes into 32 chunks of 512.
    g = product(16, 1024, 16384, T.f16)

    # The partial products come first along S and sum in f32, the accumulator type of f16
    # operands; the chunks tile K exactly (no clamp, no guard). The final op sums the chunks
    # and casts back to f16 into the original output; both ops keep the original's name.
    e = PassGraphBuilder()
    a, b = e.input("a", (16, 16384), T.f16), e.input("b", (16384, 1024), T.f16)
    r = s * 512 + kk
    term = cast(a[i0, r], T.f32) * cast(b[r, i1], T.f32)
    partial = Compute("out_splitk", (32, 16, 1024), (s, i0, i1), Reduce("sum", (kk,), (512,), term))
    partial = e.add(partial, op="out")
    total = Reduce("sum", (j,), (32,), partial[j, i0, i1])
    e.output(e.add(Compute("out", (16, 1024), (i0, i1), cast(total, T.f16))))
    after = split_k(g)
    assert_graph_equal(after, e.build())
    # split_reductions leaves both ops alone.
    assert split_reductions(after) is after


def test_a_guarded_last_chunk_selects_inside_the_operands_casts(small_thresholds):
    # K = 2000: 6 chunks of 334, the last one 4 past the end.
    g = product(8, 16, 2000, T.f16)

    # Past the end both operands read a clamped index and are 0, selected in f16 so that
    # the product keeps its f16 operands (tensor cores) and is 0 even where the clamped
    # element is infinite.
    e = PassGraphBuilder()
    a, b = e.input("a", (8, 2000), T.f16), e.input("b", (2000, 16), T.f16)
    r = s * 334 + kk
    zero = const(0, T.f16)
    a_el = select(r < 2000, a[i0, minimum(r, 1999)], zero)
    b_el = select(r < 2000, b[minimum(r, 1999), i1], zero)
    term = cast(a_el, T.f32) * cast(b_el, T.f32)
    partial = Compute("out_splitk", (6, 8, 16), (s, i0, i1), Reduce("sum", (kk,), (334,), term))
    partial = e.add(partial, op="out")
    total = Reduce("sum", (j,), (6,), partial[j, i0, i1])
    e.output(e.add(Compute("out", (8, 16), (i0, i1), cast(total, T.f16))))
    assert_graph_equal(split_k(g), e.build())
    assert_split_close(product(8, 16, 2000))


def test_batched_partial_puts_the_chunks_before_the_batch(small_thresholds):
    g = product(4, 16, 2048, batch=(3,))  # 3 tiles: 8 chunks of 256

    e = PassGraphBuilder()
    a, b = e.input("a", (3, 4, 2048)), e.input("b", (3, 2048, 16))
    r = s * 256 + kk
    term = a[i0, i1, r] * b[i0, r, i2]
    partial = Compute(
        "out_splitk", (8, 3, 4, 16), (s, i0, i1, i2), Reduce("sum", (kk,), (256,), term)
    )
    partial = e.add(partial, op="out")
    total = Reduce("sum", (j,), (8,), partial[j, i0, i1, i2])
    e.output(e.add(Compute("out", (3, 4, 16), (i0, i1, i2), total)))
    assert_graph_equal(split_k(g), e.build())
    assert_split_close(g)


def test_two_k_axes_chunk_the_outer_one_and_keep_the_taps_whole(small_thresholds):
    # A convolution's K: 256 channels times 5 taps. The channels go into 4 chunks of 64; every
    # chunk sums all 5 taps, so the flat K index stays s * 320 + (64-chunk position, tap).
    b = GraphBuilder()
    x, w = b.input("x", (8, 256, 5)), b.input("w", (256, 5, 16))
    y = b.compute(
        "y", (8, 16), lambda i, j: reduce("sum", (256, 5), lambda c, t: x[i, c, t] * w[c, t, j])
    )
    b.output(y)
    g = b.build()

    e = PassGraphBuilder()
    x, w = e.input("x", (8, 256, 5)), e.input("w", (256, 5, 16))
    c, r1 = s * 64 + kk, Var("r1", T.i64)
    term = x[i0, c, r1] * w[c, r1, i1]
    partial = Compute("y_splitk", (4, 8, 16), (s, i0, i1), Reduce("sum", (kk, r1), (64, 5), term))
    partial = e.add(partial, op="y")
    e.output(e.add(Compute("y", (8, 16), (i0, i1), Reduce("sum", (j,), (4,), partial[j, i0, i1]))))
    assert_graph_equal(split_k(g), e.build())
    assert_split_close(g)
    assert_split_close(product(8, 16, 2048))  # exact chunks, numerically


# --- kernels --------------------------------------------------------------------------------


def _kernels(fn, *args):
    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(fn, *args, options={"target": EMU})
    return report, [k for r in report.records for k in r.kernels]


@pytest.mark.parametrize(
    "dtype, template", [(torch.float16, "matmul_tc["), (torch.float32, "matmul_simt[")]
)
def test_explain_shows_a_template_partial_and_a_reduction(small_thresholds, dtype, template):
    a, b = torch.randn(8, 2048, dtype=dtype), torch.randn(2048, 16, dtype=dtype)
    report, (partial, final) = _kernels(torch.mm, a, b)
    assert report.kernel_count == 2
    assert partial.attrs.template.startswith(template)
    assert final.attrs.template is None
    assert "mm_splitk" in report.report()


def test_nvrtc_compiles_the_partial_kernels(small_thresholds, tmp_path):
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    h = torch.float16
    # Exact chunks (plain operands, cp.async) and a guarded last chunk (computed operands).
    for case, k in {"exact": 2048, "guarded": 2000}.items():
        a, b = torch.randn(8, k, dtype=h), torch.randn(k, 16, dtype=h)
        _, (partial, _) = _kernels(torch.mm, a, b)
        assert partial.attrs.template.startswith("matmul_tc["), case
        source = render_module(Module(partial.name, (partial,)))
        for arch in ("sm_80", "sm_90"):
            binary = nvrtc.compile_cuda(source, arch=arch, name=case, cache_dir=str(tmp_path))
            usage = binary.resources[partial.name]
            assert usage.registers > 0, binary.log
            assert usage.spill_stores == 0 and usage.spill_loads == 0, (case, arch, usage)


def test_an_outer_product_has_nothing_to_split():
    # K = 1 (a column times a row): neither rule splits it, and neither may fail looking for
    # the K axis to chunk.
    outer = Product(1, 256, 256, (1,), operand_bytes=2 * 512)
    assert plan(outer) is None
    assert plan_balanced_split(outer) is None
    a, b = torch.randn(256, 1, dtype=torch.float16), torch.randn(1, 256, dtype=torch.float16)
    check_compiled(torch.matmul, a, b, target=EMU, reference_dtype=torch.float64)


# --- end to end on cuda-emu against float64 PyTorch -------------------------------------------


def run(fn, *args, **tolerance):
    """`fn` compiled for cuda-emu against float64 eager; the kernels' templates."""
    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(fn, *args, target=EMU, reference_dtype=torch.float64, **tolerance)
    kernels = [k for r in records for k in r.kernels]
    assert len(kernels) == 2, [k.name for k in kernels]
    return [k.attrs.template for k in kernels]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_mm(small_thresholds, dtype):
    a, b = torch.randn(8, 2048, dtype=dtype), torch.randn(2048, 16, dtype=dtype)
    partial, final = run(torch.mm, a, b, rtol=1e-3, atol=1e-3)
    assert partial is not None and final is None


def test_addmm_with_relu_fuses_into_the_final_kernel(small_thresholds):
    h = torch.float16
    x, w = torch.randn(8, 2048, dtype=h), torch.randn(16, 2048, dtype=h)
    bias = torch.randn(16, dtype=h)
    # Linear (a transposed weight), bias and relu: the epilogue fuses into the final kernel,
    # so two kernels in all.
    partial, _ = run(lambda x, w, b: F.relu(F.linear(x, w, b)), x, w, bias, rtol=1e-3, atol=1e-3)
    assert partial.startswith("matmul_tc[")


def test_k_the_chunk_does_not_divide(small_thresholds):
    # Chunks of 334: the last one holds 330 products and 4 guarded zeros.
    a, b = torch.randn(8, 2000, dtype=torch.float16), torch.randn(2000, 16, dtype=torch.float16)
    run(torch.mm, a, b, rtol=1e-3, atol=1e-3)


def test_a_convolution_the_balanced_rule_splits(free_launch, whole_template):
    # A channels-last 3 x 3 convolution, 128 x 64 over K = 128 x 9, sized for a GPU of 64
    # SMs: whole, eight 32 x 32 blocks; in 2 chunks of 64 channels, 16. Partial (matmul_tc,
    # its input gathered) and final sum against float64 eager.
    h, cl = torch.float16, torch.channels_last
    x = torch.randn(2, 128, 8, 8, dtype=h).to(memory_format=cl)
    w = (torch.randn(64, 128, 3, 3, dtype=h) / 34).to(memory_format=cl)
    with minicomp.config.patch(sm_count=64):
        partial, final = run(lambda x, w: F.conv2d(x, w, padding=1), x, w, rtol=2e-2, atol=2e-2)
    assert partial.startswith("matmul_tc[") and final is None


def test_bmm(small_thresholds):
    a, b = torch.randn(3, 8, 2048), torch.randn(3, 2048, 16)
    run(torch.bmm, a, b, rtol=1e-4, atol=1e-4)


def test_the_split_fills_the_sms_of_the_gpu_it_compiles_for():
    # 4 tiles over K = 16384: 32 chunks of 512 on an H100's 132 SMs, 4 of 4096 fill 16 SMs.
    h100 = KSplit(0, 32, 512, True)
    assert plan_split(4, (16384,)) == plan_split(4, (16384,), sms=132) == h100
    assert plan_split(4, (16384,), sms=16) == KSplit(0, 4, 4096, True)
    # 8 tiles already keep half of 16 SMs busy: the product stays whole there.
    assert plan_split(8, (65536,), sms=16) is None
    assert plan_split(8, (65536,)) == KSplit(0, 32, 2048, True)
