"""CPU benchmark: eager PyTorch, Inductor and minicomp side by side in one run.

`--extra-cflags "-m..."` adds the backend minicomp-extra, minicomp with those C flags appended,
and `--extra-options '{"cpu_gemm": "onednn"}'` one with those options, timed in the same
interleaved rounds (to weigh a change); `--cpu-time` times with the process's CPU time (one
thread: what a busy shared machine disturbs least)."""

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import time

import torch
import torch._dynamo

import minicomp  # registers the "minicomp" backend
import minicomp.config

BACKENDS = ("eager", "inductor", "minicomp")


def elementwise_chain(x):
    y = x * 1.7 + 0.3
    y = torch.relu(y)
    y = y * y
    y = y - x
    y = y * 0.5
    y = torch.abs(y)
    y = y + 1.0
    return torch.sqrt(y)


def transcendental_chain(x):
    """sin, cos, log, erf and pow fused in one loop: one scalar libm call in it would keep
    the whole loop from vectorising."""
    return torch.sin(x) * torch.cos(x) + torch.log(x.abs() + 1.0) + torch.erf(x) + x.abs() ** 1.7


def softmax_last_dim(x):
    return torch.softmax(x, dim=-1)


def gpt2_block():
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = GPT2Config(n_embd=768, n_head=12, attn_implementation="sdpa")
    block = GPT2Block(config, layer_idx=0).eval()
    return lambda hidden_states: block(hidden_states), (torch.randn(1, 128, 768),)


def layer_norm():
    weight, bias = torch.randn(4096), torch.randn(4096)

    def fn(x):
        return torch.nn.functional.layer_norm(x, (4096,), weight, bias)

    return fn, (torch.randn(4096, 4096),)


def stem_pool():
    """ResNet-50's stem after its convolution: batch norm, ReLU and a 3x3/2 max pool."""
    mean, var = torch.randn(64), torch.rand(64) + 0.5
    weight, bias = torch.randn(64), torch.randn(64)

    def fn(x):
        y = torch.nn.functional.batch_norm(x, mean, var, weight, bias, False, 0.1, 1e-5)
        return torch.nn.functional.max_pool2d(torch.relu(y), 3, 2, 1)

    return fn, (torch.randn(1, 64, 112, 112),)


def permuted_copy():
    """A copy of a column-major matrix, which eager's clone keeps column-major: the same
    physical layout in and out (GPT-2's permuted embedding weight, saved for backward)."""
    return (lambda w: w.clone()), (torch.randn(50257, 768).t(),)


def transpose():
    """A copy that really moves data: a row-major matrix into its transpose, row-major."""
    return (lambda x: x.t().contiguous() * 1.0), (torch.randn(4096, 4096),)


