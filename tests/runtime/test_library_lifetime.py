"""A compiled graph's shared library lives as long as its plan: once the graphs are dropped,
their libraries are unloaded, so a long-lived process compiling graph after graph does not
run into the kernel's limit on mappings (vm.max_map_count)."""

import gc
import os

import pytest
import torch

GRAPHS = 4

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="counts mappings in Linux's /proc"
)


def _library_mappings(cache_dir) -> int:
    """The mappings of the libraries built under `cache_dir`, but for the emulator's runtime
    library, loaded for good (one per compiler and flags, whatever the number of graphs)."""
    from minicomp.backends.cuda.emu import _RUNTIMES

    with open("/proc/self/maps") as maps:
        return sum(
            1
            for line in maps
            if str(cache_dir) in line and not any(runtime in line for runtime in _RUNTIMES)
        )


def _gelu_ish(x):
    return x * torch.sigmoid(1.702 * x) + 1.0


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_dropped_graphs_unload_their_libraries(target, tmp_path):
    options = {"target": target, "cache_dir": str(tmp_path)}
    compiled = []
    for n in range(1, GRAPHS + 1):  # a static size per graph: a library per graph
        f = torch.compile(_gelu_ish, backend="minicomp", options=options, dynamic=False)
        x = torch.randn(n)
        torch.testing.assert_close(f(x), _gelu_ish(x))
        compiled.append(f)
    assert _library_mappings(tmp_path) >= 2 * GRAPHS  # a few segments per library

    del compiled, f
    torch._dynamo.reset()
    gc.collect()
    assert _library_mappings(tmp_path) == 0

    # Unloading took nothing away that a new graph needs (the OpenMP runtime on cpu, say).
    f = torch.compile(_gelu_ish, backend="minicomp", options=options, dynamic=False)
    x = torch.randn(3, 5)
    torch.testing.assert_close(f(x), _gelu_ish(x))
    torch._dynamo.reset()
