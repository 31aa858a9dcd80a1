"""TMA tensor copies (minicomp.script.tma): boxes of odd-sized tensors loaded under each swizzle
and checked element by element against swizzle.h's formula, zero fill at the edges, a store
round trip clipped at the edges against eager on fresh inputs, the bugs the emulator must catch
(a read without the wait, wrong expect_tx bytes, a misaligned box, a store source overwritten
early), host and compile errors, the driver's arguments, and NVRTC for sm_90 (UTMALDG/UTMASTG)."""

import struct

import pytest
import torch

import minicomp
from minicomp.backends.cuda import nvrtc
from minicomp.backends.cuda.emu import EmulatorError
from minicomp.backends.cuda.tensor_map import driver_arguments, driver_call, emulator_bytes
from minicomp.backends.errors import CompileError
from minicomp.ir.types import TensorMapType
from minicomp.ir.types import f16 as IR_F16
from minicomp.ir.types import f32 as IR_F32
from minicomp.script import (
    ScriptError,
    attrs,
    blockIdx,
    bulk_commit_group,
    bulk_wait_group,
    bulk_wait_group_read,
    dim,
    dynamic_shared_tensor,
    f16,
    f32,
    fence_proxy_async,
    i32,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait,
    shared_tensor,
    syncthreads,
    tensor_map,
    threadIdx,
    tma_load,
    tma_store,
    u64,
)

# A box of f32 per swizzle: its inner dimension spans the swizzle (16 bytes unswizzled).
BOX_0, BOX_32, BOX_64, BOX_128 = (5, 4), (8, 8), (8, 16), (8, 32)
BOXES = {0: BOX_0, 32: BOX_32, 64: BOX_64, 128: BOX_128}
ROWS, COLS, PADDED = 19, 37, 40  # the tensor: a view of 37 columns of 40 (rows of 160 bytes)


def swizzled(offset: int, span: int) -> int:
    """swizzle.h's mc_swizzle, for a box at an address aligned to 8 * span."""
    mask = {128: 7, 64: 3, 32: 1}.get(span, 0)
    return offset ^ (((offset >> 7) & mask) << 4)


@minicomp.script
def load_box(
    a0: tensor_map(f32[dim.m, dim.k], box=BOX_0),
    a32: tensor_map(f32[dim.m, dim.k], box=BOX_32, swizzle=32),
    a64: tensor_map(f32[dim.m, dim.k], box=BOX_64, swizzle=64),
    a128: tensor_map(f32[dim.m, dim.k], box=BOX_128, swizzle=128),
    out: f32[256],
    swizzle: i32,
    r: i32,
    c: i32,
    shift: i32,
    tx_extra: i32,
    wait: i32,
    m: i32,
    k: i32,
):
    """out = the shared memory a tma_load of the box at (r, c) through the map of `swizzle`
    leaves, in address order (one kernel for the four maps keeps the test to one build). The
    other flags plant bugs: `wait` 0 reads without waiting, `tx_extra` announces more or fewer
    bytes than the box has, `shift` (elements) misaligns the destination."""
    attrs.grid_dim = 1
    attrs.block_dim = 64
    t = threadIdx.x
    buf = shared_tensor(f32, (256 + 32,))
    bar = shared_tensor(u64, (1,))
    if t == 0:
        mbarrier_init(bar[0], 1)
        fence_proxy_async()
    syncthreads()
    if t == 0:
        if swizzle == 0:
            mbarrier_arrive_expect_tx(bar[0], 5 * 4 * 4 + tx_extra)
            tma_load(buf[shift], a0, r, c, bar[0])
        elif swizzle == 32:
            mbarrier_arrive_expect_tx(bar[0], 8 * 8 * 4 + tx_extra)
            tma_load(buf[shift], a32, r, c, bar[0])
        elif swizzle == 64:
            mbarrier_arrive_expect_tx(bar[0], 8 * 16 * 4 + tx_extra)
            tma_load(buf[shift], a64, r, c, bar[0])
        else:
            mbarrier_arrive_expect_tx(bar[0], 8 * 32 * 4 + tx_extra)
            tma_load(buf[shift], a128, r, c, bar[0])
    if wait != 0:
        mbarrier_wait(bar[0], 0)
    for i in range(t, 256, 64):
        out[i] = buf[shift + i]


