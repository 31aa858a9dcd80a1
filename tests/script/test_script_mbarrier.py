"""mbarriers and bulk asynchronous copies (minicomp.script.hopper): a producer/consumer ring
against a float64 sum on fresh inputs of odd sizes, the bugs the emulator must catch (a read
without the wait, a wrong phase parity, wrong transaction byte counts), compile errors, and
NVRTC compilation for sm_90 (SASS) with the architecture error below it."""

import math

import pytest
import torch

import minicomp
from minicomp.backends.cuda import nvrtc
from minicomp.backends.cuda.emu import EmulatorError, OutOfBoundsError
from minicomp.backends.errors import CompileError
from minicomp.ir.printer import function_str
from minicomp.script import (
    ScriptError,
    attrs,
    blockIdx,
    bulk_copy_g2s,
    dim,
    f32,
    fence_proxy_async,
    i32,
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_try_wait_parity,
    mbarrier_wait,
    shared_tensor,
    syncthreads,
    threadIdx,
    u64,
)
from minicomp.script.text import parse_function

THREADS = 96  # three warps; warp 0 also produces
TILE = 8  # rows a stage
STAGES = 2
ROW_BYTES = THREADS * 4


def ring_sum(bug: str = "", spin: bool = False):
    """out[c] = sum over rows r of x[r, c], a block per THREADS columns: warp 0 copies TILE rows
    a stage into a STAGES-deep shared ring with bulk copies (one a row, announced on full[s] by
    lane 0), every thread sums its column of the stage and releases it on empty[s].

    `bug` plants one: "no_wait" (consumers read without waiting on full), "parity" (the
    producer waits on empty with the consumers' parity), "short_tx" / "long_tx" (lane 0
    announces 16 bytes fewer / more than the copies bring), "overrun" (the copies start a row
    late, so the last reads past the end of x). `spin` waits with a
    mbarrier_try_wait_parity loop instead of mbarrier_wait."""
    extra = {"short_tx": -16, "long_tx": 16}.get(bug, 0)
    producer_flip = 0 if bug == "parity" else 1
    shift = 1 if bug == "overrun" else 0

    @minicomp.script
    def ring_sum_kernel(x: f32[dim.rows, dim.cols], out: f32[dim.cols], rows: i32, cols: i32):
        attrs.grid_dim = cols // THREADS
        attrs.block_dim = THREADS
        t = threadIdx.x
        col0 = blockIdx.x * THREADS
        buf = shared_tensor(f32, (STAGES, TILE, THREADS))
        full = shared_tensor(u64, (STAGES,))
        empty = shared_tensor(u64, (STAGES,))
        if t == 0:
            for s in range(STAGES):
                mbarrier_init(full[s], 1)
                mbarrier_init(empty[s], THREADS)
            fence_proxy_async()
        syncthreads()
        acc = 0.0
        for k in range((rows + TILE - 1) // TILE):
            s = k % STAGES
            phase = k // STAGES % 2
            r0 = k * TILE
            nr = min(TILE, rows - r0)
            if t < 32:
                if spin:
                    while not mbarrier_try_wait_parity(empty[s], phase ^ producer_flip):
                        acc += 0.0
                else:
                    mbarrier_wait(empty[s], phase ^ producer_flip)
                if t == 0:
                    mbarrier_arrive_expect_tx(full[s], nr * ROW_BYTES + extra)
                for r in range(t, nr, 32):
                    bulk_copy_g2s(buf[s, r, 0], x[r0 + r + shift, col0], ROW_BYTES, full[s])
            if bug != "no_wait":
                if spin:
                    while not mbarrier_try_wait_parity(full[s], phase):
                        acc += 0.0
                else:
                    mbarrier_wait(full[s], phase)
            for r in range(nr):
                acc += buf[s, r, t]
            mbarrier_arrive(empty[s])
        out[col0 + t] = acc

    return ring_sum_kernel


RING = ring_sum()


def run(kernel, rows: int, blocks: int):
    x = torch.randn(rows, blocks * THREADS)
    out = torch.full((blocks * THREADS,), math.nan)
    kernel.with_target("cuda-emu")(x, out)
    return x, out


@pytest.mark.parametrize(("rows", "blocks"), [(1, 1), (7, 2), (8, 1), (17, 3), (45, 2)])
@pytest.mark.parametrize("spin", [False, True], ids=["wait", "try_wait"])
def test_ring_matches_a_float64_sum(rows, blocks, spin):
    kernel = RING if not spin else ring_sum(spin=True)
    x, out = run(kernel, rows, blocks)
    want = x.double().sum(0)
    assert out.dtype == torch.float32 and out.shape == (blocks * THREADS,)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5 * rows)


