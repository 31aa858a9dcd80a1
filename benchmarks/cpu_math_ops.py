"""One float32 math op per graph on one CPU thread: minicomp's runtime math against Inductor's
(ATen's Sleef), interleaved rounds, medians of CPU time.

    OMP_NUM_THREADS=1 python benchmarks/cpu_math_ops.py [--ops sin,cos] [--rounds 31]

Prints ms per call for each backend and inductor/minicomp (above 1: minicomp is faster). The
inputs are randn * 3 (the common case); `--scale` widens them. `--extra-cflags "-m..."` adds
a third backend, minicomp built with those flags appended, to weigh a code-generation change
in the same interleaved rounds.
"""

import argparse
import statistics
import time

import torch

import minicomp  # registers the "minicomp" backend
import minicomp.config

OPS = {
    "sin": torch.sin,
    "cos": torch.cos,
    "erf": torch.erf,
    "gelu": lambda x: torch.nn.functional.gelu(x),
    "tanh": torch.tanh,
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs()),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="sin,cos,erf,gelu")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--calls", type=int, default=3, help="calls per round and backend")
    parser.add_argument("--numel", type=int, default=2**22)
    parser.add_argument("--scale", type=float, default=3.0)
    parser.add_argument("--extra-cflags", default="", help="flags of a third minicomp backend")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.randn(args.numel, generator=torch.Generator().manual_seed(0)) * args.scale
    for name in args.ops.split(","):
        fn = OPS[name]
        torch._dynamo.reset()
        runs = {
            "inductor": torch.compile(fn, backend="inductor"),
            "minicomp": torch.compile(fn, backend="minicomp", options={"target": "cpu"}),
        }
        if args.extra_cflags:
            flags = f"{minicomp.config.Options().cflags} {args.extra_cflags}"
            runs["extra"] = torch.compile(
                fn, backend="minicomp", options={"target": "cpu", "cflags": flags}
            )
        for run in runs.values():
            torch.testing.assert_close(run(x), fn(x), rtol=1e-4, atol=1e-5)
        samples: dict = {b: [] for b in runs}
        for r in range(args.rounds):
            order = list(runs) if r % 2 == 0 else list(runs)[::-1]
            for b in order:
                start = time.process_time()
                for _ in range(args.calls):
                    runs[b](x)
                samples[b].append((time.process_time() - start) / args.calls * 1e3)
        ms = {b: statistics.median(s) for b, s in samples.items()}
        print(
            f"{name:<6} inductor {ms['inductor']:7.3f} ms  minicomp {ms['minicomp']:7.3f} ms  "
            f"inductor/minicomp {ms['inductor'] / ms['minicomp']:.2f}x"
            + (
                f"  extra {ms['extra']:7.3f} ms  inductor/extra {ms['inductor'] / ms['extra']:.2f}x"
                if "extra" in ms
                else ""
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