def gpt2_train():
    """A GPT-2 training step (forward with the loss, backward) at 2 layers of full width, with
    the full vocabulary: the tied LM head saves its transposed weight for the backward."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2, attn_implementation="sdpa", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    model = GPT2LMHeadModel(config).train()
    tokens = torch.randint(0, config.vocab_size, (1, 64))

    def make(backend):
        mine = copy.deepcopy(model)
        run = compiled(mine, backend)

        def step(tokens):
            mine.zero_grad(set_to_none=True)
            loss = run(tokens, labels=tokens).loss
            loss.backward()
            return loss.detach()

        return step

    return make, (tokens,)


# Training steps: name -> () -> (backend -> step function, inputs); each backend steps its
# own copy of the model.
TRAINING = {"gpt2_train": gpt2_train}

# name -> () -> (function, inputs); built lazily so --only skips the others' setup.
WORKLOADS = {
    "chain": lambda: (elementwise_chain, (torch.randn(2**24),)),
    "transcendentals": lambda: (transcendental_chain, (torch.randn(2**22),)),
    "softmax": lambda: (softmax_last_dim, (torch.randn(4096, 4096),)),
    "layer_norm": layer_norm,
    "stem_pool": stem_pool,
    "permuted_copy": permuted_copy,
    "transpose": transpose,
    "gpt2_block": gpt2_block,
    **TRAINING,
}


EXTRA_CFLAGS = ""  # what --extra-cflags appends to minicomp-extra's C flags
EXTRA_OPTIONS: dict = {}  # --extra-options: minicomp-extra's other options
TIMER = time.perf_counter


def compiled(fn, backend: str):
    if backend == "eager":
        return fn
    if backend == "minicomp-extra":
        options = {"target": "cpu", **EXTRA_OPTIONS}
        if EXTRA_CFLAGS:
            options["cflags"] = f"{minicomp.config.Options().cflags} {EXTRA_CFLAGS}"
        return torch.compile(fn, backend="minicomp", options=options)
    options = {"target": "cpu"} if backend == "minicomp" else None
    return torch.compile(fn, backend=backend, options=options)


def interleaved_medians(runs: dict, inputs, repeat: int, warmup: int = 3) -> dict:
    """Median ms per backend, timing one call of each in turn so that the machine's noise
    (a shared VM here) falls on every backend alike."""
    for run in runs.values():
        for _ in range(warmup):
            run(*inputs)
    times: dict = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeat):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = TIMER()
            runs[name](*inputs)
            times[name].append((TIMER() - start) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(name: str, backends: list[str], repeat: int) -> dict:
    torch.manual_seed(0)
    fn, inputs = WORKLOADS[name]()
    torch._dynamo.reset()
    training = name in TRAINING
    make = fn if training else lambda backend: compiled(fn, backend)
    with torch.set_grad_enabled(training):
        expected = make("eager")(*inputs)
        rows, runs = {}, {}
        for backend in backends:
            run = make(backend)
            start = time.perf_counter()
            out = run(*inputs)
            compile_s = time.perf_counter() - start
            ok = torch.allclose(out, expected, rtol=1e-4, atol=1e-4)
            rows[backend] = {"ms": None, "compile_s": compile_s, "ok": ok}
            if ok:
                runs[backend] = run
        for backend, ms in interleaved_medians(runs, inputs, repeat).items():
            rows[backend]["ms"] = ms
    return rows


def ratio(results: dict, num: str, den: str) -> float | None:
    a, b = results.get(num, {}).get("ms"), results.get(den, {}).get("ms")
    return a / b if a and b else None


def print_table(results: dict, backends: list[str]) -> None:
    head = f"{'workload':<14}" + "".join(f"{b + ' ms':>14}" for b in backends)
    head += f"{'eager/minicomp':>16}{'inductor/minicomp':>19}"
    head += "".join(f"{b + ' 1st s':>16}" for b in backends)
    print(head)
    for name, rows in results.items():
        line = f"{name:<14}"
        for b in backends:
            line += f"{rows[b]['ms']:>14.3f}" if rows[b]["ok"] else f"{'FAIL':>14}"
        for num in ("eager", "inductor"):
            r = ratio(rows, num, "minicomp")
            width = 16 if num == "eager" else 19
            line += f"{r:>{width - 1}.2f}x" if r else f"{'-':>{width}}"
        line += "".join(f"{rows[b]['compile_s']:>16.2f}" for b in backends)
        print(line)


def print_goals(results: dict) -> None:
    def verdict(ratios: list) -> str:
        if not ratios or any(r is None for r in ratios):
            return "n/a (not measured, or a backend failed)"
        return "PASS" if all(r >= goal for r, goal in ratios) else "MISS"

    chain = ratio(results.get("chain", {}), "eager", "minicomp")
    versus = [ratio(rows, "inductor", "minicomp") for rows in results.values()]
    print("goal: minicomp >= 2x eager on the chain; not slower than Inductor on any")
    print(f"  chain >= 2x eager: {verdict([chain and (chain, 2.0)] if 'chain' in results else [])}")
    print(f"  not slower than Inductor: {verdict([r and (r, 1.0) for r in versus])}")


def save(results: dict, args) -> str:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    today = datetime.date.today().isoformat()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"cpu-{today}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {
        "date": today, "commit": commit, "torch": torch.__version__,
        "device": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
        "repeat": args.repeat, "results": results,
    }  # fmt: skip
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per measurement")
    parser.add_argument("--only", choices=sorted(WORKLOADS), help="run one workload")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma list")
    parser.add_argument("--save", action="store_true", help="write benchmarks/results/cpu-*.json")
    parser.add_argument("--extra-cflags", default="", help="add minicomp-extra, with these flags")
    parser.add_argument("--extra-options", default="{}", help="JSON: minicomp-extra's options")
    parser.add_argument("--cpu-time", action="store_true", help="time CPU, not wall clock")
    args = parser.parse_args()
    global EXTRA_CFLAGS, EXTRA_OPTIONS, TIMER
    EXTRA_CFLAGS = args.extra_cflags
    EXTRA_OPTIONS = json.loads(args.extra_options)
    TIMER = time.process_time if args.cpu_time else time.perf_counter
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if (args.extra_cflags or EXTRA_OPTIONS) and "minicomp-extra" not in backends:
        backends.append("minicomp-extra")
    names = [args.only] if args.only else list(WORKLOADS)
    results = {name: measure(name, backends, args.repeat) for name in names}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeat}")
    print_table(results, backends)
    print_goals(results)
    if args.save:
        print("saved", save(results, args))


if __name__ == "__main__":
    main()
