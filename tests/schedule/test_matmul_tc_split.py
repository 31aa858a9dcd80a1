"""matmul_tc's in-kernel split-K (TcConfig.splits): S blocks a tile, each over a chunk of K,
the last to arrive adding the partials in order and storing the tile. Against float64 eager
on cuda-emu (products and channels-last convolutions, f16 and bf16, K in uneven chunks), the
same bits on a second call (the tile counters back at zero), the plan's scratch memory, the
level-0 choice, and NVRTC builds without spills."""

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from graph_builder import GraphBuilder
from schedule_graphs import matmul_problem_of

from minicomp import config
from minicomp.backends.cuda.codegen import render_module
from minicomp.compiler import compile_graph
from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.compute import reduce
from minicomp.ir.expr import cast
from minicomp.ir.func import Module
from minicomp.record import CompileRecord
from minicomp.schedule.templates import matmul_tc

TARGET = "cuda-emu"
DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def compiled_twice(fn, *args, dtype):
    """`fn` compiled for cuda-emu, called twice on `args`: checked against float64 eager, the
    second result equal to the first bit for bit; the kernels' templates."""
    records: list = []
    torch._dynamo.reset()
    with recording(records), torch.no_grad():
        f = torch.compile(fn, backend="minicomp", options={"target": TARGET, "fallback": "error"})
        first, second = f(*args), f(*args)
        expected = fn(*(a.double() for a in args))
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(first, expected.to(dtype), rtol=tol, atol=tol)
    assert torch.equal(first, second)  # a fixed order of the partials, and counters reset
    return [k.attrs.template for r in records for k in r.kernels if k.attrs.template]


@pytest.mark.parametrize("dt", list(DTYPES))
def test_a_product_split_inside_the_kernel(dt):
    # 200 x 136 tiles of 32 x 32 (partial at both edges) over K = 1000: 3 chunks of 11, 11
    # and 10 steps of 32, the last one ending in a guarded partial step.
    dtype = DTYPES[dt]
    a, b = torch.randn(200, 1000, dtype=dtype), torch.randn(1000, 136, dtype=dtype) / 8
    bias = torch.randn(136, dtype=dtype)
    used = compiled_twice(lambda a, b, c: torch.relu(a @ b + c), a, b, bias, dtype=dtype)
    assert used == ["matmul_tc[32x32x32_w16x32_s3_k3]"], used


@pytest.mark.parametrize("dt", list(DTYPES))
def test_a_channels_last_convolution_split_inside_the_kernel(dt):
    # M = 4 * 6 * 6 = 144, N = 40 over K = 96 channels x 9 taps (27 steps): 6 chunks, the
    # last of 2 steps; the input gathered window by window (cp.async).
    dtype, cl = DTYPES[dt], torch.channels_last
    x = torch.randn(4, 96, 6, 6, dtype=dtype).to(memory_format=cl)
    w = (torch.randn(40, 96, 3, 3, dtype=dtype) / 30).to(memory_format=cl)
    used = compiled_twice(lambda x, w: F.conv2d(x, w, padding=1), x, w, dtype=dtype)
    assert used == ["matmul_tc[32x32x32_w16x32_s3_k6]"], used


def _product_graph(m, n, k):
    """`out = (a @ b)` in f16, summed in f32 (the form matmul_tc takes)."""
    g = GraphBuilder()
    a, b = g.input("a", (m, k), T.f16), g.input("b", (k, n), T.f16)

    def body(i, j):
        return cast(
            reduce("sum", (k,), lambda r: cast(a[i, r], T.f32) * cast(b[r, j], T.f32)), T.f16
        )

    g.output(g.compute("out", (m, n), body))
    return g.build()


def test_the_plan_gives_the_partials_workspace_and_zeroed_counters_for_good():
    plan = compile_graph(
        _product_graph(200, 136, 1000), config.resolve({"target": TARGET}), CompileRecord()
    )
    partials = [i for i in plan.slots if i.name.endswith(f".{matmul_tc.PARTIALS}")]
    assert len(partials) == 1 and partials[0].workspace
    assert partials[0].shape({}) == (7 * 5 * 3 * 32 * 32,)  # 35 tiles, 3 partials each
    (counters,) = [t for t in plan.constants.values() if t.dtype == torch.int32]
    assert counters.shape == (35,) and not counters.any()
    a, b = torch.randn(200, 1000, dtype=torch.float16), torch.randn(1000, 136, dtype=torch.float16)
    (out,) = plan(a, b)
    assert not counters.any()  # every tile's last block set its counter back
    torch.testing.assert_close(out, (a.double() @ b.double()).half(), rtol=1e-2, atol=1e-2)
    assert plan.memory_stats(a, b).workspace >= 35 * 3 * 32 * 32 * 4


def _problem(m, n, k):
    """A product problem of those sizes (built on a small one, its sizes then changed)."""
    h = torch.float16
    p = copy.copy(
        matmul_problem_of(torch.mm, torch.randn(64, 96, dtype=h), torch.randn(96, 64, dtype=h))
    )
    p.m, p.n, p.k = m, n, k
    return p


