"""Tests of the NVRTC driver: rendered kernels compile to cubins for sm_80 and sm_90, ptxas's
resource report is parsed, errors point at source lines, and the cubin cache works."""

import importlib.util
import os
import time

import pytest

from minicomp.backends.cuda import nvrtc
from minicomp.backends.cuda.codegen import render_module
from minicomp.backends.errors import CompileError

try:
    nvrtc.nvrtc_version()
except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
    pytest.skip(f"NVRTC unavailable: {err}", allow_module_level=True)


def _load_sibling(filename: str):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
    spec = importlib.util.spec_from_file_location("_cuda_codegen_samples", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


samples = _load_sibling("test_cuda_codegen.py")
ARCHS = ("sm_80", "sm_90")
# Every kernel a sample module defines, by module.
KERNELS = {
    name: [f.name for f in module.functions if f.kind == "kernel"]
    for name, module in samples.sample_modules().items()
}


@pytest.fixture(autouse=True)
def _fresh_memory_cache():
    nvrtc.clear_memory_cache()
    yield
    nvrtc.clear_memory_cache()


def _is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("module_name", sorted(KERNELS))
def test_sample_kernels_compile(module_name, arch, tmp_path):
    module = samples.sample_modules()[module_name]
    binary = nvrtc.compile_cuda(
        render_module(module), arch=arch, name=module_name, cache_dir=str(tmp_path)
    )
    assert _is_elf(binary.cubin) and binary.arch == arch
    assert sorted(binary.resources) == sorted(KERNELS[module_name])
    for kernel, usage in binary.resources.items():
        assert usage.registers > 0, (kernel, binary.log)
        assert usage.spill_stores == 0 and usage.spill_loads == 0, (kernel, usage)
    if module_name == "reduce":
        assert binary.resources["row_sum"].shared_bytes == 8 * 4
        assert binary.resources["row_sum"].barriers >= 1


@pytest.mark.parametrize("arch", ARCHS)
def test_every_device_helper_compiles(arch, tmp_path):
    binary = nvrtc.compile_cuda(
        samples.helper_source(), arch=arch, name="helpers", cache_dir=str(tmp_path)
    )
    assert _is_elf(binary.cubin)
    names = set(binary.resources)
    assert {"ops_i8", "ops_bool", "math_f32", "math_f64", "half_bf16", "direct_helpers"} <= names
    assert " warning" not in binary.log, binary.log


def test_sm_90a_and_bad_arches(tmp_path):
    source = render_module(samples.sample_modules()["ew"])
    assert _is_elf(nvrtc.compile_cuda(source, arch="sm_90a", cache_dir=str(tmp_path)).cubin)
    with pytest.raises(ValueError, match="expected sm_<number>"):
        nvrtc.compile_cuda(source, arch="compute_90", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="cannot compile for sm_11"):
        nvrtc.compile_cuda(source, arch="sm_11", cache_dir=str(tmp_path))


def test_syntax_error_names_the_line(tmp_path):
    source = render_module(samples.sample_modules()["ew"])
    lines = source.splitlines()
    target = next(k for k, line in enumerate(lines) if "out[i] = " in line)
    lines[target] = lines[target].replace(";", "")  # a missing semicolon
    lines.insert(target + 1, "    undefined_thing(i);")
    bad = "\n".join(lines) + "\n"
    with pytest.raises(CompileError) as info:
        nvrtc.compile_cuda(bad, arch="sm_80", name="broken", cache_dir=str(tmp_path))
    message = str(info.value)
    assert "NVRTC compilation of 'broken' for sm_80 failed" in message
    assert "error" in info.value.log and info.value.source == bad
    # The numbered line of the error, marked with ">", and its neighbours.
    reported = {target + 1, target + 2}
    marked = [line for line in message.splitlines() if line.startswith(">")]
    assert marked and all(int(line.split("|")[0][1:]) in reported for line in marked), message
    assert "undefined_thing" in message
    assert not os.path.exists(os.path.join(tmp_path, "cubins")) or not any(
        name.endswith(".cubin") for _, _, files in os.walk(tmp_path) for name in files
    )


def test_cache_returns_the_same_cubin_without_recompiling(tmp_path):
    source = render_module(samples.sample_modules()["half"])
    nvrtc.reset_compile_stats()
    first = nvrtc.compile_cuda(source, arch="sm_80", cache_dir=str(tmp_path))
    assert nvrtc.compile_stats()["compiles"] == 1
    again = nvrtc.compile_cuda(source, arch="sm_80", cache_dir=str(tmp_path))
    assert again is first and nvrtc.compile_stats()["memory_hits"] == 1
    nvrtc.clear_memory_cache()
    from_disk = nvrtc.compile_cuda(source, arch="sm_80", cache_dir=str(tmp_path))
    stats = nvrtc.compile_stats()
    assert stats["compiles"] == 1 and stats["disk_hits"] == 1
    assert from_disk.cubin == first.cubin and from_disk.resources == first.resources
    assert from_disk.log == first.log and from_disk.key == first.key
    entry = os.path.join(tmp_path, "cubins", first.key[:2], first.key)
    assert sorted(os.listdir(entry)) == ["kernel.cubin", "meta.json", "source.cu"]
    # Another architecture, other flags or other source: new compiles under new keys.
    other = nvrtc.compile_cuda(source, arch="sm_90", cache_dir=str(tmp_path))
    flagged = nvrtc.compile_cuda(
        source, arch="sm_80", cache_dir=str(tmp_path), extra_flags=("-lineinfo",)
    )
    edited = nvrtc.compile_cuda(source + "\n", arch="sm_80", cache_dir=str(tmp_path))
    assert nvrtc.compile_stats()["compiles"] == 4
    assert len({first.key, other.key, flagged.key, edited.key}) == 4
    assert other.cubin != first.cubin


def test_corrupt_cache_entry_is_rebuilt(tmp_path):
    source = render_module(samples.sample_modules()["ew"])
    first = nvrtc.compile_cuda(source, arch="sm_80", cache_dir=str(tmp_path))
    entry = os.path.join(tmp_path, "cubins", first.key[:2], first.key)
    with open(os.path.join(entry, "meta.json"), "w") as f:
        f.write("{not json")
    nvrtc.clear_memory_cache()
    nvrtc.reset_compile_stats()
    again = nvrtc.compile_cuda(source, arch="sm_80", cache_dir=str(tmp_path))
    assert nvrtc.compile_stats()["compiles"] == 1 and again.cubin == first.cubin


def test_parse_resources_of_both_report_styles():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k1' for 'sm_80'
ptxas info    : Function properties for k1
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, 1024 bytes smem, 376 bytes cmem[0]
ptxas info    : Function properties for helper
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 512 bytes smem
"""
    usage = nvrtc.parse_resources(log)
    assert list(usage) == ["k1", "k2"]
    assert usage["k1"] == nvrtc.KernelResources(40, 1024, 8, 4, 16, 0)
    assert usage["k2"] == nvrtc.KernelResources(12, 512, 0, 0, 0, 1)


def test_compile_time_is_reasonable(tmp_path):
    source = render_module(samples.sample_modules()["reduce"])
    start = time.perf_counter()
    nvrtc.compile_cuda(source, arch="sm_90", cache_dir=str(tmp_path))
    # NVRTC takes a fraction of a second on a kernel this size; minutes would mean the
    # device header grew something pathological.
    assert time.perf_counter() - start < 30


@pytest.mark.parametrize(
    "cuda, wheel", [("12.8", "nvidia-cuda-nvrtc-cu12"), ("13.0", '"nvidia-cuda-nvrtc>=13,<14"')]
)
def test_missing_nvrtc_names_the_wheel_of_pytorchs_cuda_version(cuda, wheel, monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", cuda)
    assert nvrtc.cuda_major() == int(cuda.split(".")[0])
    hint = nvrtc.install_hint()
    assert wheel in hint and f"CUDA {cuda.split('.')[0]}" in hint
    other = "nvidia-cuda-nvrtc-cu12" if "13" in cuda else "nvidia-cuda-nvrtc>=13"
    assert other not in hint


def test_an_unloadable_nvrtc_library_says_what_to_install(monkeypatch):
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(nvrtc, "_loaded", [])  # as in a process that has loaded no NVRTC
    with pytest.raises(nvrtc.NvrtcUnavailableError, match="cannot be loaded") as err:
        nvrtc.load("/nonexistent/libnvrtc.so.13")
    assert "CUDA 13" in str(err.value) and "nvidia-cuda-nvrtc>=13" in str(err.value)
    assert nvrtc._loaded == []


def test_the_first_nvrtc_a_process_loads_stays():
    nvrtc.load()
    first = nvrtc.library_path()
    nvrtc.load("/nonexistent/libnvrtc.so.13")  # NVRTC is loaded already: nothing changes
    assert nvrtc.library_path("/nonexistent/libnvrtc.so.13") == first
