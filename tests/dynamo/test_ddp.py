"""DistributedDataParallel over two CPU processes (gloo) with minicomp compiling the model:
both forms (`DDP(torch.compile(model))`, `torch.compile(DDP(model))`) train with eager DDP's
losses, gradients and weights, every bucket's graph compiled (none run eagerly), and so does
the second in Dynamo's python_reducer mode (one graph); the second form where it compiles
nothing (a model whose forward is PyTorch's own) warns. The ranks run ddp_worker.py."""

import json
import os
import subprocess
import sys

import pytest
from conftest import selected_targets
from helpers_ranks import failure_text, run_ranks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_worker.py")
WORLD = 2


@pytest.fixture(scope="module", params=[t for t in selected_targets() if t != "cuda"])
def ddp_results(request, tmp_path_factory):
    """What each rank saw, one job per target shared by the tests (cuda is left out: gloo
    reduces CPU tensors; the GPU machines run NCCL)."""
    target, folder = request.param, tmp_path_factory.mktemp("ddp")
    results = run_ranks(
        WORKER,
        WORLD,
        lambda rank: [rank, WORLD, folder / "store", target, folder / f"rank{rank}.json"],
    )
    assert all(r.returncode == 0 for r in results), failure_text(results)
    ranks = []
    for rank in range(WORLD):
        with open(folder / f"rank{rank}.json", encoding="utf-8") as f:
            ranks.append(json.load(f))
    return ranks


def test_ddp_trains_like_eager_ddp_in_both_forms(ddp_results):
    for rank, result in enumerate(ddp_results):
        for form in ("inner", "outer"):
            run = result[form]
            where = f"rank {rank}, {form} form"
            assert len(run["losses"]) == 3, where
            assert run["losses"] == pytest.approx(run["eager_losses"], rel=1e-5, abs=1e-6), where
            assert max(run["grad_diffs"]) < 1e-5, where
            assert run["weight_diff"] < 1e-5, where
            graphs = run["graphs"]
            # Dynamo's DDP optimizer hands minicomp one graph per bucket (two here), each
            # compiled, its backward too.
            kinds = sorted(g["kind"] for g in graphs)
            assert kinds == ["backward", "backward", "forward", "forward"], (where, graphs)
            assert all(g["error"] == "" for g in graphs), (where, graphs)
            assert sum(g["kernels"] for g in graphs) > 0, (where, graphs)
        # The python_reducer mode: DDP's forward and the model's, one graph each way.
        run = result["python_reducer"]
        assert run["losses"] == pytest.approx(run["eager_losses"], rel=1e-5, abs=1e-6), rank
        assert max(run["grad_diffs"]) < 1e-5 and run["weight_diff"] < 1e-5, rank
        kinds = sorted(g["kind"] for g in run["graphs"])
        assert kinds == ["backward", "forward"], (rank, run["graphs"])
        assert all(g["error"] == "" for g in run["graphs"]), (rank, run["graphs"])
    # Each rank trained on its own data: the gradients were averaged across ranks.
    assert ddp_results[0]["inner"]["losses"] != ddp_results[1]["inner"]["losses"]


def test_compiling_ddp_around_a_torch_module_warns_that_nothing_compiles(ddp_results):
    for rank, result in enumerate(ddp_results):
        seen = result["sequential"]
        assert seen["graphs"] == [], rank  # Dynamo handed minicomp nothing
        assert len(seen["warnings"]) == 1, (rank, seen["warnings"])  # once, not per step
        warning = seen["warnings"][0]
        assert "DDP(torch.compile(model" in warning["message"]
        assert "torch.nn.modules.container.Sequential.forward" in warning["message"]
        assert warning["filename"] == WORKER  # the user's line, not torch's


BACKWARD_IN_A_COMPILED_STEP = """
import torch, minicomp
from minicomp.dynamo.ddp import watch_ddp

def step(x, w):
    loss = (x @ w).sum()
    loss.backward()  # a graph break; the backward compiles lazily inside the compiled frame
    return loss

watch_ddp()
x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
loss = torch.compile(step, backend="minicomp", options={"fallback": "error"})(x, w)
assert torch.allclose(w.grad, x.sum(0)[:, None].expand(4, 4)), w.grad
print("ok", float(loss))
"""


def test_the_ddp_watcher_never_deadlocks_a_lazy_backward(tmp_path):
    """The watcher runs as Dynamo's end callback, under Dynamo's lock; were Dynamo to compile
    its frame (its hook is set while a backward compiles inside a compiled frame) it would take
    that lock again: the process hung there before the watcher was kept from Dynamo."""
    script = tmp_path / "step.py"
    script.write_text(BACKWARD_IN_A_COMPILED_STEP)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr[-3000:]
