"""Fixtures of the script DSL tests: script kernels run on cuda-emu and cuda, never cpu."""

import pytest


@pytest.fixture
def script_target(target):
    """The target a script kernel test runs on (the shared `target` fixture, cpu skipped)."""
    if target == "cpu":
        pytest.skip("script kernels run on cuda or cuda-emu")
    return target
