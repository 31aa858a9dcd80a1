"""Tests of the `minicomp` command run as a subprocess."""

import os
import subprocess
import sys

from minicomp import config
from minicomp.backends.cpu import compiler

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _minicomp(*args: str, cache_dir) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINICOMP_")}
    env["MINICOMP_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "minicomp.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_config_lists_every_option(tmp_path):
    proc = _minicomp("config", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in config.names():
        assert name in proc.stdout
        assert "MINICOMP_" + name.upper() in proc.stdout


def test_cache_stats_and_clear(tmp_path):
    proc = _minicomp("cache", "stats", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert os.path.join(str(tmp_path), "kernels") in proc.stdout
    assert "libraries: 0" in proc.stdout

    source = "int answer(void) { return 42; }\n"
    path = compiler.compile_c(source, cc="cc", cflags="-fPIC -shared", cache_dir=str(tmp_path))
    size = sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(tmp_path / "kernels")
        for f in files
    )
    proc = _minicomp("cache", "stats", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "libraries: 1" in proc.stdout
    assert f"({size} bytes)" in proc.stdout

    proc = _minicomp("cache", "clear", cache_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "removed 1 libraries" in proc.stdout
    assert not os.path.exists(path)
    assert "libraries: 0" in _minicomp("cache", "stats", cache_dir=tmp_path).stdout


def test_explain_without_implementation_fails_clearly(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("print('hi')\n")
    proc = _minicomp("explain", str(script), cache_dir=tmp_path)
    # Until minicomp.explain_file exists the command must say so, not crash with a traceback.
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 2:
        assert "explain_file" in proc.stderr and "Traceback" not in proc.stderr


def test_explain_runs_a_script_and_reports_every_graph_it_compiles(tmp_path):
    script = tmp_path / "model.py"
    script.write_text(
        "import sys\n"
        "import torch\n"
        "f = torch.compile(lambda x: torch.softmax(x * 2, -1) + 1, backend='minicomp')\n"
        "with torch.no_grad():\n"
        "    print('result', f(torch.randn(4, int(sys.argv[1]))).shape)\n"
    )
    proc = _minicomp("explain", str(script), "8", cache_dir=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    assert "result torch.Size([4, 8])" in proc.stdout
    for title in (
        "forward graph: ATen",
        "graph IR after fuse",
        "fused groups (1)",
        "kernel IR:",
        "generated source",
    ):
        assert title in proc.stdout
    assert "3 ATen ops -> 1 kernels" in proc.stdout
