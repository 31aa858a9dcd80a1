"""`minicomp.profile` and `minicomp profile`: every kernel a model launches is counted in the
emulator and estimated on a named GPU; the model's results stay eager's."""

import json
import math
import warnings

import pytest
import torch

from minicomp.cli import main
from minicomp.profile import profile


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))))


@pytest.fixture(scope="module")
def block_profile():
    torch.manual_seed(0)
    model, x = Block(), torch.randn(32, 64)
    seen = []

    def run(x):
        out = model(x)
        seen.append(out)
        return out

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager fails the test
        result = profile(run, x, device="a100")
        torch.testing.assert_close(seen[-1], model(x), rtol=1e-4, atol=1e-4)
    return result


def test_every_launch_is_estimated_on_the_device(block_profile):
    p = block_profile
    assert p.device.key == "a100" and len(p.graph.kernels) >= 2
    for k in p.graph.kernels:
        assert 0 < k.time < math.inf and 0 < k.fraction_of_roofline <= 1
        assert k.counts.sampled >= 1 and k.counts.dram_bytes > 0
        assert k.resources is not None and k.resources.registers > 0  # NVRTC for sm_80
    assert p.graph.time == pytest.approx(sum(k.time for k in p.graph.kernels) + p.graph.overhead)


def test_the_table_is_sorted_by_time_and_prints_its_assumptions(block_profile):
    text = str(block_profile)
    names = [k.kernel for k in block_profile.by_time()]
    positions = [text.index(n) for n in names]
    assert positions == sorted(positions)
    assert "A100" in text and "assumptions:" in text and "roofline" in text


def test_json_has_each_kernel(block_profile):
    data = json.loads(block_profile.json())
    assert data["device"] == "a100"
    assert len(data["kernels"]) == len(block_profile.graph.kernels)
    assert {"time_us", "bound", "sector_efficiency", "occupancy"} <= set(data["kernels"][0])


SCRIPT = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU())
with torch.no_grad():
    torch.compile(model, backend="minicomp")(torch.randn(8, 32))
"""


def test_the_command_profiles_a_script(tmp_path, capsys):
    script = tmp_path / "model.py"
    script.write_text(SCRIPT)
    assert main(["profile", "--json", str(script)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["device"] == "h100" and data["kernels"]


def test_the_command_names_a_bad_device_or_script(tmp_path, capsys):
    assert main(["profile", "--device", "v100", str(tmp_path / "x.py")]) == 1
    assert "unknown device 'v100'" in capsys.readouterr().err
    assert main(["profile", str(tmp_path / "missing.py")]) == 1
    assert "no such script" in capsys.readouterr().err


def test_sample_only_counts_what_a_full_run_counts_without_computing_the_rest():
    """Running only the sampled blocks gives the same estimate as running the whole grid
    (the counts come from the sample either way), and leaves the unsampled output unwritten."""
    torch.manual_seed(0)
    a, b = torch.randn(256, 64, dtype=torch.float16), torch.randn(64, 512, dtype=torch.float16)
    seen = []

    def mm(a, b):
        out = a @ b
        seen.append(out)
        return out

    full = profile(mm, a, b, device="h100")
    torch.testing.assert_close(seen[-1], a @ b, rtol=2e-2, atol=2e-2)
    a, b = a.neg(), b * 2  # new values, the same sizes: the same counts
    fast = profile(mm, a, b, device="h100", sample_only=True)
    assert [k.kernel for k in fast.graph.kernels] == [k.kernel for k in full.graph.kernels]
    for f, s in zip(full.graph.kernels, fast.graph.kernels):
        assert s.counts.blocks > s.counts.sampled  # a grid larger than its sample
        assert s.time == pytest.approx(f.time) and s.counts.dram_bytes == f.counts.dram_bytes
    assert not torch.allclose(seen[-1].float(), (a @ b).float(), atol=0.1)


@pytest.mark.parametrize("device, hopper", [("h100", True), ("a100", False)])
def test_a_model_compiles_as_the_cuda_target_would_on_the_device(device, hopper):
    # An f16 Linear takes the Hopper matmul (warpgroup MMA) on an H100, mma.sync on an A100.
    torch.manual_seed(0)
    linear, x = torch.nn.Linear(64, 128).half(), torch.randn(128, 64).half()
    with torch.no_grad():
        p = profile(linear, x, device=device, sample_only=True)
    (k,) = [k for k in p.graph.kernels if k.counts.mma or k.counts.wgmma]
    assert (k.counts.wgmma > 0, k.counts.mma > 0) == (hopper, not hopper)
