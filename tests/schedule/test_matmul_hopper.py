"""The Hopper matmul (minicomp.schedule.templates.matmul_hopper: TMA ring, warpgroup MMA,
persistent tiles) on cuda-emu against float64 at odd sizes on fresh inputs with poisoned
outputs (one and two consumer warpgroups, f16, bf16 and e4m3, f32 and 16-bit C, blocks
looping over several tiles, K not a multiple of the stage), two stages and three giving the
same bits, the bugs the ring must not have (a wrong phase parity deadlocks with the
emulator's report; a stage freed before its mma's retire gives a wrong result), the launch's
errors, the config choice, the lens's counts of its copies and mma's, and NVRTC for sm_90a:
every offered config without spills, with HGMMA (QGMMA), UTMALDG and SYNCS in its SASS.
Clusters of two CTAs sharing B's (or A's) tile by TMA multicast: against float64 with a
cluster's second tile past C's edge, the lens counting the shared tile's bytes once, and a
stage refilled before the other CTA freed it caught."""

import pytest
import torch

import minicomp
from minicomp.backends.cuda import nvrtc
from minicomp.backends.cuda.emu import EmulatorError
from minicomp.ir import types as T
from minicomp.schedule.templates.matmul_hopper import (
    CONFIGS,
    HopperConfig,
    kernel,
    matmul_hopper,
    pick_config,
)
from minicomp.script import ScriptError

M, N, K = 67, 130, 200  # odd edges; K is 4 stages of 64, the last one partial
TWO_GROUPS = HopperConfig(bn=64, consumers=2, stages=3)  # 128 x 64 tiles: 3 of them
ONE_GROUP = HopperConfig(bn=128, consumers=1, stages=2)  # 64 x 128 tiles: 4 of them
SHARE_B = HopperConfig(bn=64, consumers=1, stages=3, cluster=2, share="b")  # pairs along M
SHARE_A = HopperConfig(bn=64, consumers=1, stages=2, cluster=2, share="a")  # pairs along N


def inputs(dtype, m=M, n=N, k=K):
    return torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)


def poisoned(m, n, dtype):
    return torch.full((m, n), float("nan"), dtype=dtype)


def expected(a, b):
    return a.double() @ b.double().T


@pytest.mark.parametrize(
    ("config", "dtype", "out_dtype"),
    [(TWO_GROUPS, torch.float16, torch.float32), (ONE_GROUP, torch.bfloat16, torch.bfloat16)],
    ids=["128x64-f16-f32", "64x128-bf16-bf16"],
)
def test_the_product_matches_float64(config, dtype, out_dtype):
    a, b = inputs(dtype)
    # Every access checked against its tensor: the edge tiles' guards must hold.
    with minicomp.config.patch(emu_checks=True):
        out = matmul_hopper(a, b, poisoned(M, N, out_dtype), config=config, grid=2)
    # f32 C: the f32 sums of exact products; bf16 C: one rounding of the result.
    tol = 1e-4 if out_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), expected(a, b), rtol=tol, atol=tol * 10)


@pytest.mark.parametrize(("config", "m", "n"), [(SHARE_B, 130, 67), (SHARE_A, 67, 130)])
def test_a_cluster_sharing_a_tile_by_multicast_matches_float64(config, m, n):
    # Three tiles along the shared side: the second cluster's second CTA computes a tile past
    # C's edge, and must still load, wait and release with the first. One cluster (grid 2)
    # loops over every pair, so the ring runs on across them.
    a, b = inputs(torch.float16, m=m, n=n)
    with minicomp.config.patch(emu_checks=True):
        out = matmul_hopper(a, b, poisoned(m, n, torch.float32), config=config, grid=2)
    torch.testing.assert_close(out.double(), expected(a, b), rtol=1e-4, atol=1e-3)


def test_a_cluster_stage_refilled_before_the_other_cta_freed_it_is_caught():
    a, b = inputs(torch.float16, m=130, n=67, k=448)
    bad = kernel(SHARE_B, T.f16, T.f32, bug="own_release")
    with pytest.raises(EmulatorError, match=r"CTA 1 of its cluster.*bytes more than"):
        bad(a, b, poisoned(130, 67, torch.float32), grid=2)


