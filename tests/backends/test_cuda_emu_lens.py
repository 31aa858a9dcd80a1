"""Counted emulator builds (lens=True): hand-written CUDA kernels whose memory behaviour is known
by hand (coalesced, strided, bank-conflicting, vectorised) give exactly those counts, and still
compute what unchecked builds compute."""

import pytest
import torch

from minicomp.backends.cuda.emu import EmulatorError, build_emulated, default_sample

KERNELS = r"""
extern "C" __global__ void copy(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void gather32(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i * 32];
}
extern "C" __global__ void broadcast(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[0];
}
extern "C" __global__ void copy_vec16(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v[4];
    if (4 * i < n) {
        mc_load_vec16(v, x + 4 * i);
        mc_store_vec16(y + 4 * i, v);
    }
}
extern "C" __global__ void transpose(const float* x, float* y, int n) {
    __shared__ float t[32][32];
    int bx = blockIdx.x * 32, by = blockIdx.y * 32;
    for (int r = threadIdx.y; r < 32; r += blockDim.y)
        t[r][threadIdx.x] = x[(by + r) * n + bx + threadIdx.x];
    __syncthreads();
    for (int r = threadIdx.y; r < 32; r += blockDim.y)
        y[(bx + r) * n + by + threadIdx.x] = t[threadIdx.x][r];
}
extern "C" __global__ void transpose_padded(const float* x, float* y, int n) {
    __shared__ float t[32][33];
    int bx = blockIdx.x * 32, by = blockIdx.y * 32;
    for (int r = threadIdx.y; r < 32; r += blockDim.y)
        t[r][threadIdx.x] = x[(by + r) * n + bx + threadIdx.x];
    __syncthreads();
    for (int r = threadIdx.y; r < 32; r += blockDim.y)
        y[(bx + r) * n + by + threadIdx.x] = t[threadIdx.x][r];
}
extern "C" __global__ void dynamic_stride2(const float* x, float* y) {
    float* s = (float*)mc_dynamic_smem;
    s[2 * threadIdx.x] = x[threadIdx.x];  // two lanes a bank: 2-way conflicts
    __syncthreads();
    y[threadIdx.x] = s[2 * threadIdx.x];
}
extern "C" __global__ void count_atomics(int* counter) {
    atomicAdd(counter, 1);
}
"""
SIGNATURES = [
    ("copy", "const float*, float*, int"),
    ("gather32", "const float*, float*, int"),
    ("broadcast", "const float*, float*, int"),
    ("copy_vec16", "const float*, float*, int"),
    ("transpose", "const float*, float*, int", True),
    ("transpose_padded", "const float*, float*, int", True),
    ("dynamic_stride2", "const float*, float*", True),
    ("count_atomics", "int*"),
]


@pytest.fixture(scope="module")
def lens(tmp_path_factory):
    return build_emulated(
        KERNELS, SIGNATURES, cache_dir=str(tmp_path_factory.mktemp("c")), lens=True
    )


def sector_efficiency(c, kind="load"):
    return c[f"global_{kind}_bytes"] / (32 * c[f"global_{kind}_sectors"])