def test_reading_without_the_wait_sees_poison_not_the_data():
    _, out = run(ring_sum("no_wait"), 23, 1)
    assert out.isnan().any(), "a read before the copy's phase completed must not see the data"


@pytest.mark.parametrize("spin", [False, True], ids=["wait", "try_wait"])
def test_a_wrong_phase_parity_is_a_reported_deadlock(spin):
    with pytest.raises(EmulatorError) as err:
        run(ring_sum("parity", spin=spin), 23, 1)
    message = str(err.value)
    assert "ring_sum_kernel" in message and "deadlock" in message, message
    assert "empty" in message and "full" in message and "mbarrier" in message, message


def test_announcing_fewer_bytes_than_copied_is_an_error():
    with pytest.raises(EmulatorError, match=r"full.*16 bytes more than mbarrier_arrive_expect_tx"):
        run(ring_sum("short_tx"), 23, 1)


def test_announcing_more_bytes_than_copied_is_a_deadlock():
    with pytest.raises(EmulatorError, match=r"deadlock.*mbarrier .*full.*16 transaction bytes"):
        run(ring_sum("long_tx"), 23, 1)


def test_the_ring_prints_and_parses_back():
    text = function_str(RING.ir)
    assert "bulk_copy_g2s(" in text and "mbarrier_arrive_expect_tx(" in text
    assert parse_function(text) == RING.ir


# ---- compile errors


def _compile_error(body) -> str:
    with pytest.raises(ScriptError) as err:
        minicomp.script(body).ir  # noqa: B018
    return str(err.value)


