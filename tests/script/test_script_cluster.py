"""Thread-block clusters (minicomp.script.cluster): CTAs exchanging values through each other's
shared memory, a ring of stages that rank 0 of each cluster
of two fills by TMA multicast for both CTAs, each slot released by both CTAs' consumers on rank
0's barrier, against a float64 sum on fresh inputs; the bugs the emulator must catch (a read
before the barrier, a mask missing a CTA, a slot released on the wrong CTA, no cluster_sync
after the init or before the end), launch errors, and NVRTC for sm_90 (SASS)."""

import pytest
import torch

import minicomp
from minicomp.backends.cuda import nvrtc
from minicomp.backends.cuda.emu import EmulatorError
from minicomp.backends.errors import CompileError
from minicomp.ir.printer import function_str
from minicomp.script import (
    ScriptError,
    attrs,
    blockIdx,
    cluster_ctarank,
    cluster_load,
    cluster_nctarank,
    cluster_store,
    cluster_sync,
    dim,
    f32,
    fence_mbarrier_init,
    i32,
    mbarrier_arrive_cluster,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait,
    shared_tensor,
    tensor_map,
    threadIdx,
    tma_load,
    u16,
    u64,
)
from minicomp.script.text import parse_function

ROWS, COLS = 8, 32  # a tile: one TMA box, a thread an element
THREADS = ROWS * COLS
STAGES = 2
TILE_BYTES = ROWS * COLS * 4


