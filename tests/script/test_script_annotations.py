"""Postponed annotations (PEP 563): sizes written as bare parameter names and expressions."""
# ruff: noqa: F821 - sizes named by bare parameter names, which pyflakes cannot resolve

from __future__ import annotations

import math

import pytest
import torch

import minicomp
from minicomp.script import ScriptError, attrs, f32, i32, threadIdx


@minicomp.script
def pair_sums(x: f32[2 * n], out: f32[n], n: i32):
    attrs.grid_dim = 1
    attrs.block_dim = 64
    t = threadIdx.x
    if t < n:
        out[t] = x[2 * t] + x[2 * t + 1]


def test_size_expressions(script_target):
    kernel = pair_sums.with_target(script_target)
    x = torch.randn(40)
    out = torch.full((20,), math.nan)
    kernel(x, out)
    assert torch.equal(out, x[0::2] + x[1::2])
    with pytest.raises(ScriptError, match=r"argument x must have the shape .*dimension 0 is 39"):
        kernel(torch.randn(39), out)
