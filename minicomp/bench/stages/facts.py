"""The facts a result needs beside it: the device, its driver, the software and the commit;
and the device's measured peaks, against which kernels are judged."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess

import torch

from minicomp import config
from minicomp.backends.cuda import driver, nvrtc
from minicomp.bench.kernels.timing import interleaved
from minicomp.bench.stages.stage import commit, today

PACKAGES = ("torch", "transformers", "torchvision", "timm", "cuda-bindings", "numpy", "minicomp")


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nvrtc() -> str:
    try:
        major, minor = nvrtc.nvrtc_version(library=config.get("nvrtc_library"))
        return f"{major}.{minor}"
    except Exception as err:  # reported, not fatal: the check stage shows it
        return f"unavailable: {err}"[:200]


def _nvidia_smi() -> str | None:
    query = "name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit"
    try:
        run = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout.strip() or None


def device_facts(rehearse: bool) -> dict:
    """Everything about this machine a result depends on, as one row."""
    facts = {
        "kind": "facts",
        "date": today(),
        "commit": commit(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in PACKAGES},
        "cuda_build": torch.version.cuda,
        "nvrtc": _nvrtc(),
        "host_cpus": os.cpu_count(),
        "host_cpu": platform.processor() or platform.machine(),
    }
    if rehearse:
        facts.update(device="cuda-emu (CPU rehearsal)", slug="emu", rehearsal=True)
        return facts
    props = torch.cuda.get_device_properties(torch.cuda.current_device())

    try:
        major, minor = driver.driver_version()
        driver_cuda = f"{major}.{minor}"
    except Exception as err:
        driver_cuda = f"unavailable: {err}"[:200]
    facts.update(
        device=props.name,
        slug=None,
        rehearsal=False,
        arch=f"sm_{props.major}{props.minor}",
        sms=props.multi_processor_count,
        memory_gib=round(props.total_memory / 2**30, 1),
        l2_mib=round(props.L2_cache_size / 2**20, 1),
        driver_cuda=driver_cuda,
        nvidia_smi=_nvidia_smi(),
    )
    return facts


def measure_peaks(device: str, clock) -> dict:
    """The device's measured ceilings: TFLOP/s of a large matrix product through PyTorch's
    library in each dtype (f32 without TF32) and GB/s of a large copy (bytes read + written).
    On the host (a rehearsal) small sizes: the numbers only exercise the procedure."""
    n, elements = (8192, 2**28) if device == "cuda" else (256, 2**20)
    peaks = {}
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        sampler = clock.prepare(torch.matmul, [(a, b)], 3)
        seconds = interleaved({"mm": sampler}, 5)["mm"].median
        peaks[f"{str(dtype).removeprefix('torch.')}_tflops"] = 2 * n**3 / seconds / 1e12
        del a, b, sampler
    x = torch.randn(elements, device=device)
    y = torch.empty_like(x)
    sampler = clock.prepare(lambda: y.copy_(x), [()], 3)
    seconds = interleaved({"copy": sampler}, 5)["copy"].median
    peaks["copy_gbs"] = 2 * x.numel() * x.element_size() / seconds / 1e9
    if device == "cuda":
        torch.cuda.empty_cache()
    return peaks
