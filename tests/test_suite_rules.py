"""The rules every test runs under (tests/conftest.py and pyproject.toml): a graph minicomp
gives up on fails the test that compiled it unless the test expects it, and the suite
compiles into its own cache, never the user's."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

INNER = """
import os

import pytest
import torch

import minicomp
from minicomp import compiler


def _give_up(monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(compiler, "lower", fails)
    torch._dynamo.reset()
    return torch.compile(lambda x: x + 1, backend="minicomp")


def test_a_silent_fallback(monkeypatch):
    _give_up(monkeypatch)(torch.randn(3))


def test_an_expected_fallback(monkeypatch):
    with pytest.warns(minicomp.FallbackWarning, match="runs it eagerly"):
        _give_up(monkeypatch)(torch.randn(3))


def test_the_cache_is_the_suites_own():
    assert os.environ["MINICOMP_CACHE_DIR"] != os.environ["USERS_CACHE"]
    assert os.path.basename(os.environ["MINICOMP_CACHE_DIR"]).startswith("minicomp-tests-")
"""


def test_fallbacks_fail_unless_expected_and_the_cache_is_private(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MINICOMP_", "PYTEST_"))}
    env["MINICOMP_CACHE_DIR"] = env["USERS_CACHE"] = str(tmp_path / "users-cache")
    env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "tests")])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
         "-c", os.path.join(REPO, "pyproject.toml"), "--rootdir", str(tmp_path),
         str(tmp_path / "test_inner.py")],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert "1 failed, 2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "FAILED" in proc.stdout and "test_a_silent_fallback" in proc.stdout
    assert "FallbackWarning: minicomp could not compile an inference graph" in proc.stdout
    assert not os.path.exists(tmp_path / "users-cache")
