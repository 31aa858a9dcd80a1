"""Every kernel of the script tests compiles with NVRTC for sm_80 and sm_90 (the GPU path,
checked without a GPU)."""

import importlib.util
import os

import pytest

from minicomp.backends.cuda import nvrtc
from minicomp.script import ScriptFunction

try:
    nvrtc.nvrtc_version()
except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
    pytest.skip(f"NVRTC unavailable: {err}", allow_module_level=True)

SIBLINGS = (
    "test_script_language.py",
    "test_script_mapping.py",
    "test_script_launch.py",
    "test_script_errors.py",
    "test_script_annotations.py",
    "test_script_launch_limits.py",
)


def _load(filename: str):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
    spec = importlib.util.spec_from_file_location(f"_script_{filename[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kernels():
    params = []
    for filename in SIBLINGS:
        module = _load(filename)
        for name, value in sorted(vars(module).items()):
            if isinstance(value, ScriptFunction) and value.kind == "kernel":
                params.append(pytest.param(value, id=f"{filename[12:-3]}.{name}"))
    return params


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("kernel", _kernels())
def test_kernel_compiles(kernel, arch, tmp_path):
    binary = nvrtc.compile_cuda(
        kernel.source, arch=arch, name=kernel.ir.name, cache_dir=str(tmp_path)
    )
    assert kernel.ir.name in binary.resources
    usage = binary.resources[kernel.ir.name]
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