def test_a_barrier_must_be_a_shared_64_bit_element():
    def kernel(x: f32[16]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        bars = shared_tensor(f32, (2,))
        mbarrier_init(bars[0], 1)

    assert "the barrier of mbarrier_init() must hold u64 or i64" in _compile_error(kernel)


def test_a_bulk_copy_is_a_multiple_of_16_bytes():
    def kernel(x: f32[16]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        buf = shared_tensor(f32, (16,))
        bar = shared_tensor(u64, (1,))
        bulk_copy_g2s(buf[0], x[0], 12, bar[0])

    assert "positive multiple of 16 bytes, not 12" in _compile_error(kernel)


def test_a_bulk_copy_is_16_byte_aligned():
    def kernel(x: f32[16]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        buf = shared_tensor(f32, (16,))
        bar = shared_tensor(u64, (1,))
        bulk_copy_g2s(buf[2], x[0], 16, bar[0])

    assert "must be 16-byte aligned" in _compile_error(kernel)


def test_a_wrong_constant_parity_is_refused():
    def kernel(x: f32[16]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        bar = shared_tensor(u64, (1,))
        mbarrier_wait(bar[0], 2)

    assert "parity of mbarrier_wait() is 0 or 1, not 2" in _compile_error(kernel)


# ---- NVRTC


def _nvrtc():
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_the_ring_compiles_for_sm_90_to_sync_and_bulk_copy_instructions(arch, tmp_path):
    _nvrtc()
    from minicomp.backends.cuda import sass

    binary = nvrtc.compile_cuda(RING.source, arch=arch, name=RING.ir.name, cache_dir=str(tmp_path))
    usage = binary.resources[RING.ir.name]
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
    try:
        text = sass.disassemble(binary.cubin)[RING.ir.name]
    except sass.SassUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    # What ptxas made of them (CUDA 13): SYNCS.EXCH.64 (init), SYNCS.ARRIVE.TRANS64[.A1T0]
    # (arrive, arrive.expect_tx), SYNCS.PHASECHK.TRANS64.TRYWAIT (try_wait), UBLKCP.S.G
    # (the bulk copy), FENCE.VIEW.ASYNC.S (the proxy fence).
    ops = sass.full_opcode_counts(text)
    for op in ("SYNCS.EXCH.64", "SYNCS.PHASECHK.TRANS64.TRYWAIT", "UBLKCP.S.G"):
        assert ops[op] > 0, (op, sorted(ops))
    assert any(op.startswith("SYNCS.ARRIVE.TRANS64") for op in ops), sorted(ops)
    assert "FENCE.VIEW.ASYNC.S" in ops, sorted(ops)
    (report,) = sass.check_kernels(RING.source, binary.cubin)
    assert "UBLKCP" in report.intended and report.ok, report


# ---- mbarriers alone (sm_80): a block-wide exchange


@minicomp.script
def rotate(x: f32[dim.n], out: f32[dim.n], n: i32):
    """out[i] = x[i + 1 within its block of 64] + x[i]: values pass through shared memory,
    published by every thread's arrival on one mbarrier (count 64) instead of syncthreads."""
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    t = threadIdx.x
    i = blockIdx.x * 64 + t
    s = shared_tensor(f32, (64,))
    bar = shared_tensor(u64, (1,))
    if t == 0:
        mbarrier_init(bar[0], 64)
    syncthreads()
    s[t] = x[i] if i < n else 0.0
    mbarrier_arrive(bar[0])
    if t % 2 == 0:
        mbarrier_wait(bar[0], 0)
    else:
        while not mbarrier_try_wait_parity(bar[0], 0):
            s[t] = s[t]
    j = blockIdx.x * 64 + (t + 1) % 64
    if i < n:
        out[i] = x[i] + (s[(t + 1) % 64] if j < n else 0.0)


@pytest.mark.parametrize("n", [1, 63, 130])
def test_an_mbarrier_publishes_a_block_exchange(n):
    x = torch.randn(n)
    out = torch.full((n,), math.nan)
    rotate.with_target("cuda-emu")(x, out)
    nxt = torch.zeros(n)
    for i in range(n):
        j = i // 64 * 64 + (i % 64 + 1) % 64
        nxt[i] = x[j] if j < n else 0.0
    torch.testing.assert_close(out, x + nxt, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_mbarriers_alone_compile_for_sm_80_and_sm_90(arch, tmp_path):
    _nvrtc()
    binary = nvrtc.compile_cuda(rotate.source, arch=arch, name="rotate", cache_dir=str(tmp_path))
    assert rotate.ir.name in binary.resources
    assert "warning" not in binary.log, binary.log


def test_a_barrier_used_before_its_init_is_an_error():
    @minicomp.script
    def uninitialised(x: f32[32]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        bar = shared_tensor(u64, (1,))
        mbarrier_arrive(bar[0])
        x[threadIdx.x] = 1.0

    with pytest.raises(EmulatorError, match=r"uninitialised.*not initialised with mbarrier_init"):
        uninitialised.with_target("cuda-emu")(torch.zeros(32))


def test_below_sm_90_the_error_names_the_primitive_and_the_architecture(tmp_path):
    _nvrtc()
    with pytest.raises(CompileError, match=r"bulk_copy_g2s\(\) needs sm_90 or newer"):
        nvrtc.compile_cuda(RING.source, arch="sm_80", name=RING.ir.name, cache_dir=str(tmp_path))


def test_the_ring_runs_checked_and_a_copy_past_the_end_is_caught():
    with minicomp.config.patch(emu_checks=True):
        x, out = run(RING, 17, 2)
        torch.testing.assert_close(out.double(), x.double().sum(0), rtol=0, atol=1e-4)
        with pytest.raises(OutOfBoundsError, match=r"ring_sum_kernel.*\bx\b"):
            run(ring_sum("overrun"), 17, 1)