def test_a_coalesced_copy_uses_every_byte_of_its_sectors(lens):
    n = 4096
    x, y = torch.randn(n), torch.full((n,), float("nan"))
    sample = lens.launch_counted("copy", n // 256, 256, [x, y, n])
    assert torch.equal(y, x)  # every block ran
    c = sample.counters
    assert c["blocks"] == len(sample.sampled) == 8 and c["threads"] == 8 * 256
    assert c["global_loads"] == c["global_stores"] == 8 * 256 // 32
    assert c["global_load_sectors"] == 4 * c["global_loads"]  # 128 bytes a warp
    assert sector_efficiency(c) == sector_efficiency(c, "store") == 1
    assert sample.read == (0,) and sample.written == (1,)


def test_a_stride_32_gather_uses_an_eighth_of_its_sectors(lens):
    n = 4096
    x, y = torch.randn(32 * n), torch.empty(n)
    c = lens.launch_counted("gather32", n // 256, 256, [x, y, n]).counters
    assert torch.equal(y, x[::32])
    assert c["global_load_sectors"] == 32 * c["global_loads"]
    assert sector_efficiency(c) == 1 / 8
    assert sector_efficiency(c, "store") == 1


def test_a_broadcast_load_is_one_sector(lens):
    x, y = torch.randn(8), torch.empty(256)
    c = lens.launch_counted("broadcast", 1, 256, [x, y, 256]).counters
    assert c["global_load_sectors"] == c["global_loads"] == 8


def test_16_byte_vector_accesses_are_one_request_of_16_sectors_a_warp(lens):
    n = 4096
    x, y = torch.randn(n), torch.empty(n)
    c = lens.launch_counted("copy_vec16", n // 4 // 128, 128, [x, y, n]).counters
    assert torch.equal(y, x)
    assert c["global_load_sectors"] == 16 * c["global_loads"] and sector_efficiency(c) == 1
    assert c["global_store_sectors"] == 16 * c["global_stores"]


@pytest.mark.parametrize("kernel, load_ways", [("transpose", 32), ("transpose_padded", 1)])
def test_a_shared_transpose_conflicts_32_ways_unless_padded(lens, kernel, load_ways):
    n = 128
    x, y = torch.randn(n, n), torch.empty(n, n)
    sample = lens.launch_counted(kernel, (4, 4), (32, 8), [x, y, n])
    assert torch.equal(y, x.t())
    c = sample.counters
    # Each of 8 warps a block stores 4 rows and loads 4 columns, one request each.
    assert c["shared_stores"] == c["shared_loads"] == 8 * 4 * c["blocks"]
    requests = c["shared_stores"] + c["shared_loads"]
    assert c["shared_ideal_wavefronts"] == requests
    assert c["shared_wavefronts"] == c["shared_stores"] + load_ways * c["shared_loads"]
    assert c["barriers"] == 256 * c["blocks"]  # one per thread
    assert sector_efficiency(c) == sector_efficiency(c, "store") == 1


def test_dynamic_shared_memory_counts_as_shared(lens):
    x, y = torch.randn(64), torch.empty(64)
    sample = lens.launch_counted("dynamic_stride2", 1, 64, [x, y], 512)
    c = sample.counters
    assert torch.equal(y, x)
    assert c["shared_stores"] == c["shared_loads"] == 2
    assert c["shared_wavefronts"] == 2 * c["shared_ideal_wavefronts"] == 8


def test_sample_only_runs_the_sampled_blocks(lens):
    n = 64 * 256
    x, y = torch.randn(n), torch.zeros(n)
    sample = lens.launch_counted("copy", 64, 256, [x, y, n], sample=(3, 40), sample_only=True)
    assert sample.sampled == (3, 40) and sample.blocks == 64
    ran = (y.view(64, 256) != 0).all(1).nonzero().flatten().tolist()
    assert ran == [3, 40]
    assert sample.counters["global_loads"] == 2 * 256 // 32


def test_atomics_are_counted_per_thread(lens):
    counter = torch.zeros(1, dtype=torch.int32)
    c = lens.launch_counted("count_atomics", 4, 64, [counter]).counters
    assert counter.item() == 256 and c["atomics"] == 256


def test_the_default_sample_spreads_over_the_grid():
    assert default_sample(5) == (0, 1, 2, 3, 4)
    sample = default_sample(1000)
    assert len(sample) == 8 and sample[0] == 0 and sample[-1] == 999


def test_a_sample_of_block_groups_takes_whole_groups():
    """Blocks that finish a tile together (an in-kernel split-K) are sampled in whole groups:
    a launch of the sampled blocks alone completes each group's work."""
    assert default_sample(6, group=3) == (0, 1, 2, 3, 4, 5)
    sample = default_sample(300, group=3)
    assert len(sample) == 8 * 3 and sample[:3] == (0, 1, 2) and sample[-3:] == (297, 298, 299)
    assert all(sample[i] % 3 == 0 and sample[i + 2] == sample[i] + 2 for i in range(0, 24, 3))
    assert default_sample(7, most=2, group=3) == (0, 1, 2, 6)  # the last group is short


def test_counting_needs_a_counted_build(tmp_path):
    plain = build_emulated(KERNELS, SIGNATURES, cache_dir=str(tmp_path))
    with pytest.raises(EmulatorError, match="lens=True"):
        plain.launch_counted("copy", 1, 32, [torch.zeros(32), torch.zeros(32), 32])
    with pytest.raises(EmulatorError, match="one of ASan, checks and lens"):
        build_emulated(KERNELS, SIGNATURES, cache_dir=str(tmp_path), checks=True, lens=True)
