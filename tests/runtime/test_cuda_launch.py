"""The launch path of the cuda target (ctypes argument buffers, launch dimensions, streams,
per-thread contexts), run on the CPU against a stand-in driver (fake_libcuda.c) that keeps
what each launch was given. Kernels are real: generated, and compiled by NVRTC to cubins."""

import ctypes
import os
import subprocess
import threading

import pytest
import torch

from minicomp.backends.cuda import driver, module
from minicomp.dynamo.backend import recording
from minicomp.ir.func import Module
from minicomp.ir.symbols import launch_dims
from minicomp.ir.types import DataType

pytest.importorskip("minicomp.backends.cuda.nvrtc")

FAKE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_libcuda.c")
STREAM = 0x5000


def build_fake_driver(directory: str) -> str:
    """The stand-in driver compiled into `directory`; its path."""
    path = os.path.join(directory, "libfakecuda.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", path, FAKE_SOURCE], check=True)
    return path


@pytest.fixture
def fake(tmp_path, monkeypatch):
    path = build_fake_driver(str(tmp_path))
    lib = driver.load_driver(path)
    monkeypatch.setattr(driver, "libcuda", lambda: lib)
    monkeypatch.setattr(driver, "_retained", {})
    monkeypatch.setattr(driver, "_thread", threading.local())
    monkeypatch.setattr(driver.torch.cuda, "init", lambda: None)
    monkeypatch.setattr(driver, "_stream_reader", lambda: lambda index: STREAM + index)
    probe = ctypes.CDLL(path)  # the same loaded library: its state is the driver's
    probe.fake_param.restype = ctypes.c_uint64
    probe.fake_dim.restype = ctypes.c_uint
    probe.fake_stream.restype = ctypes.c_void_p
    probe.fake_launches.restype = ctypes.c_long
    return probe


def kernels_of(fn, *args, dynamic=False):
    torch._dynamo.reset()
    options = {"target": "cuda-emu", "fallback": "error"}
    records = []
    with recording(records):
        torch.compile(fn, backend="minicomp", options=options, dynamic=dynamic)(*args)
    return [k for r in records for k in r.kernels]


def loaded(kernels, tmp_path, device_index=0):
    graph = Module("graph", tuple(kernels))
    return module.build(graph, device_index=device_index, cache_dir=str(tmp_path), arch="sm_90")


def test_a_launch_passes_addresses_sizes_grid_and_the_current_stream(fake, tmp_path):
    x = torch.randn(3000)
    (kernel,) = kernels_of(lambda t: torch.sin(t) * 2, x)
    launch = loaded([kernel], tmp_path).kernel(kernel.name, launch_dims(kernel))
    out = torch.empty_like(x)
    n = len(kernel.params)
    fake.fake_keep_params(n)
    args = [x.data_ptr(), out.data_ptr()][:n]
    launch(*args)
    assert [fake.fake_param(i) for i in range(n)] == args
    grid, block = kernel.attrs.grid_dim, kernel.attrs.block_dim
    assert [fake.fake_dim(i) for i in range(6)] == [*grid, *block]
    assert fake.fake_stream() == STREAM


def test_symbolic_sizes_travel_as_int64_and_set_the_grid(fake, tmp_path):
    x = torch.randn(64, 40)
    (kernel,) = kernels_of(lambda t: torch.exp(t) + 1, x, dynamic=True)
    launch = loaded([kernel], tmp_path).kernel(kernel.name, launch_dims(kernel))
    sizes = [p for p in kernel.params if isinstance(p.type, DataType)]
    assert sizes, kernel.params
    n = len(kernel.params)
    fake.fake_keep_params(n)
    for rows in (5, 100_000):
        args = [0x1000 * (i + 1) for i in range(n - len(sizes))] + [rows] + [40] * (len(sizes) - 1)
        launch(*args)
        assert [fake.fake_param(i) for i in range(n)] == args
        grid, _ = launch_dims(kernel)(args)
        assert fake.fake_dim(0) == grid[0] > 0
    assert fake.fake_launches() >= 2


def test_every_thread_launches_with_the_context_current(fake, tmp_path):
    x = torch.randn(100)
    (kernel,) = kernels_of(lambda t: t * 3, x)
    launch = loaded([kernel], tmp_path).kernel(kernel.name, launch_dims(kernel))
    fake.fake_keep_params(0)
    errors = []

    def work():
        try:
            launch(*([0x1000] * len(kernel.params)))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []

    # The stand-in does refuse a thread without a context, so the check above means something.
    bare, params = [], launch._buffers()[1]
    t = threading.Thread(
        target=lambda: bare.append(
            driver.libcuda().cuLaunchKernel(
                launch.function, 1, 1, 1, 32, 1, 1, 0, None, params, None
            )
        )
    )
    t.start()
    t.join()
    assert bare == [201]


def test_driver_errors_name_the_kernel_and_the_launch(fake, tmp_path):
    x = torch.randn(100)
    (kernel,) = kernels_of(lambda t: t - 1, x)
    compiled = loaded([kernel], tmp_path)
    too_big = driver.Launcher(
        compiled.loaded, kernel.name, [ctypes.c_void_p] * 2, lambda args: ((1, 1, 1), (2048, 1, 1))
    )
    with pytest.raises(driver.CudaDriverError, match=f"launching kernel {kernel.name}.*2048"):
        too_big(1, 2)
    with pytest.raises(TypeError, match="takes 2 arguments, 3 given"):
        too_big(1, 2, 3)
    with pytest.raises(driver.CudaDriverError, match="cuModuleGetFunction.*CUDA_ERROR_FAKE"):
        compiled.loaded.function("no_such_kernel")


def test_driver_version_reads_the_drivers_cuda_version(fake):
    assert driver.driver_version() == (13, 1)


def test_a_cubin_too_new_for_the_driver_names_the_nvrtc_wheel_to_install(fake, monkeypatch):
    from minicomp.backends.cuda import nvrtc

    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (13, 0))
    monkeypatch.setattr(driver, "driver_version", lambda: (12, 8))
    hint = driver.image_hint(222)  # CUDA_ERROR_UNSUPPORTED_PTX_VERSION
    assert "NVRTC 13.0" in hint and "CUDA 12.8" in hint and "nvidia-cuda-nvrtc-cu12" in hint
    monkeypatch.setattr(driver, "driver_version", lambda: (13, 0))
    assert driver.image_hint(222) == ""  # the driver can load what NVRTC 13 builds
    assert driver.image_hint(1) == ""  # not an image error
