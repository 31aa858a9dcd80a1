"""The suite's models on the CPU, inference, one thread: minicomp against eager, Inductor and
both with freezing, interleaved, CPU time, and the geomeans.

    OMP_NUM_THREADS=1 python benchmarks/cpu_models.py --batch 1,8 [--size full] [--save]

Each round calls every backend once in turn (the order rotating from round to round) and
times each call with the process's CPU time, which the other tenants of a shared machine do
not inflate as they do the wall clock. A cell is the median over rounds of the per-round
ratio to minicomp's call, so slow drifts of the machine cancel. Every backend's first output
is checked against eager's before anything is timed.
"""

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import time

import torch
import torch._dynamo

import minicomp  # noqa: F401  (registers the "minicomp" backend)
from minicomp.bench import suite

BACKENDS = ("eager", "inductor", "inductor-freeze", "minicomp", "minicomp-freeze")
# Also accepted by --backends: minicomp-onednn and minicomp-onednn-freeze.
# llama-1b is left out by default: its full size has 22 layers, minutes per call on one thread.
DEFAULT_MODELS = ("gpt2", "bert-base", "resnet50", "vit-b16")


def compiled(model: torch.nn.Module, backend: str):
    """`model` as `backend` runs it; the freezing variants fold the weights in as constants."""
    if backend == "eager":
        return model
    if backend.startswith("inductor"):
        import torch._inductor.config as inductor_config

        # Inductor reads `freezing` from its global config when the first call compiles
        # (right after this returns); as a compile option alone it is not applied. The
        # option still matters: Dynamo's cache guards on the backend, not on the config, so
        # without it inductor-freeze reused the code "inductor" compiled just before (and
        # timed unfrozen Inductor).
        freeze = backend == "inductor-freeze"
        inductor_config.freezing = freeze
        return torch.compile(model, backend="inductor", options={"freezing": freeze})
    # minicomp-onednn[-freeze]: the cpu_gemm option forced to oneDNN (auto's choice off Intel).
    options = {"target": "cpu", "freeze": backend.endswith("-freeze")}
    if backend.startswith("minicomp-onednn"):
        options["cpu_gemm"] = "onednn"
    return torch.compile(model, backend="minicomp", options=options)


def measure(name: str, size: str, batch: int, backends: list[str], rounds: int) -> dict:
    """One model at one batch: per backend the median CPU ms, the ratio to minicomp, the
    first call's seconds and whether it matched eager."""
    torch._dynamo.reset()
    built = suite.get(name).build(size, torch.float32, batch, "cpu")
    model, inputs = built.model.eval(), built.inputs
    rows: dict = {}
    runs = {}
    with torch.no_grad():
        expected = model(*inputs)
        for backend in backends:
            run = compiled(model, backend)
            start = time.perf_counter()
            out = run(*inputs)
            first_s = time.perf_counter() - start
            ok = bool(torch.allclose(out, expected, rtol=1e-3, atol=1e-3))
            rows[backend] = {"first_s": round(first_s, 2), "ok": ok, "ms": None, "ratio": None}
            if ok:
                runs[backend] = run
        for run in runs.values():
            run(*inputs)
        times: dict = {b: [] for b in runs}
        order = list(runs)
        for r in range(rounds):
            for backend in order[r % len(order) :] + order[: r % len(order)]:
                start = time.process_time()
                runs[backend](*inputs)
                times[backend].append((time.process_time() - start) * 1e3)
    base = times.get("minicomp")
    for backend, samples in times.items():
        rows[backend]["ms"] = round(statistics.median(samples), 3)
        if base:
            ratios = [t / m for t, m in zip(samples, base)]
            rows[backend]["ratio"] = round(statistics.median(ratios), 3)
    return rows


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def print_results(results: dict, backends: list[str]) -> dict:
    """The table (backend time / minicomp time per cell: above 1, minicomp is faster) and the
    geomeans, returned too."""
    print(f"{'model':<12}{'batch':>6}" + "".join(f"{b:>17}" for b in backends))
    for (name, batch), rows in results.items():
        cells = []
        for b in backends:
            row = rows.get(b, {})
            if not row.get("ok"):
                cells.append(f"{'FAIL':>17}")
            else:
                cells.append(f"{row['ms']:>9.1f} {row['ratio'] or 0:>5.2f}x ")
        print(f"{name:<12}{batch:>6}" + "".join(cells))
    means = {}
    for b in backends:
        ratios = [rows[b]["ratio"] for rows in results.values() if rows.get(b, {}).get("ratio")]
        means[b] = geomean(ratios)
    print("geomean of backend/minicomp (minicomp's speedup over it):")
    for b, g in means.items():
        print(f"  {b:<16} {g:.3f}x" if g else f"  {b:<16} -")
    if means.get("inductor-freeze") and means.get("minicomp-freeze") and means.get("minicomp"):
        frozen = means["inductor-freeze"] / means["minicomp-freeze"]
        print(f"  both frozen: minicomp-freeze is {frozen:.3f}x inductor-freeze")
    return means


def save(results: dict, means: dict, args) -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    today = datetime.date.today().isoformat()
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "results", f"cpu-models-{args.size}-{today}-{commit}.json")
    record = {
        "date": today, "commit": commit, "torch": torch.__version__,
        "device": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "size": args.size, "rounds": args.rounds,
        "timer": "process CPU time, interleaved rounds, median of per-round ratios",
        "results": [{"model": m, "batch": b, "backends": rows} for (m, b), rows in results.items()],
        "geomean_vs_minicomp": means,
    }  # fmt: skip
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma list")
    parser.add_argument("--batch", default="1,8", help="comma list of batch sizes")
    parser.add_argument("--size", default="full", choices=["full", "small"])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma list")
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds per cell")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/*.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    backends = [b for b in args.backends.split(",") if b]
    if "minicomp" not in backends:
        parser.error("ratios are taken to minicomp: --backends must include it")
    results = {}
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batch.split(",")):
            results[(name, batch)] = measure(name, args.size, batch, backends, args.rounds)
            print(f"measured {name} batch {batch}", flush=True)
    print(f"torch {torch.__version__}, 1 thread, {args.size} models, {args.rounds} rounds")
    means = print_results(results, backends)
    if args.save:
        print("saved", save(results, means, args))


if __name__ == "__main__":
    main()
