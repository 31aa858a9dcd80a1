"""minicomp's names in PyTorch's logging (TORCH_LOGS), and warnings that point at user code.

`TORCH_LOGS="+minicomp"` sets the `minicomp` logger (every module logs to a child of it) to
DEBUG, `TORCH_LOGS=minicomp` to INFO, and each name of ARTIFACTS turns on one artifact, as
Inductor's `output_code` does: `TORCH_LOGS="minicomp_fusion,minicomp_source"`. Artifacts are
off by default: `+minicomp` does not print them.

torch parses TORCH_LOGS once, near the end of `import torch`, and refuses a name nobody
registered. So the names must be registered before that: `minicomp_torch_logs.py` (a
`torch.backends` entry point in pyproject.toml, which torch loads just before parsing) loads
this file alone, which is why it imports nothing of minicomp. `import minicomp` registers them
too, for a checkout that was never installed: then
`torch._logging.set_logs(modules={"minicomp_source": True})` works, and `TORCH_LOGS=+minicomp`
(a module name torch accepts anyway), but an artifact name in TORCH_LOGS fails `import torch`.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import warnings
from collections.abc import Callable

import torch._logging._internal as torch_logs

LOG = "minicomp"  # the TORCH_LOGS name and the logger every minicomp module logs under

# TORCH_LOGS name -> what it prints; each is one message per compiled graph.
ARTIFACTS = {
    "minicomp_passes": "minicomp: the graph IR after each pass, with the pass's time (graphs "
    "are compiled in full, never linked from the graph cache, to show them)",
    "minicomp_fusion": "minicomp: the fused groups of each graph (kernel name: the ops it "
    "computes)",
    "minicomp_fallbacks": "minicomp: the ops each graph leaves to ATen and why, and graphs "
    "that run eagerly",
    "minicomp_tuning": "minicomp: the template config chosen for each group and how "
    "(heuristic, database, measured, estimated)",
    "minicomp_kernels": "minicomp: the kernel IR of each generated kernel",
    "minicomp_source": "minicomp: the C or CUDA C source generated for each graph",
}


def register() -> None:
    """Register the `minicomp` log and the ARTIFACTS with torch._logging (once).

    Registered after torch set its logging up (no entry point ran), it sets it up again, as
    `torch._logging.set_logs` does, so the settings of TORCH_LOGS and set_logs reach the new
    names and the `minicomp` logger gets torch's handler.
    """
    registry = torch_logs.log_registry
    if registry.is_log(LOG) and all(registry.is_artifact(a) for a in ARTIFACTS):
        return
    torch_logs.register_log(LOG, LOG)
    for name, description in ARTIFACTS.items():
        torch_logs.register_artifact(name, description, off_by_default=True)
    if torch_logs.LOG_TRACE_HANDLER is not None:  # set by torch's first _init_logs
        torch_logs._init_logs()


def artifact_on(name: str) -> bool:
    """Whether TORCH_LOGS or set_logs turned this artifact on."""
    return torch_logs.log_state.is_artifact_enabled(name)


def log_artifact(name: str, text: Callable[[], str], *, force: bool = False) -> None:
    """Log an artifact's text, computed only when it is on (or `force`d by the verbose
    option, which asks for it whatever TORCH_LOGS says)."""
    if not (force or artifact_on(name)):
        return
    logger = torch_logs.getArtifactLogger(LOG, name)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s", text(), stacklevel=2)
    else:  # off_by_default: the artifact's logger does not propagate until it is on
        _handle(logging.getLogger(LOG), logger.name, logging.DEBUG, text())


def log_forced(logger: logging.Logger, level: int, message: str) -> None:
    """Log `message` even where the logger's level filters it out (the verbose option
    asked for it); torch's handler on the `minicomp` logger prints it."""
    if logger.isEnabledFor(level):
        logger.log(level, "%s", message, stacklevel=2)
    else:
        _handle(logger, logger.name, level, message)


def _handle(logger: logging.Logger, name: str, level: int, message: str) -> None:
    caller = sys._getframe(2)
    record = logger.makeRecord(
        name, level, caller.f_code.co_filename, caller.f_lineno, "%s", (message,), None
    )
    logger.handle(record)  # handlers only: no level check


def _is_internal(path: str) -> bool:
    """Whether a frame's file belongs to torch, minicomp or Python's standard library."""
    paths = sysconfig.get_paths()
    torch_dir = os.path.dirname(os.path.dirname(torch_logs.__file__))
    minicomp_dir = os.path.dirname(os.path.abspath(__file__))
    if path.startswith((torch_dir + os.sep, minicomp_dir + os.sep, "<frozen ")):
        return True
    in_site = path.startswith((paths["purelib"] + os.sep, paths["platlib"] + os.sep))
    return path.startswith(paths["stdlib"] + os.sep) and not in_site


def warn_user(message: str, category: type[Warning]) -> None:
    """`warnings.warn` at the user's line: the first frame outside torch, minicomp and the
    standard library (the caller's, when there is none, as in a backward pass run on
    autograd's own thread)."""
    frame, level = sys._getframe(1), 2
    while frame is not None and _is_internal(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
