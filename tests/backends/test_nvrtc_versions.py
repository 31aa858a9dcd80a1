"""Generated kernels compile with every NVRTC major installed (12 from the runtime dependency,
13 from the dev extras, as on the GPU machines), each loaded through MINICOMP_NVRTC_LIBRARY (the
nvrtc_library option) in a process of its own; compile workers build with their process's."""

import glob
import os
import re
import subprocess
import sys

import pytest

nvrtc = pytest.importorskip("minicomp.backends.cuda.nvrtc")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import os, sys, tempfile
import torch
import minicomp
from minicomp.backends.cuda import nvrtc
from minicomp.backends.errors import CompileError

major = int(sys.argv[1])
nvrtc.load(minicomp.config.get("nvrtc_library"))
assert nvrtc.nvrtc_version()[0] == major, nvrtc.nvrtc_version()
x, h = torch.randn(6, 300), torch.randn(4, 2048).half()
fns = [
    (lambda x: torch.softmax(x * 0.5, -1), x),
    (lambda x: torch.nn.functional.layer_norm(x, (300,)), x),
    (lambda x: (x.argmax(1), x.sum(), (x > 0).any(1)), x),
    (lambda h: torch.nn.functional.gelu(h * 2, approximate="tanh"), h),
    (lambda h: h.float().pow(2).mean(-1).bfloat16(), h),
]
cache = tempfile.mkdtemp()
kernels = 0
for fn, arg in fns:
    report = minicomp.explain(fn, arg, options={"target": "cuda-emu", "fallback": "error"})
    for source in (r.source for r in report.records if r.source):
        for arch in ("sm_80", "sm_90"):
            binary = nvrtc.compile_cuda(source, arch=arch, cache_dir=cache)
            for name, res in binary.resources.items():
                assert res.spill_stores == res.spill_loads == 0, (name, res)
                kernels += 1
try:
    nvrtc.compile_cuda("__global__ void k() { undefined_thing(); }", arch="sm_90", cache_dir=cache)
except CompileError as e:
    assert "undefined_thing" in str(e), str(e)
else:
    raise AssertionError("a bad source compiled")
print(f"nvrtc {major}: {kernels} kernel builds, no spills")
"""


def installed_nvrtc_libraries() -> dict[int, str]:
    """libnvrtc of each major installed as an nvidia-* wheel, by major."""
    try:
        import nvidia
    except ImportError:
        return {}
    found = {}
    for root in nvidia.__path__:
        for path in glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so.*")):
            match = re.search(r"libnvrtc\.so\.(\d+)$", path)
            if match:
                found[int(match[1])] = path
    return found


LIBRARIES = installed_nvrtc_libraries()


def _default_major() -> int | None:
    try:
        return nvrtc.nvrtc_version()[0]
    except nvrtc.NvrtcUnavailableError:
        return None


DEFAULT_MAJOR = _default_major()


# The NVRTC this process loads by default (13 with the dev extra) is the one
# test_nvrtc_generated.py builds every generated kernel with, for every architecture: here only
# the other major, whose library must be named to be loaded.
OTHER_MAJORS = [m for m in (12, 13) if m != DEFAULT_MAJOR] or [12]


@pytest.mark.parametrize("major", OTHER_MAJORS)
def test_generated_kernels_compile_with_nvrtc(major):
    if major not in LIBRARIES:
        pytest.skip(f"no NVRTC {major} wheel installed")
    env = {**os.environ, "MINICOMP_NVRTC_LIBRARY": LIBRARIES[major], "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(major)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout.strip())


def test_a_missing_nvrtc_library_is_named():
    env = {**os.environ, "MINICOMP_NVRTC_LIBRARY": "/nowhere/libnvrtc.so.99", "PYTHONPATH": ROOT}
    code = (
        "from minicomp import config; from minicomp.backends.cuda import nvrtc; "
        "nvrtc.nvrtc_version(library=config.get('nvrtc_library'))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode != 0
    assert "NVRTC library /nowhere/libnvrtc.so.99 (the nvrtc_library option" in done.stderr


WORKERS_SCRIPT = r"""
import functools, sys, tempfile
from minicomp.backends.cuda import nvrtc
from minicomp.tune import compile_pool

library = nvrtc.library_path(sys.argv[2])
assert nvrtc.nvrtc_version()[0] == int(sys.argv[1]), nvrtc.nvrtc_version()
sources = [f"__global__ void k{n}(float* x) {{ x[threadIdx.x] *= {n}.0f; }}" for n in range(3)]
cache = tempfile.mkdtemp()
job = functools.partial(nvrtc.compile_cuda, arch="sm_80", cache_dir=cache, library=library)
assert compile_pool.compile_parallel(job, sources, workers=2) == [None] * 3
for source in sources:
    nvrtc.compile_cuda(source, arch="sm_80", cache_dir=cache)
assert nvrtc.compile_stats()["compiles"] == 0, nvrtc.compile_stats()  # all built by the workers
"""


# Only a major other than the default can tell: workers that ignored the job's library would
# load the default NVRTC and still pass with it.
@pytest.mark.parametrize("major", OTHER_MAJORS)
def test_compile_workers_build_with_the_nvrtc_of_their_process(major):
    # Nothing tells the workers which NVRTC to load but the job: their cubins are this
    # process's cache hits only if they built them with its NVRTC (its version is in the key).
    if major not in LIBRARIES:
        pytest.skip(f"no NVRTC {major} wheel installed")
    env = {k: v for k, v in os.environ.items() if k != "MINICOMP_NVRTC_LIBRARY"}
    env["PYTHONPATH"] = ROOT
    done = subprocess.run(
        [sys.executable, "-c", WORKERS_SCRIPT, str(major), LIBRARIES[major]],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