def test_a_float8_product_matches_float64():
    # e4m3 operands: K 256 is two stages of 128; the products are exact in f32.
    a, b = (torch.randn(rows, 256).to(torch.float8_e4m3fn) for rows in (M, N))
    out = matmul_hopper(a, b, poisoned(M, N, torch.float32), config=ONE_GROUP, grid=2)
    torch.testing.assert_close(out.double(), expected(a, b), rtol=1e-5, atol=1e-4)


def test_two_stages_and_three_give_the_same_bits():
    a, b = inputs(torch.float16)
    two = HopperConfig(bn=TWO_GROUPS.bn, consumers=TWO_GROUPS.consumers, stages=2)
    second = matmul_hopper(a, b, poisoned(M, N, torch.float32), config=two, grid=2)
    third = matmul_hopper(a, b, poisoned(M, N, torch.float32), config=TWO_GROUPS, grid=3)
    assert torch.equal(second, third)


def test_a_ring_of_one_stage_is_refused():
    # It would deadlock: a stage is freed only after the next one's mma's are issued.
    with pytest.raises(ValueError, match="needs 2 stages or more"):
        kernel(HopperConfig(stages=1))


def test_a_wrong_phase_parity_is_a_reported_deadlock():
    a, b = inputs(torch.float16)
    bad = kernel(ONE_GROUP, T.f16, T.f32, bug="parity")
    with pytest.raises(EmulatorError, match=r"deadlock") as err:
        bad(a, b, poisoned(M, N, torch.float32), grid=1)
    assert "matmul_hopper" in str(err.value) and "empty" in str(err.value), err.value


def test_a_stage_freed_before_its_mmas_retire_gives_a_wrong_result():
    a, b = inputs(torch.float16)
    bad = kernel(ONE_GROUP, T.f16, T.f32, bug="early_release")
    out = poisoned(M, N, torch.float32)
    bad(a, b, out, grid=1)
    assert not torch.allclose(out.double(), expected(a, b), rtol=1e-3, atol=1e-2)


def test_operands_need_rows_of_whole_16_bytes():
    a, b = inputs(torch.float16, k=K + 1)
    with pytest.raises(ScriptError, match=r"argument a: tensor map a: .*stride"):
        matmul_hopper(a, b, poisoned(M, N, torch.float32), config=TWO_GROUPS)


def test_the_config_weighs_the_tiles_work_against_their_memory_traffic():
    largest = HopperConfig(bn=256, consumers=2, stages=4)
    smallest = HopperConfig(bn=64, consumers=1, stages=8)
    pairs = HopperConfig(bn=128, consumers=1, stages=6, cluster=2, share="b")
    # Large products: the fewest operand re-reads through L2; at 4096^3 pairs of CTAs sharing
    # B's tile read a third less (128 x 256 alone is L2-bound in the model), at 4096 x 11008
    # it is a tie (the larger grid's padding is the same), and the plain tile comes first.
    assert pick_config(4096, 4096, k=4096) == HopperConfig(
        bn=256, consumers=2, stages=4, cluster=2, share="b"
    )
    assert pick_config(4096, 11008, k=4096) == largest
    # Decode rows: the most blocks, to pull the weight from DRAM with every SM; a pair's
    # second tile would be all padding.
    assert pick_config(16, 4096, k=4096) == smallest
    assert pick_config(16, 4096, k=11008) == smallest
    # 64 tiles of 128 x 128 keep half the SMs busy; 128 of 64 x 128 re-read more through L2
    # than that costs alone, but in pairs sharing B's tile they read less (1024^3: the model's
    # 25 against 34 for 128 x 128).
    assert pick_config(1024, 1024, k=1024) == pairs
    assert pick_config(256, 4096, k=4096) == pairs
    # One SM cannot hold a cluster of two.
    assert pick_config(1024, 1024, 1, k=1024).cluster == 1


def test_the_launch_refuses_other_types_and_shapes():
    a, b = inputs(torch.float16)
    with pytest.raises(
        ValueError, match="must both be float16, bfloat16, float8_e4m3fn or float8_e5m2"
    ):
        matmul_hopper(a, b.float())
    with pytest.raises(ValueError, match="with the same K"):
        matmul_hopper(a, b[:, :8])
    with pytest.raises(ValueError, match=r"out must be a contiguous \[67, 130\]"):
        matmul_hopper(a, b, torch.empty(N, M))


# ---- NVRTC (sm_90a)


def _nvrtc():
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")


