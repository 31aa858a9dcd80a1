"""examples/train_ddp.py under torchrun, two CPU workers (gloo): a run whose rank 1 dies at a
step is restarted by torchrun, resumes from the last checkpoint and reports exactly the losses
of an uninterrupted run. Both runs go at once (they share the suite's cache)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_ddp.py")
STEPS, FAIL_AT = 12, 5  # 8 steps per epoch: it fails, and resumes, in the middle of one


def _torchrun(folder, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_LOGS", "PYTEST_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "--max-restarts=1", EXAMPLE, "--steps", str(STEPS), "--target", "cpu",
        "--checkpoint-dir", str(folder / "checkpoints"), "--losses", str(folder / "losses.txt"),
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        command, env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _losses(path) -> dict[int, float]:
    """Each step's loss as last reported: a resumed run reports the steps after its last
    checkpoint again."""
    losses = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("step "):
                _, step, _, loss = line.split()
                losses[int(step)] = float(loss)
    return losses


def test_a_killed_worker_is_restarted_and_resumes_with_the_same_losses(tmp_path):
    folders = {name: tmp_path / name for name in ("uninterrupted", "interrupted")}
    for folder in folders.values():
        folder.mkdir()
    runs = {
        "uninterrupted": _torchrun(folders["uninterrupted"]),
        "interrupted": _torchrun(folders["interrupted"], "--fail-at-step", str(FAIL_AT)),
    }
    outputs = {}
    try:
        for name, proc in runs.items():
            outputs[name] = proc.communicate(timeout=400)[0]
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                proc.kill()
    for name, proc in runs.items():
        assert proc.returncode == 0, f"{name}:\n{outputs[name][-6000:]}"
        assert "FallbackWarning" not in outputs[name], outputs[name][-6000:]

    interrupted = outputs["interrupted"]
    assert f"rank 1: failing at step {FAIL_AT}" in interrupted
    log = (folders["interrupted"] / "losses.txt").read_text()
    assert "attempt 0: starting at step 0" in log
    assert f"attempt 1: starting at step {FAIL_AT}" in log  # resumed, not started over
    expected = _losses(folders["uninterrupted"] / "losses.txt")
    assert sorted(expected) == list(range(STEPS))
    resumed = _losses(folders["interrupted"] / "losses.txt")
    assert resumed == pytest.approx(expected, rel=1e-6, abs=1e-7)
    kept = sorted(os.listdir(folders["interrupted"] / "checkpoints"))
    assert kept == [f"step-{STEPS - 1:06d}", f"step-{STEPS:06d}"]