def multicast_ring(bug: str = ""):
    """out[b, i, j] = (rank + 1) * sum over k of x[(c * tiles + k) * ROWS + i, j] for block b of
    cluster c = b // 2. Rank 0's thread 0 loads each tile once for both CTAs of its cluster by
    multicast; each CTA's thread 0 announces the bytes on its own full[s]; every thread of
    both CTAs releases the slot on rank 0's empty[s] (2 * THREADS arrivals a phase).

    `bug` plants one: "early_read" (CTA 1 reads the stage before waiting on full), "mask"
    (the multicast leaves out CTA 1), "wrong_cta" (CTA 1 releases the slot on its own
    barrier), "no_init_sync" (no cluster_sync after the inits), "no_final_sync" (none before
    the end, so rank 0 may exit while CTA 1 still signals its barrier)."""
    mask = 1 if bug == "mask" else 3

    @minicomp.script
    def multicast_ring_kernel(
        x: tensor_map(f32[dim.rows, COLS], box=(ROWS, COLS), swizzle=0),
        out: f32[dim.blocks, ROWS, COLS],
        tiles: i32,
        rows: i32,
        blocks: i32,
    ):
        attrs.grid_dim = blocks
        attrs.block_dim = THREADS
        attrs.cluster_dim = 2
        t = threadIdx.x
        rank = cluster_ctarank()
        first = blockIdx.x // cluster_nctarank() * tiles
        buf = shared_tensor(f32, (STAGES, ROWS, COLS))
        full = shared_tensor(u64, (STAGES,))
        empty = shared_tensor(u64, (STAGES,))
        if t == 0:
            for s in range(STAGES):
                mbarrier_init(full[s], 1)
                mbarrier_init(empty[s], 2 * THREADS)
            fence_mbarrier_init()
        if bug != "no_init_sync":
            cluster_sync()
        acc = 0.0
        for k in range(tiles):
            s = k % STAGES
            phase = k // STAGES % 2
            if t == 0:
                if rank == 0:
                    mbarrier_wait(empty[s], phase ^ 1)
                mbarrier_arrive_expect_tx(full[s], TILE_BYTES)
                if rank == 0:
                    tma_load(buf[s, 0, 0], x, (first + k) * ROWS, 0, full[s], multicast=mask)
            if bug != "early_read" or rank == 0:
                mbarrier_wait(full[s], phase)
            acc += buf[s, t // COLS, t % COLS]
            if bug == "early_read" and rank == 1:
                mbarrier_wait(full[s], phase)
            mbarrier_arrive_cluster(empty[s], rank if bug == "wrong_cta" else 0)
        out[blockIdx.x, t // COLS, t % COLS] = acc * f32(rank + 1)
        if bug != "no_final_sync":
            cluster_sync()

    return multicast_ring_kernel


RING = multicast_ring()


def run(kernel, tiles: int, clusters: int):
    x = torch.randn(clusters * tiles * ROWS, COLS)
    out = torch.full((2 * clusters, ROWS, COLS), float("nan"))
    kernel.with_target("cuda-emu")(x, out, tiles, x.shape[0], 2 * clusters)
    return x, out


def expected(x, tiles: int, clusters: int):
    sums = x.double().view(clusters, tiles, ROWS, COLS).sum(1)
    return torch.stack([sums, 2 * sums], 1).view(2 * clusters, ROWS, COLS)


@pytest.mark.parametrize(("tiles", "clusters"), [(1, 1), (5, 2)])
def test_a_multicast_ring_matches_a_float64_sum(tiles, clusters):
    x, out = run(RING, tiles, clusters)
    torch.testing.assert_close(out.double(), expected(x, tiles, clusters), rtol=0, atol=1e-4)


def test_reading_the_multicast_box_before_the_barrier_sees_poison():
    _, out = run(multicast_ring("early_read"), 3, 1)
    assert out[1].isnan().any(), "CTA 1 read its stage before its own barrier completed"


def test_a_mask_missing_a_waiting_cta_is_a_reported_deadlock():
    with pytest.raises(
        EmulatorError,
        match=r"deadlock of a cluster of 2 CTAs.*CTA 1:.*full.*"
        rf"{TILE_BYTES} transaction bytes",
    ):
        run(multicast_ring("mask"), 3, 1)


def test_releasing_the_slot_on_the_wrong_cta_is_caught():
    with pytest.raises(EmulatorError, match=r"deadlock of a cluster.*CTA 0:.*empty"):
        run(multicast_ring("wrong_cta"), 3, 1)


def test_signalling_a_barrier_before_its_cta_initialised_it_is_an_error():
    with pytest.raises(
        EmulatorError,
        match=r"CTA 1 of the cluster, which that CTA has not "
        r"initialised",
    ):
        run(multicast_ring("no_init_sync"), 3, 1)


def test_a_cta_exiting_while_another_signals_it_is_an_error():
    with pytest.raises(EmulatorError, match=r"reaches CTA 0 of the cluster, which has exited"):
        run(multicast_ring("no_final_sync"), 3, 1)


def test_a_grid_off_the_cluster_is_refused_naming_both():
    x, out = torch.randn(3 * ROWS, COLS), torch.empty(3, ROWS, COLS)
    with pytest.raises(
        ValueError,
        match=r"grid \(3, 1, 1\) is not a multiple of its cluster "
        r"\(2, 1, 1\)",
    ):
        RING.with_target("cuda-emu")(x, out, 1, 3 * ROWS, 3)


def ranks(cluster: int, skip: bool = False):
    """out[b] = 100 * b + 10 * nctarank + rank, written after a cluster_sync (which CTA 1
    skips with `skip`); cluster 0: no attrs.cluster_dim (the barrier is the block's)."""

    @minicomp.script
    def ranks_kernel(out: i32[dim.n], n: i32):
        attrs.grid_dim = n
        attrs.block_dim = 64
        if cluster:
            attrs.cluster_dim = cluster
        if not (skip and cluster_ctarank() == 1):
            cluster_sync()
        if threadIdx.x == 0:
            out[blockIdx.x] = 100 * blockIdx.x + 10 * cluster_nctarank() + cluster_ctarank()

    return ranks_kernel


@pytest.mark.parametrize("cluster", [0, 4])
def test_ranks_and_the_cluster_barrier(cluster):
    out = torch.full((8,), -1, dtype=torch.int32)
    ranks(cluster).with_target("cuda-emu")(out, 8)
    b = torch.arange(8, dtype=torch.int32)
    want = 100 * b + (10 * cluster + b % cluster if cluster else 10)
    assert torch.equal(out, want), out


def test_a_cta_skipping_the_cluster_barrier_is_a_reported_deadlock():
    out = torch.empty(4, dtype=torch.int32)
    with pytest.raises(
        EmulatorError,
        match=r"deadlock of a cluster of 2 CTAs: CTA 0:.*64 "
        r"threads wait at cluster_wait \(line \d+\), the cluster barrier having "
        r"64 of its 128 arrivals; CTA 1 has exited",
    ):
        ranks(2, skip=True).with_target("cuda-emu")(out, 4)


def exchange(bug: str = ""):
    """Each CTA of a pair keeps its row of x in shared memory and writes twice its row into
    the other CTA's; after a cluster_sync, out[b] = the other's row (read remotely) + twice
    the other's row (written here by it). `bug`: "no_sync" (no cluster_sync between the
    writes and the reads)."""

    @minicomp.script
    def exchange_kernel(x: f32[dim.n, 64], out: f32[dim.n, 64], n: i32):
        attrs.grid_dim = n
        attrs.block_dim = 64
        attrs.cluster_dim = 2
        t = threadIdx.x
        other = cluster_ctarank() ^ 1
        mine = shared_tensor(f32, (64,))
        given = shared_tensor(f32, (64,))
        mine[t] = x[blockIdx.x, t]
        cluster_store(given[t], other, 2.0 * x[blockIdx.x, t])
        if bug != "no_sync":
            cluster_sync()
        out[blockIdx.x, t] = cluster_load(mine[t], other) + given[t]
        cluster_sync()  # the other CTA may still read this one's shared memory

    return exchange_kernel


EXCHANGE = exchange()


def test_ctas_exchange_values_through_each_others_shared_memory():
    x = torch.randn(6, 64)
    out = torch.full((6, 64), float("nan"))
    EXCHANGE.with_target("cuda-emu")(x, out, 6)
    swapped = x.view(3, 2, 64).flip(1).reshape(6, 64)
    torch.testing.assert_close(out, 3 * swapped)


def test_reading_another_cta_before_the_cluster_sync_misses_its_writes():
    x = torch.randn(2, 64)
    out = torch.full((2, 64), float("nan"))
    exchange("no_sync").with_target("cuda-emu")(x, out, 2)
    swapped = x.flip(0)
    assert not torch.allclose(out, 3 * swapped), "CTA 0 read CTA 1's memory before it wrote it"


def test_a_remote_element_of_two_bytes_is_refused():
    def kernel(out: f32[64]):
        attrs.grid_dim = 2
        attrs.block_dim = 64
        attrs.cluster_dim = 2
        h = shared_tensor(u16, (64,))
        out[threadIdx.x] = f32(cluster_load(h[threadIdx.x], 1))

    with pytest.raises(ScriptError, match=r"cluster_load\(\) moves 4- or 8-byte elements"):
        minicomp.script(kernel).ir  # noqa: B018


def test_the_kernel_prints_and_parses_back():
    text = function_str(RING.ir)
    assert "attrs.cluster_dim = (2, 1, 1)" in text and "multicast=3" in text, text
    assert "mbarrier_arrive_cluster(" in text
    assert parse_function(text) == RING.ir
    text = function_str(EXCHANGE.ir)
    assert (
        "cluster_store(given[i64(t)], other, " in text
        and "cluster_load(mine[i64(t)], other)" in text
    )
    assert parse_function(text) == EXCHANGE.ir


def test_a_cluster_of_more_than_8_ctas_is_refused():
    def kernel(out: f32[16]):
        attrs.grid_dim = 16
        attrs.block_dim = 32
        attrs.cluster_dim = (4, 4)
        out[blockIdx.x] = 1.0

    with pytest.raises(ScriptError, match=r"has 16 CTAs; a cluster has at most 8"):
        minicomp.script(kernel).ir  # noqa: B018


def _nvrtc():
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")


def test_it_compiles_for_sm_90_to_cluster_barriers_and_a_multicast_load(tmp_path):
    _nvrtc()
    from minicomp.backends.cuda import sass

    name = RING.ir.name
    assert "__cluster_dims__(2, 1, 1)" in RING.source
    binary = nvrtc.compile_cuda(RING.source, arch="sm_90", name=name, cache_dir=str(tmp_path))
    try:
        text = sass.disassemble(binary.cubin)[name]
    except sass.SassUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    ops = sass.full_opcode_counts(text)
    for op in ("UCGABAR_ARV", "UCGABAR_WAIT", "UTMALDG.2D.MULTICAST"):
        assert ops[op] > 0, (op, sorted(ops))
    # The remote loads and stores: generic-address ld/st of the mapped address.
    name = EXCHANGE.ir.name
    binary = nvrtc.compile_cuda(EXCHANGE.source, arch="sm_90", name=name, cache_dir=str(tmp_path))
    ops = sass.full_opcode_counts(sass.disassemble(binary.cubin)[name])
    assert any(op.startswith("LD.") for op in ops) and any(op.startswith("ST.") for op in ops), ops
    with pytest.raises(CompileError, match=r"cluster_ctarank\(\) needs sm_90"):
        nvrtc.compile_cuda(RING.source, arch="sm_80", name=name, cache_dir=str(tmp_path))
    # A cluster alone, without any cluster primitive, needs sm_90 as well.

    @minicomp.script
    def plain(out: f32[4]):
        attrs.grid_dim = 4
        attrs.block_dim = 32
        attrs.cluster_dim = 2
        out[blockIdx.x] = 1.0

    with pytest.raises(CompileError, match=r"__cluster_dims__ is not supported"):
        nvrtc.compile_cuda(plain.source, arch="sm_80", name="plain", cache_dir=str(tmp_path))
