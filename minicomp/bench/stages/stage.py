"""What every stage shares: its files and their names, its time budget, its log, the rows it
writes, and the cache it imports from the stage before and hands to the next."""

from __future__ import annotations

import contextlib
import datetime
import glob
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from minicomp.bench.rows import RowWriter
from minicomp.tune import bundle

MAX_FILES = 6
# Seconds each stage may take on a GPU machine: 23.5 minutes in all, under the 25 the lease
# allows with the machine's start, and each well under a command's 10 minutes.
BUDGETS = {"check": 240, "kernels": 450, "models": 420, "train": 300}
CACHE_SUFFIX = "-cache.tar.gz"
# The device machine returns files up to 16 MiB; the bundle keeps under it with room to spare.
MAX_BUNDLE_BYTES = 12 << 20
# Every file a stage may write, by the suffix after `<stage>-<tag>`.
SUFFIXES = (".jsonl", ".log", ".png", "-tests.jsonl", "-sanitizer.txt", "-sass.txt", CACHE_SUFFIX)


class Budget:
    """A stage's deadline: what is left of its seconds, and whether a piece of work fits."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.monotonic()

    def used(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.used()

    def allows(self, seconds: float) -> bool:
        """Whether `seconds` more work ends before the deadline."""
        return self.left() >= seconds


def commit() -> str:
    """The short commit the run measures: MINICOMP_COMMIT (the device machine's copy of the
    tree may have no .git), else git's, marked "-dirty" when the tree has changes."""
    named = os.environ.get("MINICOMP_COMMIT")
    if named:
        return re.sub(r"[^\w.-]", "_", named)[:40]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, cwd=root
        )
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=root,
        )
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except OSError:
        return "unknown"


def device_slug(name: str) -> str:
    """A file-name-safe short name for a GPU: "NVIDIA H100 80GB HBM3" -> "h100-80gb-hbm3"."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w != "nvidia"]
    return "-".join(words)[:40] or "gpu"


class _Tee:
    """A stream that writes to the terminal and to the stage's log file."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.log.write(text)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(self.stream, name)


@dataclass
class Stage:
    """One stage's run: where its files go, its tag, budget and rows."""

    name: str
    out_dir: str
    rehearse: bool
    budget: Budget
    cache_dir: str
    carry_dir: str
    tag: str = ""

    def __post_init__(self) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        os.makedirs(self.cache_dir, exist_ok=True)
        for old in self.files():  # a rerun of the same stage and commit replaces the last
            os.unlink(old)
        self.rows = RowWriter(self.path(".jsonl"))

    @property
    def device(self) -> str:
        """Where tensors live: the GPU, or the host in a rehearsal."""
        return "cpu" if self.rehearse else "cuda"

    @property
    def target(self) -> str:
        """minicomp's target: cuda, or the emulator in a rehearsal."""
        return "cuda-emu" if self.rehearse else "cuda"

    def path(self, suffix: str) -> str:
        """The stage's file ending in `suffix` (one of SUFFIXES): `<out>/<stage>-<tag><suffix>`."""
        if suffix not in SUFFIXES:
            raise ValueError(f"a stage writes no {suffix!r} file; add it to SUFFIXES")
        return os.path.join(self.out_dir, f"{self.name}-{self.tag}{suffix}")

    def files(self) -> list[str]:
        """The files this stage has written under the output folder."""
        return sorted(p for p in map(self.path, SUFFIXES) if os.path.exists(p))

    def skip(self, what: str, why: str, **fields) -> None:
        """Record and print that `what` was not run."""
        print(f"  skipped {what}: {why}", flush=True)
        self.rows.write({"kind": "skipped", "what": what, "why": why, **fields})

    @contextlib.contextmanager
    def logging(self) -> Iterator[None]:
        """Copy everything printed meanwhile (warnings and tracebacks too) into the log."""
        with open(self.path(".log"), "a", encoding="utf-8") as log:
            out, err = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                sys.stdout, sys.stderr = out, err

    def import_carried(self) -> None:
        """Merge every cache bundle in the carry folder (the stages before, on a machine that
        started afresh) into this stage's cache."""
        for path in sorted(glob.glob(os.path.join(self.carry_dir, "*" + CACHE_SUFFIX))):
            try:
                counts = bundle.read_bundle(path, self.cache_dir)
                print(
                    f"imported {os.path.basename(path)}: {counts['added'] + counts['replaced']} "
                    f"tuning records, {counts['cubins']} cubins",
                    flush=True,
                )
            except bundle.BundleError as err:
                print(f"not imported: {err}", flush=True)

    def export_cache(self) -> dict | None:
        """Bundle this stage's tuning records and cubins for the next stage, small enough to
        come back from the device machine (the newest cubins first); None: nothing to carry."""
        path, cubin_bytes = self.path(CACHE_SUFFIX), MAX_BUNDLE_BYTES * 3
        while True:
            manifest = bundle.write_bundle(self.cache_dir, path, max_bytes=cubin_bytes)
            if os.path.getsize(path) <= MAX_BUNDLE_BYTES or not manifest["cubins"]:
                break
            cubin_bytes = manifest["cubin_bytes"] // 2
        if not manifest["records"] and not manifest["cubins"]:
            os.unlink(path)
            return None
        return manifest


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
