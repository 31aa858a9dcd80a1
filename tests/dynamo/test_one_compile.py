"""One compile for all ranks: processes sharing an empty cache compile the same graph at the
same moment; one builds its kernels (and the emulator's prelude), the others wait for it and
load what it built, and say who built it. The ranks run one_compile_worker.py. cuda-emu
stands for cpu too (its build is a C library as well, and the emulator's prelude besides);
cuda, where selected, compiles with NVRTC."""

import json
import os

import pytest
import torch
from conftest import selected_targets
from helpers_ranks import failure_text, run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "one_compile_worker.py")
WORLD = 2


@pytest.mark.parametrize("target", [t for t in selected_targets() if t != "cpu"] or ["cpu"])
def test_one_rank_builds_and_the_others_load_its_build(target, tmp_path):
    if target == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    env = {"MINICOMP_CACHE_DIR": str(tmp_path / "cache"), "MINICOMP_GRAPH_CACHE": "1"}
    results = run_ranks(WORKER, WORLD, lambda rank: [target, tmp_path], env=env)
    assert all(r.returncode == 0 for r in results), failure_text(results)
    ranks = []
    for rank in range(WORLD):
        with open(tmp_path / f"rank{rank}.json", encoding="utf-8") as f:
            ranks.append(json.load(f))
    builders = [r for r in ranks if r["builds"]["library"] or r["builds"]["cubin"]]
    assert len(builders) == 1, ranks  # one rank built, the other built nothing
    builder = builders[0]
    (waiter,) = [r for r in ranks if r is not builder]
    assert not any(waiter["builds"].values()), ranks
    if target == "cuda-emu":
        assert builder["builds"]["header"] == 1, ranks  # the emulator's prelude, once
    assert builder["builder"]["rank"] == builder["rank"]
    (built,) = builder["graphs"]
    assert built["cache"].startswith("stored"), built
    assert "built by this process" in built["binaries"], built
    # The waiter linked the builder's graph and loaded its binaries, and says whose they are.
    (loaded,) = waiter["graphs"]
    who = f"rank {builder['rank']} (pid {builder['builder']['pid']})"
    assert loaded["cache"].startswith("hit (") and f"compiled by {who}" in loaded["cache"]
    assert loaded["binaries"].endswith(f"from the cache, built by {who}"), loaded
    assert not os.listdir(tmp_path / "cache" / "building" / "locks")
