"""The bench's settings and command-line options (no torch import: `minicomp --help` stays fast)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from minicomp.bench.stats import NOISY_SPREAD

BACKEND_NAMES = (
    "eager",
    "inductor",
    "inductor-reduce-overhead",
    "inductor-max-autotune",
    "minicomp-ss0",
    "minicomp-ss2",
    "hidet",
)
DTYPE_NAMES = ("float32", "float16", "bfloat16")
SIZES = ("small", "full")
# The CPU defaults keep a run to minutes on a few cores: float32, batch 1, and no backend
# that only repeats another there (minicomp cannot tune without a GPU and keeps search
# space 0; Inductor's max-autotune mostly re-times ATen's GEMMs on a CPU).
CPU_DEFAULTS = {
    "dtypes": ["float32"],
    "batch": [1],
    "backends": ["eager", "inductor", "minicomp-ss0"],
    "repeats": 10,
    "warmup": 2,
}
CUDA_DEFAULTS = {
    "dtypes": list(DTYPE_NAMES),
    "batch": [1, 16],
    "backends": list(BACKEND_NAMES),
    "repeats": 50,
    "warmup": 5,
}


@dataclass
class Settings:
    """What one bench run measures, and where it writes."""

    models: list[str]
    dtypes: list[str] = field(default_factory=lambda: list(CPU_DEFAULTS["dtypes"]))
    batch: list[int] = field(default_factory=lambda: list(CPU_DEFAULTS["batch"]))
    backends: list[str] = field(default_factory=lambda: list(CPU_DEFAULTS["backends"]))
    device: str = "cpu"
    size: str = "full"
    repeats: int = CPU_DEFAULTS["repeats"]
    warmup: int = CPU_DEFAULTS["warmup"]
    json: str | None = None  # no file when None or empty
    chart: str | None = None
    progress: bool = True
    jsonl: str | None = None  # rows appended here as each is measured
    warm: bool = True  # also time a second compile from the warm on-disk cache
    options: dict = field(default_factory=dict)  # extra minicomp options (a target)
    threads: int | None = None  # CPU threads to time with; None: leave PyTorch's setting
    max_spread: float = NOISY_SPREAD  # flag a speed-up whose rounds spread wider (stats.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The bench options, shared by `minicomp bench` and benchmarks/models.py."""
    cpu_backends = ",".join(CPU_DEFAULTS["backends"])
    helps = {
        "--models": "comma list of suite models (default: all; docs/bench.md lists them)",
        "--dtypes": f"comma list of {', '.join(DTYPE_NAMES)} (default: cpu float32; cuda all "
        "three, bfloat16 where the GPU has it)",
        "--batch": "comma list of batch sizes (default: cpu 1; cuda 1,16)",
        "--backends": f"comma list of {', '.join(BACKEND_NAMES)} (default: cpu {cpu_backends}; "
        "cuda all that are installed)",
    }
    for flag, text in helps.items():
        parser.add_argument(flag, help=text)
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], help="default: cuda when a GPU is present"
    )
    parser.add_argument(
        "--size",
        choices=SIZES,
        default="full",
        help="full: the standard configs (default); small: 2 layers, narrow, for smoke runs",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="timing rounds, each calling every backend once (cpu 10, cuda 50)",
    )
    parser.add_argument("--warmup", type=int, help="untimed calls first (cpu 2, cuda 5)")
    parser.add_argument(
        "--json", metavar="PATH", help="results file (minicomp-bench-DEVICE.json; '': none)"
    )
    parser.add_argument(
        "--chart", metavar="PATH", help="PNG chart (minicomp-bench-DEVICE.png; '': none)"
    )
    parser.add_argument(
        "--jsonl", metavar="PATH", help="also append each row here the moment it is measured"
    )
    parser.add_argument(
        "--no-warm", action="store_true", help="skip the warm compile (from the on-disk cache)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="cpu: threads to time with (torch.set_num_threads, OMP_NUM_THREADS; default: the "
        "cores this process may use); cuda: left alone unless given",
    )
    parser.add_argument(
        "--max-spread",
        type=float,
        default=NOISY_SPREAD,
        metavar="F",
        help="flag a speed-up as noisy when the interquartile range of its per-round ratios "
        f"exceeds F times their median (default {NOISY_SPREAD})",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on a terminal only)"
    )


def names(text: str, known, what: str) -> list[str]:
    """The comma list `text`, each a member of `known`; raises ValueError naming the known."""
    found = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in found if n not in known]
    if unknown or not found:
        bad = ", ".join(unknown) or repr(text)
        raise ValueError(f"unknown {what} {bad}; choose from {', '.join(known)}")
    return found


def batches(text: str) -> list[int]:
    """The comma list of batch sizes `text`; raises ValueError."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"bad --batch {text!r}: expected a comma list of integers") from None
    if not values or min(values) < 1:
        raise ValueError(f"bad --batch {text!r}: batch sizes are positive integers")
    return values
