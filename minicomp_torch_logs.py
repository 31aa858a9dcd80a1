"""Registers minicomp's TORCH_LOGS names while `import torch` runs, before torch reads TORCH_LOGS.

torch calls the `torch.backends` entry points (pyproject.toml) just before it parses TORCH_LOGS,
so that extensions can register their names first; a name nobody registered makes
`import torch` fail. This module sits outside the minicomp package because importing any
`minicomp.*` module runs `minicomp/__init__.py`, which imports most of minicomp (about half a
second) inside every `import torch`. It loads `minicomp/logs.py` alone, by path: that file
imports nothing of minicomp. Any failure is a warning, never a failed `import torch`.
"""

import importlib.util
import os
import warnings


def register() -> None:
    """Register minicomp's log and artifact names with torch._logging (minicomp/logs.py)."""
    try:
        spec = importlib.util.find_spec("minicomp")
        if spec is None or not spec.submodule_search_locations:
            return
        path = os.path.join(list(spec.submodule_search_locations)[0], "logs.py")
        logs_spec = importlib.util.spec_from_file_location("_minicomp_logs", path)
        logs = importlib.util.module_from_spec(logs_spec)
        logs_spec.loader.exec_module(logs)
        logs.register()
    except Exception as e:  # noqa: BLE001 - never break `import torch`
        warnings.warn(f"minicomp could not register its TORCH_LOGS names: {e}", stacklevel=2)
