"""One compile for all ranks: processes sharing an empty cache compile the same graph at the
same moment; one builds its kernels (and the emulator's prelude), the others wait for it and
load what it built, and say who built it. The ranks run one_compile_worker.py."""

import json
import os

from helpers_distributed import failure_text, run_ranks

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "one_compile_worker.py")
WORLD = 2


def test_one_rank_builds_and_the_others_load_its_build(target, tmp_path):
    env = {"MINICOMP_CACHE_DIR": str(tmp_path / "cache"), "MINICOMP_GRAPH_CACHE": "1"}
    results = run_ranks(WORKER, WORLD, lambda rank: [target, tmp_path], env=env)
    assert all(r.returncode == 0 for r in results), failure_text(results)
    ranks = []
    for rank in range(WORLD):
        with open(tmp_path / f"rank{rank}.json", encoding="utf-8") as f:
            ranks.append(json.load(f))
    builders = [r for r in ranks if r["library_builds"]]
    assert len(builders) == 1, ranks  # one rank built, the other built nothing
    builder = builders[0]
    (waiter,) = [r for r in ranks if r is not builder]
    assert waiter["library_builds"] == waiter["header_builds"] == 0, ranks
    if target == "cuda-emu":
        assert builder["header_builds"] == 1, ranks  # the emulator's prelude, once
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
