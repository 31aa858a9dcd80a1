"""Compile time, cold and warm, of the suite's models: minicomp against Inductor, and against
Dynamo and AOTAutograd's own tracing (the aot_eager backend, which compiles nothing). "builds
only" is minicomp warm with its graph cache off (MINICOMP_GRAPH_CACHE=0): only the kernel
builds cached, every pass run again.

    python benchmarks/compile_time.py [--models gpt2,bert-base,resnet50] [--size full] [--save]

Every measurement is a fresh process timing the model's first call (for training, a forward
and a backward). "cold" runs on an empty cache directory; "warm" runs again on the one the
cold run filled, as a restarted job does: minicomp then links each graph from its graph
cache and its kernels from the build cache, Inductor reads its FX graph cache. What is left
of a warm compile is Dynamo and AOTAutograd tracing, which aot_eager shows alone.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
import torch
import minicomp  # noqa: F401
from minicomp.bench import suite
name, size, mode, backend = sys.argv[1:5]
built = suite.get(name).build(size, torch.float32, 1, "cpu")
model = built.model if mode == "train" else built.model.eval()
options = {"options": {"target": "cpu"}} if backend == "minicomp" else {}
compiled = torch.compile(model, backend=backend, **options)
start = time.perf_counter()
if mode == "train":
    compiled(*built.inputs).float().sum().backward()
else:
    with torch.no_grad():
        compiled(*built.inputs)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def first_call(
    name: str, size: str, mode: str, backend: str, cache: str, graph_cache: bool = True
) -> float:
    """Seconds of the first call of `name` compiled by `backend`, in a fresh process whose
    minicomp and Inductor caches live in `cache`."""
    env = {
        **os.environ,
        "MINICOMP_GRAPH_CACHE": "1" if graph_cache else "0",
        "MINICOMP_CACHE_DIR": os.path.join(cache, "minicomp"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, name, size, mode, backend],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{name} {mode} {backend}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


def measure(name: str, size: str, mode: str, repeats: int) -> dict:
    """Median seconds per column: aot_eager, Inductor and minicomp, cold and warm."""
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="compile-time-") as cache:
        first_call(name, size, mode, "aot_eager", cache)  # the OS's file cache, warmed
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="compile-time-") as cache:
            times.setdefault("aot_eager", []).append(
                first_call(name, size, mode, "aot_eager", cache)
            )
            for backend in ("inductor", "minicomp"):
                for state in ("cold", "warm"):
                    seconds = first_call(name, size, mode, backend, cache)
                    times.setdefault(f"{backend} {state}", []).append(seconds)
            # What a warm compile cost before the graph cache: only the kernel builds cached.
            seconds = first_call(name, size, mode, "minicomp", cache, graph_cache=False)
            times.setdefault("builds only", []).append(seconds)
    return {column: statistics.median(values) for column, values in times.items()}


COLUMNS = (
    "aot_eager",
    "inductor cold",
    "inductor warm",
    "minicomp cold",
    "minicomp warm",
    "builds only",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="gpt2,bert-base,resnet50")
    parser.add_argument("--size", default="full", choices=("small", "full"))
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--repeats", type=int, default=1, help="fresh caches per cell")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/")
    args = parser.parse_args()

    rows = []
    print(f"first call, seconds, {args.size} models, 1 thread (median of {args.repeats})")
    print(
        f"{'model':10} {'mode':6}" + "".join(f"{c:>15}" for c in COLUMNS) + "  warm over aot_eager"
    )
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            cells = measure(name, args.size, mode, args.repeats)
            extra = cells["minicomp warm"] - cells["aot_eager"]
            print(
                f"{name:10} {mode:6}"
                + "".join(f"{cells[c]:15.2f}" for c in COLUMNS)
                + f"  {extra:+.2f} s"
            )
            rows.append({"model": name, "mode": mode, **cells})
    if args.save:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        path = os.path.join(
            os.path.dirname(__file__),
            "results",
            f"compile-time-{datetime.date.today()}-{commit}.json",
        )
        record = {"commit": commit, "machine": platform.machine(), "size": args.size, "rows": rows}
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
        print(f"saved {path}")


if __name__ == "__main__":
    main()
