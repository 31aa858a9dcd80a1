"""Running Python in a fresh interpreter as an install of this checkout would: its entry points
declared (pyproject.toml), its own cache, chosen environment variables."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def installed_entry_points(folder) -> str:
    """A dist-info under `folder` declaring pyproject.toml's entry points, so that a Python
    with `folder` first on its path runs them as an install of this checkout would (whatever
    the installed minicomp's metadata says)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    info = os.path.join(folder, f"minicomp-{project['version']}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: minicomp\nVersion: {project['version']}\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        for group, points in project["entry-points"].items():
            f.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) + "\n")
    return str(folder)


def run_python(code: str, tmp_path, **env_vars: str) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh interpreter with this checkout installed (entry points
    included), its own cache, and `env_vars` set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MINICOMP_", "TORCH_LOGS", "TORCH_TRACE", "PYTEST_"))
    }
    site = installed_entry_points(tmp_path / "site")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, REPO, env.get("PYTHONPATH")]))
    env["MINICOMP_CACHE_DIR"] = str(tmp_path / "cache")
    env.update(env_vars)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