@pytest.fixture(scope="module")
def loader():
    kernel = load_box.with_target("cuda-emu")

    def load(x, swizzle, r, c, *, shift=0, tx_extra=0, wait=1) -> torch.Tensor:
        """The box's elements as they land in shared memory (`x` backs all four maps)."""
        out = torch.full((256,), -7.0)
        kernel(x, x, x, x, out, swizzle, r, c, shift, tx_extra, wait)
        rows, cols = BOXES[swizzle]
        return out[: rows * cols]

    return load


def fresh_tensor(device: str = "cpu") -> torch.Tensor:
    """A fresh ROWS x COLS f32 view whose rows are PADDED apart; the padding holds NaNs, which
    must never be loaded."""
    base = torch.full((ROWS, PADDED), float("nan"))
    base[:, :COLS] = torch.randn(ROWS, COLS)
    return base.to(device)[:, :COLS]


def expected_box(x: torch.Tensor, r: int, c: int, swizzle: int) -> torch.Tensor:
    rows, cols = BOXES[swizzle]
    out = torch.full((rows * cols,), float("nan"))
    for i in range(rows):
        for j in range(cols):
            inside = 0 <= r + i < x.shape[0] and 0 <= c + j < x.shape[1]
            at = swizzled((i * cols + j) * 4, swizzle) // 4
            out[at] = x[r + i, c + j] if inside else 0.0
    return out


@pytest.mark.parametrize("swizzle", sorted(BOXES))
@pytest.mark.parametrize("r, c", [(0, 0), (5, 3), (-3, -2), (16, 33)])
def test_a_box_lands_swizzled_with_zeros_outside_the_tensor(loader, swizzle, r, c):
    x = fresh_tensor()
    out = loader(x, swizzle, r, c)
    torch.testing.assert_close(out, expected_box(x, r, c, swizzle), rtol=0, atol=0)


def test_a_read_without_the_wait_sees_poison(loader):
    x = fresh_tensor()
    out = loader(x, 128, 0, 0, wait=0)
    assert torch.isnan(out).any()  # the poison of the copy in flight, not x's values
    assert not torch.equal(out, expected_box(x, 0, 0, 128))


def test_announcing_fewer_bytes_than_the_box_is_an_error(loader):
    with pytest.raises(EmulatorError, match=r"16 bytes more than mbarrier_arrive_expect_tx"):
        loader(fresh_tensor(), 128, 0, 0, tx_extra=-16)


def test_announcing_more_bytes_than_the_box_is_a_deadlock(loader):
    with pytest.raises(EmulatorError, match=r"deadlock.*16 transaction bytes"):
        loader(fresh_tensor(), 128, 0, 0, tx_extra=16)


def test_a_misaligned_destination_is_an_error(loader):
    with pytest.raises(EmulatorError, match=r"tma_load .*not 1024-byte aligned"):
        loader(fresh_tensor(), 128, 0, 0, shift=32)


# ---- host errors


def test_a_misaligned_tensor_is_refused(loader):
    flat = torch.randn(ROWS * PADDED + 1)
    x = flat[1:].view(ROWS, PADDED)
    with pytest.raises(ScriptError, match=r"argument a0: .*not 16-byte aligned"):
        loader(x, 0, 0, 0)


def test_rows_not_a_multiple_of_16_bytes_are_refused(loader):
    x = torch.randn(ROWS, COLS)  # rows of 148 bytes
    with pytest.raises(ScriptError, match=r"stride of 148 bytes.*multiple of 16 bytes"):
        loader(x, 0, 0, 0)


