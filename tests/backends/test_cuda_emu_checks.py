"""Checked emulator builds (checks=True): hand-written CUDA kernels that access their tensors
out of bounds raise OutOfBoundsError and leave the process running; correct ones compute as
unchecked builds do."""

import pytest
import torch

from minicomp.backends.cuda.emu import OutOfBoundsError, build_emulated

KERNELS = r"""
extern "C" __global__ void row_sums(const float* x, float* out) {
    __shared__ float s[256];
    unsigned t = threadIdx.x;
    s[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (unsigned k = blockDim.x / 2; k > 0; k >>= 1) {
        if (t < k) s[t] += s[t + k];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}
extern "C" __global__ void copy_bytes(const float* x, float* out, long n) {
    if (threadIdx.x == 0) memcpy(out, x, n * sizeof(float));  // the C library's, unchecked
}
extern "C" __global__ void sum4(const float* x, float* out, long n) {
    long i = threadIdx.x;
    float v[4];
    if (4 * i < n) {
        mc_load_vec16(v, x + 4 * i);  // the bug: reads past the end when n % 4 != 0
        out[i] = v[0] + v[1] + v[2] + v[3];
    }
}
extern "C" __global__ void add_one_twice(const float* x, float* out, long n) {
    long i = threadIdx.x;
    if (i < n) {
        out[i] = x[i] + 1.0f;
        out[i] = x[i] + 1.0f;  // x is out: reads the first write
    }
}
extern "C" __global__ void previous(const float* x, float* out, long n) {
    long i = threadIdx.x;
    if (i < n) out[i] = x[i - 1];  // the bug: x[-1] at i = 0
}
extern "C" __global__ void address_mod_16(const float* x, long long* out) {
    out[0] = (long long)((uintptr_t)x % 16);
}
"""

SIGNATURES = [
    ("row_sums", "const float*, float*", True),
    ("copy_bytes", "const float*, float*, long"),
    ("sum4", "const float*, float*, long"),
    ("add_one_twice", "const float*, float*, long"),
    ("previous", "const float*, float*, long"),
    ("address_mod_16", "const float*, long long*"),
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("emu_cache"))


@pytest.fixture(scope="module")
def checked(cache_dir):
    return build_emulated(KERNELS, SIGNATURES, cache_dir=cache_dir, checks=True)


@pytest.mark.parametrize("ucontext", [False, True])
def test_a_bad_read_between_barriers_names_its_thread_and_block(cache_dir, ucontext):
    m = build_emulated(KERNELS, SIGNATURES, cache_dir=cache_dir, checks=True, ucontext=ucontext)
    x = torch.randn(3, 256)
    out = torch.zeros(4)
    with pytest.raises(OutOfBoundsError) as info:
        m.launch("row_sums", 4, 256, [x, out])  # a block more than x has rows
    e = info.value
    assert (e.kernel, e.tensor, e.index, e.write) == ("row_sums", "x", 768, False)
    assert (e.thread, e.block) == ((0, 0, 0), (3, 0, 0))
    torch.testing.assert_close(out[:3], x.sum(1))  # the blocks before it ran, as on a GPU
    m.launch("row_sums", 3, 256, [x, out])  # and the library still works


def test_an_access_the_instrumentation_misses_faults_on_a_guard(checked):
    x, out = torch.arange(100.0), torch.zeros(200)
    with pytest.raises(OutOfBoundsError, match=r"reads x\[1\d\d\], out of bounds") as info:
        checked.launch("copy_bytes", 1, 32, [x, out, 150])
    # The first byte memcpy touched past the end, in whatever order it reads.
    assert info.value.tensor == "x" and 100 <= info.value.index < 150
    checked.launch("copy_bytes", 1, 32, [x, out, 100])
    assert torch.equal(out[:100], x)


def test_a_vector_read_straddling_the_end_is_caught(checked):
    x, out = torch.ones(10), torch.zeros(3)
    with pytest.raises(OutOfBoundsError, match=r"an access of 16 bytes at byte offset 32"):
        checked.launch("sum4", 1, 32, [x, out, 10])


def test_a_tensor_updated_in_place_is_one_copy(checked):
    x = torch.zeros(8)
    checked.launch("add_one_twice", 1, 32, [x, x, 8])
    assert x.tolist() == [2.0] * 8


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_a_copy_keeps_the_address_modulo_16(checked, offset):
    view = torch.zeros(8)[offset : offset + 4]
    out = torch.zeros(1, dtype=torch.int64)
    checked.launch("address_mod_16", 1, 1, [view, out])
    assert out.item() == view.data_ptr() % 16


def test_a_view_is_checked_against_its_own_bounds(checked):
    base = torch.arange(8.0)
    with pytest.raises(OutOfBoundsError, match=r"thread \(0, 0, 0\) .* reads x\[-1\]"):
        checked.launch("previous", 1, 32, [base[2:6], torch.zeros(4), 4])  # base[1] exists
