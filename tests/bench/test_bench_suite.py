"""Every suite model at its small size, compiled by minicomp on the CPU, matches eager."""

import pytest
import torch
from helpers import check_compiled

from minicomp.bench import suite

# The same tolerance as tests/models: a few layers of matmuls summed in different orders.
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


@pytest.mark.parametrize("name", suite.model_names())
def test_small_model_matches_eager(name):
    spec = suite.get(name)
    if spec.missing():
        pytest.skip(f"{name} {spec.missing()}")
    built = spec.build("small", torch.float32, 1, "cpu")
    assert not built.model.training
    with torch.no_grad():
        check_compiled(built.model, *built.inputs, target="cpu", **TOLERANCE)


def test_builds_are_reproducible_and_shaped_as_documented():
    a = suite.get("gpt2").build("small", torch.float32, 2, "cpu")
    b = suite.get("gpt2").build("small", torch.float32, 2, "cpu")
    (ids,) = a.inputs
    assert ids.shape == (2, suite.TEXT_SEQ["small"]) and a.shape == {"seq": ids.shape[1]}
    assert torch.equal(ids, b.inputs[0])
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(p, q), name
    vit = suite.get("vit-b16").build("small", torch.bfloat16, 3, "cpu")
    (pixels,) = vit.inputs
    assert pixels.shape == (3, 3, 32, 32) and pixels.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in vit.model.parameters())


def test_unknown_model_and_missing_package_are_reported():
    with pytest.raises(KeyError, match="unknown model 'nope'; the suite has resnet50"):
        suite.get("nope")
    spec = suite.ModelSpec("x", "vision", "needs a package", lambda *a: None, ("no_such_pkg",))
    assert spec.missing() == "needs no_such_pkg, which is not installed"
    with pytest.raises(ValueError, match="unknown size"):
        suite.get("gpt2").build("medium", torch.float32, 1, "cpu")
