"""GPU benchmark: bandwidth of elementwise chains, softmax and layer_norm against the device's
copy bandwidth and against eager and Inductor; host overhead per call of a 50-kernel plan with
and without CUDA graphs.

    python benchmarks/cuda_bench.py [--repeat 50] [--out benchmarks/results/cuda-DATE.json]

Kernel times are CUDA-event medians over `--repeat` calls, the backends interleaved call by call
so clock drift hits them alike. Bandwidth counts each input read and each output written once.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch._dynamo

import minicomp

BACKENDS = ("eager", "inductor", "minicomp")


def chain(x):
    y = x * 1.7 + 0.3
    y = torch.relu(y) * y - x
    return torch.sqrt(torch.abs(y * 0.5) + 1.0)


def gelu_bias(x, b):
    return torch.nn.functional.gelu(x + b, approximate="tanh")


def softmax(x):
    return torch.softmax(x, dim=-1)


def layer_norm_fn(n):
    w = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    return lambda x: torch.nn.functional.layer_norm(x, (n,), w, b)


def workloads():
    """name -> (function, inputs, bytes moved per call)."""
    out = {}
    for dtype, tag in ((torch.float32, "f32"), (torch.float16, "f16")):
        x = torch.randn(2**26, device="cuda", dtype=dtype)
        out[f"chain {tag} 2^26"] = (chain, (x,), 2 * x.nbytes)
    x = torch.randn(8192, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, device="cuda", dtype=torch.float16)
    out["gelu(x+b) f16 8192x4096"] = (gelu_bias, (x, b), 2 * x.nbytes + b.nbytes)
    for rows, cols in ((4096, 4096), (32768, 512), (1024, 32768)):
        x = torch.randn(rows, cols, device="cuda")
        out[f"softmax f32 {rows}x{cols}"] = (softmax, (x,), 2 * x.nbytes)
        out[f"layer_norm f32 {rows}x{cols}"] = (layer_norm_fn(cols), (x,), 2 * x.nbytes)
    return out


def copy_bandwidth(repeat: int) -> float:
    """The device's copy bandwidth in GB/s (read + write), from a 1 GiB copy."""
    x = torch.empty(2**28, device="cuda")
    y = torch.empty_like(x)
    times = [event_time(lambda: y.copy_(x)) for _ in range(repeat)]
    return 2 * x.nbytes / statistics.median(times) / 1e9


def event_time(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def compiled(fn, backend: str, **options):
    if backend == "eager":
        return fn
    if backend == "inductor":
        return torch.compile(fn, backend="inductor")
    return torch.compile(fn, backend="minicomp", options=options)


def bench_kernels(repeat: int, only: str | None) -> dict:
    results = {}
    for name, (fn, args, nbytes) in workloads().items():
        if only and only not in name:
            continue
        torch._dynamo.reset()
        runners, errors = {}, {}
        for backend in BACKENDS:
            try:
                run = compiled(fn, backend)
                expected = fn(*args)
                torch.testing.assert_close(run(*args), expected, rtol=2e-2, atol=2e-2)
                for _ in range(3):
                    run(*args)
                runners[backend] = run
            except Exception as e:  # report, keep going with the other backends
                errors[backend] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        times = {b: [] for b in runners}
        for _ in range(repeat):
            for b, run in runners.items():
                times[b].append(event_time(lambda run=run, args=args: run(*args)))
        row = {b: statistics.median(t) for b, t in times.items()}
        results[name] = {"seconds": row, "bytes": nbytes, "errors": errors}
    return results


def many_kernels(x):
    # Each step is a row reduction and its epilogue: one kernel each, 50 in all.
    for k in range(50):
        x = x - x.amax(dim=-1, keepdim=True) * (0.5 + k / 100)
    return x


def host_overhead(repeat: int) -> dict:
    """Wall time per call of a 50-kernel plan on tiny tensors (the GPU work is negligible)."""
    x = torch.randn(16, 64, device="cuda")
    out = {}
    for label, backend, options in (
        ("eager", "eager", {}),
        ("inductor", "inductor", {}),
        ("minicomp, no CUDA graphs", "minicomp", {"cuda_graphs": False}),
        ("minicomp, CUDA graphs", "minicomp", {}),
    ):
        torch._dynamo.reset()
        run = compiled(many_kernels, backend, **options)
        try:
            for _ in range(5):
                run(x)
            torch.cuda.synchronize()
            calls = max(repeat * 20, 200)
            t0 = time.perf_counter()
            for _ in range(calls):
                run(x)
            torch.cuda.synchronize()
            out[label] = (time.perf_counter() - t0) / calls
        except Exception as e:
            out[label] = f"{type(e).__name__}: {e}"
    explanation = minicomp.explain(many_kernels, x, options={"target": "cuda"})
    out["minicomp kernels"] = explanation.kernel_count
    torch._dynamo.reset()
    run = compiled(torch.sin, "minicomp")
    for _ in range(5):
        run(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        run(x)
    torch.cuda.synchronize()
    out["minicomp, CUDA graphs, 1 kernel"] = (time.perf_counter() - t0) / 2000
    return out


def report(results: dict, copy_gbs: float, overhead: dict) -> str:
    lines = [f"copy bandwidth: {copy_gbs:.0f} GB/s"]
    head = f"{'workload':32} " + " ".join(f"{b:>14}" for b in BACKENDS)
    lines += ["", "kernel time (us) and share of copy bandwidth", head]
    for name, r in results.items():
        cells = []
        for b in BACKENDS:
            t = r["seconds"].get(b)
            if t is None:
                cells.append(f"{'error':>14}")
            else:
                share = r["bytes"] / t / 1e9 / copy_gbs
                cells.append(f"{t * 1e6:8.1f} {share:4.0%}")
        vs = r["seconds"]
        ratio = ""
        if "minicomp" in vs and "inductor" in vs:
            ratio = f"  inductor/minicomp {vs['inductor'] / vs['minicomp']:.2f}x"
        if "minicomp" in vs:
            ratio += f"  eager/minicomp {vs['eager'] / vs['minicomp']:.2f}x"
        lines.append(f"{name:32} " + " ".join(cells) + ratio)
        for b, e in r["errors"].items():
            lines.append(f"    {b}: {e}")
    lines += ["", "host time per call, 50-kernel plan on 16x64 floats"]
    for label, v in overhead.items():
        shown = f"{v * 1e6:8.1f} us" if isinstance(v, float) else str(v)
        lines.append(f"  {label:34} {shown}")
    return "\n".join(lines)


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--only", help="run workloads whose name contains this")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("cuda_bench.py needs a CUDA device")
    copy_gbs = copy_bandwidth(args.repeat)
    results = bench_kernels(args.repeat, args.only)
    overhead = host_overhead(args.repeat)
    text = report(results, copy_gbs, overhead)
    meta = {
        "device": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    print(" ".join(f"{k}={v}" for k, v in meta.items()))
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(
                {**meta, "copy_gbs": copy_gbs, "kernels": results, "host_overhead": overhead},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