def test_every_offered_config_compiles_for_sm_90a_without_spills(tmp_path):
    _nvrtc()
    from minicomp.backends.cuda import sass

    types = ((T.f16, T.f16), (T.bf16, T.f32), (T.f8e4m3fn, T.bf16), (T.bf16, T.f16))
    for config, (in_type, out_type) in zip(CONFIGS, types * 2):
        k = kernel(config, in_type, out_type)
        name = k.ir.name
        binary = nvrtc.compile_cuda(k.source, arch="sm_90a", name=name, cache_dir=str(tmp_path))
        usage = binary.resources[name]
        assert usage.spill_stores == 0 and usage.spill_loads == 0, (config, usage)
        assert "warning" not in binary.log.lower(), binary.log
        # One block an SM: its threads must fit the register file (65536 registers).
        assert usage.registers * config.threads <= 65536, (config, usage)
        try:
            text = sass.disassemble(binary.cubin)[name]
        except sass.SassUnavailableError as err:  # pragma: no cover - depends on the machine
            pytest.skip(str(err))
        ops = sass.full_opcode_counts(text)
        mma = "QGMMA" if in_type.nbytes == 1 else "HGMMA"  # float8: QGMMA
        for prefix in (mma, "UTMALDG", "SYNCS"):
            assert any(op.startswith(prefix) for op in ops), (config, prefix, sorted(ops))
        if config.cluster > 1:  # the shared tile by multicast, the cluster barrier
            for op in ("UTMALDG.2D.MULTICAST", "UCGABAR_ARV", "UCGABAR_WAIT"):
                assert ops[op] > 0, (config, op, sorted(ops))
        (report,) = sass.check_kernels(k.source, binary.cubin)
        assert report.ok, report


# ---- the performance lens


def test_the_lens_counts_the_tma_traffic_and_the_wgmma_work():
    from minicomp.lens.counts import KernelCounts
    from minicomp.lens.devices import H100
    from minicomp.lens.profile import profile_session
    from minicomp.lens.session import recording

    a, b = inputs(torch.float16)
    out = poisoned(M, N, torch.float32)
    with minicomp.config.patch(lens=True), recording() as session:
        matmul_hopper(a, b, out, config=TWO_GROUPS)
    torch.testing.assert_close(out.double(), expected(a, b), rtol=1e-4, atol=1e-3)
    (launch,) = session.launches
    sample = launch.sample
    assert launch.function.attrs.template == "matmul_hopper[128x64x64_s3]"
    # 3 tiles of 4 K steps, each step 2 warpgroups x 4 m64n64k16: 32 m16n8k16 each.
    counts = KernelCounts.from_sample(sample)
    assert counts.wgmma == 3 * 4 * 2 * 4 * 32 and counts.mma == 0
    # The copies read A and B through their maps (arguments 0 and 1), every row of each once
    # a tile: A's 67 rows in each of the 3 column tiles, B's 130 once; whole sectors of 400-byte
    # rows.
    assert set(sample.read) == {0, 1} and sample.written == (2,)
    assert sample.read_sectors[0] * 32 == pytest.approx(a.nbytes, rel=0.1)
    assert sample.read_sectors[1] * 32 == pytest.approx(b.nbytes, rel=0.1)
    assert counts.global_load_bytes == 3 * a.nbytes + b.nbytes
    # The profile builds it for sm_90a, as the cuda target would: ptxas's registers.
    (k,) = profile_session(session, H100).graph.kernels
    assert k.resources is not None and k.resources.registers > 0, k


def test_the_lens_counts_a_multicast_tile_once():
    from minicomp.lens.counts import KernelCounts
    from minicomp.lens.session import recording

    # 130 x 192: three column tiles of 64, two row tiles of 64 (one pair along M).
    a, b = inputs(torch.float16, m=128, n=130, k=192)
    counts = {}
    for config in (HopperConfig(bn=64, consumers=1, stages=3), SHARE_B):
        out = poisoned(128, 130, torch.float32)
        with minicomp.config.patch(lens=True), recording() as session:
            matmul_hopper(a, b, out, config=config)
        torch.testing.assert_close(out.double(), expected(a, b), rtol=1e-4, atol=1e-3)
        (launch,) = session.launches
        counts[config.cluster] = KernelCounts.from_sample(launch.sample)
    # Alone, each of the two row tiles reads B's column tile; in pairs, B's tile comes once.
    assert counts[1].global_load_bytes == 3 * a.nbytes + 2 * b.nbytes
    assert counts[2].global_load_bytes == 3 * a.nbytes + b.nbytes
    assert counts[2].wgmma == counts[1].wgmma
