"""Loaded libraries live as long as their users: a library, a function of it or a module
keeps it mapped; when the last goes, it is unloaded."""

import ctypes
import gc
import os

import pytest
import torch

from minicomp.backends.cpu import compiler
from minicomp.backends.cuda.emu import build_emulated

FLAGS = "-O1 -fPIC -shared"

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="counts mappings in Linux's /proc"
)


def _mapped(path: str) -> bool:
    with open("/proc/self/maps") as maps:
        return any(line.rstrip().endswith(path) for line in maps)


def test_a_function_keeps_its_library_loaded(tmp_path):
    source = "long triple(long a) { return 3 * a; }\n"
    library = compiler.compile_library(source, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    path = library._name
    triple = library["triple"]
    triple.argtypes, triple.restype = [ctypes.c_long], ctypes.c_long
    del library
    gc.collect()
    assert _mapped(path) and triple(14) == 42
    del triple
    gc.collect()
    assert not _mapped(path)
    # Compiled again, it is loaded again (from the disk cache).
    again = compiler.compile_library(source, cc="cc", cflags=FLAGS, cache_dir=str(tmp_path))
    assert again._name == path and _mapped(path)


def test_compile_c_keeps_its_library_until_the_memory_cache_is_cleared(tmp_path):
    path = compiler.compile_c(
        "long one(void) { return 1; }\n", cc="cc", cflags=FLAGS, cache_dir=str(tmp_path)
    )
    gc.collect()
    assert _mapped(path) and compiler.load_library(path).one() == 1
    compiler.clear_memory_cache()
    gc.collect()
    assert not _mapped(path)


MMA = r"""
extern "C" __global__ void mma_tile(const uint16_t* a, const uint16_t* b, float* d) {
    unsigned lane = threadIdx.x;
    uint16_t fa[8], fb[4];
    float acc[4] = {0, 0, 0, 0};
    for (int i = 0; i < 8; i++) fa[i] = a[lane * 8 + i];
    for (int i = 0; i < 4; i++) fb[i] = b[lane * 4 + i];
    mc_mma_m16n8k16_f16(acc, fa, fb, acc);
    for (int i = 0; i < 4; i++) d[lane * 4 + i] = acc[i];
}
"""


def test_an_emulator_module_is_unloaded_after_its_last_launch(tmp_path):
    m = build_emulated(
        MMA, [("mma_tile", "const uint16_t*, const uint16_t*, float*")], cache_dir=str(tmp_path)
    )
    a = torch.randn(256).half().view(torch.int16)
    b = torch.randn(128).half().view(torch.int16)
    d = torch.zeros(128)
    m.launch("mma_tile", 1, 32, [a, b, d])  # one block: this thread ran the warp collective
    path = m.path
    assert _mapped(path) and d.abs().sum() > 0
    del m
    gc.collect()
    assert not _mapped(path)