def test_the_tensor_must_have_the_maps_element_type(loader):
    x = torch.randn(ROWS, PADDED).half()
    with pytest.raises(ScriptError, match=r"argument a0.*float32 tensor, got float16"):
        loader(x, 0, 0, 0)


@pytest.mark.parametrize(
    "box, swizzle, message",
    [
        ((300, 8), 0, r"sizes 1 to 256"),
        ((8, 6), 0, r"inner dimension is 12 bytes.*multiple of 16"),
        ((8, 64), 64, r"128 bytes .* over the 64-byte swizzle span"),
        ((8, 8), 48, r"swizzle of tensor_map\(\) is 0, 32, 64 or 128"),
    ],
)
def test_a_box_the_driver_refuses_is_a_compile_error(box, swizzle, message):
    def kernel(a: tensor_map(f16[dim.m, dim.k], box=box, swizzle=swizzle), m: i32, k: i32):
        attrs.grid_dim = 1
        attrs.block_dim = 32

    with pytest.raises(ScriptError, match=message):
        minicomp.script(kernel).ir  # noqa: B018


# ---- a TMA-fed kernel: tiles loaded, doubled in shared memory, stored back

TILE = (16, 64)  # f16: 128-byte rows, the 128-byte swizzle


@minicomp.script
def double_tiles(
    a: tensor_map(f16[dim.m, dim.k], box=TILE, swizzle=128),
    b: tensor_map(f16[dim.m, dim.k], box=TILE, swizzle=128),
    clobber: i32,
    m: i32,
    k: i32,
):
    """b = 2 * a, a block per 16 x 64 tile: thread 0 loads the tile, every thread doubles its
    elements in shared memory, thread 0 stores it (clipped at the tensor's edges). `clobber`
    plants a bug: the source is written again before bulk_wait_group_read."""
    attrs.grid_dim = ((k + 63) // 64, (m + 15) // 16)
    attrs.block_dim = 128
    t = threadIdx.x
    r0 = blockIdx.y * 16
    c0 = blockIdx.x * 64
    buf = shared_tensor(f16, (16 * 64,))
    bar = shared_tensor(u64, (1,))
    if t == 0:
        mbarrier_init(bar[0], 1)
        fence_proxy_async()
    syncthreads()
    if t == 0:
        mbarrier_arrive_expect_tx(bar[0], 16 * 64 * 2)
        tma_load(buf, a, r0, c0, bar[0])
    mbarrier_wait(bar[0], 0)
    for i in range(t, 16 * 64, 128):
        buf[i] = buf[i] * 2.0
    fence_proxy_async()
    syncthreads()
    if t == 0:
        tma_store(b, r0, c0, buf)
        bulk_commit_group()
        if clobber != 0:
            buf[0] = 0.0
        bulk_wait_group_read(0)
        buf[1] = 0.0  # the store has read its source: free to reuse
        bulk_wait_group(0)


@pytest.fixture(scope="module")
def doubler():
    return double_tiles.with_target("cuda-emu")


def test_a_store_round_trip_is_clipped_at_the_edges(doubler):
    m, k, padded = 37, 100, 104  # rows of 208 bytes; edge tiles partly outside
    a = torch.randn(m, padded).half()[:, :k]
    out = torch.full((m, padded), float("nan")).half()
    b = out[:, :k]
    doubler(a, b, 0)
    torch.testing.assert_close(b, a * 2, rtol=0, atol=0)
    assert torch.isnan(out[:, k:]).all()  # past the edge: never written


def test_overwriting_a_store_source_before_its_read_wait_is_an_error(doubler):
    a = torch.randn(16, 64).half()
    with pytest.raises(EmulatorError, match=r"source of tma_store \(line \d+\) was overwritten"):
        doubler(a, torch.zeros(16, 64).half(), 1)


# ---- a 1D stream through two buffers: stores in flight while the next chunk loads


@minicomp.script
def stream(
    x: tensor_map(f32[dim.n], box=(64,)),
    y: tensor_map(f32[dim.n], box=(64,)),
    skip_wait: i32,
    n: i32,
):
    """y = x, 64 elements a chunk, by thread 0 alone: each chunk is loaded into buffer k % 2 and
    stored from there, the store left in flight. Before loading into a buffer again, the store
    issued from it two chunks ago must have read it: bulk_wait_group_read(1). `skip_wait`
    plants the bug of leaving that wait out."""
    attrs.grid_dim = 1
    attrs.block_dim = 32
    bufs = shared_tensor(f32, (2, 64))
    full = shared_tensor(u64, (2,))
    if threadIdx.x == 0:
        mbarrier_init(full[0], 1)
        mbarrier_init(full[1], 1)
        fence_proxy_async()
        for k in range((n + 63) // 64):
            s = k % 2
            if skip_wait == 0:
                bulk_wait_group_read(1)
            mbarrier_arrive_expect_tx(full[s], 64 * 4)
            tma_load(bufs[s, 0], x, k * 64, full[s])
            mbarrier_wait(full[s], k // 2 % 2)
            tma_store(y, k * 64, bufs[s, 0])
            bulk_commit_group()
        bulk_wait_group(0)


@pytest.fixture(scope="module")
def streamer():
    return stream.with_target("cuda-emu")


def test_stores_in_flight_complete_in_their_groups(streamer):
    x = torch.randn(300)
    out = torch.full((320,), float("nan"))
    streamer(x, out[:300], 0)
    assert torch.equal(out[:300], x) and torch.isnan(out[300:]).all()


def test_reloading_a_buffer_a_store_still_reads_is_an_error(streamer):
    with pytest.raises(EmulatorError, match=r"source of tma_store \(line \d+\) was overwritten"):
        streamer(torch.randn(300), torch.zeros(300), 1)


# ---- three dimensions


@minicomp.script
def copy_boxes_3d(
    a: tensor_map(f16[dim.p, dim.q, dim.r], box=(2, 3, 8)),
    b: tensor_map(f16[dim.p, dim.q, dim.r], box=(2, 3, 8)),
    p: i32,
    q: i32,
    r: i32,
):
    """b = a, a block per 2 x 3 x 8 box, loaded and stored by thread 0."""
    attrs.grid_dim = ((r + 7) // 8, (q + 2) // 3, (p + 1) // 2)
    attrs.block_dim = 32
    box = shared_tensor(f16, (2, 3, 8))
    bar = shared_tensor(u64, (1,))
    if threadIdx.x == 0:
        mbarrier_init(bar[0], 1)
        mbarrier_arrive_expect_tx(bar[0], 2 * 3 * 8 * 2)
        tma_load(box, a, blockIdx.z * 2, blockIdx.y * 3, blockIdx.x * 8, bar[0])
        mbarrier_wait(bar[0], 0)
        tma_store(b, blockIdx.z * 2, blockIdx.y * 3, blockIdx.x * 8, box)
        bulk_commit_group()
        bulk_wait_group(0)


def test_three_dimensional_boxes_round_trip():
    a = torch.randn(5, 7, 24).half()[:, :, :20]  # rows of 48 bytes, planes of 336
    out = torch.full((5, 7, 24), float("nan")).half()
    copy_boxes_3d.with_target("cuda-emu")(a, out[:, :, :20])
    assert torch.equal(out[:, :, :20], a) and torch.isnan(out[:, :, 20:]).all()


# ---- compile errors


def _compile_error(body) -> str:
    with pytest.raises(ScriptError) as err:
        minicomp.script(body).ir  # noqa: B018
    return str(err.value)


def test_the_destination_must_be_aligned_for_the_swizzle():
    def kernel(a: tensor_map(f16[dim.m, dim.k], box=TILE, swizzle=128), m: i32, k: i32):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        buf = shared_tensor(f16, (2 * 16 * 64,))
        bar = shared_tensor(u64, (1,))
        tma_load(buf[64], a, 0, 0, bar[0])

    assert "must be 1024-byte aligned; element 64 of buf is at byte 128" in _compile_error(kernel)


def test_the_destination_must_hold_the_box():
    def kernel(a: tensor_map(f16[dim.m, dim.k], box=TILE, swizzle=128), m: i32, k: i32):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        buf = shared_tensor(f16, (16 * 32,))
        bar = shared_tensor(u64, (1,))
        tma_load(buf, a, 0, 0, bar[0])

    assert "needs 1024 f16 elements; buf has 512" in _compile_error(kernel)


def test_the_destination_must_be_an_aligned_shared_tensor_of_the_maps_type():
    def wrong_type(a: tensor_map(f16[dim.m, dim.k], box=TILE), m: i32, k: i32):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        buf = shared_tensor(f32, (16 * 64,))
        bar = shared_tensor(u64, (1,))
        tma_load(buf, a, 0, 0, bar[0])

    def dynamic(a: tensor_map(f16[dim.m, dim.k], box=TILE, swizzle=128), m: i32, k: i32):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        # The dynamic shared memory starts 1024-byte aligned: a box under the 128-byte swizzle
        # goes at a multiple of 1024 bytes (as matmul_hopper's ring does), not at 512.
        buf = dynamic_shared_tensor(f16, (2, 16 * 64), at=512)
        bar = shared_tensor(u64, (1,))
        tma_load(buf[blockIdx.x], a, 0, 0, bar[0])

    assert "holds f32: the types must match" in _compile_error(wrong_type)
    assert (
        "must be placed at a multiple of 1024 bytes of the dynamic shared memory; buf starts "
        "at byte 512" in _compile_error(dynamic)
    )


def test_a_copy_takes_one_coordinate_a_dimension():
    def kernel(a: tensor_map(f16[dim.m, dim.k], box=TILE), m: i32, k: i32):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        buf = shared_tensor(f16, (16 * 64,))
        tma_store(a, 0, 0, 0, buf)

    assert "takes 2 coordinates for a (a 2-dimensional tensor map), 3 given" in _compile_error(
        kernel
    )


def test_a_kernel_with_a_tensor_map_is_not_a_custom_op():
    with pytest.raises(ScriptError, match=r"parameter a is a TMA tensor map"):
        minicomp.script.custom_op("tma_test::double", double_tiles, outputs="b")


def test_a_wait_takes_a_compile_time_group_count():
    def kernel(n: i32):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        bulk_wait_group(n)

    assert "bulk_wait_group() takes a compile-time int from 0 to 63" in _compile_error(kernel)


# ---- the driver's arguments and the emulator's encoding (no GPU needed)


def test_the_driver_arguments_list_dimensions_innermost_first():
    x = torch.zeros(37, 104, dtype=torch.float16)[:, :100]
    args = driver_arguments(x, TensorMapType(IR_F16, TILE, 128))
    assert args["tensorDataType"] == 6  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    assert args["tensorRank"] == 2 and args["globalAddress"] == x.data_ptr()
    assert args["globalDim"] == [100, 37] and args["globalStrides"] == [208]
    assert args["boxDim"] == [64, 16] and args["elementStrides"] == [1, 1]
    assert args["swizzle"] == 3 and args["interleave"] == 0 and args["oobFill"] == 0
    call = driver_call(x, TensorMapType(IR_F16, TILE, 128))  # in cuda-python's types
    assert [int(n) for n in call[3]] == [100, 37] and [int(n) for n in call[5]] == [64, 16]
    assert call[8].name == "CU_TENSOR_MAP_SWIZZLE_128B"


def test_the_emulators_map_holds_what_emu_tma_h_reads():
    x = torch.zeros(ROWS, PADDED)[:, :COLS]
    data = emulator_bytes(x, TensorMapType(IR_F32, (8, 16), 64))
    assert len(data) == 128
    base, magic, size, rank, swizzle = struct.unpack_from("<QIIII", data)
    dims = struct.unpack_from("<5Q", data, 24)
    strides = struct.unpack_from("<5Q", data, 64)
    box = struct.unpack_from("<5I", data, 104)
    assert (base, magic, size, rank, swizzle) == (x.data_ptr(), 0x4D54434D, 4, 2, 64)
    assert dims[:2] == (COLS, ROWS) and strides[:2] == (4, PADDED * 4) and box[:2] == (16, 8)


# ---- NVRTC


def _nvrtc():
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_tma_compiles_for_sm_90_to_utmaldg_and_utmastg(arch, tmp_path):
    _nvrtc()
    from minicomp.backends.cuda import sass

    source, name = double_tiles.source, double_tiles.ir.name
    binary = nvrtc.compile_cuda(source, arch=arch, name=name, cache_dir=str(tmp_path))
    usage = binary.resources[name]
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
    try:
        text = sass.disassemble(binary.cubin)[name]
    except sass.SassUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    ops = sass.full_opcode_counts(text)
    assert ops["UTMALDG.2D"] > 0 and ops["UTMASTG.2D"] > 0, sorted(ops)
    (report,) = sass.check_kernels(source, binary.cubin)
    assert {"UTMALDG", "UTMASTG"} <= set(report.intended) and report.ok, report
    assert sass.instruction_classes(ops)["async copy"] >= 2


@pytest.mark.parametrize("kernel, rank", [(stream, 1), (copy_boxes_3d, 3)])
def test_one_and_three_dimensional_copies_compile_for_sm_90(kernel, rank, tmp_path):
    _nvrtc()
    from minicomp.backends.cuda import sass

    name = kernel.ir.name
    binary = nvrtc.compile_cuda(kernel.source, arch="sm_90", name=name, cache_dir=str(tmp_path))
    try:
        ops = sass.full_opcode_counts(sass.disassemble(binary.cubin)[name])
    except sass.SassUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    assert ops[f"UTMALDG.{rank}D"] > 0 and ops[f"UTMASTG.{rank}D"] > 0, sorted(ops)


def test_below_sm_90_the_error_names_the_tma_primitives(tmp_path):
    _nvrtc()
    with pytest.raises(CompileError, match=r"tma_load\(\) needs sm_90 or newer"):
        nvrtc.compile_cuda(
            double_tiles.source, arch="sm_80", name="double_tiles", cache_dir=str(tmp_path)
        )


# ---- on a GPU


@pytest.mark.gpu
def test_on_the_gpu_the_driver_map_runs_the_round_trip():
    m, k, padded = 37, 100, 104
    a = torch.randn(m, padded, device="cuda").half()[:, :k]
    out = torch.full((m, padded), float("nan"), device="cuda").half()
    double_tiles.with_target("cuda")(a, out[:, :k], 0)
    torch.cuda.synchronize()
    torch.testing.assert_close(out[:, :k], a * 2, rtol=0, atol=0)
    assert torch.isnan(out[:, k:]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("swizzle", sorted(BOXES))
def test_on_the_gpu_boxes_land_as_the_emulator_lands_them(swizzle):
    kernel = load_box.with_target("cuda")
    x = fresh_tensor("cuda")
    rows, cols = BOXES[swizzle]
    for r, c in [(0, 0), (5, 3), (-3, -2), (16, 33)]:
        out = torch.full((256,), -7.0, device="cuda")
        kernel(x, x, x, x, out, swizzle, r, c, 0, 0, 1)
        torch.cuda.synchronize()
        expected = expected_box(x.cpu(), r, c, swizzle)
        torch.testing.assert_close(out[: rows * cols].cpu(), expected, rtol=0, atol=0)