def test_level0_splits_the_small_grids_the_lens_found_slow():
    # 1024^3: whole on 128 half tiles (L2- and shared-bound); in 2 on 128 full tiles.
    assert matmul_tc.level0_splits(1, 1024, 1024, 1024, 132, 4 << 20, 2) == 2
    assert str(matmul_tc.heuristic(_problem(1024, 1024, 1024))) == "128x128x32_w64x64_s3_k2"
    # ResNet-50's 2048 -> 512 1 x 1 (K = 2048) and 512 -> 512 3 x 3 (K = 4608) at 7 x 7: 52
    # tiles, 104 full ones in 2 (not 4 or 5 of 128 x 256: their last blocks read 3 or 4
    # partials alone).
    for k in (2048, 4608):
        operands = 2 * (1568 * k + k * 512)
        assert matmul_tc.level0_splits(1, 1568, 512, k, 132, operands, 2) == 2
        two = matmul_tc.product_work(1, 1568, 512, k, 132, operand_bytes=operands, out_size=2)
        split = [
            matmul_tc.product_work(
                1, 1568, 512, k, 132, operand_bytes=operands, out_size=2, splits=s
            )
            for s in (2, 4, 5)
        ]
        assert split[0] < min(two, *split[1:])
    # Grids that fill the GPU, K too short to chunk: whole.
    assert matmul_tc.heuristic(_problem(4096, 4096, 4096)).splits == 1
    assert matmul_tc.level0_splits(1, 20, 4096, 64, 132, 1 << 20, 2) == 1
    assert matmul_tc.split_candidates(1, 2048, 2048, 2048, 132) == range(2, 2)


def test_a_split_needs_static_sizes_and_chunks_with_steps():
    p = _problem(1024, 1024, 1024)
    cfg = matmul_tc.TcConfig(128, 128, 32, 64, 64, 3, splits=2)
    assert matmul_tc.valid(p, cfg)
    assert not matmul_tc.valid(p, dataclasses.replace(cfg, splits=matmul_tc.MAX_SPLITS + 1))
    assert matmul_tc.chunks_fill(32, 3) and matmul_tc.chunks_fill(10, 4)
    assert not matmul_tc.chunks_fill(10, 6)  # chunks of 2 steps: the sixth would be empty
    assert not matmul_tc.chunks_fill(1, 2)
    q = copy.copy(p)
    q.static_sizes = lambda: None  # as for a symbolic size
    assert not matmul_tc.valid(q, cfg)


def test_the_split_kernel_builds_with_nvrtc_without_spilling(tmp_path):
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    h, cl = torch.float16, torch.channels_last
    problems = {
        # The lens's cases, or small problems of their kind with their tilings: 1024^3, and
        # a channels-last 3 x 3 convolution with a fused batch norm and relu (ResNet-50's
        # late ones use 128 x 128 tiles of 64 x 64 warps, the most registers).
        "mm": _problem(1024, 1024, 1024),
        "conv3x3_bn_relu": matmul_problem_of(
            lambda x, w, s, b: F.relu(F.conv2d(x, w, padding=1) * s + b),
            torch.randn(2, 128, 8, 8, dtype=h).to(memory_format=cl),
            torch.randn(64, 128, 3, 3, dtype=h).to(memory_format=cl),
            torch.randn(1, 64, 1, 1, dtype=h),
            torch.randn(1, 64, 1, 1, dtype=h),
        ),
    }
    for case, p in problems.items():
        configs = {matmul_tc.heuristic(p)}
        configs |= {
            dataclasses.replace(c, splits=s)
            for c in matmul_tc.space(p, 1)
            for s in (2, 5)
            if c.bm * c.bn >= 128 * 128
        }
        assert any(c.splits > 1 for c in configs)
        for cfg in sorted(configs, key=str):
            if not matmul_tc.valid(p, cfg):
                continue
            kernel = matmul_tc.instantiate(p, cfg)
            source = render_module(Module(kernel.name, (kernel,)))
            for arch in ("sm_80", "sm_90"):
                binary = nvrtc.compile_cuda(source, arch=arch, name=case, cache_dir=str(tmp_path))
                usage = binary.resources[kernel.name]
                what = (case, str(cfg), arch, usage)
                assert usage.spill_stores == 0 and usage.spill_loads == 0, what
                assert usage.stack_bytes == 0, what


def test_the_late_resnet_3x3_at_level0_splits_without_spilling(tmp_path):
    """ResNet-50's 512 -> 512 3 x 3 at 7 x 7, batch 32 (the lens's case): 128 x 128 tiles of
    64 x 64 warps split in 2, at 255 registers. It spilled 8 bytes while the last block
    summed the partials in registers (32 loads in flight beside the 128 accumulators) and
    the window's element path computed its own 64-bit offsets beside the cp.async's."""
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    h, cl = torch.float16, torch.channels_last
    p = matmul_problem_of(
        lambda x, w: F.conv2d(x, w, padding=1),
        torch.randn(32, 512, 7, 7, dtype=h).to(memory_format=cl),
        torch.randn(512, 512, 3, 3, dtype=h).to(memory_format=cl),
    )
    cfg = matmul_tc.heuristic(p)
    assert str(cfg) == "128x128x32_w64x64_s3_k2"
    kernel = matmul_tc.instantiate(p, cfg)
    source = render_module(Module(kernel.name, (kernel,)))
    for arch in ("sm_80", "sm_89", "sm_90"):
        usage = nvrtc.compile_cuda(source, arch=arch, cache_dir=str(tmp_path)).resources[
            kernel.name
        ]
        what = (arch, usage)
        assert usage.spill_stores == 0 and usage.spill_loads == 0 and usage.stack_bytes == 0, what
