"""Launching a script as the ranks of a small distributed job: one fresh interpreter per rank,
all started at once, with this checkout first on the path."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_ranks(
    script: str, world: int, args_of, *, env: dict | None = None, timeout: float = 300
) -> list[subprocess.CompletedProcess]:
    """Run `python script *args_of(rank)` for each rank at once, with RANK and WORLD_SIZE set
    and `env` added; the finished processes, by rank. A rank still running after `timeout`
    seconds is killed, and so are the others."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_LOGS", "PYTEST_"))}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, base.get("PYTHONPATH")]))
    base.update(env or {})
    procs = [
        subprocess.Popen(
            [sys.executable, script, *map(str, args_of(rank))],
            env={**base, "RANK": str(rank), "WORLD_SIZE": str(world)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, out, err)
        for p, (out, err) in zip(procs, outputs)
    ]


def failure_text(results: list[subprocess.CompletedProcess]) -> str:
    """The end of each rank's output, for an assertion message."""
    return "\n".join(
        f"--- rank {rank} (exit {r.returncode})\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        for rank, r in enumerate(results)
    )
