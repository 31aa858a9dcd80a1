"""Per-call overhead on the CPU: a one-op graph (x + 1 on 8 floats) under eager, Inductor and
minicomp, one thread, interleaved; microseconds per call, medians of the rounds.

    python benchmarks/cpu_overhead.py [--rounds 15] [--calls 2000]

What a call costs beyond the kernel: Dynamo's guards, AOTAutograd's wrappers (the same for
both compilers) and the compiled graph's own Python (minicomp's plan, Inductor's `call`).
"""

import argparse
import statistics
import time

import torch

import minicomp  # noqa: F401  (registers the "minicomp" backend)


def one_op(x):
    return x + 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and backend")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(8)
    runs = {
        "eager": one_op,
        "inductor": torch.compile(one_op, backend="inductor"),
        "minicomp": torch.compile(one_op, backend="minicomp", options={"target": "cpu"}),
    }
    for run in runs.values():
        torch.testing.assert_close(run(x), one_op(x))
        for _ in range(100):
            run(x)
    samples: dict = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                run(x)
            samples[name].append((time.perf_counter() - start) / args.calls * 1e6)
    us = {name: statistics.median(s) for name, s in samples.items()}
    print("us per call: " + ", ".join(f"{name} {t:.2f}" for name, t in us.items()))
    print(f"minicomp / inductor: {us['minicomp'] / us['inductor']:.3f} (goal: <= 1)")


if __name__ == "__main__":
    main()
