"""Host cost of minicomp's CUDA launch path, measured on any machine: the driver is the
stand-in of tests/runtime/fake_libcuda.c, whose cuLaunchKernel only records its arguments, so
what is timed is our side (argument buffers, launch dimensions, stream, the foreign call).
A real cuLaunchKernel adds the driver's own cost on top (a few microseconds).

    python benchmarks/launch_overhead.py [--calls 200000]
"""

import argparse
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "runtime"))
sys.path.insert(0, os.path.join(HERE, ".."))

from test_cuda_launch import build_fake_driver  # noqa: E402

from minicomp.backends.cuda import driver, module  # noqa: E402
from minicomp.dynamo.backend import recording  # noqa: E402
from minicomp.ir.func import Module  # noqa: E402
from minicomp.ir.symbols import launch_dims  # noqa: E402


def kernels(fn, *args, dynamic=False):
    records = []
    torch._dynamo.reset()
    with recording(records):
        torch.compile(fn, backend="minicomp", options={"target": "cuda-emu"}, dynamic=dynamic)(
            *args
        )
    return [k for r in records for k in r.kernels]


def per_call(fn, calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lib = driver.load_driver(build_fake_driver(tmp))
        driver.libcuda = lambda: lib
        driver.torch.cuda.init = lambda: None
        driver._stream_reader = lambda: lambda index: 0
        x = torch.randn(4096, 256)
        rows = []
        for label, ks in (
            ("static sizes", kernels(lambda t: torch.softmax(t, -1), x)),
            ("symbolic sizes", kernels(lambda t: torch.softmax(t, -1), x, dynamic=True)),
        ):
            (k,) = ks
            launch = module.build(
                Module("graph", (k,)), device_index=0, cache_dir=tmp, arch="sm_90"
            ).kernel(k.name, launch_dims(k))
            values = [x.data_ptr()] * len(k.params)
            values[-1] = 4096
            rows.append((label, per_call(lambda launch=launch, v=values: launch(*v), args.calls)))
        raw = lib.cuLaunchKernel
        params = launch._buffers()[1]
        rows.append(
            (
                "bare ctypes cuLaunchKernel",
                per_call(
                    lambda: raw(launch.function, 1, 1, 1, 256, 1, 1, 0, 0, params, None), args.calls
                ),
            )
        )
        print("host cost per launch, stand-in driver (Python side and a no-op driver call):")
        for label, seconds in rows:
            print(f"  {label:28} {seconds * 1e6:6.2f} us")


if __name__ == "__main__":
    main()
