"""One rank of tests/dynamo/test_one_compile.py: waits until every rank is ready, compiles a
small graph with minicomp into the shared cache, checks it against eager and writes what the
compile did to a JSON file.

Run as `python one_compile_worker.py TARGET FOLDER` with RANK and WORLD_SIZE set.
"""

import json
import os
import sys
import time
import warnings

import torch

from minicomp.backends import cache
from minicomp.backends.cpu import compiler
from minicomp.backends.cuda import nvrtc
from minicomp.dynamo import backend
from minicomp.record import builds


def step(x, w):
    return torch.softmax(torch.tanh(x @ w) * 3.0, dim=-1).sum(0)


def wait_for_everyone(folder, rank, world):
    """A barrier through files: the ranks start compiling together, so that each would build
    if nothing made the others wait."""
    open(os.path.join(folder, f"ready-{rank}"), "w").close()
    deadline = time.monotonic() + 120
    while sum(os.path.exists(os.path.join(folder, f"ready-{r}")) for r in range(world)) < world:
        if time.monotonic() > deadline:
            raise TimeoutError("the other ranks never came")
        time.sleep(0.01)


def main(target, folder):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    warnings.simplefilter("error", backend.FallbackWarning)
    warnings.simplefilter("error", backend.KernelFallbackWarning)
    device = "cuda" if target == "cuda" else "cpu"
    x, w = torch.randn(6, 5, device=device), torch.randn(5, 7, device=device)
    compiled = torch.compile(step, backend="minicomp", options={"target": target})
    wait_for_everyone(folder, rank, world)
    records = []
    with backend.recording(records):
        got = compiled(x, w)
    torch.testing.assert_close(got, step(x, w))
    stats = compiler.cache_stats()
    result = {
        "rank": rank,
        "builder": cache.builder(),
        "builds": {
            "library": stats.misses,
            "header": stats.header_builds,
            "cubin": nvrtc.compile_stats()["compiles"],
        },
        "graphs": [{"cache": r.cache, "binaries": builds(r)} for r in records],
    }
    with open(os.path.join(folder, f"rank{rank}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
